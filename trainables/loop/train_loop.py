"""The training loop: one config in, one result dict per measured window out.

    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.loop.train_loop import run_training
    result = run_training(TrialConfig.make(model="vit-micro", windows=2))

Measurement follows the seeds' hand-run loops, minus their mistakes: the first step
(compilation, first-touch allocation) is timed on its own; the remaining warm-up steps
are not timed at all; steady state is measured in time-bounded windows with one device
sync at each boundary and no per-step host reads of device values. Each window ends in
a report, so a Tune scheduler can stop a hopeless trial after its first window.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import itertools
import math
import time
from typing import Any, Callable, Iterator, Mapping, Optional

from accelsweep.trainables.batches import map_tensors
from accelsweep.trainables.trial_progress import phase
from accelsweep.trainables.compile_cache import DYNAMO_CACHE_COUNTERS, dynamo_cache_counts
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.contention import ContentionMeter
from accelsweep.trainables.cost import usd_per_1m_samples
from accelsweep.trainables.distributed import World
from accelsweep.trainables.utilisation import TrialUtilisation
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.failures import NonFiniteGradient, NonFiniteLoss
from accelsweep.trainables.timing.windows import (WindowStats, coefficient_of_variation, host_probe_s,
                                                matmul_probe_gflops, percentile, time_window,
                                                torch_compile_seconds)
from accelsweep.trainables.metrics import DRIVER_METRICS, TRAINING_METRICS
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.platforms.cpu_threads import ThreadFit
from accelsweep.trainables.timing.limiter import data_range, profile_steps
from accelsweep.trainables.precision import get_precision
from accelsweep.trainables.loop.rejection import SlowTrial, StepGuard, TrialLimits, current_limits
from accelsweep.trainables.loop.watchdog import TrialAborted
from accelsweep.trainables.turns import current_turns, drain_steps, turn_window_steps
from accelsweep.trainables.workloads.base import Workload, load_workload

__all__ = ["NonFiniteGradient", "NonFiniteLoss", "run_training"]


def run_training(config: TrialConfig, report: Optional[Callable[[dict], None]] = None,
                 usd_per_hour: float = float("nan"), capture_dir: Optional[str] = None,
                 limits: Optional[TrialLimits] = None) -> dict:
    """Train ``config`` for its warm-up and windows; call ``report`` after each window
    with the cumulative result, and return the last one. ``usd_per_hour`` is what the
    resources this trial holds cost (NaN: no price basis, so no cost metrics).
    ``capture_dir``: where ``nan_capture`` saves its file (default: the Tune trial's
    directory inside a Tune trial, else the working directory). ``limits``: when to give
    up on the trial (trainables/loop/rejection.py; default: the sweep's, inside a sweep's
    trial): a hopeless projection ends it with a ``rejected`` result, a compile past the
    limit with CompileTimeout."""
    since = time.time()
    try:
        return _run_training(config, report, usd_per_hour, capture_dir,
                             limits if limits is not None else current_limits())
    except Exception as error:
        # The platform may know better words for its own failures (neuronx-cc's log).
        explained = get_platform(config.platform).explain_failure(error, config, since)
        if explained is None:
            raise
        raise explained from error


def _run_training(config: TrialConfig, report: Optional[Callable[[dict], None]],
                  usd_per_hour: float, capture_dir: Optional[str], limits: Optional[TrialLimits]) -> dict:
    started = time.perf_counter()
    phase("building the model and data")
    platform = get_platform(config.platform)
    # Other processes' CPU is read from here (cpu_threads.py). Not while configs take turns:
    # the others alive then are the confirmation's own, waiting at the baton.
    threads_fit = platform.thread_fit(config, measure=current_turns() is None)
    workload = load_workload(config.workload)
    device = platform.prepare(config)
    world = World.current()
    if world.size > 1 and threads_fit is not None:
        threads_fit.keep_threads()  # the trial's other workers would read as other processes
    # Code is not the workload's memory: its modules, and torch.compile's, load first (what
    # the compiler allocates while it compiles still counts: a compiled trial's memory).
    for module in workload.imports + (("torch._dynamo", "torch._inductor") if config.torch_compile != "none" else ()):
        importlib.import_module(module)
    # How far from the hardware's limit: model FLOPs (counted once per workload and shape)
    # and the peak of what the trial holds (measured once per machine on a CPU), both
    # before the memory baseline and outside every timed window.
    phase("counting model FLOPs; the hardware's peak")
    utilisation = TrialUtilisation.of(workload, config, platform, device, world)
    # The workload's memory: the peak from here (model, optimizer state, activations,
    # batches) over what the process held before it.
    platform.reset_peak_memory(device)
    memory_before_mb = platform.memory_in_use_mb(device)
    trial = _Trial(config, platform, workload, device, world)
    if threads_fit is not None:
        threads_fit.fit()  # from what others took while the trial started
    result: dict = {}  # the cumulative result of the windows done so far
    if config.nan_capture:
        def report_capture(fields: dict) -> None:
            # The driver logs the capture file with the trial's run when a result names it,
            # so this report comes before the trial ends: what the windows done so far
            # measured (NaN before the first one), the unfinished window's throughput as
            # unknown, and where the capture is.
            if report is not None:
                measured = result or {m.name: float("nan") for m in TRAINING_METRICS if m not in DRIVER_METRICS}
                report({**measured, "window_throughput_samples_per_s": float("nan"),
                        "windows_done": measured.get("windows_done", 0), **fields})

        trial.capture_nans(report_capture, capture_dir)

    compiles = _CompileClock(platform, config)
    setup_s = time.perf_counter() - started

    loop_start = time.perf_counter()
    # Rejection and the compile limit need every worker to agree on stopping (a step is a
    # collective): a trial of several workers runs without them.
    guard = StepGuard(limits if world.size == 1 else None, samples_per_step=config.batch_size,
                      units_per_step=lambda: trial.units_done / trial.steps_done if trial.steps_done else float("nan"),
                      unit=workload.unit, usd_per_hour=usd_per_hour,
                      compiling=config.torch_compile != "none" or platform.torch_on_xla)
    try:
        with guard:
            return _measure(config, report, usd_per_hour, platform, workload, device, world, trial, compiles,
                            guard, setup_s, loop_start, memory_before_mb, utilisation, latest=result,
                            threads_fit=threads_fit)
    except TrialAborted as error:
        if not isinstance(error, SlowTrial):  # raised by the watchdog, it has no message of its own
            raise type(error)(guard.reason_of(error)) from None
        rejected = guard.rejected_result(error, setup_s=setup_s, loop_s=time.perf_counter() - loop_start,
                                         compile_s=compiles.seconds(), device=platform.describe_device(device))
        rejected.update(compiles.cache_figures())  # its compile hit or filled the cache all the same
        if report is not None:
            report(rejected)
        return rejected


def _measure(config: TrialConfig, report, usd_per_hour: float, platform, workload, device, world, trial: "_Trial",
             compiles: "_CompileClock", guard: StepGuard, setup_s: float, loop_start: float,
             memory_before_mb: float, utilisation: TrialUtilisation, latest: dict,
             threads_fit: Optional[ThreadFit] = None) -> dict:
    """Warm-up, then the measured windows, each reported. ``latest`` is kept equal to the
    cumulative result of the windows done so far (a NaN capture reports it)."""
    first_step_s, warmup_step_s = trial.warm_up(guard)
    compiles.warmed_up()
    threading: dict = {}
    if threads_fit is not None:
        note = threads_fit.note()
        threading = {**threads_fit.figures(), **({"threading": note} if note else {})}
    # Fewer threads than asked: every window counts as contended (its figure is not the config's).
    threads_cut = threads_fit is not None and threads_fit.cut
    turns = current_turns()  # a confirmation that takes turns (trainables/turns.py)
    min_steps, min_seconds = trial.window_bounds(warmup_step_s, in_turns=turns is not None)
    unit = workload.unit
    # Once: a platform may gather them over the workers.
    trial_tags = {**platform.trial_tags(device), **world.placement_tags()}
    stats = WindowStats(samples_per_step=config.batch_size,
                        host_clock_times_steps=platform.host_clock_times_steps)
    # The machine's own speed, probed between windows (outside them): a figure taken
    # while the host was loaded shows as a slow probe, not only as a slow trial.
    probes = [host_probe_s()]
    # And at the trial's own math (a matmul in its precision's compute dtype), where the
    # host's regime shows on a CPU: the search ranks its candidates by figure over probe.
    speed = _SpeedProbe(config, device)
    # Each window's samples, units, seconds and whether other processes took cores from it
    # (trainables/contention.py): the trial's figures come from its trustworthy windows.
    windows = _Windows()
    meter = ContentionMeter()
    if turns is not None:  # warmed up, so ready
        turns.ready()
    result: dict = {}
    for index in range(1, config.windows + 1):
        if turns is not None and not turns.take():
            break  # no turn left for this config (the confirmation's time is up)
        phase(f"window {index} of {config.windows}")
        if turns is not None:  # what the loader prefetched while this trial waited is not timed
            trial.counting = False
            for _ in range(drain_steps(config.num_workers)):
                trial.step()
            trial.sync()
        trial.counting = True  # the workload's counts cover the measured steps only
        units_before = trial.units_done
        # Only the first window can still reject the trial (a hopeless one never gets further).
        step = guard.watching(trial.step) if index == 1 else trial.step
        with trial.segment():  # its own work on entry and exit stays outside the window's timer
            meter.start()
            window = time_window(step, trial.sync, min_steps, min_seconds, step_multiple=trial.group)
            contention = meter.stop()
        stats.add(window)
        probes.append(host_probe_s())
        speed.probe()
        if turns is not None:
            turns.done()
        final_loss = float(trial.last_loss[0])  # the window already synced: this read waits for nothing
        if not math.isfinite(final_loss):
            raise NonFiniteLoss(f"loss is {final_loss} after window {index} ({stats.steps} measured steps)")
        # Global throughput: every worker's samples over the slowest worker's window.
        samples, units, workers_reporting = world.reduce(
            [window.steps * config.batch_size, trial.units_done - units_before, 1], "sum", device)
        # The slowest worker's window, and the most contended worker's contention.
        window_seconds, excess_cpus, other_cpus, contended = world.reduce(
            [window.seconds, contention.excess_cpus if contention else -1.0,
             contention.other_cpus if contention else -1.0, float(bool(contention and contention.contended))],
            "max", device)
        contended = max(contended, float(threads_cut))
        windows.add(samples, units, window_seconds, contended=contended > 0)
        throughput = windows.throughput()
        peak_memory_mb = platform.peak_memory_mb(device)
        result = {
            "throughput_samples_per_s": throughput,
            "window_throughput_samples_per_s": samples / window.seconds,
            # Noise: how much the (trustworthy) windows disagree, and how much the machine's speed moved.
            "throughput_cv": coefficient_of_variation(windows.throughputs()),
            # Contention: other processes' CPU during this window, in cores (NaN: not measurable here).
            "other_cpus": other_cpus if other_cpus >= 0 else float("nan"),
            "contention_cpus": excess_cpus if excess_cpus >= 0 else float("nan"),
            "window_contended": contended,
            "contended_windows": windows.contended,
            "host_probe_s": percentile(probes, 50),
            "host_cv": coefficient_of_variation(probes),
            **speed.fields(),
            "step_time_p50_s": stats.step_time(50),
            "step_time_p90_s": stats.step_time(90),
            "first_step_s": first_step_s,
            "warmup_step_s": warmup_step_s,
            "compile_s": compiles.seconds(),
            "peak_memory_mb": peak_memory_mb,
            "memory_capacity_mb": platform.memory_capacity_mb(device),
            "workload_memory_mb": peak_memory_mb - memory_before_mb,
            "initial_loss": trial.initial_loss,
            "final_loss": final_loss,
            "usd_per_1m_samples": usd_per_1m_samples(usd_per_hour, throughput),
            "usd_per_hour": usd_per_hour,
            "setup_s": setup_s,
            "loop_s": time.perf_counter() - loop_start,
            "measured_s": stats.seconds,
            "measured_steps": stats.steps,
            "windows_done": index,
            "device": platform.describe_device(device),
            **trial_tags,
            **threading,
            "step_time_source": stats.step_time_source,
            "workers": world.size,
            "workers_reporting": workers_reporting,
            "unit": unit,
            **({"rejection_off": guard.note} if guard.note else {}),
            **compiles.xla_counts(),
            **compiles.cache_figures(),
            **utilisation.fields(throughput),
        }
        if unit != "samples":  # the workload's own unit beside samples: tokens/s, $ per 1M tokens
            unit_throughput = windows.throughput(units=True)
            result[f"throughput_{unit}_per_s"] = unit_throughput
            result[f"window_throughput_{unit}_per_s"] = units / window.seconds
            result[f"usd_per_1m_{unit}"] = usd_per_1m_samples(usd_per_hour, unit_throughput)
        result.update(_workload_figures(workload, trial.counts_done, result, world, device))
        if index == config.windows:
            result.update(_limiter(trial, platform, world, turns))
        if report is not None:
            report(result)
        latest.clear()
        latest.update(result)
    return result


def _limiter(trial: "_Trial", platform, world, turns) -> dict[str, Any]:
    """After the last window, outside it: what limits this config (timing/limiter.py), from
    a few profiled steps. A trial of one process whose host clock times its steps only;
    not while configs take turns (the baton's window is the turn's)."""
    if not platform.host_clock_times_steps or world.size > 1 or turns is not None:
        return {}
    from torch.autograd import _profiler_enabled  # torch is loaded: the trial has trained

    if _profiler_enabled():  # a caller's own profiler: one session at a time, and it is theirs
        return {"limiter": "not profiled: a profiler of the caller's was running"}
    trial.counting, trial.profiling = False, True
    started = time.perf_counter()
    try:
        with trial.segment():
            breakdown = profile_steps(trial.step, trial.sync)
        # Its seconds: a confirmation's trial of the same config profiles nothing, so its
        # start is planned without them (confirm._start_seconds).
        return {**breakdown.figures(narrower_precisions(platform, trial.config)),
                "limit_profile_s": time.perf_counter() - started}
    except Exception as error:  # noqa: BLE001 - the trial's figures stand without it; said in its result
        return {"limiter": f"not profiled: {type(error).__name__}: {error}"}
    finally:
        trial.profiling = False


def narrower_precisions(platform, config: TrialConfig) -> Optional[str]:
    """The platform's precisions whose math is narrower than ``config``'s and that this
    hardware runs natively ("bf16-autocast or bf16"); None when there are none: advice to
    lower the precision would send the user to an emulated dtype, several times slower."""
    own = get_precision(config.precision).math_bits
    emulated = platform.capabilities(config).emulated.get("precision", {})
    narrower = [name for name in platform.precisions
                if name not in emulated and get_precision(name).math_bits < own]
    return " or ".join(narrower) or None


class _SpeedProbe:
    """The host's speed at the trial's math, probed before the first window and after
    each (outside them): ``matmul_probe_gflops`` in the precision's compute dtype. On a
    CPU only: elsewhere a host matmul says nothing of the device's speed."""

    def __init__(self, config: TrialConfig, device):
        self.dtype = get_precision(config.precision).compute if device.type == "cpu" else None
        self.figures: list[float] = []
        self.probe()

    def probe(self) -> None:
        if self.dtype is not None:
            self.figures.append(matmul_probe_gflops(self.dtype))

    def fields(self) -> dict[str, Any]:
        if self.dtype is None:
            return {}
        import torch

        return {"speed_probe_gflops": percentile(self.figures, 50),
                "speed_probe_kind": f"{self.dtype} matmul, {torch.get_num_threads()} threads"}


