"""Seed 003's metric-collection workload: a 1000-class image classifier on random images
that collects the seed's per-step TorchMetrics the way knob ``metrics_mode`` says.

``none`` collects nothing; ``naive`` makes the seed's calls on TorchMetrics 1.6.1 (the loss's
weight a Python 1.0, the step time a Python float, every metric on the training device);
``explicit-weights`` gives the loss's weight as ``torch.ones_like(loss)``; ``no-nan-check``
builds the MeanMetrics with ``nan_strategy="disable"``; ``tensor-updates`` passes the step
time as a host tensor with a tensor weight; ``host-placement`` keeps the step-time metric on
the host (``sync_on_compute=False``); ``all-fixes`` combines weights, no NaN check and tensor
updates (the seed's end state, which works under DDP). ``count_syncs`` counts each mode's
would-be syncs a step on a CPU (``WouldBeSyncs``): reads of device values, ops sized by them,
and host-to-device copies.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob
from accelsweep.trainables.workloads.random_images import RandomImageDataset

NUM_CLASSES = 1000  # the seed's (ImageNet-sized) classification head and metrics
COMPUTE_EVERY = 100  # steps between compute() + reset(), as in the seed
# metrics_mode -> the seed's fixes it applies (None: no metrics at all).
FIXES = {
    "none": None,
    "naive": frozenset(),
    "explicit-weights": frozenset({"weights"}),
    "no-nan-check": frozenset({"no_nan_check"}),
    "tensor-updates": frozenset({"tensors"}),
    "host-placement": frozenset({"host"}),
    "all-fixes": frozenset({"weights", "no_nan_check", "tensors"}),
}
MODES = tuple(FIXES)
OLD_DEFAULT_WEIGHT = 1.0  # MeanMetric.update's default weight in TorchMetrics 1.6 (the seed's)
INSTALL_HINT = "pip install torchmetrics (or this project's dev extra: pip install -e '.[dev]')"


class StepMetrics:
    """The seed's metrics for one trial, updated every step the way ``mode`` says.
    ``on_device``: the metrics on the training device; ``on_host``: those on the host."""

    def __init__(self, mode: str, device: torch.device, num_classes: int = NUM_CLASSES):
        try:
            from torchmetrics import Accuracy, F1Score, MeanMetric, Precision, Recall
        except ImportError:
            raise ConfigError("torchmetrics", f"installed ({INSTALL_HINT})", "not importable") from None
        self.fixes = FIXES[mode]
        nan_strategy = "disable" if "no_nan_check" in self.fixes else "warn"  # "warn": MeanMetric's default
        classes = dict(task="multiclass", num_classes=num_classes)
        self.on_device = {"avg_loss": MeanMetric(nan_strategy=nan_strategy), "accuracy": Accuracy(**classes),
                          "precision": Precision(**classes), "recall": Recall(**classes),
                          "f1_score": F1Score(**classes)}
        self.on_host = {}
        if "host" in self.fixes:  # its values are the host's; under DDP it must not sync on compute
            self.on_host["avg_step_time"] = MeanMetric(nan_strategy=nan_strategy, sync_on_compute=False)
        else:
            self.on_device["avg_step_time"] = MeanMetric(nan_strategy=nan_strategy)
        self.on_device = {name: metric.to(device) for name, metric in self.on_device.items()}
        self.steps, self.last_time, self.values = 0, None, {}

    def update(self, outputs: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor) -> None:
        metrics = {**self.on_device, **self.on_host}
        weight = torch.ones_like(loss) if "weights" in self.fixes else OLD_DEFAULT_WEIGHT
        metrics["avg_loss"].update(loss, weight=weight)
        for name in ("accuracy", "precision", "recall", "f1_score"):
            metrics[name].update(outputs, targets)
        now = time.perf_counter()
        if self.last_time is not None:  # the time since the last step's metrics: a host value
            if "tensors" in self.fixes:
                seconds = torch.as_tensor(now - self.last_time)
                metrics["avg_step_time"].update(seconds, torch.ones_like(seconds))
            else:
                metrics["avg_step_time"].update(now - self.last_time, weight=OLD_DEFAULT_WEIGHT)
        self.last_time = now
        self.steps += 1
        if self.steps % COMPUTE_EVERY == 0:
            self.values = {name: metric.compute().item() for name, metric in metrics.items()}
            for metric in metrics.values():
                metric.reset()


class MetricCollection(Workload):
    """A 1000-class image classifier (the seed's ResNet-18, or a small CNN) on random
    images, with seed 003's per-step metrics collected the way ``metrics_mode`` says."""

    imports = ("torchvision", "torchmetrics")

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        metrics_mode: str = knob("none", choices=MODES)
        # The seed's ResNet-18, or a two-conv CNN with the same 1000-class head whose step
        # is short enough on a CPU for the metrics' share of it to show.
        network: str = knob("resnet18", choices=("resnet18", "small-cnn"))
        image_size: int = knob(224, choices=(16, 32, 64, 128, 224))

    def build_model(self, config):
        import torchvision
        from torch import nn

        # Once per trial: its metrics are made on the device of its first step's outputs.
        self.mode, self.metrics = config.workload_knobs.metrics_mode, None
        if config.workload_knobs.network == "resnet18":
            return torchvision.models.resnet18(num_classes=NUM_CLASSES)
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(32, NUM_CLASSES))

    def dataset(self, config, rank, world_size):
        # A pool of images drawn once: a batch costs the same little in every trial.
        return RandomImageDataset(config.workload_knobs.image_size, NUM_CLASSES, seed=config.seed * 1000 + rank,
                                  learnable=False, pool=64)

    def on_step(self, outputs, targets, loss):
        if self.mode == "none":
            return
        if self.metrics is None:
            self.metrics = StepMetrics(self.mode, outputs.device)
        self.metrics.update(outputs, targets, loss)


