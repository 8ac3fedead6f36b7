"""What a training trial's process runs: the training loop (train_loop) and its guards:
rejection of hopeless configs and the compile limit (rejection, watchdog), NaN capture and
replay, and the failure causes a trial reports. Its timing windows (trainables/timing), the
precisions, the compile cache, batches and the data-parallel world sit below the platforms,
which share them. Used by trials, never by the sweep's driver except for the names it reads
back (failures, rejection's limits)."""
