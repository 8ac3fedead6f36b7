"""Timing that the platforms and every trainable share: the loop's measured windows and
their statistics (``windows``), and device time of calls too short to time one at a time
(``device``: CUDA events, JAX traces). Below ``platforms/``, which time through it."""
