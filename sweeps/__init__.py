"""accelsweep sweeps: runnable studies, and the sweep-building API (sweeps.api)."""
