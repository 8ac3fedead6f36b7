"""What limits a config: a few profiled steps after a trial's last window (outside every
timed one), their host time split into ``compute`` (matmul, convolution, attention kernels'
own time), ``ops`` (every other operator's), ``optimizer`` (its operators' work under
torch's ``Optimizer.step#...`` ranges), ``data`` (waiting for the next batch: the loader,
the copy to the device) and ``host`` (Python and the framework between operators, plus each
operator call's fixed cost: the profiled own time of an add of one-element tensors,
``dispatch_cost_s``). The largest names the knob that attacks it (``ADVICE``): a larger
batch when dispatch dominates, loader workers when data does, compilation when small
operators do. Only where the host clock times the steps (a CPU, whose kernels run on the
calling thread); on an asynchronous device the host's split says nothing of the device's
time, and no line is given.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

__all__ = ["ADVICE", "DATA_RANGE", "LIMITS", "PROFILED_STEPS", "Breakdown", "dispatch_cost_s", "limiter_line",
           "profile_steps"]

PROFILED_STEPS = 3  # enough to average a step's split; each costs the profiler's overhead too
DATA_RANGE = "accelsweep.next_batch"  # the loop's range around fetching a batch
LIMITS = ("compute", "ops", "optimizer", "data", "host")
NAMES = {"compute": "compute kernels (matmul, convolution, attention)", "ops": "other operators",
         "optimizer": "the optimizer step", "data": "waiting for data", "host": "the host's dispatch"}
ADVICE = {
    "compute": "the math itself: faster kernels; the config is compute-bound",
    "ops": "many small operators: compilation (torch_compile) fuses them",
    "optimizer": "a fused or foreach optimizer, or a larger batch (fewer steps per sample)",
    "data": "the loader: more loader workers (num_workers); resident_batches shows the model's own ceiling",
    "host": "per-operator overhead: a larger batch spreads it over more samples; compilation removes calls",
}
_COMPUTE = re.compile(r"^aten::(addmm|mm|bmm|baddbmm|_addmm_activation|matmul|linear)$|conv|attention"
                      r"|scaled_dot_product|mkldnn_(linear|matmul)")
_OPTIMIZER = "Optimizer."
_COMPILED = re.compile(r"Compiled|Torch-Compiled Region|CompiledFxGraph")


@dataclass(frozen=True)
class Breakdown:
    """Seconds per step by what they were spent on (``LIMITS``), over ``steps`` profiled steps."""

    seconds: Mapping[str, float]
    step_s: float
    steps: int

    @property
    def largest(self) -> str:
        return max(LIMITS, key=lambda limit: self.seconds[limit])

    def shares(self) -> dict[str, float]:
        return {limit: self.seconds[limit] / self.step_s if self.step_s > 0 else math.nan for limit in LIMITS}

    def figures(self, lower_precision: Optional[str] = None) -> dict[str, Any]:
        """For the trial's result: a share per limit, and the largest with its advice
        (``limiter_line``)."""
        shares = self.shares()
        return {**{f"limit_{limit}_share": share for limit, share in shares.items()},
                "limiter": limiter_line(shares, lower_precision)}


def limiter_line(shares: Mapping[str, float], lower_precision: Optional[str] = None) -> str:
    """"the host's dispatch 62% of the step (...): <advice>" from each limit's share.
    ``lower_precision``: a precision whose math is narrower than the config's and native on
    this hardware, which compute-bound advice names (None: there is none to name: the
    config runs the narrowest already, or the host only emulates narrower math)."""
    ordered = sorted(LIMITS, key=lambda limit: -shares[limit])
    largest = ordered[0]
    rest = ", ".join(f"{NAMES[limit]} {shares[limit]:.0%}" for limit in ordered[1:] if shares[limit] >= 0.005)
    advice = ADVICE[largest]
    if largest == "compute" and lower_precision:
        advice = advice.replace("faster kernels", f"a lower precision ({lower_precision}) or faster kernels")
    return f"{NAMES[largest]} {shares[largest]:.0%} of the step ({rest}): {advice}"


# What the profiler's library (Kineto) writes to stderr at each start and stop, and on a
# machine with no GPU "gpuGetDeviceCount failed": its log's format, whatever its level says.
_KINETO_LINE = re.compile(rb"^(USDT|STAGE|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_quiet() -> Iterator[None]:
    """The profiler's own log lines kept out of the trial's output (a trial's output is its
    run's, and an ERROR line there reads as the trial's); everything else written to
    stderr meanwhile is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught if not _KINETO_LINE.match(line))
            if kept:
                os.write(2, kept)


