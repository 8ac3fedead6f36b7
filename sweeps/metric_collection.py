"""Seed 003's metric-collection study as a sweep: what per-step TorchMetrics costs, naive and fixed.

    python sweeps/metric_collection.py                       # local default: CPU, 7 trials, under 10 min
    python sweeps/metric_collection.py --smoke               # tiny images, seconds per trial
    python sweeps/metric_collection.py --dry-run --platform cuda

The seed's hand-run study ("Efficient Metric Collection in PyTorch: Avoiding the Performance
Pitfalls of TorchMetrics"; NVIDIA A40, PyTorch 2.5.1, TorchMetrics 1.6.1; ResNet-18 on random
224x224 images, batch 128; every step it updates a MeanMetric of the loss and multiclass
Accuracy, Precision, Recall and F1 over 1000 classes, and computes and resets them every 100
steps). The seed's step times are in a table that is an image; its text says:

    experiment           what changes                                        the seed's result
    no metrics           the baseline
    naive                avg_loss.update(loss) (default weight 1.0)          "nearly 10%" slower; "eight"
                                                                             cudaStreamSynchronize a step
    explicit weight      update(loss, weight=torch.ones_like(loss))          the weight's copy to the GPU gone
    no NaN check         MeanMetric without its nans.any() check             with the above: step time back to
                                                                             the baseline, no metric syncs left
    step time on GPU     a MeanMetric of the step time on the GPU (for       a sync per step
                         DDP), updated with a Python float
    tensors not floats   update(t := torch.as_tensor(s), torch.ones_like(t))  back to the baseline
    placement            the step-time metric on the CPU, where its values   no copy; under DDP only with
                         are                                                 sync_on_compute=False

Here each row is a value of the workload knob ``metrics_mode`` (a grid, one trial each, the
"none" trial the baseline), with every metric above plus the step-time MeanMetric:

- ``none``: no metrics.
- ``naive``: the seed's calls on TorchMetrics 1.6.1. Its PR (Lightning-AI/torchmetrics#2943)
  made MeanMetric's default weight None and added ``nan_strategy="disable"``; with the
  TorchMetrics installed here, naive passes 1.6.1's default weight 1.0 itself, so the pitfall
  the seed measured is still measured. The step time goes in as a Python float, its metric
  on the training device.
- ``explicit-weights``: the loss's weight is ``torch.ones_like(loss)``.
- ``no-nan-check``: the MeanMetrics have ``nan_strategy="disable"`` (the public option the
  seed's PR added in place of its subclass).
- ``tensor-updates``: the step time goes in as a host tensor with a tensor weight.
- ``host-placement``: the step-time metric lives on the host (``sync_on_compute=False``).
- ``all-fixes``: explicit weights, no NaN check and tensor updates, the step-time metric on
  the training device (the seed's end state, which works under DDP).

At the end the study prints, per trial, its throughput cost against the "none" trial
(the share of that throughput lost) and the would-be syncs per step of its mode
(``count_syncs``, below), and logs both on each trial's MLflow run
(``throughput_cost_vs_baseline``, ``would_be_syncs_per_step``). Counted: naive 7,
explicit-weights 6, no-nan-check 3, tensor-updates 3, host-placement 3, all-fixes 0 (on
the CPU; the counter cannot see a host tensor copied to a device, a no-op here: on CUDA the
step time's host tensor handed to a device metric, in tensor-updates and all-fixes, is such
a copy, not counted). The
classification metrics add none (their ``validate_args`` check runs ``torch.unique`` only on
integer predictions; micro averaging, the default, needs no ``bincount``).

What was verified where: this project's 2-core AMD EPYC VM only. On a CPU nothing waits for a
device, so what the CPU trials measure is the metrics' host work (Python, dispatch, small
kernels: about a millisecond a step here), against a small CNN whose step is short enough
for it to show; what the syncs cost is the GPU's, and the seed's figures are the seed's.
One default run here (2026-11-23, 4 min 11 s, other jobs keeping the load average at 3 to
7): every metrics mode cost +0.6% to +12.4% of the no-metrics throughput (4422 samples/s),
in no order of their syncs: on a CPU the modes differ by microseconds a step, below this
VM's noise. The would-be syncs are counted on the CPU operation by operation
(WouldBeSyncs; tests/test_metric_collection.py); on CUDA
``torch.cuda.set_sync_debug_mode("warn")`` reports the real ones (a gpu-marked test
compares naive with all-fixes that way; not run yet). On a lent H100 (torch 2.11,
2026-11-26; docs/gpu.md) the cuda config (the seed's ResNet-18, 224x224, batch 128) trained
with none (3295 samples/s) and naive (2493: -24.3%, the syncs real there); in a later
call, on another H100, none 2842, naive 2063 (-27.4%) and all fixes 2653 (-6.6%: the
fixes win back 28.6% over naive). On xla/neuron/tpu a host read of a device value executes the pending lazy
graph, the same pitfall: their plans are listed by --dry-run, never run here.
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from accelsweep import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.define.cli import common_parser, main_guard, platform_from_args, sweep_options
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.trainable import train_trainable
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, import_path, knob

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
CPU_TIME_BUDGET_S = 540  # the local default run stays under 10 minutes on 2 cores, however slow the VM
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


class RandomImages(torch.utils.data.Dataset):
    """The seed's FakeDataset (random images, label = index % classes), drawn from a fixed
    pool so that making a batch costs the same little in every trial."""

    def __init__(self, image_size: int, seed: int, pool: int = 64):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(pool, 3, image_size, image_size, generator=generator)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        return self.images[index % len(self.images)], index % NUM_CLASSES


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
        return RandomImages(config.workload_knobs.image_size, seed=config.seed * 1000 + rank)

    def on_step(self, outputs, targets, loss):
        if self.mode == "none":
            return
        if self.metrics is None:
            self.metrics = StepMetrics(self.mode, outputs.device)
        self.metrics.update(outputs, targets, loss)


# As Ray's workers import it: accelsweep.sweeps.metric_collection:MetricCollection.
WORKLOAD = import_path(MetricCollection)


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


def base_config(platform: str, smoke: bool, cpus: int, seed: int) -> TrialConfig:
    """The baseline: no metrics. Elsewhere than on a CPU, the seed's ResNet-18 on 224x224
    images, batch 128; on a CPU a small CNN on 16x16 images, whose steps of a few ms leave
    the metrics' host work (about a millisecond a step) a share that shows through this
    VM's noise, with one intra-op thread (tiny ops gain nothing from a second)."""
    if smoke:
        sizes = dict(network="small-cnn", image_size=16, batch_size=8, warmup_steps=2, window_min_steps=5,
                     window_min_s=0.5, windows=2)
    elif platform == "cpu":
        sizes = dict(network="small-cnn", image_size=16, batch_size=32, warmup_steps=5, window_min_steps=50,
                     window_min_s=10.0, windows=3)
    else:  # the seed's; windows long enough to hold its compute() every 100 steps
        sizes = dict(network="resnet18", image_size=224, batch_size=128, warmup_steps=10, window_min_steps=100,
                     window_min_s=10.0, windows=3, num_workers=4)
    extra = {"threads": 1, "cpus_per_worker": cpus} if platform == "cpu" else {}
    return TrialConfig.make(platform=platform, workload=WORKLOAD, metrics_mode="none",
                            seed=seed, **sizes, **extra)


