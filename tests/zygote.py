"""Commands the tests start, forked from one process that has already imported what they import.

A sweep's command spends about 6 s of CPU importing Ray Tune, MLflow, Optuna, Matplotlib and
scikit-learn before its first line (benchmarks/results/test_suite.md), and the suite starts
well over a hundred of them on a 2-core machine. Each test worker starts one zygote: a
process that imports those once and then forks a child per command, the way
multiprocessing's forkserver (set_forkserver_preload) serves its workers. The child is a
real process of its own: its pid takes signals, its own session or process group when
asked, its exit status comes back as waitpid's, its output goes to the pipes or files the
test gave. It runs the script or module as ``python`` would run it (``__main__``, argv,
sys.path[0], the environment and folder given) and ends as the interpreter ends (non-daemon
threads joined, exit handlers run, output flushed).

``ZygotePopen`` is subprocess.Popen with that one difference, installed for the test
session by tests/conftest.py. It routes a command to the zygote only when that cannot
change what the command does:
- ``python SCRIPT.py ...``, ``python -m accelsweep...|benchmarks...|tests...`` and the
  ``accelsweep`` console script; never ``-c`` or interpreter flags, a shell, preexec_fn,
  pass_fds, another user or umask;
- an environment equal to the zygote's in every variable the preloaded libraries read when
  imported (IMPORT_TIME_VARIABLES: Ray's constants, OpenMP's and the allocator's settings,
  Python's own); a test that sets one of those gets a plain subprocess.
A test marked ``real_process`` (the interpreter's own start or exit is what it checks)
always gets a plain subprocess, and ACCELSWEEP_TEST_ZYGOTE=0 turns the zygote off.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Optional

PRELOAD = ("numpy", "pandas", "pyarrow", "ray", "ray.tune", "ray.train", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.store.db.utils", "alembic.command", "sqlalchemy", "optuna", "optuna.importance", "matplotlib",
           "matplotlib.figure", "matplotlib.backends.backend_agg", "requests", "pydantic")
IMPORT_TIME_VARIABLES = ("RAY_", "PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_", "MALLOC_", "LD_", "MPL",
                         "MATPLOTLIB", "TMPDIR", "HOME", "XDG_", "GRPC_", "LANG", "LC_")
# Of those, read only when called, not when imported: what an in-process sweep leaves in a
# test process's environment (Ray's breakpoint hook, Tune's output switch), and the cluster
# a command joins (ray.init reads RAY_ADDRESS; Ray's modules only name it).
READ_WHEN_CALLED = ("PYTHONBREAKPOINT", "RAY_AIR_NEW_OUTPUT", "RAY_ADDRESS")
# What the preloaded libraries put in their own process's environment when imported, so in
# a test's after its first in-process sweep: the zygote has them too (importing Ray sets
# RAY_CLIENT_MODE=0, as good as unset; scikit-learn KMP_DUPLICATE_LIB_OK=True; scikit-learn
# and joblib KMP_INIT_AT_FORK=FALSE, which only Intel's OpenMP reads, not torch's libgomp: a
# test that imported either made the next command, and its Ray workers, plain processes).
SET_WHEN_IMPORTED = {("RAY_CLIENT_MODE", "0"), ("KMP_DUPLICATE_LIB_OK", "True"), ("KMP_INIT_AT_FORK", "FALSE")}
ROUTED_MODULES = ("accelsweep", "benchmarks", "tests")
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "accelsweep")
HEADER_BYTES = 16
enabled = os.environ.get("ACCELSWEEP_TEST_ZYGOTE", "1") != "0"


# --- the zygote ------------------------------------------------------------------------


def serve(socket_path: str, preload: tuple[str, ...] = PRELOAD, accepts=None, child_setup=None) -> None:
    """Import ``preload``, then fork a child per request on ``socket_path`` until the
    process that started this one ends. ``accepts(request)`` False: the client is told to
    run the command itself; ``child_setup(request)`` runs in the child, in the command's
    environment and folder, before the command.
    A request with ``end_with_client`` has its child killed when its client's connection
    closes first (a client that stands in for the child, killed in its place)."""
    for name in preload:
        try:
            __import__(name)
        except ImportError:  # a venv without it (the XLA lane's): its commands import it themselves
            pass
    # What the imports left, out of every collection of the children (what prefork servers
    # do): a child's full collection walked the half a million objects, writing to each, so
    # it copied every page it shares with this process (0.4 s of CPU a collection, not 0.25).
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    print("ready", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:  # a test process that ended without stopping it (killed) ends it too
        for key, _ in selector.select(timeout=1.0):
            if key.data is not None and selector.get_map().get(key.fd) is not key:
                # Handled already in this batch: a child's end closes its client's connection,
                # and a client's end kills its child. Acting again ended the zygote (KeyError:
                # the fd unregistered), and every later command or worker then started plainly.
                continue
            if key.data is None:
                _fork_one(listener, selector, accepts, child_setup)
            elif key.data[0] == "client":  # its client closed the connection (or wrote, which it never does)
                selector.unregister(key.fd)
                try:
                    os.kill(key.data[1], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                _, pid, connection = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                if connection.fileno() in selector.get_map():
                    selector.unregister(connection)
                try:
                    connection.sendall(f"{status}\n".encode())
                except OSError:
                    pass  # the test is gone; the child is reaped all the same
                connection.close()
    import shutil

    shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)  # its socket and log


def serve_commands(socket_path: str) -> None:
    """The test process's zygote: a command's sweep that starts a Ray instance of its own has
    that instance's workers forked by the test process's worker zygote (tests/worker_zygote.py)."""
    from tests import worker_zygote

    serve(socket_path, child_setup=worker_zygote.in_a_command)


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError(f"the client closed its connection after {len(data)} of {size} bytes")
        data += chunk
    return data


def _fork_one(listener: socket.socket, selector: selectors.BaseSelector, accepts, child_setup) -> None:
    # A client can go at any moment (a raylet kills a worker it is still starting when that
    # worker's job ends): its request is dropped, and the zygote serves the next. An error
    # here once ended the zygote, and every later worker of its instance started plainly.
    connection, _ = listener.accept()
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(connection, HEADER_BYTES, 3)
        header += _read_exactly(connection, HEADER_BYTES - len(header))
        request = json.loads(_read_exactly(connection, int(header)))
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        connection.close()
        return
    if accepts is not None and not accepts(request):
        for fd in fds:
            os.close(fd)
        try:
            connection.sendall(b"plain\n")
        except OSError:
            pass  # its client is gone: it needs no answer
        connection.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        # Nothing of the zygote's own stays open in the command: its listener, the other
        # commands' connections and process handles.
        for key in list(selector.get_map().values()):
            if key.data is not None and key.data[0] == "child":
                key.data[2].close()
                os.close(key.fd)
        selector.close()
        listener.close()
        _run_child(request, fds, connection, child_setup)
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall(f"{pid}\n".encode())
    except OSError:  # its client went while it was forked: the process it stood in for goes too
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        connection.close()
        return
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, ("child", pid, connection))
    if request.get("end_with_client"):
        selector.register(connection, selectors.EVENT_READ, ("client", pid))


def _run_child(request: dict, fds: list[int], connection: socket.socket, child_setup=None) -> None:
    connection.close()
    if request["new_session"]:
        os.setsid()
    elif request["process_group"] is not None:
        os.setpgid(0, request["process_group"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for reread in REREAD_IN_CHILD.values():
        reread()
    if child_setup is not None:
        child_setup(request)
    code = 0
    interrupted = False
    try:
        _run_as_main(request["argv"])
    except SystemExit as ended:
        code = _exit_code(ended.code)
    except KeyboardInterrupt:
        _print_traceback()
        interrupted = True
    except BaseException:
        _print_traceback()
        code = 1
    # The interpreter's own end: non-daemon threads, then exit handlers, then the output.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as python ends on an uncaught KeyboardInterrupt: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _print_traceback() -> None:
    """The traceback python prints, from the script's first frame (not this module's or runpy's)."""
    kind, error, frames = sys.exc_info()
    while frames is not None and frames.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
        frames = frames.tb_next
    sys.excepthook(kind, error.with_traceback(frames), frames)  # the hook prints the error's own


