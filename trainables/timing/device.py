"""Device time of kernel calls too short to time one at a time (GPUs).

A CUDA event pair around each call times the host as much as the GPU when the call is
short: the stream drains between calls, so each call's first event waits for the host's
next launch, and a launch-bound kernel's figure moves with the host. Three windows here
time the device instead: ``held_batch_window`` (a held stream, torch on CUDA),
``async_batch_window`` (the host clock over batches of async calls, JAX) and
``traced_batch_window`` (the device's own record of each batch, JAX with CUPTI).

The device is a small interface (``HeldStream``), so the logic runs on a CPU against a
fake device in tests/test_launch_bound_timing.py; trainables/platforms/cuda.py gives the
real one (CUDA events and ``torch.cuda._sleep``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional, Protocol

from accelsweep.trainables.timing.windows import Window

__all__ = ["AsyncBatchWindow", "BatchPlan", "CallWaitsForDevice", "DeviceTrace", "DeviceTraceUnavailable", "HeldStream",
           "HeldWindow", "TracedWindow", "async_batch_window", "held_batch_window", "traced_batch_window"]


class HeldStream(Protocol):
    """The stream a kernel's calls are enqueued on."""

    def hold(self, seconds: float) -> None:
        """Enqueue a kernel that keeps the stream busy for about ``seconds``."""

    def mark(self) -> Any:
        """Record a marker (a CUDA event) on the stream; returns it."""

    def reached(self, marker: Any) -> bool:
        """Whether the device has passed ``marker`` (without waiting)."""

    def between(self, first: Any, second: Any) -> float:
        """Device seconds from ``first`` to ``second``, both reached."""

    def synchronize(self) -> None:
        """Wait until the device has done everything enqueued."""


class DeviceTrace(Protocol):
    """The device's own record of its work (kernel and copy start and end times) over a
    span of host calls, each batch of calls marked on it."""

    def start(self) -> None:
        """Begin recording."""

    def batch(self, index: int) -> ContextManager[Any]:
        """Marks the host's span of batch ``index`` (its calls and its wait)."""

    def stop(self) -> dict[int, float]:
        """End recording: device busy seconds of each marked batch, by index."""


class DeviceTraceUnavailable(RuntimeError):
    """The device's record could not be taken or read (no profiler, no device plane, or
    batches the record does not line up with)."""


class CallWaitsForDevice(RuntimeError):
    """The call blocks the host until the device catches up (a copy to the host, a size
    only the device knows): no stream can be held across it."""


@dataclass(frozen=True)
class BatchPlan:
    """How batches are sized."""

    # Device time a batch aims at: long against the events' ~0.5 us resolution and the
    # calls' own jitter, short enough for many batches in a window.
    target_batch_s: float = 2e-3
    # Calls per batch at most: a held stream's launch queue fills (CUDA's is finite, of the
    # order of a thousand launches, and one call may launch several kernels); a full queue
    # blocks the host, which is caught below and answered with smaller batches.
    max_calls: int = 256
    first_calls: int = 4  # the batch that sizes the others
    # The hold lasts this many times the host's expected enqueue time of a batch.
    hold_margin: float = 2.0
    min_hold_s: float = 100e-6
    max_hold_s: float = 2.0
    # The host "waited for the hold" when its enqueue took this share of the hold or more.
    waited_share: float = 0.9

    def calls_for(self, device_s_per_call: float, cap: int) -> int:
        if not device_s_per_call > 0:
            return min(self.max_calls, cap)
        calls = math.ceil(self.target_batch_s / device_s_per_call - 1e-6)  # 2 ms / 20 us is 100, not 101
        return max(1, min(cap, self.max_calls, calls))


@dataclass
class _Batch:
    calls: int
    device_s: float  # events around the batch
    enqueue_s: float  # host clock over the batch's enqueue


@dataclass
class HeldWindow(Window):
    """A window of held batches. ``step_seconds``: device time per call, one per batch
    (the batch's event time / its calls); ``steps``: calls; ``enqueue_seconds``: the
    host's enqueue time per call, one per batch."""

    enqueue_seconds: list[float] = field(default_factory=list)
    calls_per_batch: int = 1
    timer: str = "cuda events around a held batch"
    # A call is launch-bound where the host's enqueue per call reaches this share of the
    # figure per call: here the device's own time, so 1.
    launch_bound_share: float = 1.0

    def is_launch_bound(self, enqueue_s: float, per_call_s: float) -> bool:
        return enqueue_s >= self.launch_bound_share * per_call_s


@dataclass
class AsyncBatchWindow(HeldWindow):
    """A window of async batches: ``step_seconds`` is the host clock over a batch (its N
    calls and one wait) / N, the larger of the host's dispatch and the device's work per
    call. The device's work alone is not seen, so a call counts as launch-bound when its
    dispatch alone takes 90% of that figure: the device finished within 10% of the host."""

    timer: str = "host clock over a batch of async calls and one block_until_ready"
    launch_bound_share: float = 0.9


