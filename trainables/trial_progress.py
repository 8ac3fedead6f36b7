"""What a running trial is doing, and what it printed, told to the sweep's driver.

A trial reports to Tune only at the end of a measured window: a trial that compiles for
minutes says nothing for minutes. And the console of a sweep shows the tool's lines only:
what a trial's process prints (a library's warnings, a compiler's log, a traceback's
context) belongs with the trial. So, in each trial process, ``phase("compiling (first
step)")`` says what the trial is doing (the driver shows it for a quiet trial:
sweeps/driver/run/callbacks.py), and ``captured_output`` sends on what it prints (the
driver keeps it in the trial's MLflow run, trial-output.log, and prints it only when the
trial failed, or with --verbose).

Both travel through one small Ray actor per sweep (``TrialProgress``, named, started by
the driver; trainables/sweep_actor.py serves it and the sweep's board from one process), so they work the same on a cluster, where a trial's files are on another
machine. Outside a sweep (no actor) ``phase`` does nothing and output is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any, Iterator, Optional

from accelsweep.trainables.ray_adapter import on_this_node

SEND_EVERY_S = 2.0
# A trial's output kept whole up to this size; past it only its end (the part that says
# why a trial failed) is kept, after a line saying how much was left out.
OUTPUT_LIMIT_BYTES = 1 << 20
TAIL_BYTES = 64 << 10
# Trials send while the driver reads: the actor serves calls from a few threads.
PROGRESS_CONCURRENCY = 4


class TrialProgress:
    """The actor: each running trial's phase and output, by trial id (the driver takes a
    trial's output when it ends, which frees it)."""

    def __init__(self):
        self._phases: dict[str, tuple[str, float]] = {}
        self._output: dict[str, bytearray] = {}
        self._left_out: dict[str, int] = {}

    def set_phase(self, trial_id: str, phase: str, at: float) -> None:
        self._phases[trial_id] = (phase, at)

    def phases(self) -> dict[str, tuple[str, float]]:
        return dict(self._phases)

    def append_output(self, trial_id: str, chunk: bytes) -> None:
        kept = self._output.setdefault(trial_id, bytearray())
        kept += chunk
        if len(kept) > OUTPUT_LIMIT_BYTES:
            cut = len(kept) - TAIL_BYTES
            self._left_out[trial_id] = self._left_out.get(trial_id, 0) + cut
            del kept[:cut]

    def take_output(self, trial_id: str) -> str:
        """The trial's output so far (its end only, past OUTPUT_LIMIT_BYTES); forgotten here."""
        self._phases.pop(trial_id, None)
        kept = bytes(self._output.pop(trial_id, b""))
        left_out = self._left_out.pop(trial_id, 0)
        text = kept.decode("utf-8", "replace")
        if left_out:
            text = f"[... {left_out} bytes of this trial's output left out: only its last part is kept ...]\n" + text
        return text


def start_progress(name: str):
    """The driver's side: start the sweep's actor under ``name`` (held for the sweep's
    duration: Ray ends a named actor with its last handle)."""
    import ray

    return ray.remote(num_cpus=0)(TrialProgress).options(name=name, max_concurrency=PROGRESS_CONCURRENCY, **on_this_node()).remote()


class _Reporter:
    """A trial's side: its actor and its trial id."""

    def __init__(self, actor: Any, trial_id: str):
        self.actor, self.trial_id = actor, trial_id

    def phase(self, text: str) -> None:
        self.actor.set_phase.remote(self.trial_id, text, time.time())  # not waited for

    def send(self, chunk: bytes, wait: bool = False) -> None:
        if not chunk:
            return
        sent = self.actor.append_output.remote(self.trial_id, chunk)
        if wait:
            import ray

            with contextlib.suppress(Exception):  # the driver gone: nothing to tell
                ray.get(sent, timeout=10)


_current: Optional[_Reporter] = None


def phase(text: str) -> None:
    """Say what this trial is doing now (its next part: "window 2 of 3"). The training loop
    and the kernel harness call it as they start each part; the driver shows it for a
    trial that has been quiet a while (at most every PROGRESS_EVERY_S, callbacks.py). A
    no-op outside a sweep's trial."""
    if _current is not None:
        with contextlib.suppress(Exception):  # a lost driver must not fail the trial
            _current.phase(text)


