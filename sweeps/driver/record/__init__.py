"""What a sweep keeps: one MLflow parent run per sweep and one nested run per trial
(``tracking``, ``tracking_buffer``, ``sqlite_store``, ``secrets``), a trial as the driver
holds it (``trial_record``), the Optuna study (``optuna_study``), the marker beside Tune's
state, and a sweep read back from MLflow (``history``, ``resumed_runs``). Only the driver
writes here: trial processes report to Tune, never to MLflow."""