def _run_as_main(argv: list[str]) -> None:
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# --- the tests' side -------------------------------------------------------------------


class Zygote:
    """One per test process, started at its first routed command."""

    _lock = threading.Lock()
    _started: Optional["Zygote"] = None
    _failed = False
    # Why the last command that could have been routed was not (tests/test_zygote.py says it).
    why_plain = ""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="zygote-", dir="/tmp")  # a Unix socket's path is short
        self.socket_path = os.path.join(self.folder, "socket")
        self.log_path = os.path.join(self.folder, "zygote.log")
        # Only what the preloaded libraries read at import, as the session began (not as the
        # test that happens to start it has them): a password a test exported stays out of
        # the zygote, and out of /proc/PID/environ of every command it forks.
        self.environment = SESSION_ENVIRONMENT
        with open(self.log_path, "w") as log:
            self.process = _PlainPopen([sys.executable, "-c", "import sys; from tests.zygote import serve_commands; "
                                        "serve_commands(sys.argv[1])", self.socket_path],
                                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                       env={**self.environment, "PATH": os.environ.get("PATH", os.defpath)},
                                       stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True)
        ready = self.process.stdout.readline()
        if ready.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the zygote did not start: {open(self.log_path).read()[-2000:]}")

    @classmethod
    def get(cls) -> Optional["Zygote"]:
        with cls._lock:
            if cls._started is not None and cls._started.process.poll() is not None:
                # Ended under a test (a signal to its process group): the next command starts another.
                cls.why_plain = f"the zygote ended (exit {cls._started.process.returncode}); started again"
                cls._started = None
            if cls._started is None and not cls._failed:
                try:
                    cls._started = Zygote()
                    atexit.register(cls.stop)  # a process that imported tests/conftest.py outside pytest
                except (OSError, RuntimeError) as error:
                    cls._failed = True
                    cls.why_plain = f"the zygote did not start: {error}"
                    print(f"tests/zygote.py: commands run as plain subprocesses: {error}", file=sys.stderr)
            return cls._started

    @classmethod
    def stop(cls) -> None:
        with cls._lock:
            started, cls._started = cls._started, None
        if started is not None:
            started.process.kill()
            started.process.wait()
            started.process.stdout.close()
            for name in os.listdir(started.folder):
                os.unlink(os.path.join(started.folder, name))
            os.rmdir(started.folder)

    def compatible(self, env: dict[str, str]) -> bool:
        return _imported(env) == self.environment

    def launch(self, argv: list[str], env: dict[str, str], cwd: str, new_session: bool,
               process_group: Optional[int], fds: list[int]) -> tuple[socket.socket, int]:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.socket_path)
        from tests import worker_zygote

        body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "new_session": new_session,
                           "process_group": process_group, **worker_zygote.for_a_command(env)}).encode()
        socket.send_fds(connection, [f"{len(body):0{HEADER_BYTES}d}".encode()], fds)
        connection.sendall(body)
        return connection, int(_read_line(connection, block=True))


