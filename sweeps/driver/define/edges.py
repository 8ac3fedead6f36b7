"""Past the space's edge: when the search's leader sits on the largest value of an
ordered knob, the next value out is tried, and again while it leads or the run cannot tell it
from the leader.

Why: a space is written before the host is known. The main job's CPU batches end at 64;
on a host none of its rules saw, both tools' winners sat on 64 and a plain loop measured 256
faster (docs/budget.md): the seeds' engineers would simply have tried the next batch. The
platform says which knobs are ordered, how to step out and how far this hardware lets
them go (``Platform.ordered_knobs``); the batch also stops where its memory would not fit
(``fits_memory``). A step that fails (out of memory) or measures clearly worse than the
leader ends the climb on that knob; one the run cannot tell from the leader goes on
(``climb_base``). Every step is one of the sweep's trials, inside its budget; the
summary says which edges moved (``edge_lines``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from accelsweep.sweeps.driver.record.trial_record import TrialRecord, config_key

__all__ = ["EDGE_MARK", "MEMORY_SHARE", "climb_base", "edge_lines", "edge_step", "first_figure_s", "fits_memory",
           "fits_time", "largest_values", "next_value"]

EDGE_MARK = "past the space's edge"
# Of the memory a trial's peak is measured against, the share a step's predicted peak may
# take: Ray's memory monitor kills a worker at 95% of its node's memory
# (memory_usage_threshold), and beside the trial the node runs Ray, the driver and the
# trial's loader processes; a GPU's allocator needs room past the peak it reports.
MEMORY_SHARE = 0.8


def next_value(rule: str, value: Any, limit: Optional[int]) -> Optional[int]:
    """The value past ``value`` by ``rule`` ("x2", "+1"); None past ``limit`` or for a value
    that is not a count."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    stepped = value * 2 if rule == "x2" else value + 1 if rule == "+1" else None
    if stepped is None or (limit is not None and stepped > limit):
        return None
    return stepped


def fits_memory(memory: Optional[tuple[float, float, float]], ratio: float) -> bool:
    """Whether a batch ``ratio`` times the leader's fits, from the leader's (peak, workload,
    capacity) in MB: its workload's memory (activations, batches) grows with the batch, the
    rest (the process, the weights) does not. Unknown figures: tried (a failed step is
    recorded with its cause, and ends the climb)."""
    if memory is None or not all(math.isfinite(x) for x in memory):
        return True
    peak, workload, capacity = memory
    return peak + max(0.0, workload) * (ratio - 1) <= MEMORY_SHARE * capacity


def first_figure_s(result: Mapping[str, Any]) -> tuple[float, float]:
    """From a trial's result: the seconds to its first measured window, as (its setup, the
    loop's warm-up and one window); NaN where they are not reported."""
    setup, loop, measured = (float(result.get(name, math.nan)) for name in ("setup_s", "loop_s", "measured_s"))
    windows = float(result.get("windows_done", math.nan))
    return setup, (loop - measured) + measured / windows if windows > 0 else math.nan


def fits_time(base_first_s: Optional[tuple[float, float]], ratio: float, seconds_left: Optional[float]) -> bool:
    """Whether a step ``ratio`` times the base's batch can measure one window in the
    ``seconds_left`` of the search, from the base's ``first_figure_s``: its setup as it
    was, its warm-up and window scaled by the ratio (a step of twice the batch takes about
    twice as long). Why: a large batch proposed in the search's last seconds is cut
    before its first figure, and those seconds measure nothing. Unknown figures: tried."""
    if seconds_left is None or base_first_s is None or not all(math.isfinite(x) for x in base_first_s):
        return True
    setup, steps = base_first_s
    return setup + steps * max(1.0, ratio) <= seconds_left


