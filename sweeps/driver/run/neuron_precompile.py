"""The optional precompile phase of a Neuron sweep (seed 002): before any trial, the
configs the search will propose first are compiled in parallel into the sweep's shared
compile cache with ``neuron_parallel_compile``, so those trials find their graphs there
(which configs: ``first_proposals``).

Each config's extraction runs as a Ray task on a node of the trials' kind (it holds the
same resources a trial worker holds: a NeuronCore, the instance-type marker), so the
graphs are traced by the same torch-neuronx, for the same --target, into the cache every
trial reads (NEURON_COMPILE_CACHE_URL). Never run here: there is no Neuron SDK on our
machines; the command, its environment and the Ray plumbing are what the tests check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from accelsweep.sweeps.driver.define.plan import startup_trials
from accelsweep.sweeps.driver.run.lifecycle import _searcher
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import get_platform

TOOL = "neuron_parallel_compile"


@dataclass
class PrecompileResult:
    searched: dict[str, Any]
    seconds: float
    returncode: int
    output_tail: str


def first_proposals(plan, count: int) -> list[dict[str, Any]]:
    """The first ``count`` configs (searched knobs) the sweep's searcher will propose,
    baseline first, capped at the ones that cannot depend on results: what the seeded TPE
    searcher proposes while fewer than its start-up count of trials have completed (the
    baseline counts) is random and seeded, so a searcher built the same way proposes them
    again, in the same order, in the sweep itself. Later proposals depend on measurements
    and compile when they run."""
    searcher = _searcher(plan)
    knowable = min(count, startup_trials(plan.sweep))
    return [dict(searcher.suggest(f"precompile-{index}")) for index in range(knowable)]


def precompile_command(config: TrialConfig) -> list[str]:
    return [TOOL, sys.executable, "-m", "accelsweep.trainables.loop.precompile", "--config", json.dumps(config.to_dict())]


def precompile_env(config: TrialConfig) -> dict[str, str]:
    """The trial's own compiler and runtime environment: same flags, same cache."""
    return dict(get_platform(config.platform).trial_env(config))


def check_precompile(platform: str, count: int, compile_cache) -> None:
    if count < 0:
        raise ConfigError("--precompile", "a number of configs >= 0", count)
    if count and platform != "neuron":
        raise ConfigError("--precompile", f"0 on platform {platform!r} (it runs Neuron's {TOOL})", count)
    if count and not compile_cache:
        raise ConfigError("--compile-cache", "a cache every trial reads (a shared directory or s3://) with "
                          "--precompile", compile_cache, "Graphs compiled into a node's default cache "
                          "help only trials that land on that node.")


def _extract_and_compile(command: Sequence[str], env: Mapping[str, str]) -> tuple[float, int, str]:
    started = time.monotonic()
    done = subprocess.run(list(command), env={**os.environ, **env}, capture_output=True, text=True)
    output = (done.stdout + done.stderr)[-2000:]
    return time.monotonic() - started, done.returncode, output


def skip_reason(config: TrialConfig) -> str:
    """Why a config is not precompiled ("" when it is)."""
    if config.workers > 1:
        return (f"skipped: {config.workers} workers; their graphs hold collectives a one-process extraction "
                "does not trace (compiled when the trial runs)")
    return ""


def run_precompile(config_for: Callable[[Mapping[str, Any]], TrialConfig],
                   proposals: Sequence[Mapping[str, Any]]) -> list[PrecompileResult]:
    """One Ray task per config, all at once: the cluster runs as many as fit.
    ``config_for``: searched values -> the trial's config (``Plan.config_for``)."""
    import ray

    task = ray.remote(_extract_and_compile)
    pending = []
    for searched in proposals:
        config = config_for(searched)
        if skip_reason(config):
            continue
        resources = dict(get_platform(config.platform).worker_resources(config))
        options = {"num_cpus": resources.pop("CPU", 1), "resources": resources}
        pending.append((dict(searched), task.options(**options).remote(precompile_command(config),
                                                                      precompile_env(config))))
    return [PrecompileResult(searched, *ray.get(ref)) for searched, ref in pending]


def describe_plan(config_for: Callable[[Mapping[str, Any]], TrialConfig],
                  proposals: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"precompile: {len(proposals)} configs with {TOOL}, before the first trial:"]
    for searched in proposals:
        config = config_for(searched)
        lines.append(f"  {searched}")
        if skip_reason(config):
            lines.append(f"    {skip_reason(config)}")
            continue
        lines.append(f"    NEURON_CC_FLAGS={precompile_env(config).get('NEURON_CC_FLAGS', '')!r} "
                     f"cache={get_platform(config.platform).compile_cache(config)}")
    return lines
