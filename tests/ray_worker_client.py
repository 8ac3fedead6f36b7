"""Stands in for a Ray worker process of the session's shared instance (tests/worker_zygote.py).

The raylet starts ``python default_worker.py ...`` (or ``setup_worker.py``) for each worker;
the instance's launcher runs this file instead, with the real interpreter's path first. It
asks the worker zygote to fork the worker, passing its standard streams, environment and
folder, then waits for it, passes on the signals it gets, and ends as the worker ended (its
exit code, or the same signal). Refused (an environment the zygote's imports were not made
with) or no zygote: it becomes the real interpreter, exactly the command the raylet asked
for. Standard library only: it runs with ``-I -S``, in milliseconds.
"""

import json
import os
import signal
import socket
import sys

HEADER_BYTES = 16  # as tests/zygote.py reads a request
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main() -> None:
    python, argv = sys.argv[1], sys.argv[2:]
    socket_path = os.environ.get("ACCELSWEEP_WORKER_ZYGOTE")
    forked = None
    if socket_path:
        try:
            forked = ask_to_fork(socket_path, argv)
        except OSError as error:  # no zygote (ended, or never started): the plain command
            print(f"tests/ray_worker_client.py: the worker zygote did not answer ({error}); a plain worker",
                  file=sys.stderr, flush=True)
    if forked is None:
        os.execv(python, [python, *argv])
    wait_as(*forked)


def ask_to_fork(socket_path: str, argv: list):
    """(pid, the connection its exit status comes on), or None when the zygote refuses."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    # A process group of its own, as the raylet gives each worker it starts: it kills a
    # worker's group when the worker ends (the zygote's would take every other worker with it).
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "new_session": False,
                       "process_group": 0, "end_with_client": True}).encode()
    socket.send_fds(connection, [f"{len(body):0{HEADER_BYTES}d}".encode()], [0, 1, 2])
    connection.sendall(body)
    replies = connection.makefile("rb")
    first = replies.readline().strip()
    if first in (b"plain", b""):
        connection.close()
        return None
    return int(first), replies


def wait_as(pid: int, replies) -> None:
    """Until the worker ends, passing on the signals this process gets; then end as it did."""
    def pass_on(number, _frame):
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass

    for number in FORWARDED_SIGNALS:
        signal.signal(number, pass_on)
    try:
        status = replies.readline().strip()
    except OSError:
        status = b""
    if not status:  # the zygote ended under it, and the worker with it
        os._exit(255)
    status = int(status)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # no handler of those to reset
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