@contextlib.contextmanager
def trial_progress(actor_name: Optional[str]) -> Iterator[None]:
    """For one trial's duration in this process: ``phase`` reaches the sweep's actor, and
    the process's output is captured and sent there (``captured_output``). Nothing when
    ``actor_name`` is None (a trainable run outside a sweep)."""
    global _current
    if actor_name is None:
        yield
        return
    import ray
    from ray import tune

    reporter = _Reporter(ray.get_actor(actor_name), tune.get_context().get_trial_id())
    _current = reporter
    try:
        with captured_output(reporter):
            yield
    finally:
        _current = None


# Where this process's own stdout and stderr went before a trial captured them (Ray's
# worker log files), and how far the trials of this process have read them.
_read_up_to: dict[str, int] = {}
RAY_LOG_MARKER = re.compile(rb"^:(job_id|actor_name|task_name):")


def _process_logs() -> list[str]:
    """The regular files behind file descriptors 1 and 2 (one, when they are the same)."""
    paths = []
    for descriptor in (1, 2):
        with contextlib.suppress(OSError):
            path = os.readlink(f"/proc/self/fd/{descriptor}")
            if os.path.isfile(path) and path not in paths:
                paths.append(path)
    return paths


def _unread_process_output() -> bytes:
    """What this process printed outside any trial since the last one (its start-up: the
    imports' warnings), read from its log files: a trial's output begins with it."""
    chunks = []
    for path in _process_logs():
        with contextlib.suppress(OSError), open(path, "rb") as log:
            log.seek(_read_up_to.get(path, 0))
            chunk = log.read(OUTPUT_LIMIT_BYTES)
            _read_up_to[path] = log.tell()
            # Ray marks whose output follows in its workers' logs (":job_id:01000000",
            # ":actor_name:..."), for the driver's log monitor: not the process's words.
            chunk = b"".join(line for line in chunk.splitlines(keepends=True) if not RAY_LOG_MARKER.match(line))
            if chunk.strip():
                chunks.append(chunk)
    if not chunks:
        return b""
    return b"[this process's output before the trial]\n" + b"".join(chunks) + b"[the trial's own output]\n"


@contextlib.contextmanager
def captured_output(reporter: _Reporter) -> Iterator[None]:
    """File descriptors 1 and 2 of this process (so a C library's output and a child
    process's too) into a file, sent on by a thread every
    SEND_EVERY_S and in full when the block ends (waited for: a failed trial's report
    follows, and its output must be there when the driver reads it); then put back.
    What the process printed before (its start-up) is sent first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        reporter.send(_unread_process_output())
    capture = tempfile.NamedTemporaryFile(prefix="accelsweep-trial-output-", suffix=".log", delete=False)
    saved = [os.dup(1), os.dup(2)]
    os.dup2(capture.fileno(), 1)
    os.dup2(capture.fileno(), 2)
    stop = threading.Event()
    reader = open(capture.name, "rb")
    # Both ends are open: the name can go now, so a trial killed outright (its timeout, a
    # second signal) leaves no file behind in the temporary folder.
    with contextlib.suppress(OSError):
        os.unlink(capture.name)

    def send_new(wait: bool = False) -> None:
        reporter.send(reader.read(), wait=wait)

    def keep_sending() -> None:
        while not stop.wait(SEND_EVERY_S):
            with contextlib.suppress(Exception):
                send_new()

    sender = threading.Thread(target=keep_sending, name="accelsweep-trial-output", daemon=True)
    sender.start()
    # Python's own streams onto the descriptors too, whatever sys.stdout was replaced with
    # (a test runner's capture, a library's wrapper): print() lands in the same file.
    streams = [open(descriptor, "w", buffering=1, closefd=False) for descriptor in (1, 2)]
    try:
        with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
            yield
    finally:
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.flush()
                stream.close()
        stop.set()
        sender.join(timeout=SEND_EVERY_S + 5)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in saved:
            os.close(descriptor)
        for path in _process_logs():  # the next trial of this process starts from here
            with contextlib.suppress(OSError):
                _read_up_to[path] = os.path.getsize(path)
        with contextlib.suppress(Exception):
            send_new(wait=True)
        reader.close()
        capture.close()
