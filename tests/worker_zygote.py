"""The worker processes of the test session's Ray instances, forked from one process that
has imported what a trial imports.

A trial's Ray worker spends about 7 s of CPU before its first step on imports alone: Ray's
worker (and, for a trial with a runtime environment, Ray's setup_worker.py before it),
torch, torchvision (which imports torch._dynamo) and timm (benchmarks/results/test_suite.md).
The suite's sweeps start hundreds of them on a 2-core machine. Each test process starts one
worker zygote; the Ray instances it starts are told that a launcher is their Python: the
shared instance (tests/shared_ray.py) and every private one that a sweep's driver starts in
a command forked by tests/zygote.py or in the test process itself (``route_new_instances``).
The raylet's command for a worker runs tests/ray_worker_client.py, which asks this zygote
to fork the worker; every other Python process of the instance (its agents) is the real
interpreter, unchanged.

The forked worker is the one the raylet asked for: its argv, environment, folder and
standard streams, registered with the raylet under its own pid (Ray matches a worker to
the process it started by a startup token, not a pid: containers and setup_worker.py start
workers through other processes too). A trial whose runtime environment sets a variable
that the preloaded libraries read when imported (a CPU trial's LD_PRELOAD allocator, an
inductor trial's TORCHINDUCTOR_* cache switches) gets the real interpreter, as Ray's
setup_worker.py would exec it; so does a worker whose environment differs from the
zygote's in such a variable (a test that sets OMP_NUM_THREADS or HOME for its sweep). The
zygote never runs a torch op (a forked OpenMP pool would hang), so what a trial measures is
its own process's.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Optional

from tests import zygote

# Not Ray: importing ray._raylet builds Ray's C++ config from the environment once per
# process, and a worker's job id is in it (RAY_JOB_ID, a flag no later call reads again).
PRELOAD = ("numpy", "torch", "torchvision", "timm")
# What the libraries above read when imported: the test zygote's list without Ray's and
# gRPC's (imported in the forked worker, from its own environment: its job id, its
# instance's switches), with torch's and its companions'.
# (Not TF_: TensorFlow is not among them; importing JAX in a test process sets TF_CPP_MIN_LOG_LEVEL.)
IMPORT_TIME_VARIABLES = (*(prefix for prefix in zygote.IMPORT_TIME_VARIABLES if prefix not in ("RAY_", "GRPC_")),
                         "TORCH", "TRITON", "CUDA", "NVIDIA", "XLA", "PJRT", "NEURON", "JAX", "HF_",
                         "HUGGINGFACE", "TIMM", "DNNL", "ONEDNN", "KINETO", "NUMEXPR")
# Of those, read only when called: Hugging Face's token (a secret some tests' sweeps carry).
READ_WHEN_CALLED = (*zygote.READ_WHEN_CALLED, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _read_dynamo_cache_again() -> None:
    package = sys.modules.get("torch._dynamo.package")
    if package is not None and hasattr(package, "DynamoCache"):
        package.DynamoCache = package.DiskDynamoCache(os.path.join(package.cache_dir(), "dynamo"))


# Read at import into a value the forked worker sets again from its own environment, as the
# import computes it: inductor's cache folder, which torch._dynamo.package's import both
# reads (its DynamoCache) and sets when unset (so in every test process that imported
# torchvision); a trial's compile cache sets it in its runtime environment.
READ_AGAIN_IN_WORKER = {"TORCHINDUCTOR_CACHE_DIR": _read_dynamo_cache_again}
WORKER_SCRIPTS = ("default_worker.py", "setup_worker.py")
SOCKET_VARIABLE = "ACCELSWEEP_WORKER_ZYGOTE"
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_worker_client.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def imported(environment) -> dict[str, str]:
    """The variables of ``environment`` that change what the preloaded libraries did when imported."""
    return {name: value for name, value in environment.items()
            if name.startswith(IMPORT_TIME_VARIABLES) and name not in READ_WHEN_CALLED and name not in READ_AGAIN_IN_WORKER and (name, value) not in zygote.SET_WHEN_IMPORTED}


# --- the zygote ------------------------------------------------------------------------

_own_environment: dict[str, str] = {}


def serve_workers(socket_path: str) -> None:
    _own_environment.update(imported(os.environ))
    zygote.serve(socket_path, PRELOAD, accepts=_is_a_worker_it_can_fork, child_setup=_worker_setup)


def _is_a_worker_it_can_fork(request: dict) -> bool:
    """A worker (not another of the instance's processes) with the variables the zygote's
    imports were made with."""
    if not request["argv"] or os.path.basename(request["argv"][0]) not in WORKER_SCRIPTS:
        return _decided(request, False, "not a worker")
    differing = set(imported(request["env"]).items()) ^ set(_own_environment.items())
    if differing:
        return _decided(request, False, f"import-time variables differ: {sorted({name for name, _ in differing})}")
    return _decided(request, True, "")


def _decided(request: dict, forked: bool, why: str) -> bool:
    """With ACCELSWEEP_TEST_ZYGOTE_LOG=FILE, a line per worker the raylet starts; a refusal
    also on this zygote's stderr (zygote.log in its folder), where a test that finds a
    worker not forked reads why."""
    if not forked:
        print(f"refused {os.path.basename(request['argv'][0]) if request['argv'] else '?'}: {why}",
              file=sys.stderr, flush=True)
    path = os.environ.get("ACCELSWEEP_TEST_ZYGOTE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({"how": "worker-zygote" if forked else "worker-plain", "why": why,
                                  "command": [os.path.basename(a) for a in request["argv"][:1]]}) + "\n")
    return forked


def _read_again() -> None:
    for read in READ_AGAIN_IN_WORKER.values():
        read()


def _worker_setup(request: dict) -> None:
    """What the imports read, from the worker's environment. Ray's setup_worker.py ends by
    exec'ing the worker with the runtime environment's variables set; here, in the same
    process, where none of those would have changed an import."""
    _read_again()
    if os.path.basename(request["argv"][0]) != "setup_worker.py":
        return
    from ray._private.runtime_env.context import RuntimeEnvContext
    from ray._private.utils import update_envs
    from ray.core.generated.common_pb2 import Language

    exec_worker = RuntimeEnvContext.exec_worker

    def run_worker_here(context, passthrough_args, language):
        set_at_import = {name: value for name, value in context.env_vars.items()
                         if imported({name: value}) and os.environ.get(name) != value}
        if (language != Language.PYTHON or context.command_prefix or context.override_worker_entrypoint
                or os.path.realpath(context.py_executable) != os.path.realpath(sys.executable) or set_at_import):
            return exec_worker(context, passthrough_args, language)
        update_envs(context.env_vars)
        _read_again()
        zygote._run_as_main(list(passthrough_args))

    RuntimeEnvContext.exec_worker = run_worker_here


# --- the session's side ----------------------------------------------------------------


@dataclass
class WorkerZygote:
    process: subprocess.Popen = field(repr=False)
    folder: str  # its socket and log (it removes them when it ends)
    launcher: str  # the Python the instance is started with (in the instance's own folder)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.folder, "workers.sock")

    def stop(self) -> None:
        """It (its workers end with the instance's raylet, or with their client)."""
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(environment: dict[str, str]) -> Optional[WorkerZygote]:
    """A worker zygote with ``environment`` (its import-time variables are the ones a worker
    must have to be forked), and in its folder the launcher that sends an instance's workers
    to it; None when turned off (ACCELSWEEP_TEST_ZYGOTE=0 turns off both zygotes,
    ACCELSWEEP_TEST_WORKER_ZYGOTE=0 this one) or when it did not start."""
    if not zygote.enabled or os.environ.get("ACCELSWEEP_TEST_WORKER_ZYGOTE", "1") == "0":
        return None
    folder = tempfile.mkdtemp(prefix="zygote-workers-", dir="/tmp")  # a Unix socket's path is short
    launcher = os.path.join(folder, "python")
    with open(launcher, "w") as script:
        script.write("#!/bin/sh\n"
                     "# A test Ray instance's Python: its workers forked by tests/worker_zygote.py.\n"
                     'case "$1" in\n'
                     f'  */default_worker.py|*/setup_worker.py) exec "{sys.executable}" -I -S "{CLIENT}" '
                     f'"{sys.executable}" "$@" ;;\n'
                     "esac\n"
                     f'exec "{sys.executable}" "$@"\n')
    os.chmod(launcher, os.stat(launcher).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    started = WorkerZygote(None, folder, launcher)
    with open(os.path.join(folder, "zygote.log"), "w") as log:
        started.process = zygote._PlainPopen(
            [sys.executable, "-c", "import sys; from tests.worker_zygote import serve_workers; "
             "serve_workers(sys.argv[1])", started.socket_path],
            cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True)
    ready = started.process.stdout.readline()
    started.process.stdout.close()
    if ready.strip() != "ready":
        why = open(log.name).read()[-1000:]
        started.stop()
        print(f"tests/worker_zygote.py: Ray workers start as plain processes: the zygote did not start ({why})",
              file=sys.stderr)
        return None
    return started


# This test process's worker zygotes, by the import-time variables they were started with:
# one for the session's, and one for an instance started with others (the shared instance,
# when a test before it left one in this process's environment).
_session_workers: dict[frozenset, WorkerZygote] = {}
_session_lock = threading.Lock()
_session_environment: dict[str, str] = {}


def install() -> None:
    """Take the import-time variables as they are now (tests/conftest.py: before any test
    runs) as the session's, and route the workers of the Ray instances this process starts
    to a worker zygote with this process's variables, if one runs."""
    _session_environment.update(imported(os.environ))
    route_new_instances(lambda: session_workers(os.environ, start_one=False))


def session_workers(environment=None, start_one: bool = True) -> Optional[WorkerZygote]:
    """This test process's worker zygote for workers with ``environment`` (default: the
    session's as it began, ``install``), started at the first call that asks for one."""
    if os.environ.get("ACCELSWEEP_TEST_WORKER_ZYGOTE", "1") == "0":  # also set by a test for its own instance
        return None
    wanted = imported(environment) if environment is not None else _session_environment
    key = frozenset(wanted.items())
    with _session_lock:
        running = _session_workers.get(key)
        if running is not None and running.process.poll() is not None:
            del _session_workers[key]  # ended under a test (its process group signalled): another
            running = None
        if running is None and start_one:
            log = {name: os.environ[name] for name in ("ACCELSWEEP_TEST_ZYGOTE_LOG",) if name in os.environ}
            running = start({**wanted, "PATH": os.environ.get("PATH", os.defpath), **log})
            if running is not None:
                _session_workers[key] = running
        return running


def stop_session_workers() -> None:
    with _session_lock:
        started = list(_session_workers.values())
        _session_workers.clear()
    for running in started:
        running.stop()


def route_new_instances(workers) -> None:
    """Ray instances this process starts from now on (``ray.init()`` with no address) have
    their workers forked by ``workers()`` (a WorkerZygote, or None: plain workers): the
    raylet is started with its launcher as its Python. Only the raylet's start sees it: the
    rest of the process keeps its own interpreter's path."""
    import ray._private.services as services

    start_raylet = getattr(services.start_raylet, "__wrapped__", services.start_raylet)

    @functools.wraps(start_raylet)
    def start_raylet_forking_workers(*args, **kwargs):
        forking = workers()
        if forking is None:
            return start_raylet(*args, **kwargs)
        python, had_socket = sys.executable, os.environ.get(SOCKET_VARIABLE)
        sys.executable, os.environ[SOCKET_VARIABLE] = forking.launcher, forking.socket_path  # workers inherit it
        try:
            return start_raylet(*args, **kwargs)
        finally:
            sys.executable = python
            if had_socket is None:
                os.environ.pop(SOCKET_VARIABLE, None)
            else:
                os.environ[SOCKET_VARIABLE] = had_socket

    services.start_raylet = start_raylet_forking_workers


def for_a_command(environment: dict[str, str]) -> dict:
    """What a command forked by tests/zygote.py is told, so that an instance its sweep
    starts has its workers forked too: this process's worker zygote for the command's
    environment, if one is running."""
    running = session_workers(environment, start_one=False)
    return {} if running is None else {"ray_workers": [running.folder, running.launcher]}


def in_a_command(request: dict) -> None:
    """In the command's process, before it runs (tests/zygote.py's child_setup)."""
    if request.get("ray_workers"):
        folder, launcher = request["ray_workers"]
        known = WorkerZygote(None, folder, launcher)
        route_new_instances(lambda: known)
