"""A storage path that fills up (or turns read-only) while a sweep runs: the sweep stops
while Tune can still save its state, and says how to go on.

``store_checks.check_storage_path`` refuses a full or read-only storage path before anything
starts; it cannot see the disk filling during the sweep (another job's output, a growing
log). Tune then goes on: its copy of the experiment's state fails with a traceback at every
save, the sweep ends "finished", and the state left on disk is cut short, which a later
--resume cannot read. So at each step of Tune's loop ``StorageWatch.check`` reads the free
space and watches Tune's copy for "no space left" and "read-only file system"; below
``STOP_FREE_BYTES`` or on such a failure the sweep stops as Ctrl-C stops it, and ``run_sweep``
raises SweepStopped (exit status 75), saying to run the same command with --resume once there
is room.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from typing import Callable, Iterator, Optional

from accelsweep.sweeps.driver.define.store_checks import MIN_FREE_BYTES, free_bytes
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.errors import SweepStopped

__all__ = ["CHECK_EVERY_S", "STOP_FREE_BYTES", "STORAGE_ERRNOS", "StorageWatch", "storage_error_stopped"]

# Tune's saved state is about 12 KB per trial (store_checks.MIN_FREE_BYTES), written as a
# new copy beside the old: 16 MiB leaves room for the last save of a sweep of several
# hundred trials, and for the sweep's marker and the MLflow writes it keeps.
STOP_FREE_BYTES = 16 * 1024 * 1024
assert STOP_FREE_BYTES < MIN_FREE_BYTES  # a sweep allowed to start is not stopped at once
CHECK_EVERY_S = 1.0  # a statvfs call: microseconds
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# Tune's copy of the experiment to the storage path logs its failures here, with a traceback,
# and its wait for that copy at a forced save there (an ERROR with the exception attached).
SYNCER_LOGGER = "ray.train._internal.syncer"
EXPERIMENT_STATE_LOGGER = "ray.tune.execution.experiment_state"
TUNE_LOGGER = "ray.tune.tune"
_STORAGE_FAILURES = ("No space left on device", "Disk quota exceeded", "Read-only file system",
                     "errno 28", "errno 122", "errno 30")


def _mib(count: int) -> str:
    return f"{count / 1024 / 1024:.1f} MiB"


def storage_error_stopped(error: OSError, storage: str) -> Optional[SweepStopped]:
    """A write of the sweep's own that failed for want of room (or a disk turned
    read-only), as the SweepStopped it means; None for any other error."""
    if error.errno not in STORAGE_ERRNOS:
        return None
    where = error.filename or storage
    return SweepStopped(f"the sweep stopped: writing {where} failed ({error.strerror}). Free space on that disk "
                        f"(or make it writable), then run the same command with --resume (same --storage-path "
                        f"{storage}).")


class StorageWatch:
    """Stops the sweep before its storage path fills up. Pickled with the sweep callback
    (Tune's state): plain values only; run_sweep sets a new one on every run."""

    def __init__(self, storage: str, say: Optional[Callable[[str], None]] = None,
                 stop_free: int = STOP_FREE_BYTES, every_s: float = CHECK_EVERY_S):
        self.storage, self.stop_free, self.every_s = storage, stop_free, every_s
        self.say = say
        self.reason: Optional[str] = None  # why the sweep stopped; None while it goes on
        self.free: Optional[int] = None
        self._next_check = 0.0
        self._failed_copy: Optional[str] = None
        self._interrupt: Optional[Callable[[], None]] = None

    def __getstate__(self):
        return {**self.__dict__, "say": None, "_interrupt": None}

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def check(self) -> None:
        """At each step of Tune's loop: stop the sweep when the storage path is nearly full
        or Tune's copy to it failed for want of room."""
        if self.tripped or time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + self.every_s
        try:
            self.free = free_bytes(self.storage)
        except OSError:
            return  # gone or unreadable for a moment: Tune's own copy says if it matters
        if self._failed_copy is not None:
            self.reason = f"Tune could not save the sweep's state under {self.storage}: {self._failed_copy}"
        elif self.free < self.stop_free:
            self.reason = (f"the storage path {self.storage} has {_mib(self.free)} free, under the "
                           f"{_mib(self.stop_free)} kept for Tune's saved state")
        else:
            return
        self._say(f"{self.reason}: stopping the sweep while its state can still be saved (running trials end as "
                  "interrupted; --resume runs them again)")
        if self._interrupt is not None:
            self._interrupt()

    def stopped(self) -> SweepStopped:
        free = f" ({_mib(self.free)} free now)" if self.free is not None else ""
        return SweepStopped(f"{self.reason}. The sweep stopped{free}; its finished trials are kept. Free space on "
                            f"that disk (at least {_mib(MIN_FREE_BYTES)}), then run the same command with --resume.")

    @contextlib.contextmanager
    def stopping_tune(self) -> Iterator[None]:
        """While Tune's loop runs: a trip stops it as Ctrl-C does, and Tune's warnings of a
        copy that failed for want of room become this watch's (one line, no traceback)."""
        copies = [logging.getLogger(SYNCER_LOGGER), logging.getLogger(EXPERIMENT_STATE_LOGGER)]
        tune_logger = logging.getLogger(TUNE_LOGGER)
        level = tune_logger.level
        for logger in copies:
            logger.addFilter(self._filter)
        self._interrupt = self._stop_tune
        try:
            yield
        finally:
            self._interrupt = None
            for logger in copies:
                logger.removeFilter(self._filter)
            tune_logger.setLevel(level)

    def _filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info:  # the exception itself is not in the message
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        failure = next((sign for sign in _STORAGE_FAILURES if sign in message), None)
        if failure is None:
            return True
        if self._failed_copy is None:
            lines = [line.strip() for line in message.splitlines() if failure in line]
            self._failed_copy = (lines[-1] if lines else failure)[:300]
            self._next_check = 0.0  # acted on at the next step of Tune's loop
        return False

    def _stop_tune(self) -> None:
        stop_tune = ray_adapter.tune_interrupt_handler()
        if stop_tune is None or threading.current_thread() is not threading.main_thread():
            raise self.stopped()  # out of Tune's loop: its state is as of its last save
        logging.getLogger(TUNE_LOGGER).setLevel(logging.CRITICAL)  # its "Resume with Tuner.restore" lines
        import signal

        stop_tune(signal.SIGUSR1, None)

    def _say(self, line: str) -> None:
        (self.say or (lambda text: print(text, flush=True)))(line)
