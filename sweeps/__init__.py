"""accelsweep sweeps: the runnable studies, one module each, read like the seed's
experiment table; the sweep-building library is ``accelsweep.sweeps.driver``."""
