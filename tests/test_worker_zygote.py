"""The shared Ray instance's workers forked from the worker zygote (tests/worker_zygote.py)
are Ray workers as the raylet would have started them: their job, their runtime
environment, a process group of their own; a runtime environment that sets a variable read
at import gets the real interpreter; the process the raylet started ends as its worker did."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import shared_ray as shared_ray_instance
from tests import worker_zygote, zygote

PROBE_WORKER = r"""
import json, os, sys, time
package = sys.modules.get("torch._dynamo.package")
print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "argv": sys.argv[1:], "torch": "torch" in sys.modules,
                  "job": os.environ.get("RAY_JOB_ID"),
                  "dynamo_cache": package.DynamoCache._path_prefix if package else None}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
"""

# Each test starts Ray instances and a worker zygote (imports torch, torchvision, timm):
# 5-15 s each in the quick lane.
pytestmark = pytest.mark.slow


def worker_facts():
    import sys

    import ray

    with open(f"/proc/{os.getpid()}/environ") as environ:  # what the process was exec'd with
        started_with = environ.read().split("\0")
    return {"pid": os.getpid(), "parent": os.getppid(), "pgid": os.getpgid(0), "torch": "torch" in sys.modules,
            "job": ray.get_runtime_context().get_job_id(), "variable": os.environ.get("ACCELSWEEP_PROBE"),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "exec_threads": [e for e in started_with if e.startswith("OMP_NUM_THREADS=")]}


def test_a_task_runs_in_a_forked_worker_with_its_job_and_runtime_environment(ray_session, shared_ray):
    if shared_ray.workers is None:
        pytest.skip("the worker zygote is off (ACCELSWEEP_TEST_ZYGOTE=0 or ACCELSWEEP_TEST_WORKER_ZYGOTE=0)")
    ray = ray_session
    probe = ray.remote(num_cpus=1)(worker_facts)
    zygote_pid = shared_ray.workers.process.pid
    job = ray.get_runtime_context().get_job_id()

    plain_env = ray.get(probe.options(runtime_env={"env_vars": {"ACCELSWEEP_PROBE": "1"}}).remote())
    assert plain_env["parent"] == zygote_pid and plain_env["torch"], plain_env  # forked, imports done
    assert plain_env["job"] == job and plain_env["variable"] == "1", plain_env
    assert plain_env["pgid"] == plain_env["pid"], plain_env  # its own group: the raylet kills a worker's group

    # OMP_NUM_THREADS is read when OpenMP loads (with torch): such a worker is a new
    # interpreter (exec'd by Ray's setup_worker.py, which ran forked), started with it.
    read_at_import = ray.get(probe.options(runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}).remote())
    assert not read_at_import["torch"], read_at_import
    assert read_at_import["exec_threads"] == ["OMP_NUM_THREADS=1"] and read_at_import["job"] == job, read_at_import


PRIVATE_INSTANCE = r"""
import glob, json, os, sys
import ray
import ray._private.services as services
# tests/zygote.py's command routes the instance's raylet (tests/worker_zygote.in_a_command);
# a command run plainly does not.
routed = hasattr(services.start_raylet, "__wrapped__")
ray.init(num_cpus=1, include_dashboard=False)

@ray.remote
def facts():
    return {"parent": os.getppid(), "torch": "torch" in sys.modules}

found = ray.get(facts.remote())
logs = ray._private.worker._global_node.get_logs_dir_path()
said = [line.strip() for path in glob.glob(os.path.join(logs, "*.err")) for line in open(path, errors="replace")
        if "ray_worker_client" in line]