def edge_step(leader: Mapping[str, Any], memory: Optional[tuple[float, float, float]],
              edges: Mapping[str, tuple[str, Optional[int]]], largest: Mapping[str, Any],
              taken: set, first_s: Optional[tuple[float, float]] = None,
              seconds_left: Optional[float] = None) -> Optional[tuple[dict, str]]:
    """The first config one step past the space's edge from ``leader`` (its searched
    values) not ``taken`` (config keys measured or running), with what it changed; None
    when the leader is on no edge, or every step out is taken, past the hardware,
    memory, or the search's time (``fits_time`` from the leader's ``first_s``).
    ``largest``: each ordered knob's largest value in the space."""
    for knob, (rule, limit) in edges.items():
        if knob not in leader or knob not in largest:
            continue
        value = leader[knob]
        if isinstance(value, bool) or not isinstance(value, int) or value < largest[knob]:
            continue  # inside the space: TPE and the local search cover it
        stepped = next_value(rule, value, limit)
        if stepped is None:
            continue
        if knob == "batch_size" and not fits_memory(memory, stepped / value):
            continue
        if not fits_time(first_s, stepped / value if knob == "batch_size" else 1.0, seconds_left):
            continue
        config = {**leader, knob: stepped}
        if config_key(config) not in taken:
            return config, f"{knob} {value} -> {stepped} {EDGE_MARK}"
    return None


def climb_base(leader: Mapping[str, Any], knob: str, figures: Sequence[tuple[Mapping[str, Any], float]],
               margin: float, mode: str) -> Mapping[str, Any]:
    """The config the climb on ``knob`` goes on from: of the measured configs that differ
    from ``leader`` in ``knob`` alone, at a larger value, the farthest whose figure is within
    ``margin`` of the leader's (``figures``: (config, figure) of every measured config, the
    leader's among them, on one footing); the leader itself when there is none.

    Why not only past a step that leads: within the run's near-best margin one trial's
    figure ranks two configs no closer, and on a plateau one trial per batch ranks 64, 128
    and 256 by the host's noise: the climb stopped at the first step that measured a little
    low, where the judge's plain loop (rounds in fresh processes) put 256 above 128 above 64,
    a few percent each, in every record that measured them
    (benchmarks/results/vs_plain_tune*.json). An engineer tries the next batch while the
    last was no worse."""
    lead = next((f for c, f in figures if dict(c) == dict(leader)), None)
    if lead is None:
        return leader
    base = leader
    for config, figure in figures:
        value = config.get(knob)
        if (set(config) != set(leader) or any(config[k] != v for k, v in leader.items() if k != knob)
                or isinstance(value, bool) or not isinstance(value, int) or value <= base[knob]):
            continue
        if (figure >= lead * (1 - margin)) if mode == "max" else (figure <= lead * (1 + margin)):
            base = config
    return base


def largest_values(distributions: Mapping[str, Any], edges: Mapping[str, Any]) -> dict[str, int]:
    """Each ordered knob's largest choice in a space of Optuna distributions (counts only)."""
    largest = {}
    for knob in edges:
        choices = getattr(distributions.get(knob), "choices", None)
        counts = [c for c in choices or () if isinstance(c, int) and not isinstance(c, bool)]
        if counts:
            largest[knob] = max(counts)
    return largest


def edge_lines(records: Sequence[TrialRecord], metric: str) -> list[str]:
    """The summary's line on the edges the search moved past, each step with its trial and figure."""
    steps = [r for r in records if EDGE_MARK in str(r.result.get("local_step", ""))]
    if not steps:
        return []
    said = []
    for record in sorted(steps, key=lambda r: r.number):
        step = str(record.result["local_step"]).replace(f" {EDGE_MARK}", "")
        figure = f"{record.metric(metric):.4g}" if record.measured(metric) else (record.error_cause or record.status)
        said.append(f"{step} (trial {record.number}: {figure})")
    return [f"the space's edge moved ({len(steps)} trial(s) past it, one step each while the leader sat on "
            "the edge or near it): " + "; ".join(said)]
