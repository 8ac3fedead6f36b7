"""The GPU's own record of JAX's work: CUPTI's kernel and copy times, through jax.profiler.

JAX gives no stream to hold (trainables/timing/device.py), so a launch-bound JAX
call timed on the host clock is timed by its dispatch. jax.profiler records what the GPU
ran (XLA's CUPTI tracer: one line per stream on the ``/device:GPU:N`` plane, each kernel
and copy an event carrying its ``correlation_id``) on the same clock as the host's trace
annotations, so each batch's device work is the events that start inside its annotation.
Their union (overlaps once) is the batch's busy time: NVBench's "GPU time", from CUPTI.

The derived lines XLA's converters may add to a device plane ("XLA Ops", "XLA Modules",
...) restate the same kernels as spans and are left out; so is every event without a
``correlation_id`` (not a CUPTI activity).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from typing import Any, Iterable

from accelsweep.trainables.timing.device import DeviceTraceUnavailable

__all__ = ["BATCH_PREFIX", "JaxDeviceTrace", "busy_seconds_by_batch", "work_by_batch"]

BATCH_PREFIX = "accelsweep-batch-"
DEVICE_PLANE_PREFIX = "/device:GPU:"
DERIVED_LINES = frozenset({"XLA Ops", "XLA Modules", "Steps", "Framework Ops", "Framework Name Scope", "Source code",
                           "XLA TraceMe", "Launch Stats", "TensorFlow Ops", "TensorFlow Name Scope", "Async XLA Ops"})


class JaxDeviceTrace:
    """A DeviceTrace over jax.profiler: ``start`` begins a trace (host tracer level 1, for
    the annotations; no Python tracer, which would slow the host's dispatch), ``batch``
    annotates, ``stop`` reads the trace's XSpace and removes it."""

    def __init__(self) -> None:
        self.folder: str | None = None

    def start(self) -> None:
        import jax

        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        options.host_tracer_level = 1
        self.folder = tempfile.mkdtemp(prefix="accelsweep-trace-")
        try:
            jax.profiler.start_trace(self.folder, profiler_options=options)
        except Exception as error:  # noqa: BLE001 - a second profiler, no CUPTI: said, not hidden
            shutil.rmtree(self.folder, ignore_errors=True)
            raise DeviceTraceUnavailable(f"jax.profiler could not start: {type(error).__name__}: {error}") from error

    def batch(self, index: int) -> contextlib.AbstractContextManager[Any]:
        import jax

        return jax.profiler.TraceAnnotation(f"{BATCH_PREFIX}{index}")

    def stop(self) -> dict[int, float]:
        return busy_seconds_by_batch(self.stop_profile())

    def stop_profile(self):
        """End recording; the trace as a jax.profiler.ProfileData."""
        import jax

        try:
            jax.profiler.stop_trace()
            files = glob.glob(os.path.join(self.folder, "**", "*.xplane.pb"), recursive=True)
            if not files:
                raise DeviceTraceUnavailable(f"jax.profiler wrote no .xplane.pb under {self.folder}")
            return jax.profiler.ProfileData.from_file(files[0])
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def busy_seconds_by_batch(profile) -> dict[int, float]:
    """Seconds the GPU was busy inside each annotated batch: {batch index: seconds}. The
    profile is a jax.profiler.ProfileData (an XSpace)."""
    return {index: _union_s(work) for index, work in work_by_batch(profile).items()}


def work_by_batch(profile) -> dict[int, list[tuple[float, float]]]:
    """The GPU's kernels and copies that started inside each annotated batch, as sorted
    (start_ns, end_ns) intervals: {batch index: intervals}."""
    spans = {}
    device_lines = []
    for plane in profile.planes:
        if plane.name.startswith(DEVICE_PLANE_PREFIX):
            device_lines += [line for line in plane.lines if line.name not in DERIVED_LINES]
            continue
        for line in plane.lines:
            for event in line.events:
                if event.name.startswith(BATCH_PREFIX):
                    spans[int(event.name[len(BATCH_PREFIX):])] = (event.start_ns, event.end_ns)
    if not device_lines:
        planes = [plane.name for plane in profile.planes]
        raise DeviceTraceUnavailable(f"the trace has no {DEVICE_PLANE_PREFIX}N plane with work (planes: {planes})")
    work = sorted((event.start_ns, event.end_ns) for line in device_lines for event in line.events
                  if _is_device_activity(event))
    if not work:
        names = sorted({line.name for line in device_lines})
        raise DeviceTraceUnavailable(f"the device plane's lines {names} hold no event with a correlation_id")
    return {index: [interval for interval in work if begin <= interval[0] < end] for index, (begin, end) in spans.items()}


def _is_device_activity(event) -> bool:
    return any(name == "correlation_id" for name, _ in event.stats)


def _union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of sorted (start, end) intervals, in seconds (ns in)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total / 1e9
