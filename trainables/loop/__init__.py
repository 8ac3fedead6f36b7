"""What a training trial's process runs: the training loop (train_loop), its timing
windows (measure), and its guards: rejection of hopeless configs and the compile limit
(rejection, watchdog), NaN capture and replay, the failure causes a trial reports, the
compile cache, precision and the data-parallel world. Used by trials, never by the
sweep's driver except for the names it reads back (failures, rejection's limits)."""