def _imported(environment) -> dict[str, str]:
    return {name: value for name, value in environment.items()
            if name.startswith(IMPORT_TIME_VARIABLES) and name not in READ_WHEN_CALLED
            and name not in REREAD_IN_CHILD and (name, value) not in SET_WHEN_IMPORTED}


def _reread_ray_cluster_switch() -> None:
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR,
                                                              not ray_constants.IS_WINDOWS_OR_OSX)


def _reread_ray_config() -> None:
    from ray._raylet import Config

    Config.initialize("")  # as Ray itself does when it turns token auth on in a process


# Read at import into a value that the child sets again from its own environment, as Ray's
# import computes it: the switch a driver joining a loopback cluster sets in its own process
# (trainables/ray_adapter.keep_loopback), so in a test process after such a test; Ray's
# authentication mode, in its C++ config (a command run as a user runs it leaves it unset:
# token auth, where the session turns it off).
REREAD_IN_CHILD = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": _reread_ray_cluster_switch,
                   "RAY_AUTH_MODE": _reread_ray_config}


def _read_line(connection: socket.socket, block: bool, pending: Optional[bytearray] = None) -> Optional[str]:
    pending = bytearray() if pending is None else pending
    connection.setblocking(block)
    while b"\n" not in pending:
        try:
            chunk = connection.recv(64)
        except BlockingIOError:
            return None
        if not chunk:
            raise ConnectionError("the zygote closed the connection without the command's exit status")
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode()


