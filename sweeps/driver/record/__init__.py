"""The MLflow record the sweep driver keeps: one parent run per sweep and one nested run
per trial (tracking), writes kept in order while the tracking server is away
(tracking_buffer), sqlite stores opened safely by several processes (sqlite_store), and
credentials kept out of everything recorded (secrets). Only the driver uses these: trial
processes report to Tune, never to MLflow."""
