"""accelsweep sweeps: the runnable studies (one module each, read like the seed's
experiment table) and, in ``accelsweep.sweeps.driver``, the sweep-building library."""
