"""Module paths of the previous release, kept for one release: importing one gives the
module at its new path, with a DeprecationWarning that names the new import."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_D = "accelsweep.sweeps.driver"
_T = "accelsweep.trainables"
# old path -> new path
MOVED = {
    f"{_D}.api": "accelsweep",
    "accelsweep.trainables.workload": "accelsweep.trainables.workloads.base",
    "accelsweep.sweeps.console": f"{_D}.console",
    "accelsweep.sweeps.measurement_flags": f"{_D}.define.measurement_flags",
    "accelsweep.sweeps.report": f"{_D}.reporting.report_command",
    "accelsweep.sweeps.compare": f"{_D}.reporting.compare_command",
    **{f"{_D}.{name}": f"{_D}.define.{name}" for name in (
        "sweep", "plan", "space", "first_guess", "cli", "studies", "preflight", "store_checks", "resume_check",
        "warm_start")},
    **{f"{_D}.{name}": f"{_D}.run.{name}" for name in (
        "lifecycle", "searchers", "schedulers", "callbacks", "confirm", "deadline", "stop_signals", "storage_watch",
        "local_ray", "raylet_child", "detach", "kernel_sweep", "goal")},
    f"{_D}.precompile": f"{_D}.run.neuron_precompile",
    f"{_D}.records": f"{_D}.record.trial_record",
    f"{_D}.history": f"{_D}.record.history",
    f"{_D}.marker": f"{_D}.record.marker",
    f"{_D}.resumed_runs": f"{_D}.record.resumed_runs",
    f"{_D}.study": f"{_D}.record.optuna_study",
    f"{_D}.database_errors": f"{_D}.record.database_errors",
    f"{_D}.report": f"{_D}.reporting.summary",
    f"{_D}.sweep_report": f"{_D}.reporting.report_artifacts",
    f"{_D}.compare": f"{_D}.reporting.comparison",
    **{f"{_D}.{name}": f"{_D}.reporting.{name}" for name in (
        "plots", "roofline_plot", "changes", "verdict", "cluster_watch")},
    **{f"{_D}.{name}": f"{_D}.ops.{name}" for name in (
        "team_store", "cluster_hosts", "local_cluster", "local_node_provider")},
    # what the platforms and the loop share, below both
    **{f"{_T}.loop.{name}": f"{_T}.{name}" for name in ("precision", "compile_cache", "batches", "distributed")},
    f"{_T}.loop.measure": f"{_T}.timing.windows",
    f"{_T}.harness.device_timing": f"{_T}.timing.device",
}


def new_import(old: str, new: str) -> str:
    """How a script imports what it imported from ``old``."""
    return "import accelsweep" if new == "accelsweep" else f"from {new} import ..."


def _warn(old: str, category: type = DeprecationWarning) -> None:
    warnings.warn(f"{old} has moved: {new_import(old, MOVED[old])} (the old path goes in the next release)",
                  category, stacklevel=3)


class _MovedPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old path with the module at its new one (the same object, not a copy),
    and ``python -m OLD`` with the new module's code."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        _warn(spec.name)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system writes the old spec over it; exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # the module at the new path is already executed

    def is_package(self, fullname):
        return False

    def get_code(self, fullname):  # python -m OLD (runpy) runs the new module as __main__
        _warn(fullname, FutureWarning)  # a command's user sees it (Python shows FutureWarning by default)
        spec = importlib.util.find_spec(MOVED[fullname])
        return spec.loader.get_code(spec.name)


def install_moved_paths() -> None:
    if not any(isinstance(finder, _MovedPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedPaths())