class WouldBeSyncs(TorchDispatchMode):
    """Counts, on any device (a CPU included, where nothing waits), the operations that would
    make the host wait for an accelerator: reads of a device tensor's value (item, bool,
    float, tolist, cpu), operations whose result size depends on device values (unique,
    nonzero, bincount, boolean masks), and tensors made from host data (Python numbers)
    inside a device-placed metric's update, a host-to-device copy. Device tensors are the
    ones ``on_device`` marks (a step's outputs, targets, loss; the metrics' states), what is
    computed from them, and what device-placed metrics make. On CUDA,
    ``torch.cuda.set_sync_debug_mode("warn")`` reports the real ones."""

    READS = {"aten::_local_scalar_dense": "read"}
    SIZED_BY_VALUES = {name: "data-dependent" for name in (
        "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::nonzero", "aten::masked_select",
        "aten::bincount")}

    def __init__(self):
        super().__init__()
        self.device = WeakTensorKeyDictionary()
        self.counts: collections.Counter = collections.Counter()
        self.depth = 0  # > 0 inside a device-placed metric's update

    def on_device(self, *tensors) -> None:
        for tensor in tensors:
            self.device[tensor] = True

    def counting_updates(self, metric) -> None:
        """Count what ``metric`` (placed on the device) makes from host data as copies."""
        update = metric.update

        def counted(*args, **kwargs):
            self.depth += 1
            try:
                return update(*args, **kwargs)
            finally:
                self.depth -= 1

        metric.update = counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(_tensors((args, kwargs)))
        name = func._schema.name
        if name == "aten::lift_fresh":  # torch.tensor / torch.as_tensor of Python data
            on_device = self.depth > 0
            if on_device:
                self.counts["host-to-device"] += 1
        else:
            on_device = any(t in self.device for t in inputs) or (not inputs and self.depth > 0)
            kind = self.READS.get(name) or self.SIZED_BY_VALUES.get(name)
            if name == "aten::index" and any(t.dtype == torch.bool for t in inputs[1:]):
                kind = "data-dependent"
            if on_device and kind:
                self.counts[kind] += 1
        out = func(*args, **kwargs)
        if on_device:
            self.on_device(*_tensors(out))
        return out

    def __enter__(self):
        # tolist() and cpu() of a tensor already on the CPU reach no operator: count them here.
        self._methods = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu")}
        for name, method in self._methods.items():
            setattr(torch.Tensor, name, self._read_by(method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._methods.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _read_by(self, method):
        def read(tensor, *args, **kwargs):
            if tensor in self.device:
                self.counts["read"] += 1
            return method(tensor, *args, **kwargs)

        return read


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def count_syncs(mode: str, steps: int = 3, batch: int = 8, device: str = "cpu") -> dict[str, float]:
    """Would-be syncs per metric update step of ``mode`` (steps that do not compute), by
    kind, and their ``total``: a few steps of random outputs through StepMetrics."""
    if FIXES[mode] is None:
        return {"total": 0.0}
    torch.manual_seed(0)
    metrics = StepMetrics(mode, torch.device(device))
    counter = WouldBeSyncs()
    for metric in metrics.on_device.values():
        counter.counting_updates(metric)

    def batch_step():
        outputs = torch.randn(batch, NUM_CLASSES, device=device)
        targets = torch.randint(NUM_CLASSES, (batch,), device=device)
        loss = torch.nn.functional.cross_entropy(outputs, targets)
        counter.on_device(outputs, targets, loss)
        for metric in metrics.on_device.values():
            counter.on_device(*_tensors(list(metric.metric_state.values())))
        metrics.update(outputs, targets, loss)

    with counter:
        batch_step()  # the first step has no step time yet
        counter.counts.clear()
        for _ in range(steps):
            batch_step()
    per_step = {kind: count / steps for kind, count in counter.counts.items()}
    return {**per_step, "total": sum(per_step.values())}
