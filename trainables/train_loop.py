"""The training loop: one config in, one result dict per measured window out.

    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.train_loop import run_training
    result = run_training(TrialConfig(model="vit-micro", windows=2))

Measurement follows the seeds' hand-run loops, minus their mistakes: the first step
(compilation, first-touch allocation) is timed on its own; the remaining warm-up steps
are not timed at all; steady state is measured in time-bounded windows with one device
sync at each boundary and no per-step host reads of device values. Each window ends in
a report, so a Tune scheduler can stop a hopeless trial after its first window.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Optional

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import usd_per_1m_samples
from accelsweep.trainables.failures import NonFiniteGradient, NonFiniteLoss  # noqa: F401 (part of the loop's API)
from accelsweep.trainables.measure import WindowStats, time_window
from accelsweep.trainables.models import MODEL_PRESETS, build_model
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.precision import get_precision

# The result names every trainable, tracker and user script relies on.
METRIC_NAMES = (
    "throughput_samples_per_s", "step_time_p50_s", "step_time_p90_s", "first_step_s",
    "compile_s", "peak_memory_mb", "final_loss", "usd_per_1m_samples", "trial_cost_usd",
    "overhead_s",
)
DRIVER_METRICS = ("trial_cost_usd", "overhead_s")  # the sweep driver's, not the loop's (sweeps/driver/callbacks.py)

# torch.compile's own timers (torch._dynamo.utils.compilation_time_metrics): the
# forward graph compile and the backward graph compile, which runs on first backward.
_DYNAMO_COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def _dynamo_compile_seconds() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(name, ())) for name in _DYNAMO_COMPILE_TIMERS)


def run_training(config: TrialConfig, report: Optional[Callable[[dict], None]] = None,
                 usd_per_hour: float = float("nan"), capture_dir: Optional[str] = None) -> dict:
    """Train ``config`` for its warm-up and windows; call ``report`` after each window
    with the cumulative result, and return the last one. ``usd_per_hour`` is what the
    resources this trial holds cost (NaN: no price basis, so no cost metrics).
    ``capture_dir``: where ``nan_capture`` saves its file (default: the Tune trial's
    directory inside a Tune trial, else the working directory)."""
    since = time.time()
    try:
        return _run_training(config, report, usd_per_hour, capture_dir)
    except Exception as error:
        # The platform may know better words for its own failures (neuronx-cc's log).
        explained = get_platform(config.platform).explain_failure(error, config, since)
        if explained is None:
            raise
        raise explained from error


def _run_training(config: TrialConfig, report: Optional[Callable[[dict], None]],
                  usd_per_hour: float, capture_dir: Optional[str]) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from accelsweep.trainables.data import RandomImageDataset
    from accelsweep.trainables.distributed import World

    started = time.perf_counter()
    platform = get_platform(config.platform)
    device = platform.prepare(config)
    preset = MODEL_PRESETS[config.model]
    world = World.current()

    torch.manual_seed(config.seed)
    if config.torch_compile != "none":
        torch._dynamo.reset()  # a reused trial process must not reuse the last trial's graphs
    precision = get_precision(config.precision)
    memory_format = platform.memory_format(config)
    model = build_model(config.model, config.patch_embed).to(device=device, memory_format=memory_format)
    model = model.to(precision.parameter_dtype)
    input_dtype = precision.input_dtype
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    loss_function = torch.nn.CrossEntropyLoss()
    trained = platform.distribute(model, device) if world.size > 1 else model
    forward = platform.compile(trained, config)

    dataset = RandomImageDataset(preset.image_size, preset.num_classes, seed=config.seed,
                                 rank=world.rank, world_size=world.size)
    loader = DataLoader(dataset, batch_size=config.batch_size, num_workers=config.num_workers,
                        drop_last=True, persistent_workers=False)
    batches = iter(platform.device_batches(loader, device, config))
    last_loss = []  # device tensor of the latest step's loss; read only after a sync
    result: dict = {}  # the cumulative result of the windows done so far
    nan_capture = None  # a NanCapture when config.nan_capture (set below, before any step)

    def train_step(inputs, targets) -> None:
        inputs = inputs.to(dtype=input_dtype, memory_format=memory_format)
        if nan_capture is not None:
            nan_capture.before_step(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        with platform.autocast(config):
            loss = loss_function(forward(inputs), targets)
        loss.backward()
        if nan_capture is not None:
            # Before the optimizer step: the weights are still the ones this step started from.
            nan_capture.after_backward(loss)
        platform.optimizer_step(optimizer)
        last_loss[:] = [loss.detach()]

    def step() -> None:
        train_step(*next(batches))

    def sync() -> None:
        platform.sync(device)

    # Every run of steps below ends in a sync; with nan_capture on an asynchronous device,
    # that is where the capture reads its flag (NanCapture.segment). Else: nothing.
    segment = contextlib.nullcontext
    if config.nan_capture:
        from accelsweep.trainables.nan_capture import NanCapture

        def report_capture(fields: dict) -> None:
            # The driver logs the capture file with the trial's run when a result names it,
            # so this report comes before the trial ends: what the windows done so far
            # measured (NaN before the first one), the unfinished window's throughput as
            # unknown, and where the capture is.
            if report is not None:
                measured = result or {name: float("nan") for name in METRIC_NAMES if name not in DRIVER_METRICS}
                report({**measured, "window_throughput_samples_per_s": float("nan"),
                        "windows_done": measured.get("windows_done", 0), **fields})

        nan_capture = NanCapture(model, optimizer, device, platform, config, train_step, report_capture,
                                 capture_dir)
        segment = nan_capture.segment

    platform.reset_peak_memory(device)
    compile_start = _dynamo_compile_seconds() if config.torch_compile != "none" else 0.0
    counters_start = platform.compile_stats()
    setup_s = time.perf_counter() - started

    loop_start = time.perf_counter()
    with segment():
        step()
        sync()
    first_step_s = time.perf_counter() - loop_start
    initial_loss = float(last_loss[0])
    group = platform.steps_per_execution(config)  # steps per XLA execution (1 elsewhere)
    warmup_rest = config.warmup_steps - 1
    if group > 1:  # whole groups, at least one, so the k-step graph compiles in warm-up
        warmup_rest = -(-max(warmup_rest, group) // group) * group
    warmup_start = time.perf_counter()
    with segment():
        for _ in range(warmup_rest):
            step()
        sync()
    warmup_step_s = (time.perf_counter() - warmup_start) / warmup_rest if warmup_rest else first_step_s
    counters_after_warmup = platform.compile_stats()
    min_steps, min_seconds = config.window_min_steps, config.window_min_s
    if world.size > 1:
        # Workers must run the same number of steps (each step is a collective), and
        # agreeing on "time is up" every step would be a sync per step. So all agree
        # once, on a fixed step count that fills the minimum window on the slowest one.
        wanted = max(min_steps, math.ceil(min_seconds / warmup_step_s))
        min_steps, min_seconds = int(world.reduce([wanted], "max", device)[0]), 0.0
    global_samples = global_seconds = 0.0

    stats = WindowStats(samples_per_step=config.batch_size,
                        host_clock_times_steps=platform.host_clock_times_steps)
    for index in range(1, config.windows + 1):
        with segment():  # its own work on entry and exit stays outside the window's timer
            window = time_window(step, sync, min_steps, min_seconds, step_multiple=group)
        stats.add(window)
        final_loss = float(last_loss[0])  # the window already synced: this read waits for nothing
        if not math.isfinite(final_loss):
            raise NonFiniteLoss(f"loss is {final_loss} after window {index} ({stats.steps} measured steps)")
        # Global throughput: every worker's samples over the slowest worker's window.
        samples, workers_reporting = world.reduce([window.steps * config.batch_size, 1], "sum", device)
        global_samples += samples
        global_seconds += world.reduce([window.seconds], "max", device)[0]
        throughput = global_samples / global_seconds
        compile_s = _dynamo_compile_seconds() - compile_start if config.torch_compile != "none" else 0.0
        counters = platform.compile_stats()
        if "xla_compile_s" in counters:
            compile_s = counters["xla_compile_s"] - counters_start["xla_compile_s"]
        result = {
            "throughput_samples_per_s": throughput,
            "window_throughput_samples_per_s": samples / window.seconds,
            "step_time_p50_s": stats.step_time(50),
            "step_time_p90_s": stats.step_time(90),
            "first_step_s": first_step_s,
            "compile_s": compile_s,
            "peak_memory_mb": platform.peak_memory_mb(device),
            "initial_loss": initial_loss,
            "final_loss": final_loss,
            "usd_per_1m_samples": usd_per_1m_samples(usd_per_hour, throughput),
            "usd_per_hour": usd_per_hour,
            "setup_s": setup_s,
            "loop_s": time.perf_counter() - loop_start,
            "measured_s": stats.seconds,
            "measured_steps": stats.steps,
            "windows_done": index,
            "device": platform.describe_device(device),
            "step_time_source": stats.step_time_source,
            "workers": world.size,
            "workers_reporting": workers_reporting,
        }
        if "xla_compiles" in counters:
            # Graphs compiled after warm-up: a count that keeps rising means every step
            # recompiles (a shape or a Python value changes per step).
            result["xla_compiles"] = counters["xla_compiles"] - counters_after_warmup["xla_compiles"]
            result["xla_compiles_total"] = counters["xla_compiles"] - counters_start["xla_compiles"]
            result["xla_cache_hits"] = counters["xla_cache_hits"] - counters_start["xla_cache_hits"]
        if report is not None:
            report(result)
    return result
