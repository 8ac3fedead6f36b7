"""The sweep driver: the library every study in ``accelsweep.sweeps`` composes.

    from accelsweep.sweeps.driver.api import Objective, Sweep, run_sweep

Its modules: ``api`` (Sweep, plan_sweep, run_sweep), ``cli`` (the flags every study
shares), ``preflight`` (checks against the machine or cluster), ``space`` (search
spaces), ``searchers`` (Optuna through Tune), ``schedulers`` (early stopping with
several objectives), ``callbacks`` (trials to records and MLflow runs), ``report`` (the
end-of-sweep summary), ``kernel_sweep`` (the grid every kernel study runs),
``precompile`` (Neuron's ahead-of-time compile phase), ``stop_signals`` (SIGINT and
SIGTERM end a sweep cleanly) and ``local_ray`` (a local Ray instance that does not
outlive its driver).
"""
