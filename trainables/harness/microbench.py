"""The kernel microbenchmark harness: one implementation of one op, checked, then timed.

    from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench
    run_microbench(KernelConfig.make(op="giou", impl="torch-naive", batch=64, boxes=256))
    run_microbench(KernelConfig.make(op="my_package.ops:SPEC", impl="mine"))  # any package's op

``op`` is any name ``accelsweep.kernels.registry.get_op`` takes: a built-in op, one
installed under entry point group ``accelsweep.ops``, or ``"package.module:ATTR"``.
The output is checked against the op's numpy float64 reference before anything is timed
(a wrong kernel is a failed trial, never a fast one); then calls are timed to their
device's completion by the platform (trainables/platforms/). ``run_microbench`` says how.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from accelsweep.kernels.registry import KernelUnavailable, get_op
from accelsweep.trainables.errors import ConfigError, non_negative_float, one_of, positive_int, random_seed
from accelsweep.trainables.config import DictConfig
from accelsweep.trainables.trial_progress import phase
from accelsweep.trainables.contention import ContentionMeter
from accelsweep.trainables.timing.windows import Window, coefficient_of_variation, host_probe_s, percentile, time_window
from accelsweep.trainables.metrics import KERNEL_METRICS, MetricSet
from accelsweep.trainables.platforms import PLATFORM_NAMES, Platform, PlatformUnavailable, get_platform
from accelsweep.trainables.roofline import is_integer_dtype, kernel_roofline

# Window-to-window cv above which a figure is flagged noisy: rank differences smaller than
# a few times this are not to be trusted on that machine.
NOISY_CV = 0.05
# What run_microbench reports: trainables/metrics.py KERNEL_METRICS (kernel_metrics).

__all__ = ["NOISY_CV", "KernelConfig", "KernelMismatch", "kernel_metrics", "kernel_trainable", "run_microbench"]


class KernelMismatch(RuntimeError):
    """The implementation's output differs from the reference beyond tolerance."""