ray.shutdown()
print(json.dumps({**found, "python": sys.executable, "routed": routed, "launcher_said": said[-3:]}))
"""


def test_a_private_instance_that_a_command_starts_forks_its_workers_too(tmp_path):
    """A sweep given no address starts its own instance (in a command forked by
    tests/zygote.py): its raylet is started with the launcher, the rest of the command not."""
    workers = worker_zygote.session_workers(os.environ)  # the one for this process's environment
    if workers is None:
        pytest.skip("the worker zygote is off (ACCELSWEEP_TEST_ZYGOTE=0 or ACCELSWEEP_TEST_WORKER_ZYGOTE=0)")
    script = tmp_path / "private_instance.py"
    script.write_text(PRIVATE_INSTANCE)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    # Not forked (twice in the parallel lane, in about thirty runs): the command ran plainly
    # ("routed" false: tests/zygote.py says why), or the worker's client found no zygote
    # ("launcher_said", from the instance's worker logs), or the zygote refused the worker
    # (its zygote.log).
    assert facts["routed"], f"the command was not forked by tests/zygote.py: {zygote.Zygote.why_plain!r}"
    refusals = open(os.path.join(workers.folder, "zygote.log"), errors="replace").read()[-2000:]
    assert {k: facts[k] for k in ("parent", "torch", "python")} == {
        "parent": workers.process.pid, "torch": True, "python": sys.executable}, \
        f"{facts}\nworker zygote's log: {refusals}\n{done.stderr[-3000:]}"


@pytest.fixture
def launcher(tmp_path):
    """The launcher and a zygote of its own, and a stand-in for Ray's default_worker.py."""
    environment = shared_ray_instance.head_environment()
    started = worker_zygote.start(environment)
    if started is None:
        pytest.skip("the worker zygote is off (ACCELSWEEP_TEST_ZYGOTE=0 or ACCELSWEEP_TEST_WORKER_ZYGOTE=0)")
    worker = tmp_path / "default_worker.py"
    worker.write_text(PROBE_WORKER)
    environment = {**environment, worker_zygote.SOCKET_VARIABLE: started.socket_path, "RAY_JOB_ID": "02000000"}
    yield started, [started.launcher, str(worker)], environment
    started.stop()


def test_the_process_the_raylet_starts_ends_as_its_worker_does(launcher, tmp_path):
    started, command, environment = launcher
    done = subprocess.run([*command, "7"], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert '"torch": true' in done.stdout and '"job": "02000000"' in done.stdout, done.stdout

    # Inductor's cache folder, read when torch._dynamo is imported, is read again from the
    # worker's own environment; JAX's logging switch changes nothing preloaded: forked.
    cache = str(tmp_path / "inductor")
    done = subprocess.run([*command, "0"], env={**environment, "TORCHINDUCTOR_CACHE_DIR": cache,
                                                "TF_CPP_MIN_LOG_LEVEL": "1"}, capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout.splitlines()[0])
    assert seen["torch"] and seen["dynamo_cache"] == os.path.join(cache, "dynamo"), seen

    client = subprocess.Popen([*command, "sleep"], env=environment, stdout=subprocess.PIPE, text=True)
    worker = int(client.stdout.readline().split('"pid": ')[1].split(",")[0])
    assert worker != client.pid
    os.kill(worker, signal.SIGKILL)  # as the raylet ends a worker: by its registered pid
    assert client.wait(timeout=30) == -signal.SIGKILL

    client = subprocess.Popen([*command, "sleep"], env=environment, stdout=subprocess.PIPE, text=True)
    worker = int(client.stdout.readline().split('"pid": ')[1].split(",")[0])
    client.kill()  # the process the raylet started, killed: its worker goes too
    client.wait(timeout=30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}") or open(f"/proc/{worker}/stat").read().split()[2] == "Z"


def test_without_its_zygote_the_launcher_runs_the_real_interpreter(launcher):
    started, command, environment = launcher
    os.killpg(started.process.pid, signal.SIGKILL)  # gone under the instance, its socket left
    started.process.wait()
    done = subprocess.run([*command, "5"], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 5 and '"torch": false' in done.stdout, done.stdout + done.stderr
    assert "the worker zygote did not answer" in done.stderr
    other = subprocess.run([command[0], "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                           timeout=60)
    assert other.stdout.strip() == sys.executable  # the instance's agents: the real interpreter