_PlainPopen = subprocess.Popen
SESSION_ENVIRONMENT: dict[str, str] = {}


def install() -> None:
    """This process's commands from now on through ZygotePopen, taking the import-time
    variables as they are now (tests/conftest.py: before any test runs) as the zygote's."""
    global SESSION_ENVIRONMENT
    SESSION_ENVIRONMENT = _imported(os.environ)
    subprocess.Popen = ZygotePopen


def routed_argv(args, executable, shell: bool) -> Optional[list[str]]:
    """What the zygote's child runs (a script's path or -m MODULE, then its arguments), or
    None for a command it must not run."""
    if shell or executable is not None or isinstance(args, (str, bytes)):
        return None
    args = [os.fspath(arg) for arg in args]
    if not args or not all(isinstance(arg, str) for arg in args):
        return None
    if args[0] == CONSOLE_SCRIPT:
        return [CONSOLE_SCRIPT, *args[1:]]
    if args[0] != sys.executable or len(args) < 2:
        return None
    if args[1] == "-m" and len(args) > 2 and args[2].split(".")[0] in ROUTED_MODULES:
        return args[1:]
    if args[1].endswith(".py") and not args[1].startswith("-"):
        return args[1:]
    return None


def _log_decision(args, argv, how: str, why: str) -> None:
    """With ACCELSWEEP_TEST_ZYGOTE_LOG=FILE, a line per command a test starts: how, why, which test."""
    path = os.environ.get("ACCELSWEEP_TEST_ZYGOTE_LOG")
    if not path or (argv is None and how == "plain" and not str(args).count(sys.executable)):
        return
    with open(path, "a") as log:
        log.write(json.dumps({"how": how, "why": why, "command": [str(a) for a in list(args)[:3]]
                              if not isinstance(args, (str, bytes)) else str(args)[:200],
                              "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n")


class ZygotePopen(_PlainPopen):
    _zygote_connection: Optional[socket.socket] = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids,
                       uid, umask, start_new_session, process_group):
        argv = routed_argv(args, executable, shell) if enabled else None
        plain = (argv is None or preexec_fn is not None or pass_fds or gid is not None or gids is not None
                 or uid is not None or umask >= 0)
        zygote = None if plain else Zygote.get()
        environment = {os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()}
        if zygote is not None and not zygote.compatible(environment):
            changed = sorted(set(_imported(environment).items()) ^ set(zygote.environment.items()))
            Zygote.why_plain = f"an import-time variable differs from the session's: {sorted({k for k, _ in changed})}"
            zygote = None
        _log_decision(args, argv, "plain" if zygote is None else "zygote",
                      "not a command it runs" if plain else Zygote.why_plain if zygote is None else "")
        if zygote is None:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                                          process_group)
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        self._zygote_pending = bytearray()
        self._zygote_connection, self.pid = zygote.launch(
            argv, environment, os.fspath(cwd) if cwd is not None else os.getcwd(), bool(start_new_session),
            process_group if process_group is not None and process_group >= 0 else None, fds)
        self._child_created = True
        # The child has its ends of the pipes; this process closes them, as Popen does.
        devnull = getattr(self, "_devnull", None)
        if p2cread != -1 and p2cwrite != -1 and p2cread != devnull:
            os.close(p2cread)
        if c2pwrite != -1 and c2pread != -1 and c2pwrite != devnull:
            os.close(c2pwrite)
        if errwrite != -1 and errread != -1 and errwrite != devnull:
            os.close(errwrite)
        if devnull is not None:
            os.close(devnull)
        self._closed_child_pipe_fds = True

    def _zygote_status(self, block: bool) -> Optional[int]:
        try:
            line = _read_line(self._zygote_connection, block, self._zygote_pending)
        except ConnectionError:
            return 255 << 8  # the zygote is gone and the status with it
        if line is None:
            return None
        self._zygote_connection.close()
        return int(line)

    def _try_wait(self, wait_flags):
        if self._zygote_connection is None:
            return super()._try_wait(wait_flags)
        status = self._zygote_status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate=None, **options):
        if self._zygote_connection is None:
            return super()._internal_poll(_deadstate, **options)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    status = self._zygote_status(block=False)
                    if status is not None:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode
