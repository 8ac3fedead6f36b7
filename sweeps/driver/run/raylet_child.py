"""Run a command that dies with its parent: ``python -S raylet_child.py PROGRAM ARGS...``.

The local Ray instance's raylet starts its two agents (DashboardAgent, RuntimeEnvAgent)
without a parent-death signal, and when their raylet dies with a SIGKILLed driver they
notice it but block for 60 s on the dead GCS, and may never answer SIGTERM: with the
sweep's reaper killed too, they stay for good. local_ray.start has the raylet start them
through this shim, which asks the kernel for SIGKILL when the parent (the raylet) dies,
then becomes the agent itself (exec keeps the pid, the parent and the death signal).
Standard library only, started with -S: it adds no start-up time.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: nothing would signal
        os._exit(1)
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
