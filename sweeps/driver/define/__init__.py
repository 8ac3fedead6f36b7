"""Defining and planning a sweep: what a sweep is (``sweep``), its search space (``space``),
the platform's first guess, the flags every study shares (``cli``, ``measurement_flags``),
the built-in studies (``studies``), and the plan with every check made before a trial starts
(``plan``, ``preflight``, ``store_checks``, ``resume_check``, ``warm_start``)."""
