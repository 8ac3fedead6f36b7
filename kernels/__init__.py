"""accelsweep kernels: one folder per op, each with a reference and one module per
implementation language."""