@dataclass(frozen=True)
class KernelConfig(DictConfig):
    """One microbenchmark. Flat as a dict (``KernelConfig.make(op="matmul", m=512,
    bm=128, ...)``): the op's shape parameters, its semantic options and the
    implementations' tuning knobs sit beside the fields below and are validated against
    the op's spec."""

    op: str = "giou"  # a built-in op, an installed one, or "package.module:ATTR" (kernels/registry.py)
    impl: str = "torch-naive"
    platform: str = "cpu"
    dtype: str = "float32"
    shape: Optional[Mapping[str, int]] = None  # None: the op's defaults
    options: Optional[Mapping[str, Any]] = None
    tuning: Optional[Mapping[str, Any]] = None
    warmup_calls: int = 3
    window_min_calls: int = 10
    window_min_s: float = 0.3
    windows: int = 3
    seed: int = 0
    cpus_per_worker: int = 1
    workers: int = 1  # a microbenchmark is one process
    # torch's intra-op threads (torch.set_num_threads) in the trial; None: cpus_per_worker,
    # every CPU the trial holds. A torch implementation's knob only: numpy's BLAS and JAX
    # pick their own thread counts, which the harness does not set.
    threads: Optional[int] = None

    @classmethod
    def make(cls, **values: Any) -> "KernelConfig":
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "KernelConfig":
        fields = {f.name for f in dataclasses.fields(cls)} - {"shape", "options", "tuning"}
        spec = get_op(values.get("op", cls.op))
        groups = {"shape": spec.shape, "options": spec.options, "tuning": spec.tuning_knobs()}
        clash = sorted(fields & {name for names in groups.values() for name in names})
        if clash:  # a config is one flat dict: an op's name must not shadow a field of its own
            raise ConfigError(f"shape, option and tuning names of op {spec.name!r}",
                              f"names other than the config's fields ({', '.join(sorted(fields))})", clash)
        direct = {k: v for k, v in values.items() if k in fields}
        split: dict[str, dict] = {group: {} for group in groups}
        for key, value in values.items():
            if key in fields:
                continue
            group = next((g for g, names in groups.items() if key in names), None)
            if group is None:
                allowed = sorted(fields | {k for names in groups.values() for k in names})
                raise ConfigError("config key", f"one of {', '.join(allowed)} for op {spec.name!r}", key)
            split[group][key] = value
        return cls(**direct, **split)

    def to_dict(self) -> dict[str, Any]:
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("shape", "options", "tuning")}
        return {**flat, **self.shape, **self.options, **self.tuning}

    def __post_init__(self) -> None:
        spec = get_op(self.op)
        implementation = spec.impl(self.impl)
        one_of("platform", self.platform, PLATFORM_NAMES)
        if self.platform not in implementation.platforms:
            runs_here = ", ".join(i.name for i in spec.impls_for(self.platform)) or "none"
            raise ConfigError("impl", f"an implementation that runs on {self.platform} ({runs_here})", self.impl,
                              f"{self.impl} runs on {', '.join(implementation.platforms)}.")
        one_of("dtype", self.dtype, implementation.dtypes or spec.dtypes,
               f"(dtypes of {self.impl}; op {self.op} has {', '.join(spec.dtypes)})")
        object.__setattr__(self, "shape", _filled("shape", self.shape, spec.shape, spec.name))
        object.__setattr__(self, "options", _filled("option", self.options, spec.options, spec.name))
        object.__setattr__(self, "tuning", _filled("tuning knob", self.tuning, spec.tuning_knobs(), spec.name))
        for name, value in self.shape.items():
            positive_int(name, value)
        for name, value in self.options.items():
            allowed = spec.option_values.get(name)
            if isinstance(allowed, tuple):
                one_of(name, value, allowed)
            elif callable(allowed):
                allowed(name, value)
            supported = implementation.supports
            if supported is not None and name not in supported and value != spec.options[name]:
                raise ConfigError(name, f"{spec.options[name]!r} for impl {self.impl} (it does not implement "
                                        f"{name}; implementations that do: "
                                        f"{', '.join(_supporting(spec, name))})", value)
        for name, value in self.tuning.items():
            if name not in implementation.tuning and value != spec.tuning_knobs()[name]:
                raise ConfigError(name, f"{spec.tuning_knobs()[name]!r} for impl {self.impl} (a knob of "
                                        f"{', '.join(i.name for i in spec.implementations if name in i.tuning)})",
                                  value)
            if name in implementation.tuning:
                positive_int(name, value)
        if spec.check is not None:
            spec.check(shape=dict(self.shape), options=dict(self.options))
        if implementation.check is not None:
            implementation.check(shape=dict(self.shape), options=dict(self.options), tuning=self.impl_tuning(),
                                 dtype=self.dtype, platform=self.platform)
        positive_int("warmup_calls", self.warmup_calls)
        positive_int("window_min_calls", self.window_min_calls)
        non_negative_float("window_min_s", self.window_min_s)
        positive_int("windows", self.windows)
        random_seed("seed", self.seed)
        positive_int("cpus_per_worker", self.cpus_per_worker)
        if self.workers != 1:
            raise ConfigError("workers", "1 for a kernel microbenchmark", self.workers)
        if self.threads is not None:
            if implementation.framework != "torch":
                torch_impls = ", ".join(i.name for i in spec.implementations if i.framework == "torch") or "none"
                raise ConfigError("threads", f"None for impl {self.impl} (a {implementation.framework} "
                                             f"implementation: the harness sets torch's thread count only; torch "
                                             f"implementations of op {spec.name}: {torch_impls})", self.threads)
            if (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                    or not 1 <= self.threads <= self.cpus_per_worker):
                raise ConfigError("threads", f"an integer from 1 to cpus_per_worker ({self.cpus_per_worker})",
                                  self.threads, "More threads than the CPUs the trial holds would oversubscribe "
                                                "them: raise cpus_per_worker to hold more CPUs.")

    @property
    def torch_threads(self) -> int:
        """The intra-op thread count a torch implementation runs with."""
        return self.cpus_per_worker if self.threads is None else self.threads

    def trial_env(self) -> dict[str, str]:
        """Environment a kernel trial needs before its framework starts: its platform's
        runtime environment (torch-xla's PJRT client on xla and tpu), no knobs."""
        return get_platform(self.platform).runtime_env()

    def impl_tuning(self) -> dict[str, Any]:
        """The tuning knobs this config's implementation takes."""
        return {name: self.tuning[name] for name in get_op(self.op).impl(self.impl).tuning}


