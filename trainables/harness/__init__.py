"""What a kernel trial's process runs: the microbenchmark harness (microbench: one
implementation of one op, checked against its reference, then timed) and the machine's
steadiness check (stability). Device time of launch-bound calls is trainables/timing/device.py."""