class _Windows:
    """The measured windows' counts (every worker's, over the slowest worker's seconds).
    A contended window (other processes took cores from it) is kept out of the trial's
    figures while any window was not: its figure says more about the neighbours than the
    config. When every window was contended, all count, and the trial says so."""

    def __init__(self):
        self.done: list[tuple[float, float, float, bool]] = []  # samples, units, seconds, contended

    def add(self, samples: float, units: float, seconds: float, contended: bool) -> None:
        self.done.append((samples, units, seconds, contended))

    @property
    def contended(self) -> int:
        return sum(window[3] for window in self.done)

    def trusted(self) -> list[tuple[float, float, float, bool]]:
        return [window for window in self.done if not window[3]] or self.done

    def throughput(self, units: bool = False) -> float:
        trusted = self.trusted()
        return sum(window[1 if units else 0] for window in trusted) / sum(window[2] for window in trusted)

    def throughputs(self) -> list[float]:
        return [window[0] / window[2] for window in self.trusted()]


class _Trial:
    """One config's model, optimizer, data and step, built in this process, and its
    warm-up: everything the measured windows run."""

    def __init__(self, config: TrialConfig, platform, workload, device, world):
        import torch
        from torch.utils.data import DataLoader

        self.config, self.platform, self.device, self.world = config, platform, device, world
        torch.manual_seed(config.seed)
        if config.torch_compile != "none":
            torch._dynamo.reset()  # a reused trial process must not reuse the last trial's graphs
        precision = get_precision(config.precision)
        self.memory_format = platform.memory_format(config)
        self.input_dtype = precision.input_dtype
        model = workload.build_model(config).to(device=device, memory_format=self.memory_format)
        self.model = model.to(precision.parameter_dtype)
        self.model.train()
        self.optimizer = workload.optimizer(self.model.parameters(), config)
        self.loss_function = workload.loss
        # The workload's own per-step work, timed with the step (seed 003's per-step metrics).
        self.on_step = workload.on_step if type(workload).on_step is not Workload.on_step else None
        trained = platform.distribute(self.model, device) if world.size > 1 else self.model
        self.forward = platform.compile(trained, config)
        # fp16 autocast's loss scaling (precision.scales_loss); None: the loss unscaled.
        self.scaler = torch.amp.GradScaler(device.type) if precision.scales_loss else None
        # reduce-overhead replays CUDA graphs: each step begins a new replay generation,
        # so the last step's outputs (freed by then) are not kept alive by the graph pool.
        self.mark_step = (torch.compiler.cudagraph_mark_step_begin if config.torch_compile == "reduce-overhead"
                          else None)
        dataset = workload.dataset(config, rank=world.rank, world_size=world.size)
        # Persistent workers: a dataset shorter than the trial runs epoch after epoch, and
        # a new epoch must not start new loader processes inside a timed window.
        loader = DataLoader(dataset, batch_size=config.batch_size, num_workers=config.num_workers,
                            collate_fn=workload.collate_fn(config), drop_last=True,
                            persistent_workers=config.num_workers > 0)
        # Units (tokens, ...) and the workload's own counts are taken on the host as
        # batches leave the loader, in step order; each step takes its batch's. A FIFO
        # keeps them paired even when the platform's loader runs ahead (torch-xla's
        # MpDeviceLoader prefetches).
        self.batch_counts: collections.deque = collections.deque()
        self.units_done = 0
        self.steps_done = 0
        self.counts_done: collections.Counter = collections.Counter()  # the workload's, measured steps only
        self.counting = False  # on from the first measured window
        self.profiling = False  # the limiter's steps (timing/limiter.py) mark their batches
        counted = _counted(loader, workload, self.batch_counts)
        self.batches = iter(platform.device_batches(counted, device, config))
        if config.resident_batches:
            self.batches = self._resident(config.resident_batches)
        self.group = platform.steps_per_execution(config)  # steps per XLA execution (1 elsewhere)
        self.last_loss: list = []  # device tensor of the latest step's loss; read only after a sync
        self.initial_loss = float("nan")
        self.nan_capture = None  # a NanCapture with config.nan_capture (capture_nans)
        # Every run of steps ends in a sync; with nan_capture on an asynchronous device,
        # that is where the capture reads its flag (NanCapture.segment). Else: nothing.
        self.segment = contextlib.nullcontext

    def capture_nans(self, report: Callable[[dict], None], capture_dir: Optional[str]) -> None:
        # nan_capture imports torch: the driver, which imports this module (through trainable.py), never needs it
        from accelsweep.trainables.loop.nan_capture import NanCapture

        self.nan_capture = NanCapture(self.model, self.optimizer, self.device, self.platform, self.config,
                                      self.train_step, report, capture_dir)
        self.segment = self.nan_capture.segment

    def train_step(self, inputs, targets) -> None:
        inputs = map_tensors(self._as_input, inputs)
        if self.nan_capture is not None:
            self.nan_capture.before_step(inputs, targets)
        self.optimizer.zero_grad(set_to_none=True)
        if self.mark_step is not None:
            self.mark_step()
        with self.platform.autocast(self.config):
            outputs = self.forward(inputs)
            loss = self.loss_function(outputs, targets)
        if self.scaler is not None:  # fp16-autocast (nan_capture refuses it: config.py)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if self.nan_capture is not None:
                # Before the optimizer step: the weights are still the ones this step started from.
                self.nan_capture.after_backward(loss)
            self.platform.optimizer_step(self.optimizer)
        self.last_loss[:] = [loss.detach()]
        if self.on_step is not None:
            self.on_step(outputs.detach(), targets, loss.detach())

    def _as_input(self, value):
        """One tensor of a batch's inputs as the model takes it: floating ones in the
        precision's input dtype (token ids and other integers keep theirs), images in the
        platform's layout (channels_last on a CPU, ...)."""
        if not value.is_floating_point():
            return value
        value = value.to(dtype=self.input_dtype)
        return value.to(memory_format=self.memory_format) if value.dim() == 4 else value

    def _resident(self, count: int) -> Iterator:
        """The next ``count`` batches, as the model takes them, kept, then handed out in
        turn for good; each one's counts go to ``batch_counts`` as it is handed out, as
        the loader's do."""
        kept = [(map_tensors(self._as_input, inputs), targets)
                for inputs, targets in itertools.islice(self.batches, count)]  # epoch after epoch: always count
        kept_counts = [self.batch_counts.popleft() for _ in kept]
        self.batch_counts.clear()  # a loader that reads ahead: batches no step takes

        def cycle():
            while True:
                for batch, counts in zip(kept, kept_counts):
                    self.batch_counts.append(counts)
                    yield batch
        return cycle()

    def step(self) -> None:
        if self.profiling:
            with data_range():  # what the limiter counts as waiting for data
                batch = next(self.batches)
        else:
            batch = next(self.batches)
        self.train_step(*batch)
        self.steps_done += 1
        units, counts = self.batch_counts.popleft()
        self.units_done += units
        if self.counting:
            self.counts_done.update(counts)

    def sync(self) -> None:
        self.platform.sync(self.device)

    def warm_up(self, guard: StepGuard) -> tuple[float, float]:
        """The first step, timed on its own (compilation, first touch), then the rest of
        the warm-up, untimed but for its mean step time. Returns both. ``guard`` may end
        the trial on the way (SlowTrial, CompileTimeout)."""
        compiles = self.config.torch_compile != "none" or self.platform.torch_on_xla
        phase("compiling (first step)" if compiles else "first step")
        start = time.perf_counter()
        with self.segment(), guard.first_step():
            self.step()
            self.sync()
        first_step_s = time.perf_counter() - start
        guard.first_step_done(first_step_s)
        self.initial_loss = float(self.last_loss[0])
        rest = self.config.warmup_steps - 1
        if self.group > 1:  # whole groups, at least one, so the k-step graph compiles in warm-up
            rest = -(-max(rest, self.group) // self.group) * self.group
        phase(f"warming up ({rest} steps)")
        start = time.perf_counter()
        with self.segment():
            if self.platform.host_clock_times_steps:
                for _ in range(rest):  # each step is its own evidence: judged as it ends
                    guard.watching(self.step, abandon=True)()
            else:  # an asynchronous device: only the sync at the end tells how long the steps took
                with guard.steps(rest):
                    for _ in range(rest):
                        self.step()
                    self.sync()
        elapsed = time.perf_counter() - start
        if rest and not self.platform.host_clock_times_steps:
            guard.judge_steps(elapsed, rest)
        return first_step_s, elapsed / rest if rest else first_step_s

    def window_bounds(self, warmup_step_s: float, in_turns: bool = False) -> tuple[int, float]:
        """Each window's minimum steps and seconds; ``in_turns``: a confirmation's turn, whose
        step floor is ``turn_window_steps``."""
        min_steps, min_seconds = self.config.window_min_steps, self.config.window_min_s
        if in_turns:
            min_steps = turn_window_steps(min_steps)
        if self.world.size > 1:
            # Workers must run the same number of steps (each step is a collective), and
            # agreeing on "time is up" every step would be a sync per step. So all agree
            # once, on a fixed step count that fills the minimum window on the slowest one.
            wanted = max(min_steps, math.ceil(min_seconds / warmup_step_s))
            min_steps, min_seconds = int(self.world.reduce([wanted], "max", self.device)[0]), 0.0
        return min_steps, min_seconds


def _workload_figures(workload: Workload, counts: Mapping[str, float], result: Mapping[str, Any], world,
                      device) -> dict[str, Any]:
    """The workload's own figures from its counts over the measured steps so far, summed
    over every worker (e.g. the padding fraction of the tokens trained on)."""
    names = sorted(counts)
    totals = dict(zip(names, world.reduce([counts[name] for name in names], "sum", device))) if names else {}
    figures = dict(workload.figures(totals))
    clash = sorted(set(figures) & set(result))
    if clash:
        raise ConfigError(f"figures of workload {type(workload).__name__}", "names the loop does not report",
                          clash)
    return figures


def _counted(loader, workload: Workload, counts: collections.deque):
    """The loader's batches, epoch after epoch (a workload's dataset may be short), each
    one's unit count and the workload's own counts appended to ``counts`` as it passes."""
    while True:
        batches = 0
        for inputs, targets in loader:
            counts.append((int(workload.units(inputs, targets)), workload.count(inputs, targets)))
            batches += 1
            yield inputs, targets
        if batches == 0:
            raise ConfigError("batch_size", "at most the dataset's length", loader.batch_size,
                              "The loop drops the last partial batch: a dataset shorter than one batch gives none.")


class _CompileClock:
    """Compiler time, graph counts and compile-cache use since the trial started:
    torch.compile's own timers and its caches' counters, or the platform's counters
    (torch-xla's) where it has them."""

    def __init__(self, platform, config: TrialConfig):
        self.platform = platform
        self.dynamo = config.torch_compile != "none"
        self.dynamo_start = torch_compile_seconds() if self.dynamo else 0.0
        self.cache_start = dynamo_cache_counts() if self.dynamo else {}
        self.start = platform.compile_stats()
        self.after_warmup = self.start

    def warmed_up(self) -> None:
        self.after_warmup = self.platform.compile_stats()

    def seconds(self) -> float:
        counters = self.platform.compile_stats()
        if "xla_compile_s" in counters:
            return counters["xla_compile_s"] - self.start["xla_compile_s"]
        return torch_compile_seconds() - self.dynamo_start if self.dynamo else 0.0

    def cache_figures(self) -> dict[str, Any]:
        """The FX graph and AOTAutograd cache hits, misses and bypasses of this trial's
        torch.compile (none without it: nothing was looked up): a second sweep of the same
        configs shows hits, no misses, and a smaller ``compile_s``. Where the trial compiled,
        also where its compiler cached (a tag). torch-xla's persistent-cache hits come from
        ``xla_counts``; NaN where the platform has no such cache."""
        xla = "xla_compiles" in self.start
        figures: dict[str, Any] = {}
        if self.dynamo or xla:
            figures["compile_cache_location"] = self.platform.compile_cache_in_effect()
        if self.dynamo:
            now = dynamo_cache_counts()
            figures.update({name: now[name] - self.cache_start[name] for name in now})
        else:  # counted without importing torch._dynamo, which an eager trial never loads
            figures.update(dict.fromkeys(DYNAMO_CACHE_COUNTERS, 0.0))
        if not xla:
            figures["xla_cache_hits"] = float("nan")
        return figures

    def xla_counts(self) -> dict[str, float]:
        counters = self.platform.compile_stats()
        if "xla_compiles" not in counters:
            return {}
        # Graphs compiled after warm-up: a count that keeps rising means every step
        # recompiles (a shape or a Python value changes per step).
        return {"xla_compiles": counters["xla_compiles"] - self.after_warmup["xla_compiles"],
                "xla_compiles_total": counters["xla_compiles"] - self.start["xla_compiles"],
                "xla_cache_hits": counters["xla_cache_hits"] - self.start["xla_cache_hits"]}
