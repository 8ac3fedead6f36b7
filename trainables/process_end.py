"""Ending a process that has done its work: the exit handlers run, the output is
flushed, then the process exits without the interpreter's teardown.

That teardown only frees, one object at a time, the heap that torch, Ray, MLflow and
scikit-learn built: about 3 s of one core after a sweep has printed its summary, and as
long again after a fresh-process trial has sent its last result, while its parent waits
for the exit status (benchmarks/process_end_cost.py). Nothing of it is kept.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["end_process"]


def end_process(status: int) -> NoReturn:
    """End this process with ``status``: the exit handlers run (Ray's shutdown, logging's
    flush, MLflow's), the output is flushed, then the process exits without the
    interpreter's teardown. While a thread of the process's own still runs, it exits as
    usual instead (sys.exit): the interpreter waits for that thread."""
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.current_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()  # each handler once, then none are left
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status)
