"""accelsweep trainables: what a trial's process runs.

- the trainables Tune calls (trainable) and the trial config (config), with its cost
  basis (cost), declared metrics (metrics), errors and the environment it records;
- what the platforms and the loop share, below both: precision, compile_cache, batches,
  distributed, and timing/ (the measured windows, device time);
- loop/: the training loop and its guards;
- harness/: the kernel microbenchmark harness;
- platforms/: one module per platform (cpu, cuda, xla, neuron, tpu), owning its knobs;
- workloads/: what the loop trains (the Workload interface in workloads.base).

Importing this package does not import torch."""