def _filled(kind: str, given: Optional[Mapping[str, Any]], defaults: Mapping[str, Any], op: str) -> dict:
    given = dict(given or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(kind, f"one of {', '.join(defaults) or '(none)'} for op {op!r}", unknown[0])
    return {**defaults, **given}


def _supporting(spec, option: str) -> list[str]:
    return [i.name for i in spec.implementations if i.supports is None or option in i.supports] or ["none"]


def _numpy_dtype(dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes  # ships with jax

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _rounded(array, dtype: str):
    """An input as the kernel will see it: floating inputs in the trial's dtype; integer
    inputs (indices, counts) stay integers unless the dtype is an integer one (int8)."""
    import numpy as np

    target = _numpy_dtype(dtype)
    if np.issubdtype(array.dtype, np.integer) and not np.issubdtype(np.dtype(target), np.integer):
        return array
    return array.astype(target)


class _Framework:
    """How one framework's inputs are placed, its outputs read back, and its calls timed.
    Torch asks the platform: its checked device, its sync, its timer, its compile count.
    JAX checks that it runs on the platform's backend and times on the host clock after
    ``block_until_ready``; numpy runs on the host."""

    def __init__(self, framework: str, platform: Platform, threads: int):
        self.name, self.platform = framework, platform
        self.threads = float("nan")  # numpy's BLAS and JAX choose their own: not set here
        if framework == "torch":
            import torch

            torch.set_num_threads(threads)
            self.threads = torch.get_num_threads()  # what ran, for the result
            # A reused trial process must not carry torch.compile state from another shape
            # (it would recompile with dynamic shapes: a different kernel than asked for).
            torch._dynamo.reset()
            try:
                self.device = platform.torch_device()
            except PlatformUnavailable as missing:
                raise KernelUnavailable(str(missing)) from None
            self.label = platform.describe_device(self.device)
        elif framework == "jax":
            import jax

            device = jax.devices()[0]
            if platform.jax_backend is None:
                raise KernelUnavailable(f"platform {platform.name} runs no JAX kernels: nothing timed")
            if device.platform != platform.jax_backend:
                raise KernelUnavailable(f"platform {platform.name} asks for JAX's {platform.jax_backend} backend, "
                                        f"but JAX runs on {device.platform} here ({device}): nothing timed")
            self.label = str(device)
        else:
            self.label = "cpu (numpy)"

    def place(self, array):
        if self.name == "torch":
            import numpy as np
            import torch

            if array.dtype.name == "bfloat16":  # ml_dtypes' (numpy has none; torch takes none)
                tensor = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
            else:
                tensor = torch.from_numpy(array)
            # clone(): torch-allocated (64-byte aligned) memory; numpy's alignment varies run
            # to run, and vectorised CPU kernels run at different speeds on it.
            return tensor.to(self.device).clone()
        if self.name == "jax":
            import jax

            return jax.device_put(array)
        return array

    def wait(self, output):
        if self.name == "jax":
            import jax

            return jax.block_until_ready(output)
        if self.name == "torch":
            self.platform.sync(self.device)  # on XLA: cut the traced graph, launch it, wait for it
        return output

    def timer(self) -> str:
        if self.name == "torch":
            return self.platform.call_timer
        return "host clock after block_until_ready" if self.name == "jax" else "host clock"

    def compiles(self) -> float:
        """Graph compiles so far in this process (NaN where nothing counts them)."""
        return self.platform.compile_count() if self.name == "torch" else float("nan")

    def to_numpy(self, output):
        import numpy as np

        if self.name == "torch":
            import torch

            if output.dtype == torch.bfloat16:
                output = output.float()
            return output.detach().cpu().numpy()
        return np.asarray(output)

    def window(self, call: Callable[[], Any], min_calls: int, min_seconds: float) -> Window:
        if self.name == "torch":
            return self.platform.time_calls(call, self.device, min_calls, min_seconds)
        if self.name == "jax":
            return self.platform.time_jax_calls(call, self.wait, min_calls, min_seconds)
        return time_window(lambda: self.wait(call()), lambda: None, min_calls, min_seconds)


def _checked_error(got, expected, tolerance: float, config: KernelConfig) -> float:
    """The output's max abs difference from the reference; a wrong shape, a NaN the
    reference lacks, or a difference over the dtype's tolerance raises KernelMismatch."""
    import numpy as np

    if np.shape(got) != np.shape(expected):
        raise KernelMismatch(f"{config.impl} output shape {np.shape(got)} != reference {np.shape(expected)}")
    difference = np.abs(np.asarray(got, dtype=np.float64) - expected)
    if np.isnan(difference).any():
        raise KernelMismatch(f"{config.impl} output has NaN where the reference has none: not timed")
    max_abs_error = float(difference.max()) if difference.size else 0.0
    if not max_abs_error <= tolerance:
        raise KernelMismatch(f"{config.impl} differs from the reference by {max_abs_error:.3g} "
                             f"(tolerance {tolerance:g} for {config.dtype}): not timed")
    return max_abs_error


def run_microbench(config: KernelConfig, report: Optional[Callable[[dict], None]] = None) -> dict:
    """Check ``config``'s kernel against the reference, then time it; ``report`` gets the
    figures after each window, and the last are returned.

    Inputs are fresh random arrays (seeded), rounded to the trial's dtype; the reference is
    computed on those same rounded inputs. A wrong kernel raises ``KernelMismatch``. The
    first call, where compilers compile, is timed apart (``compile_s``). Warm-up calls
    (caches) are not timed; then calls are timed to their device's completion by the
    platform: JAX's through ``time_jax_calls`` (``block_until_ready`` after each call; on a
    GPU, batches of async calls and one ``block_until_ready``), torch's through
    ``time_calls``. On a GPU that is the device's time alone: CUDA events around batches of
    calls enqueued while a spin kernel holds the stream (trainables/timing/device.py),
    so a launch-bound kernel's figure is not its host's launch time; the host's enqueue time
    per call is reported beside it (``host_enqueue_s``), with ``launch_bound`` where it is
    the larger, and ``latency_p*`` are percentiles of the batches' means (``batch_calls``
    calls each). On XLA devices (torch-xla: its CPU client, NeuronCores, TPUs) the host
    clock around the call, ``torch_xla.sync()`` and ``wait_device_ops()`` (the op is traced
    and launched every call, as in a model; its graph compiles once, and ``xla_compiles``
    counts any compile during the timed windows); on a CPU the host clock, the call having
    returned done. The platform also gives the device, checked to be its hardware (anything
    else is ``KernelUnavailable``: nothing timed).

    Calls repeat in windows of at least ``window_min_calls`` calls and ``window_min_s``
    seconds. ``latency_cv`` is the window-to-window cv of the window medians. After each
    window a fixed pure-Python loop is timed (``host_probe_s``): its cv (``host_cv``) is the
    machine's own, so a noisy figure says whether the kernel or the machine moved."""
    import numpy as np

    spec = get_op(config.op)
    implementation = spec.impl(config.impl)
    phase(f"loading {config.impl} and its inputs")
    os.environ.update(config.trial_env())  # before the framework initialises its runtime
    kernel = implementation.load()
    framework = _Framework(implementation.framework, get_platform(config.platform), config.torch_threads)
    arrays = [_rounded(a, config.dtype) for a in spec.make_inputs(config.seed, **config.shape)]
    expected = spec.canonical(spec.reference(*[a.astype(np.float64) for a in arrays], **config.options))
    inputs = [framework.place(a) for a in arrays]
    arguments = {**config.options, **config.impl_tuning()}

    def call():
        return kernel(*inputs, **arguments)

    # The first call compiles or traces (torch.compile, jax.jit, Pallas, Triton): timed apart
    # as compile_s, an upper bound that includes one cold run of the kernel.
    phase("first call (compiling or tracing), checked against the reference")
    first_call_start = time.perf_counter()
    first_output = framework.wait(call())
    compile_s = time.perf_counter() - first_call_start
    max_abs_error = _checked_error(spec.canonical(framework.to_numpy(first_output)), expected,
                                   spec.tolerance[config.dtype], config)

    items = spec.items(**config.shape)
    flops = spec.flops(**config.shape, **config.options) if spec.flops else None
    itemsize = np.dtype(_numpy_dtype(config.dtype)).itemsize
    bytes_moved = spec.bytes_moved(**config.shape, **config.options, itemsize=itemsize) if spec.bytes_moved else None
    # Before the warm-up and the windows: on a CPU a peak is measured on the cores the
    # kernel is about to use (once per machine, then cached), so never during a window.
    phase("the roofline: the hardware's peaks (on a CPU measured once per machine, then cached)")
    roofline = kernel_roofline(config, framework.label, flops=flops is not None, bytes_moved=bytes_moved is not None)

    phase(f"warming up ({config.warmup_calls} calls)")
    loop_start = time.perf_counter()
    for _ in range(config.warmup_calls):
        framework.wait(call())
    interpreted = config.platform in implementation.interpreted_on
    compiles_before = framework.compiles()
    calls = 0
    host_probes: list[float] = []
    # Each window, and whether other processes took cores from it (trainables/contention.py):
    # the figures come from the windows that were not contended, while there are any.
    windows: list[tuple[Window, bool]] = []
    meter = ContentionMeter()
    contended = 0
    result: dict = {}
    for index in range(1, config.windows + 1):
        phase(f"window {index} of {config.windows}")
        meter.start()
        window = framework.window(call, config.window_min_calls, config.window_min_s)
        contention = meter.stop()
        host_probes.append(host_probe_s())  # the machine's own speed, right after the window
        is_contended = bool(contention and contention.contended)
        contended += is_contended
        windows.append((window, is_contended))
        trusted = [w for w, was_contended in windows if not was_contended] or [w for w, _ in windows]
        latencies = [seconds for w in trusted for seconds in w.step_seconds]
        enqueues = [seconds for w in trusted for seconds in getattr(w, "enqueue_seconds", [])]
        window_medians = [percentile(w.step_seconds, 50) for w in trusted]
        calls += window.steps
        p50 = percentile(latencies, 50)
        enqueue_p50 = percentile(enqueues, 50)
        result = {
            "latency_p50_s": p50,
            "latency_p10_s": percentile(latencies, 10),
            "latency_p90_s": percentile(latencies, 90),
            # How much the figure moves from window to window: the measurement's own noise.
            "latency_cv": coefficient_of_variation(window_medians),
            # The same for a fixed pure-Python loop timed after each window: when this is high
            # too, the machine's speed moved (shared host), not the kernel's.
            "host_cv": coefficient_of_variation(host_probes),
            "host_probe_s": percentile(host_probes, 50),
            "max_abs_error": max_abs_error,
            "items_per_s": items / p50 if p50 > 0 else float("nan"),
            # TFLOP/s and GB/s at the p50, against the roofs (trainables/roofline.py); NaN where
            # the op declares no count. Its bases (strings) become the run's tags.
            **roofline.fields(flops, bytes_moved, p50),
            "compile_s": compile_s,
            # Beside a device-time figure (held or async batches on a GPU): the host's own
            # time to enqueue a call, and whether it is the bound (the device would wait for
            # the host in a loop of these calls). NaN where the timer waits for every call.
            "host_enqueue_s": enqueue_p50,
            "launch_bound": (float(window.is_launch_bound(enqueue_p50, p50)) if enqueues else float("nan")),
            "batch_calls": getattr(window, "calls_per_batch", 1),
            "calls": calls,
            # Compile, check, warm-up and windows: what the trial spent measuring, as the
            # training loop's loop_s (the driver's overhead_s is the wall time outside it).
            "loop_s": compile_s + time.perf_counter() - loop_start,
            "windows_done": index,
            "interpreted": int(interpreted),
            "device": framework.label + (" (Pallas interpret mode: not a speed figure)" if interpreted else ""),
            "timer": getattr(window, "timer", None) or framework.timer(),
            # Compiles during the timed windows: 0 unless the kernel's graph changes call to call.
            "xla_compiles": framework.compiles() - compiles_before,
            "impl": config.impl,
            **(contention.figures() if contention else {}),
            "window_contended": float(is_contended),
            "contended_windows": contended,
            # torch's intra-op threads as torch reports them; NaN for numpy and JAX (not set).
            "threads": framework.threads,
        }
        if report is not None:
            report(result)
    return result


def kernel_metrics(base: KernelConfig) -> MetricSet:
    """What ``run_microbench`` reports for ``base``'s op: KERNEL_METRICS, without the rows
    of figures the op cannot have (NaN): TFLOP/s without a FLOP count, GB/s without bytes
    moved, the roofline fraction without either, or in an integer dtype (no FLOP peak)."""
    spec = get_op(base.op)
    unknown = {"tflops": not spec.flops, "gbytes_per_s": not spec.bytes_moved,
               "roofline_fraction": not (spec.flops and spec.bytes_moved) or is_integer_dtype(base.dtype)}
    metrics = KERNEL_METRICS
    for name in (name for name, missing in unknown.items() if missing):
        metrics = metrics.replace(name, label=None)
    return metrics


def kernel_trainable(searched: Mapping[str, Any], base: Mapping[str, Any], cost=None) -> None:
    from ray import tune

    run_microbench(KernelConfig.from_dict({**base, **searched}), report=tune.report)


# What it reports, for the sweep driver (Sweep.metrics): it depends on the op.
kernel_trainable.metrics = kernel_metrics
