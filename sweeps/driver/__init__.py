"""The sweep driver: the library every study in ``accelsweep.sweeps`` composes, in rooms
by concern. Users import its public names from ``accelsweep``.

- ``define/``: what a sweep is and its plan, validated before anything starts (the sweep,
  its space, the flags every study shares, the built-in studies, the checks made first);
- ``run/``: running it (Ray, the searcher and schedulers, the callbacks, the confirmation,
  the guards: deadlines, signals, storage);
- ``record/``: what it keeps (MLflow runs, the Optuna study, the marker, reading a sweep back);
- ``reporting/``: what it says (the summary, the verdict, the report and its plots, comparisons);
- ``ops/``: tools around sweeps (a local cluster, namespace hosts, a team's store);
- ``console``: the ``accelsweep`` command.
"""
