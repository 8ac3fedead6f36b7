"""What a kernel trial's process runs: the microbenchmark harness (microbench: one
implementation of one op, checked against its reference, then timed), device time of
launch-bound calls (device_timing), and the machine's steadiness check (stability)."""