@dataclass
class TracedWindow(HeldWindow):
    """A window of async batches timed by the device's own record: ``step_seconds`` is the
    device's busy time in a batch / N (kernels and copies, overlaps counted once), the
    device's work alone as with a held stream, so launch-bound is judged as there."""

    timer: str = "device trace (CUPTI kernel and copy times) over a batch of async calls"


def _held_batch(call: Callable[[], Any], stream: HeldStream, calls: int, hold_s: float,
                clock: Callable[[], float]) -> tuple[Optional[_Batch], float, float]:
    """One batch behind a hold of ``hold_s``: (the batch, or None where the hold ended before
    the host had queued it all; the host's enqueue seconds; the hold's device seconds)."""
    stream.synchronize()
    before_hold = stream.mark()
    stream.hold(hold_s)
    first = stream.mark()
    began = clock()
    for _ in range(calls):
        call()
    enqueue_s = clock() - began
    held = not stream.reached(first)  # asked before anything else is queued
    last = stream.mark()
    stream.synchronize()
    hold_device_s = stream.between(before_hold, first)
    if not held:
        return None, enqueue_s, hold_device_s
    return _Batch(calls, stream.between(first, last), enqueue_s), enqueue_s, hold_device_s


class _HeldBatches:
    """Runs held batches, growing the hold until it covers the host's enqueue and halving
    the batch when the host turns out to wait for the device (a full launch queue, or a
    call that synchronises), down to one call: then ``CallWaitsForDevice``."""

    def __init__(self, call: Callable[[], Any], stream: HeldStream, plan: BatchPlan, clock: Callable[[], float]):
        self.call, self.stream, self.plan, self.clock = call, stream, plan, clock
        self.hold_scale = 1.0  # device seconds a hold asked for one second gives (learned)
        self.cap = plan.max_calls  # calls per batch that did not fill the launch queue

    def run(self, calls: int, enqueue_s_per_call: Optional[float]) -> _Batch:
        plan = self.plan
        calls = min(calls, self.cap)

        def hold_for(calls: int) -> float:
            return max(plan.min_hold_s, plan.hold_margin * (enqueue_s_per_call or 0.0) * calls)

        wanted = hold_for(calls)
        host_waited_before = False
        while True:
            asked = wanted / self.hold_scale
            batch, enqueue_s, hold_device_s = _held_batch(self.call, self.stream, calls, asked, self.clock)
            if hold_device_s > 0:  # a spin kernel's clock rate moves with the GPU's clock: learn it
                self.hold_scale = hold_device_s / asked
            if batch is not None:
                return batch
            # The hold ended before the last call was queued. Either it was too short for an
            # enqueue this slow (a longer one fixes it), or the host was blocked until it
            # ended: then the enqueue grows with the hold, twice in a row.
            host_waited = enqueue_s >= plan.waited_share * hold_device_s
            if host_waited and host_waited_before:
                if calls == 1:
                    raise CallWaitsForDevice(
                        "each call blocks the host until the device has caught up (it copies to the host or "
                        "synchronises), so the stream cannot be held across it")
                calls = self.cap = max(1, calls // 2)
                host_waited_before = False
                wanted = hold_for(calls) if enqueue_s_per_call else max(plan.min_hold_s, hold_device_s / 2)
                continue
            host_waited_before = host_waited
            wanted = max(2 * wanted, plan.hold_margin * enqueue_s)
            if wanted > plan.max_hold_s:
                raise CallWaitsForDevice(f"the host took {enqueue_s:.3g} s to enqueue {calls} call(s), longer than "
                                         f"a {plan.max_hold_s:g} s hold")


def held_batch_window(call: Callable[[], Any], stream: HeldStream, min_calls: int, min_seconds: float,
                      clock: Callable[[], float] = time.perf_counter, plan: BatchPlan = BatchPlan()) -> HeldWindow:
    """Held batches of one size until at least ``min_calls`` calls and ``min_seconds``
    have passed. A first, smaller batch (not counted) sizes them to about
    ``plan.target_batch_s`` of device time. Raises ``CallWaitsForDevice`` for a call that
    synchronises with the host.

    This times the device's work only, as NVBench does: a kernel that spins for a set time
    holds the stream while the host enqueues a batch of N calls behind it, and events
    around the batch time it. Right after the last call is queued the host asks whether the
    hold is still running; only then did the device run the batch back to back, never
    waiting for the host, and the batch counts. The batch's event time / N is the device
    time per call; the host's enqueue time per call is timed beside it, and a call is
    launch-bound where the host takes at least as long to enqueue it as the device takes to
    run it: in a loop of such calls the device waits for the host."""
    start = clock()
    batches = _HeldBatches(call, stream, plan, clock)
    sizing = batches.run(plan.first_calls, None)
    calls = plan.calls_for(sizing.device_s / sizing.calls, batches.cap)
    enqueue_per_call = sizing.enqueue_s / sizing.calls
    counted: list[_Batch] = []
    while not counted or sum(b.calls for b in counted) < min_calls or clock() - start < min_seconds:
        batch = batches.run(calls, enqueue_per_call)
        calls = batch.calls  # smaller where the launch queue filled
        enqueue_per_call = batch.enqueue_s / batch.calls
        counted.append(batch)
    return HeldWindow(steps=sum(b.calls for b in counted), seconds=clock() - start,
                      step_seconds=[b.device_s / b.calls for b in counted],
                      enqueue_seconds=[b.enqueue_s / b.calls for b in counted], calls_per_batch=calls)


def _async_batch(call: Callable[[], Any], wait: Callable[[Any], Any], calls: int,
                 clock: Callable[[], float]) -> _Batch:
    """N async calls and one wait on the last output (the device runs one process's calls
    in order, so that output is the batch's end), on the host clock."""
    began = clock()  # the device is idle: the harness's calls before, and each batch, end in a wait
    output = None
    for _ in range(calls):
        output = call()  # only the last is held: N outputs alive at once could fill the device
    enqueued = clock()
    wait(output)
    return _Batch(calls, clock() - began, enqueued - began)


def async_batch_window(call: Callable[[], Any], wait: Callable[[Any], Any], min_calls: int, min_seconds: float,
                       clock: Callable[[], float] = time.perf_counter,
                       plan: BatchPlan = BatchPlan()) -> AsyncBatchWindow:
    """Batches of async calls on the host clock. A first batch (not counted) sizes them,
    as in ``held_batch_window``.

    For a framework that dispatches asynchronously but gives no stream to hold (JAX): N
    calls, then one wait on the last output. The figure per call is the larger of the
    host's dispatch and the device's work, so a launch-bound call is timed by the host;
    ``traced_batch_window`` asks the device's own record instead."""
    start = clock()
    sizing = _async_batch(call, wait, plan.first_calls, clock)
    calls = plan.calls_for(sizing.device_s / sizing.calls, plan.max_calls)
    counted: list[_Batch] = []
    while not counted or sum(b.calls for b in counted) < min_calls or clock() - start < min_seconds:
        counted.append(_async_batch(call, wait, calls, clock))
    return AsyncBatchWindow(steps=sum(b.calls for b in counted), seconds=clock() - start,
                            step_seconds=[b.device_s / b.calls for b in counted],
                            enqueue_seconds=[b.enqueue_s / b.calls for b in counted], calls_per_batch=calls)


def traced_batch_window(call: Callable[[], Any], wait: Callable[[Any], Any], min_calls: int, min_seconds: float,
                        trace: DeviceTrace, clock: Callable[[], float] = time.perf_counter,
                        plan: BatchPlan = BatchPlan()) -> TracedWindow:
    """Batches of async calls, as in ``async_batch_window``, each marked on the device's
    record (``DeviceTrace``: CUPTI through jax.profiler), which gives each batch's device
    time: the busy time of the kernels and copies that ran inside it / N; the host's
    dispatch is timed beside it. The sizing batch runs before the record
    starts (on the host clock: a batch of about ``plan.target_batch_s`` of the larger of
    dispatch and device time). Raises ``DeviceTraceUnavailable`` where the record has no
    work inside a counted batch: a figure of zero would be the record's gap, not the call's."""
    start = clock()
    sizing = _async_batch(call, wait, plan.first_calls, clock)
    calls = plan.calls_for(sizing.device_s / sizing.calls, plan.max_calls)
    counted: list[_Batch] = []
    trace.start()
    try:
        while not counted or sum(b.calls for b in counted) < min_calls or clock() - start < min_seconds:
            with trace.batch(len(counted)):
                counted.append(_async_batch(call, wait, calls, clock))
    finally:
        busy = trace.stop()
    missing = [index for index in range(len(counted)) if not busy.get(index, 0.0) > 0]
    if missing:
        raise DeviceTraceUnavailable(f"the device trace holds no work inside {len(missing)} of {len(counted)} "
                                     f"batch(es) (first: batch {missing[0]}); it recorded {len(busy)} batch(es)")
    return TracedWindow(steps=sum(b.calls for b in counted), seconds=clock() - start,
                        step_seconds=[busy[index] / b.calls for index, b in enumerate(counted)],
                        enqueue_seconds=[b.enqueue_s / b.calls for b in counted], calls_per_batch=calls)
