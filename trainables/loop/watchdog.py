"""A deadline on a stretch of a trial's own thread: when it passes, an exception is
raised in that thread, so a step or a compile that has already run too long is
abandoned instead of waited for.

    with Watchdog() as dog:
        dog.expect(60.0, CompileTimeout, "compile ran past --max-compile-s 60")
        first_step()
        dog.clear()

The deadline is kept to within about one long C call, not to the microsecond
(``Watchdog`` says why).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Optional

RESEND_S = 0.2


class TrialAborted(BaseException):
    """Raised in a trial's thread when its watchdog's deadline passed. Subclasses say
    why; the message is set when the trial catches it (``Watchdog.reason``). A
    BaseException, as KeyboardInterrupt is: a library's ``except Exception`` (torch.compile
    wraps what fails inside it, or falls back) must not swallow or reword it."""


class Watchdog:
    """The exception is delivered with CPython's PyThreadState_SetAsyncExc: it is raised at
    the next bytecode the thread runs. Python code between torch ops (a model's forward,
    torch.compile's tracing and lowering) reaches one often; a single long C call (one big
    matmul, a backward pass on the CPU, a C++ compiler subprocess) finishes first. Python
    drops an exception raised inside a weakref callback or a destructor ("Exception
    ignored in ..."), so it is sent again every RESEND_S until the thread has it."""

    def __init__(self, thread_id: Optional[int] = None):
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self._lock = threading.Condition()
        self._deadline: Optional[float] = None
        self._exception: type[TrialAborted] = TrialAborted
        self._fired = False
        self._closed = False
        self.reason = ""
        self._thread = threading.Thread(target=self._watch, name="accelsweep-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._withdraw(close=True)
        self._thread.join()

    def expect(self, seconds: float, exception: type[TrialAborted], reason: str) -> None:
        """Raise ``exception`` in the watched thread unless ``clear`` comes within ``seconds``."""
        with self._lock:
            self._deadline = time.monotonic() + seconds
            self._exception, self.reason, self._fired = exception, reason, False
            self._lock.notify()

    def clear(self) -> None:
        """The stretch ended in time, or just too late: in that case (the deadline passed
        while this thread was still inside a C call), its exception is raised here, not
        later somewhere else."""
        with self._lock:
            self._deadline = None
            if self._fired:
                self._cancel_pending()
                self._fired = False
                raise self._exception(self.reason)

    def disarm(self) -> None:
        """End the stretch without a verdict (it ended in an error of its own): nothing more
        is sent, and what was sent but not yet raised is withdrawn."""
        self._withdraw(close=False)

    def _withdraw(self, close: bool) -> None:
        """No deadline, nothing pending (and, with ``close``, the watch ended). A resend may
        land in here before the lock is taken: withdraw again until it held."""
        while True:
            try:
                with self._lock:
                    self._closed = self._closed or close
                    self._deadline = None
                    self._fired = False
                    self._cancel_pending()
                    self._lock.notify()
                return
            except TrialAborted:
                continue

    def _cancel_pending(self) -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                if self._deadline is None:
                    self._lock.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                self._fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                           ctypes.py_object(self._exception))
                self._deadline = time.monotonic() + RESEND_S  # until clear() or close: it may be dropped
