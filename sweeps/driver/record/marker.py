"""The sweep marker: the file beside Tune's state that says which MLflow parent run a
sweep writes to, whether it ended, and what defines it, so that --resume finds the newest
stopped run of a sweep and continues it in the same record."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Mapping, Optional

from accelsweep.trainables.errors import ConfigError

SWEEP_MARKER = "accelsweep-sweep.json"


def write_sweep_marker(experiment_dir: str, parent_run_id: str, status: str,
                        defines: Optional[Mapping[str, Any]] = None) -> None:
    """What --resume needs besides Tune's state: the MLflow parent run, whether the sweep
    ended (a finished sweep is not resumed), and what defines it (``defines``, written at
    the start and kept: resume_check.py; no credential in it). Replaced whole (a rename):
    a driver killed while writing leaves the previous marker."""
    os.makedirs(experiment_dir, exist_ok=True)
    marker = {**read_sweep_marker(experiment_dir), "parent_run_id": parent_run_id, "status": status}
    if defines is not None:
        marker["defines"] = dict(defines)
    path = os.path.join(experiment_dir, SWEEP_MARKER)
    with open(path + ".tmp", "w") as new:
        json.dump(marker, new)
    os.replace(path + ".tmp", path)


def read_sweep_marker(experiment_dir: str) -> dict[str, Any]:
    """The marker of the sweep in ``experiment_dir``; {} when it has none, or one cut
    short (by a driver killed as it wrote it, before markers were replaced whole)."""
    try:
        with open(os.path.join(experiment_dir, SWEEP_MARKER)) as marker:
            return json.load(marker)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def unfinished_sweep_dir(storage: str, name: str) -> str:
    """The newest run of sweep ``name`` under ``storage`` that did not finish."""
    candidates = []
    for marker_path in glob.glob(os.path.join(storage, f"{name}-*", SWEEP_MARKER)):
        directory = os.path.dirname(marker_path)
        status = read_sweep_marker(directory).get("status")
        if status != "finished" and os.path.exists(os.path.join(directory, "tuner.pkl")):
            candidates.append(directory)
    if not candidates:
        raise ConfigError("--resume", f"a stopped run of sweep {name!r} under {storage} (a {name}-* directory "
                                      "with Tune's state that did not finish)", "none found",
                          "Start it without --resume, or pass the --storage-path it ran with.")
    return max(candidates, key=os.path.getmtime)
