"""SIGINT, SIGTERM and SIGHUP end a sweep the way Ctrl-C ends a Ray Tune run, and the
script with a stated exit status (``SweepInterrupted``: 128 + the signal's number).

While trials run, Tune is told to stop as its own Ctrl-C handler would (it saves the
experiment; the running trials, the parent run and the marker end as interrupted); in
``Sweep.before_trials`` the sweep stops at once; anywhere else the step ends first. A second
signal stops at once (--resume closes what it left open).

Why the sweep handles them itself: ray.init sets SIGTERM to exit the driver, whose core
worker then finds its raylet gone and aborts (a C++ stack trace, the parent run FAILED), and
Tune handles SIGINT only. A SIGTERM to the driver's whole process group (bash's ``kill
%job``, systemd's KillMode=control-group) stops Ray's processes too, before the sweep can
close its trials: use KillMode=mixed, or signal the driver's pid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

from accelsweep.sweeps.driver.define.cli import SweepInterrupted
from accelsweep.trainables import ray_adapter
from accelsweep.trainables.environment_variables import environment_snapshot, restore_environment

__all__ = ["STOP_SIGNALS", "StopSignals", "SweepInterrupted"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Tune's own lines on a stop ("Resume experiment with: Tuner.restore(...)", "Trials did
# not complete") would contradict the sweep's: they are kept quiet while it stops.
TUNE_LOGGER = "ray.tune.tune"
AT_ONCE, AFTER_STEP, THROUGH_TUNE = "at once", "after the step", "through Tune"


class StopSignals:
    """The sweep's SIGINT, SIGTERM and SIGHUP handlers, as a context for its duration. What
    a signal does depends on the step the sweep is in: in ``through_tune`` it stops Tune's
    loop, in ``at_once`` it raises SweepInterrupted there; anywhere else it is acted on
    where the sweep calls ``raise_if_requested`` (between steps: the checks, a store being
    created, Ray starting, the parent run being opened or closed, seconds each).

    Tune's own SIGINT handler is off (TUNE_DISABLE_SIGINT_HANDLER): every signal reaches
    Tune's stop the same way. The previous handlers are put back after the sweep (run_sweep
    may run in a notebook). Only the main thread can set them: a sweep run from another
    thread leaves signals to the process's own handlers."""

    def __init__(self, say: Optional[Callable[[str], None]] = None):
        self.say = say or (lambda line: print(line, flush=True))
        self.received: Optional[int] = None
        self.mode = AFTER_STEP
        self.active = False
        self._previous: dict[int, Any] = {}
        self._tune_handler_setting: dict[str, Optional[str]] = {}
        self._tune_logger_level = logging.NOTSET
        self._on_request: list[Callable[[], None]] = []

    def when_requested(self, act: Callable[[], None]) -> None:
        """Have ``act`` called as soon as a stop is requested (in the signal handler: it must
        be quick and must not wait), e.g. to stop retrying a tracking store that is down."""
        self._on_request.append(act)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal works on the main thread only
        self._previous = {signum: signal.getsignal(signum) for signum in (*STOP_SIGNALS, signal.SIGUSR1)}
        self._unraisable_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        self._tune_handler_setting = environment_snapshot(["TUNE_DISABLE_SIGINT_HANDLER"])
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        self._tune_logger_level = logging.getLogger(TUNE_LOGGER).level
        if ray_adapter.tune_interrupt_handler() is not None:
            # An earlier Tune run's, which Tune leaves set: taken for this sweep's, it
            # would stop nothing while this sweep's fit sets up its own.
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self.active = True
        self.claim()
        return self

    def __exit__(self, *exc_info) -> None:
        if not self.active:
            return
        self.active = False
        sys.unraisablehook = self._unraisable_hook
        for signum, previous in self._previous.items():
            # None: a handler set outside Python (a C library's), which Python cannot set again.
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        restore_environment(self._tune_handler_setting)
        logging.getLogger(TUNE_LOGGER).setLevel(self._tune_logger_level)

    def _unraisable(self, unraisable) -> None:
        """A second signal's SweepInterrupted raised where Python can only print it (a
        finalizer, a weakref callback: "Exception ignored in ..."): not printed, and the
        signal delivered again, so that it stops the sweep where it can."""
        if isinstance(unraisable.exc_value, SweepInterrupted):
            os.kill(os.getpid(), unraisable.exc_value.signum)
            return
        self._unraisable_hook(unraisable)

    def claim(self) -> None:
        """Set the handlers (again): starting Ray puts its core worker's C++ handler over
        SIGTERM (it prints a stack trace, then calls the previous one)."""
        if self.active:
            for signum in STOP_SIGNALS:
                signal.signal(signum, self._handle)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """A step a signal may cut short (it has written nothing the sweep keeps)."""
        with self._mode(AT_ONCE):
            yield

    @contextlib.contextmanager
    def through_tune(self) -> Iterator[None]:
        """Tune's loop (``Tuner.fit``): a signal ends it as Tune's Ctrl-C does, one that
        came before it (the parent run being opened) as soon as it begins: its state is
        saved then, which --resume needs."""
        with self._mode(THROUGH_TUNE):
            if self.requested:
                self._stop_tune_when_it_begins()
            yield

    def raise_if_requested(self, result: Any = None) -> None:
        if self.received is not None:
            raise SweepInterrupted(self.received, result)

    @contextlib.contextmanager
    def _mode(self, mode: str) -> Iterator[None]:
        before, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = before

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            _away_from_terminal()
        if self.received is not None:
            self._say(f"{name} again: stopping at once")
            raise SweepInterrupted(self.received)
        self.received = signum
        for act in self._on_request:
            act()
        if self.mode == AT_ONCE:
            raise SweepInterrupted(signum)
        if self.mode == THROUGH_TUNE:
            stop_tune = ray_adapter.tune_interrupt_handler()
            if stop_tune is None:
                self._stop_tune_when_it_begins()
            else:
                logging.getLogger(TUNE_LOGGER).setLevel(logging.CRITICAL)
                stop_tune(signal.SIGUSR1, frame)
        self._say(f"{name}: stopping the sweep; trials still running end as interrupted (--resume runs them "
                  f"again). {name} again stops at once")

    def _stop_tune_when_it_begins(self) -> None:
        """Tune is setting its loop up (seconds): once its handler is set, signal it. A
        thread watches for it; the signal makes Tune's handler run on the main thread."""
        def signal_tune() -> None:
            while self.mode == THROUGH_TUNE:
                if ray_adapter.tune_interrupt_handler() is not None:
                    logging.getLogger(TUNE_LOGGER).setLevel(logging.CRITICAL)
                    os.kill(os.getpid(), signal.SIGUSR1)
                    return
                time.sleep(0.05)

        threading.Thread(target=signal_tune, name="accelsweep-stop-tune", daemon=True).start()

    def _say(self, line: str) -> None:
        try:
            self.say(line)
        except (RuntimeError, OSError):  # the signal came mid-write to the same stream; a closed terminal
            pass


def _away_from_terminal() -> None:
    """Point the standard streams that are a terminal at /dev/null (as under nohup): the
    terminal hung up, and a write to it fails (EIO) from now on, which would fail the writes
    that close the sweep's runs. SIGHUP is the common end of a sweep started by hand on a
    cluster's head node: run it under nohup, tmux or screen to keep it past a logout."""
    for fd in (0, 1, 2):
        try:
            if not os.isatty(fd):
                continue
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, fd)
            os.close(null)
        except OSError:
            pass
