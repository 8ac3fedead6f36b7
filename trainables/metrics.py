"""What each trainable reports, declared once: name, unit, which way is better, and how
the sweep shows it.

    from accelsweep.trainables.metrics import TRAINING_METRICS
    Sweep(..., trainable=train_trainable, metrics=TRAINING_METRICS)

The sweep driver reads a trainable's ``MetricSet`` and nothing else: an objective must
name one of its metrics (and go its better way), the summary table has a row per
summarised metric, the per-window curves in MLflow are its ``curve`` metrics, and a
trial's progress line shows its headline figures. Adding a metric is one ``Metric``
here, plus the line in the trainable's result dict that reports it.

A leaf: it imports nothing of accelsweep but the errors module, so the driver reads the
declarations without importing torch or a trainable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

from accelsweep.trainables.errors import ConfigError, one_of

__all__ = ["CONTENTION_METRICS", "DRIVER_METRICS", "KERNEL_METRICS", "Metric", "MetricSet", "TRAINING_METRICS",
           "training_metrics"]

BETTER = ("max", "min", None)  # None: context, not a figure to optimise (the machine's own noise)


@dataclass(frozen=True)
class Metric:
    name: str  # flat, with its unit: throughput_samples_per_s, step_time_p50_s
    unit: str  # "" for a ratio or a loss
    better: Optional[str] = None  # "max", "min", or None: an objective on it must go this way
    label: Optional[str] = None  # its row in the summary table; None: not summarised
    fmt: str = "{:.4g}"  # the summary table's format of its value
    curve: bool = False  # logged after every window (an MLflow curve), not only at the trial's end
    # Its part of a trial's progress line (when the set names it a headline): a format of
    # the value times progress_scale; progress_if_known leaves it out while it is unknown
    # (NaN: no price basis).
    progress: Optional[str] = None
    progress_scale: float = 1.0
    progress_if_known: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("metric name", "a non-empty string", self.name)
        one_of(f"better for metric {self.name}", self.better, BETTER)

    def shown(self, value: float) -> str:
        """Its figure on a progress line."""
        return self.progress.format(value * self.progress_scale)


@dataclass(frozen=True)
class MetricSet:
    """One trainable's metrics. ``headline``: the progress line's figures, in order; the
    first leads it (the sweep ranks by its objectives, not by the headline)."""

    metrics: tuple[Metric, ...]
    headline: tuple[str, ...]

    def __post_init__(self) -> None:
        names = [m.name for m in self.metrics]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError("metric names", "unique within a set", repeated)
        if not self.headline:
            raise ConfigError("headline", "at least one metric of the set", self.headline)
        for name in self.headline:
            one_of("headline metric", name, tuple(names))
            if self[name].progress is None:
                raise ConfigError(f"progress of headline metric {name}", "a format for the progress line", None)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self.metrics)

    def __getitem__(self, name: str) -> Metric:
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise ConfigError("metric", "one of " + ", ".join(self.names), name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics)

    @property
    def measurement(self) -> str:
        return self.headline[0]

    @property
    def summarised(self) -> tuple[Metric, ...]:
        return tuple(m for m in self.metrics if m.label is not None)

    @property
    def curves(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics if m.curve)

    def per_window(self, name: str) -> Optional[str]:
        """The metric giving each window's own figure of ``name`` (which is over all the
        trial's windows so far): ``window_<name>`` where the set declares it as a curve,
        else None. A confirmation in turns compares configs window by window on it."""
        windowed = f"window_{name}"
        return windowed if windowed in self.curves else None

    def replace(self, name: str, **changes) -> "MetricSet":
        """This set with one metric changed, e.g. its label, or ``label=None`` to leave it
        out of the summary (a sweep's variant of its trainable's set)."""
        changed = dataclasses.replace(self[name], **changes)
        return dataclasses.replace(self, metrics=tuple(changed if m.name == name else m for m in self.metrics))

    def check_objective(self, metric: str, mode: str) -> None:
        """An objective must name a declared metric and go its better way."""
        one_of("objective metric", metric, self.names, "Those are what the sweep's trainable declares (Sweep.metrics).")
        better = self[metric].better
        if better is not None and mode != better:
            raise ConfigError(f"objective mode for {metric}", repr(better), mode,
                              f"{'Higher' if better == 'max' else 'Lower'} {metric} is better.")


# Measured by the sweep driver for every trial (sweeps/driver/run/callbacks.py), not by the
# trainable: wall time outside the measured loop, and what the trial's resources cost.
DRIVER_METRICS = (
    Metric("trial_cost_usd", "USD", "min", label="trial cost ($)", fmt="{:.5f}"),
    Metric("overhead_s", "s", "min", progress="overhead {:.2f} s"),
)

# Around every window of every trial (trainables/contention.py): the training loop and
# the kernel harness measure their own windows; for any other trainable, the trial's
# wrapper takes the time between its reports as its windows. Every sweep logs them.
CONTENTION_METRICS = (
    # Cores other processes (and a VM's steal) kept busy during the window, and the part
    # of it beyond the cores the trial left free: more than CONTENDED_CPUS, contended.
    Metric("other_cpus", "cores", curve=True),
    Metric("contention_cpus", "cores", curve=True),
    Metric("window_contended", ""),  # 1: this window was contended (early stopping skips it)
    Metric("contended_windows", "windows"),
)

# trainables/loop/train_loop.py: run_training's result, after each window.
TRAINING_METRICS = MetricSet(
    metrics=(
        # Over all the trial's measured windows; each window's own is the curve beside it.
        Metric("throughput_samples_per_s", "samples/s", "max", label="throughput (samples/s)", fmt="{:.2f}",
               progress="{:.1f} samples/s"),
        Metric("window_throughput_samples_per_s", "samples/s", "max", curve=True),
        Metric("step_time_p50_s", "s", "min", label="step time p50 (s)", fmt="{:.4f}", progress="p50 step {:.4f} s"),
        Metric("step_time_p90_s", "s", "min", label="step time p90 (s)", fmt="{:.4f}"),
        Metric("first_step_s", "s", "min", label="first step (s)", fmt="{:.3f}"),
        Metric("compile_s", "s", "min", label="compile (s)", fmt="{:.2f}"),
        Metric("peak_memory_mb", "MB", "min", label="peak memory (MB)", fmt="{:.0f}"),
        # What that peak is measured against (host RAM on a CPU, the GPU's memory): how far a
        # larger batch may go when the search steps past its space's edge
        # (sweeps/driver/define/edges.py).
        Metric("memory_capacity_mb", "MB"),
        # The peak over what the process held before the workload was built (model,
        # optimizer state, activations, batches): on a CPU, peak RSS is mostly torch and Ray.
        Metric("workload_memory_mb", "MB", "min", label="workload memory (MB)", fmt="{:.0f}"),
        # The compile cache (trainables/compile_cache.py): per trial, graphs loaded from it
        # (hits), compiled and stored (misses), or not cacheable (bypasses); where it is, a tag.
        Metric("fxgraph_cache_hits", "graphs"),
        Metric("fxgraph_cache_misses", "graphs"),
        Metric("fxgraph_cache_bypasses", "graphs"),
        Metric("aotautograd_cache_hits", "graphs"),
        Metric("aotautograd_cache_misses", "graphs"),
        Metric("aotautograd_cache_bypasses", "graphs"),
        Metric("xla_cache_hits", "graphs"),  # torch-xla's persistent cache (PersistentCacheHit)
        Metric("final_loss", "", "min", label="final loss", fmt="{:.4f}", curve=True),
        Metric("usd_per_1m_samples", "USD", "min", label="$ per 1M samples", fmt="{:.4f}",
               progress="${:.4g}/1M samples", progress_if_known=True),
        # How far from the hardware's limit (trainables/utilisation.py): model FLOPs per item
        # times throughput, and its fraction of the peak of what the trial holds for its
        # precision (on a CPU measured here; elsewhere the datasheet's), and of the CPU's
        # theoretical one.
        Metric("model_tflops", "TFLOP/s", "max", label="model TFLOP/s", fmt="{:.4g}"),
        # On a CPU, the host's speed at the trial's math between its windows (a matmul in its
        # compute dtype; speed_probe_kind): the confirmation's candidates are ranked by
        # throughput over it, so a figure from a fast moment of the host is not a fast config.
        Metric("speed_probe_gflops", "GFLOP/s"),
        # On a CPU, the threading the trial ran with (trainables/platforms/cpu_threads.py):
        # its intra-op threads (one fewer per core another process kept busy as it started),
        # those asked, what the others took then, in cores, and its niceness.
        Metric("intra_op_threads", "threads"),
        # What limits the config (trainables/timing/limiter.py): the share of a profiled
        # step's time after the last window in compute kernels, other operators, the
        # optimizer, waiting for data and the host's dispatch (the largest, with its knob:
        # the ``limiter`` tag).
        Metric("limit_compute_share", ""),
        Metric("limit_ops_share", ""),
        Metric("limit_optimizer_share", ""),
        Metric("limit_data_share", ""),
        Metric("limit_host_share", ""),
        Metric("limit_profile_s", "s"),  # the profiled steps' seconds (not in a turn's trial)
        Metric("threads_asked", "threads"),
        Metric("other_cpus_at_start", "cores"),
        Metric("niceness", ""),
        Metric("mfu", "", "max", label="utilisation (MFU)", fmt="{:.1%}", progress="{:.1f}% of peak",
               progress_scale=100.0, progress_if_known=True),
        Metric("mfu_theoretical", "", "max"),
        Metric("model_flops_per_item", "FLOP"),
        Metric("peak_tflops", "TFLOP/s"),
        Metric("peak_tflops_theoretical", "TFLOP/s"),
        *CONTENTION_METRICS,
        *DRIVER_METRICS,
    ),
    headline=("throughput_samples_per_s", "usd_per_1m_samples", "mfu", "step_time_p50_s", "overhead_s"),
)



def training_metrics(unit: str = "samples") -> MetricSet:
    """What the training loop reports for a workload counting ``unit``
    (trainables/workloads/base.py): TRAINING_METRICS, plus throughput and $ per 1M in that
    unit when it is not samples (tokens/s leads the progress line of a language model)."""
    if unit == "samples":
        return TRAINING_METRICS
    own = (Metric(f"throughput_{unit}_per_s", f"{unit}/s", "max", label=f"throughput ({unit}/s)", fmt="{:.2f}",
                  progress=f"{{:.1f}} {unit}/s"),
           Metric(f"window_throughput_{unit}_per_s", f"{unit}/s", "max", curve=True),
           Metric(f"usd_per_1m_{unit}", "USD", "min", label=f"$ per 1M {unit}", fmt="{:.4f}",
                  progress=f"${{:.4g}}/1M {unit}", progress_if_known=True))
    return MetricSet(metrics=own + TRAINING_METRICS.metrics,
                     headline=(own[0].name, own[2].name, "mfu", "step_time_p50_s", "overhead_s"))


# trainables/harness/microbench.py: run_microbench's result, after each window. A kernel sweep is
# not priced, so the driver's figures are not among them.
KERNEL_METRICS = MetricSet(
    metrics=(
        Metric("latency_p50_s", "s", "min", label="latency p50 (s)", fmt="{:.3e}", progress="p50 {:.4f} ms",
               progress_scale=1e3),
        Metric("latency_p10_s", "s", "min", label="latency p10 (s)", fmt="{:.3e}"),
        Metric("latency_p90_s", "s", "min", label="latency p90 (s)", fmt="{:.3e}"),
        # Window-to-window cv of the window medians (noisy above microbench.NOISY_CV).
        Metric("latency_cv", "", "min", label="window-to-window cv", fmt="{:.2%}", progress="cv {:.1%}"),
        Metric("items_per_s", "items/s", "max", label="items/s", fmt="{:.4g}"),
        Metric("max_abs_error", "", "min", label="max abs error", fmt="{:.2e}", progress="max error {:.2g}"),
        Metric("tflops", "TFLOP/s", "max", label="TFLOP/s", fmt="{:.4g}"),  # NaN for an op without a FLOP count
        # Against the roofline (trainables/roofline.py): NaN where the op declares no FLOP
        # count or bytes moved, or a peak is unknown (int8: no FLOP peak). The peaks' bases
        # are tags (peak_basis, bandwidth_basis): measured here, or the datasheet's.
        Metric("gbytes_per_s", "GB/s", "max", label="GB/s", fmt="{:.4g}"),
        Metric("arithmetic_intensity", "FLOP/byte"),
        Metric("roofline_fraction", "", "max", label="of its roofline bound", fmt="{:.1%}"),
        Metric("roofline_tflops", "TFLOP/s"),
        Metric("compute_fraction", "", "max"),
        Metric("bandwidth_fraction", "", "max"),
        Metric("peak_tflops", "TFLOP/s"),
        Metric("peak_gbytes_per_s", "GB/s"),
        Metric("compile_s", "s", "min"),
        # The machine's own speed between windows: says whether a noisy figure is the kernel's.
        Metric("host_cv", ""),
        Metric("host_probe_s", "s"),
        # On a GPU, beside the device's time: the host's enqueue time per call, and 1 where
        # it is the larger (launch-bound); NaN where the timer waits for each call.
        Metric("host_enqueue_s", "s"),
        Metric("launch_bound", ""),
        # torch's intra-op threads the trial ran with (KernelConfig.threads); NaN for numpy, JAX.
        Metric("threads", "threads"),
        *CONTENTION_METRICS,
    ),
    headline=("latency_p50_s", "latency_cv", "max_abs_error"),
)
