"""A workload's model FLOPs per item, counted once per workload and shape.

The count is what MFU means by model FLOPs: the matmuls, convolutions and attention of
one forward and one backward pass (torch.utils.flop_counter.FlopCounterMode's ops;
elementwise work, normalisation and the optimizer's step are not counted), the same
whatever the precision, compiler or platform, so that every trial of a sweep is held to
one number. It is counted on the meta device (shapes only: no memory, no time) from a
batch of COUNTED_ITEMS items of the workload's own data; a model that cannot be built on
the meta device is counted for real on the CPU. A workload may instead declare its own
(``Workload.flops_per_item``), e.g. the 6 x parameters x tokens rule of a language model.

Counts are cached per process and on disk ($XDG_CACHE_HOME/accelsweep/flops.json), keyed
by the workload and its knobs (which set the model and an item's shape).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from accelsweep.trainables.batches import map_tensors
from accelsweep.trainables.peaks import cache_file, locked_json_cache

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.workloads.base import Workload

__all__ = ["FlopCount", "count_model_flops", "flops_of_step"]

COUNTED_ITEMS = 2  # not 1: a BatchNorm in training refuses a batch of one
METHOD_META = ("torch.utils.flop_counter over one forward and backward pass of {n} items on the meta device "
               "(matmuls, convolutions, attention; elementwise ops and the optimizer not counted)")
METHOD_CPU = METHOD_META.replace("on the meta device", "on the CPU (the model could not be built on the meta device)")

_COUNTED: dict[str, "FlopCount"] = {}


@dataclass(frozen=True)
class FlopCount:
    per_item: float  # forward + backward FLOPs of one dataset item
    method: str
    cached: bool = False

    def fields(self) -> dict:
        return {"model_flops_per_item": self.per_item, "flops_method": self.method}


def flops_of_step(model: Any, inputs: Any, targets: Any, loss) -> float:
    """FLOPs of ``loss(model(inputs), targets).backward()``, by torch's counter."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss(model(inputs), targets).backward()
    return float(counter.get_total_flops())


def _sample_batch(workload: "Workload", config: "TrialConfig", items: int):
    from torch.utils.data import default_collate

    dataset = workload.dataset(config, rank=0, world_size=1)
    collate = workload.collate_fn(config) or default_collate
    return collate([dataset[i] for i in range(items)])


def _on(device: str, value: Any) -> Any:
    return map_tensors(lambda t: t.to("meta") if device == "meta" else t, value)


def _key(config: "TrialConfig") -> str:
    """The workload and its knobs: what sets the model and an item's shape (image size,
    sequence length, ...); FLOPs per item do not depend on the batch size."""
    identity = json.dumps([config.workload, str(config.workload_knobs)], default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def count_model_flops(workload: "Workload", config: "TrialConfig", cache: Optional[str] = None) -> FlopCount:
    """The model FLOPs of one item of ``config``'s workload (see the module's docstring)."""
    declared = workload.flops_per_item(config)
    if declared is not None:
        return FlopCount(float(declared), f"declared by the workload ({type(workload).__name__}.flops_per_item)")
    import torch

    key = _key(config)
    if key in _COUNTED:
        return _COUNTED[key]
    path = cache or cache_file("flops.json")
    with locked_json_cache(path) as entries:
        if key in entries:
            found = FlopCount(entries[key]["per_item"], entries[key]["method"], cached=True)
        else:
            found = None
            # Only now the data: a dataset may be costly to build (a class template per image class).
            inputs, targets = _sample_batch(workload, config, COUNTED_ITEMS)
            items = len(targets) if hasattr(targets, "__len__") else COUNTED_ITEMS
            failures = []
            for device, method in (("meta", METHOD_META), ("cpu", METHOD_CPU)):
                try:
                    with torch.device(device):
                        model = workload.build_model(config)
                    model.train()
                    total = flops_of_step(model, _on(device, inputs), _on(device, targets), workload.loss)
                except Exception as error:  # noqa: BLE001 - the next way, then the reasons said
                    failures.append(f"on {device}: {type(error).__name__}: {error}")
                    continue
                found = FlopCount(total / items, method.format(n=items))
                break
            if found is None:
                return FlopCount(math.nan, "not counted: " + "; ".join(failures))
            entries[key] = {"per_item": found.per_item, "method": found.method}
    _COUNTED[key] = found
    return found
