"""The one small Ray actor a sweep's driver starts for its trials.

It holds the sweep's board (its best value so far and its trials' typical host speed,
trainables/loop/rejection.py: ``SweepBoard``) and what each running trial is doing and
printing (trainables/trial_progress.py: ``TrialProgress``). Both are a few numbers and
strings; each Ray actor is a process of its own, about 1.7 s of CPU to start on this
project's 2-core VM (a Ray worker importing Ray), paid by every sweep. So one actor serves
both, under one name that a trial uses for either.
"""

from __future__ import annotations

from typing import Any, Optional

from accelsweep.trainables.loop.rejection import SweepBoard
from accelsweep.trainables.ray_adapter import on_this_node
from accelsweep.trainables.trial_progress import PROGRESS_CONCURRENCY, TrialProgress


class SweepActor(TrialProgress, SweepBoard):
    def __init__(self, mode: Optional[str]):
        TrialProgress.__init__(self)
        SweepBoard.__init__(self, mode)


def start_sweep_actor(name: str, mode: Optional[str]) -> Any:
    """The sweep's actor under ``name``, on this node, holding no CPU. The caller keeps
    the handle for the sweep's duration: Ray ends a named actor with its last handle."""
    import ray

    return ray.remote(num_cpus=0)(SweepActor).options(name=name, max_concurrency=PROGRESS_CONCURRENCY,
                                                      **on_this_node()).remote(mode)
