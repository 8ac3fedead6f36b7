"""What a sweep says: the end-of-sweep summary (``summary``), whether the best beats the
baseline beyond the noise (``verdict``, ``changes``), the report and its plots on the parent
run (``report_artifacts``, ``plots``, ``roofline_plot``, ``cluster_watch``), sweeps compared
(``comparison``), and the ``accelsweep report`` and ``accelsweep compare`` commands."""