def report_costs(result, syncs: dict[str, dict[str, float]]) -> str:
    """Each trial's throughput against the no-metrics baseline, and its mode's would-be
    syncs per step; both also logged on the trial's MLflow run."""
    from mlflow.tracking import MlflowClient

    metric = "throughput_samples_per_s"
    baseline = result.baseline.metric(metric) if result.baseline else float("nan")
    client = MlflowClient(result.tracking_uri)
    lines = [f"{'metrics_mode':<18}{'samples/s':>11}{'cost vs none':>14}{'would-be syncs/step':>21}"]
    for record in sorted(result.records, key=lambda r: MODES.index(r.config["metrics_mode"])):
        mode, value = record.config["metrics_mode"], record.metric(metric)
        cost = 1 - value / baseline
        figures = {"throughput_cost_vs_baseline": cost, "would_be_syncs_per_step": syncs[mode]["total"]}
        if record.run_id:
            for name, figure in figures.items():
                if figure == figure:  # not NaN (a failed trial, or no baseline)
                    client.log_metric(record.run_id, name, figure)
        shown = "baseline" if record.is_baseline else f"{cost:+.1%}" if cost == cost else record.status
        lines.append(f"{mode:<18}{value:>11.1f}{shown:>14}{syncs[mode]['total']:>21g}")
    lines.append("cost: the share of the no-metrics trial's throughput lost (negative: faster); syncs: counted "
                 "on this CPU (what would wait for an accelerator)")
    return "\n".join(lines)


# What a would-be sync is on each platform (the dry run says it).
SYNC_MEANS = {
    "cpu": "nothing waits for a device; what the trials measure is the metrics' host work",
    "cuda": "each is a cudaStreamSynchronize (torch.cuda.set_sync_debug_mode('warn') reports them); on an "
            "H100 naive cost 24-27% of the no-metrics throughput, all fixes 7% (docs/gpu.md)",
    "xla": "each read executes the pending lazy graph (a graph cut); a copy is a host-to-device transfer",
    "neuron": "each read executes the pending lazy graph on the NeuronCore (a graph cut); never run here",
    "tpu": "each read executes the pending lazy graph on the TPU (a graph cut); never run here",
}


def main():
    parser = common_parser(__doc__.split("\n\n")[0], len(MODES))
    args = parser.parse_args()
    platform, note = platform_from_args(args)
    cpus = os.cpu_count() or 1
    sweep = Sweep(name="metric_collection", trainable=train_trainable, platform_note=note,
                  base=base_config(platform, args.smoke, cpus, args.seed),
                  space=lambda trial: {"metrics_mode": trial.suggest_categorical("metrics_mode", list(MODES))},
                  objectives=[Objective("throughput_samples_per_s", "max")],
                  # Every mode once, each measured to the end: a grid, no early stopping.
                  **sweep_options(args, default_samples=len(MODES), sampler="grid", scheduler="none",
                                  default_time_budget_s=CPU_TIME_BUDGET_S if platform == "cpu" and not args.smoke
                                  else None))
    syncs = {mode: count_syncs(mode) for mode in MODES}
    if args.dry_run:
        base = sweep.base
        print(plan_sweep(sweep).describe())
        print(f"\nevery trial: {base.workload_knobs.network} on {base.workload_knobs.image_size}x"
              f"{base.workload_knobs.image_size} random images, batch {base.batch_size}, {NUM_CLASSES} classes; "
              f"metrics computed and reset every {COMPUTE_EVERY} steps")
        print("would-be syncs per step (counted on this CPU): "
              + ", ".join(f"{mode} {counts['total']:g}" for mode, counts in syncs.items()))
        print(f"on {platform}: {SYNC_MEANS[platform]}")
        return
    result = run_sweep(sweep)
    print("\nThroughput cost of each way of collecting metrics, against none (seed 003):\n"
          + report_costs(result, syncs))
    return result


if __name__ == "__main__":
    main_guard(main)
