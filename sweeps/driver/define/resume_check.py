"""``--resume`` goes on with a stopped sweep only when the command defines the same sweep.

A resumed sweep writes into the stopped run's MLflow parent run and Optuna study, and
its searcher goes on from the stopped one's state: a command with another tracking
store, experiment, search space, seed, objectives or base config would mix two sweeps
in one record (or, with another store, find no parent run at all). So the sweep's
marker (marker.SWEEP_MARKER in its experiment dir) keeps what defines it, with no
credential in it (tracking and study URIs as ``secrets.shown_uri`` writes them, the
base config scrubbed), and ``check_same_sweep`` compares it with the command's own
before anything starts, naming every difference.

Not compared: what a resumed run may change without mixing sweeps (--num-samples,
--time-budget-s: Tune's saved state decides them; --address, --max-concurrent-trials,
--retries, --trial-timeout-s, ...), and a password (one rotated since is the same store).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from accelsweep.trainables.errors import ConfigError
from accelsweep.sweeps.driver.define.store_checks import default_storage_path
from accelsweep.sweeps.driver.record.secrets import scrub, shown_uri

__all__ = ["DEFINING", "ResumeMismatch", "check_same_sweep", "defining_flags", "storage_dir"]

# Marker key -> how the command names it.
DEFINING = {
    "tracking_uri": "--tracking-uri",
    "experiment": "--experiment",
    "study_storage": "--study-storage",
    "search_space": "search space",
    "seed": "--seed",
    "objectives": "objectives",
    "base": "base config (--smoke, --platform, the study's own flags)",
}
_SHOWN_CHARS = 300  # per value in the message: a search space can be long


class ResumeMismatch(ConfigError):
    """--resume with flags that define another sweep than the stopped run. Bad input like
    any ConfigError (scripts exit 2), said as the list of differences rather than one
    field's allowed values."""

    def __init__(self, experiment_dir: str, differences: list[str]):
        self.field = "--resume"
        self.differences = differences
        ValueError.__init__(self, f"--resume: {'; '.join(differences)}. Run it again with the flags the stopped "
                                  f"run used, or without --resume to start a new sweep (the stopped run stays "
                                  f"in {experiment_dir}).")


def storage_dir(sweep: Any) -> str:
    """Where the sweep's Tune experiments are (Sweep.storage_path, else the default:
    store_checks.default_storage_path)."""
    return os.path.abspath(os.path.expanduser(sweep.storage_path or default_storage_path()))


def _located(uri: str) -> str:
    """A relative sqlite path names another file from another directory: made absolute."""
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    return uri


def defining_flags(plan: Any) -> dict[str, Any]:
    """What defines the sweep of ``plan`` (a plan.Plan), as the marker keeps it: JSON
    values, no credential."""
    sweep = plan.sweep
    space = dict(line.split(": ", 1) for line in plan.space.describe())
    return json.loads(json.dumps({
        "tracking_uri": shown_uri(_located(sweep.tracking_uri)),
        "experiment": sweep.experiment or sweep.name,
        # Given or not: the default follows the tracking URI and the storage path.
        "study_storage": shown_uri(_located(sweep.study_storage)) if sweep.study_storage else None,
        "search_space": space,
        "seed": sweep.seed,
        "objectives": [f"{o.mode} {o.metric}" for o in sweep.objectives],
        "base": scrub(plan.base_dict),
    }, default=str))


def _same(before: Any, now: Any) -> bool:
    """As JSON text: a NaN in a config equals itself."""
    return json.dumps(before, sort_keys=True) == json.dumps(now, sort_keys=True)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else "(not given)" if value is None else json.dumps(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _entries(before: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[str, str]:
    """The entries of two dicts that differ, each side as ``name=value, ...``."""
    names = [k for k in dict.fromkeys([*before, *now]) if not _same(before.get(k, "<none>"), now.get(k, "<none>"))]
    side = lambda values: ", ".join(f"{k}={_shown(values[k]) if k in values else '<none>'}" for k in names)
    return side(before), side(now)


def check_same_sweep(plan: Any, marker: Mapping[str, Any], experiment_dir: str) -> None:
    """ResumeMismatch naming each flag whose value differs from the stopped run's (its
    ``marker``). A marker written before the marker kept them is not checked."""
    stopped = marker.get("defines")
    if not isinstance(stopped, Mapping):
        return
    now = defining_flags(plan)
    differences = []
    for key, flag in DEFINING.items():
        if key not in stopped or _same(stopped[key], now[key]):
            continue
        if isinstance(stopped[key], Mapping) and isinstance(now[key], Mapping):
            before, after = _entries(stopped[key], now[key])
        else:
            before, after = _shown(stopped[key]), _shown(now[key])
        differences.append(f"the stopped run used {flag} {before}, this command {flag} {after}")
    if differences:
        raise ResumeMismatch(experiment_dir, differences)
