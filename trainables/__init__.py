"""accelsweep trainables: the training loop, the microbenchmark harness, platforms,
cost and tracking. Importing this package does not import torch."""
