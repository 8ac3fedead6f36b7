"""Running a sweep: its lifecycle on Ray (``lifecycle``, ``local_ray``), the searcher and the
early-stopping rules, trials turned into records and progress lines (``callbacks``), the
confirmation phase, the guards that stop it cleanly (deadlines, signals, a filling disk),
the kernel grid and Neuron's ahead-of-time compile phase."""