def dispatch_cost_s(calls: int = 200) -> float:
    """An operator call's fixed cost as the profiler sees it: the mean own time of an add
    of two one-element tensors (no work to speak of), profiled as the window is."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.ones(1), torch.ones(1)
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        for _ in range(calls):
            torch.add(a, b)
    own = [e.self_cpu_time_total for e in profiled.events() if e.name == "aten::add"]
    return (sum(own) / len(own)) / 1e6 if own else 0.0


@contextlib.contextmanager
def data_range() -> Iterator[None]:
    """The range the split counts as waiting for data."""
    import torch

    with torch.profiler.record_function(DATA_RANGE):
        yield


def profile_steps(step: Callable[[], None], sync: Callable[[], None], steps: int = PROFILED_STEPS) -> Breakdown:
    """Run ``steps`` steps under the profiler (synced at both ends) and split their time."""
    from torch.profiler import ProfilerActivity, profile

    with kineto_quiet():
        per_call = dispatch_cost_s()
        sync()
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            started = time.perf_counter()
            for _ in range(steps):
                step()
            sync()
            wall = time.perf_counter() - started
    return split(profiled.events(), wall, steps, per_call)


def split(events, wall_s: float, steps: int, per_call_s: float) -> Breakdown:
    """The profiled ``events`` (torch's FunctionEvents) over ``wall_s`` split by limit."""
    seconds = dict.fromkeys(LIMITS, 0.0)
    covered = 0.0
    # The steps' thread: the one that fetched their batches (the profiler's own thread ids).
    tops = [event for event in events if event.cpu_parent is None]
    main_thread = next((e.thread for e in tops if e.name == DATA_RANGE), tops[0].thread if tops else None)
    for event in tops:
        if event.thread != main_thread:
            continue  # other threads' work overlaps the step's: its own thread's time is the step's
        covered += event.cpu_time_total / 1e6
        if event.name == DATA_RANGE:
            seconds["data"] += event.cpu_time_total / 1e6
        else:
            _walk(event, seconds, per_call_s)
    seconds["host"] += max(0.0, wall_s - covered)  # Python and the framework between operators
    return Breakdown({limit: value / steps for limit, value in seconds.items()}, wall_s / steps, steps)


def _walk(event, seconds: dict[str, float], per_call_s: float, in_optimizer: bool = False) -> None:
    """An operator's own time, less its call's fixed cost (the host's, wherever the call
    is: a small model's optimizer step is hundreds of them), under the optimizer's ranges
    its work is the optimizer's; and its children's."""
    in_optimizer = in_optimizer or event.name.startswith(_OPTIMIZER)
    own = event.self_cpu_time_total / 1e6
    if event.name.startswith("aten::"):
        fixed = min(own, per_call_s)
        seconds["host"] += fixed
        work = "optimizer" if in_optimizer else "compute" if _COMPUTE.search(event.name) else "ops"
        seconds[work] += own - fixed
    elif _COMPILED.search(event.name):  # inductor's fused kernels run in its range, no operator of their own
        seconds["optimizer" if in_optimizer else "ops"] += own
    else:  # a range (autograd's, a module's, the optimizer's Python): its own time is the framework's
        seconds["host"] += own
    for child in event.cpu_children:
        _walk(child, seconds, per_call_s, in_optimizer)
