"""Shared fixtures. One Ray instance per test session (starting Ray costs seconds),
joined by every test that does not test a sweep's own (tests/shared_ray.py); MLflow
stores are sqlite files in each test's temporary directory; one run of the README's main
job (--smoke) that every test reading a real sweep's record shares."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# In the parallel pass (a pytest-xdist worker) two workers' trials share two cores, each
# with as many OpenMP threads as there are cores. OpenMP's threads spin at every barrier
# waiting for the one whose core the other worker holds: passive waiting took the same
# tests 8-16% less CPU (benchmarks/results/test_suite.md, the tenth run). Set before
# anything imports torch, so this process, its zygotes and every Ray instance it starts
# read it; the serial pass (one test at a time, what a user's trial does) keeps spinning.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The suite's caches stay out of the user's (~/.cache/accelsweep: CPU peaks, FLOP counts,
# compile caches, local clusters' files): its peaks are measured under its own load (two
# workers, passive waiting) and a user's sweeps would read them back as this machine's. One
# folder per run of pytest, its xdist workers' too (they inherit the variable), removed when
# the run that made it ends. Set before the zygotes and the session's Ray instance start.
# The user's data folder too (the team store's default folder), in the same one.
_TEST_CACHE_MADE = "ACCELSWEEP_TEST_CACHE" not in os.environ
if _TEST_CACHE_MADE:
    os.environ["ACCELSWEEP_TEST_CACHE"] = tempfile.mkdtemp(prefix="accelsweep-test-cache-")
os.environ["XDG_CACHE_HOME"] = os.environ["ACCELSWEEP_TEST_CACHE"]
os.environ["XDG_DATA_HOME"] = os.path.join(os.environ["ACCELSWEEP_TEST_CACHE"], "data")
# And the Tune state of every sweep that names no --storage-path (else ~/ray_results: 47 MB
# of a hundred-odd experiment folders from a dozen runs, never removed).
os.environ["ACCELSWEEP_STORAGE_PATH"] = os.path.join(os.environ["ACCELSWEEP_TEST_CACHE"], "ray_results")

from tests import shared_ray as shared_ray_instance
from tests import worker_zygote, zygote

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
# Commands this session starts are forked from one process that has their imports done
# (tests/zygote.py says which commands, and why it changes nothing else).
zygote.install()
# The Ray workers of the session's instances too: the shared one's, and those of the
# private instances that sweeps start, in a command or in this process (tests/worker_zygote.py).
worker_zygote.install()

# A test marked host_timing asserts on what this host measured: a kernel against a roof
# measured seconds earlier, a slow config judged against a fast one. This shared 2-core VM
# changes speed by 40% within seconds and CI runs beside other work, so such a test gets one
# more try (pytest-rerunfailures prints an R and counts the reruns in the summary). A
# second failure fails the run; a test that fails for a wrong figure fails both times.
HOST_TIMING_RERUNS = 1


# The main lane runs in two passes (env/test.sh): two pytest-xdist workers take every test
# not marked host_timing or alone, a file's tests on one worker (--dist loadfile: its
# module fixtures are built once, its tests never race each other), then those marked run
# one at a time. What two files share is shared through the run's temporary folder
# (run_once: the main job, the second sweep) or kept apart (test_node_loss.py's cluster
# records itself under its own RAY_TMPDIR, not in the /tmp/ray that test_local_cluster.py
# checks).
# Files that took long in a measured run (benchmarks/results/test_suite.md), longest first.
# pytest-xdist hands files out by their number of tests, most first (its loadscope reorder):
# this order only breaks its ties. Handing these out first instead (--no-loadscope-reorder)
# was tried: it ran the main job beside the local cluster's fake nodes, whose load got three
# of its four trials rejected as hopeless and left it no confirmation (test_suite.md, the
# eighth run), and it started test_bad_input.py after a test had connected its worker to Ray.
LONGEST_FILES = ("test_team_store_faults.py", "test_vs_plain_tune.py", "test_tracking_outage.py", "test_local_cluster.py",
                 "test_cpu_resnet.py", "test_secrets.py", "test_mlflow_ui.py", "test_attention_kernels.py",
                 "test_store_faults.py", "test_driver_api.py", "test_vit_attention.py", "test_lifecycle.py",
                 "test_secret_leak.py", "test_resume.py", "test_varlen_gpt.py", "test_metric_collection.py",
                 "test_neuron_standin.py", "test_kernels.py", "test_train_loop.py", "test_team_store.py")


# What a command that ran past its test's timeout had printed: subprocess.run kills it and
# raises TimeoutExpired with the output, which pytest's report shows only as a cut repr. The
# console's progress lines say where a hung sweep stood (what it waited for, which trial).
TIMED_OUT_OUTPUT_CHARS = 6000


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    timed_out = call.excinfo.value if call.excinfo is not None else None
    if not isinstance(timed_out, subprocess.TimeoutExpired):
        return
    report = outcome.get_result()
    for stream, text in (("stdout", timed_out.output), ("stderr", timed_out.stderr)):
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if text:
            shown = text if len(text) <= TIMED_OUT_OUTPUT_CHARS else \
                text[:TIMED_OUT_OUTPUT_CHARS // 3] + "\n[...]\n" + text[-2 * TIMED_OUT_OUTPUT_CHARS // 3:]
            report.sections.append((f"timed-out command's {stream} ({len(text)} chars)", shown))


def pytest_sessionfinish(session, exitstatus):
    zygote.Zygote.stop()
    worker_zygote.stop_session_workers()
    if _TEST_CACHE_MADE:
        shutil.rmtree(os.environ["ACCELSWEEP_TEST_CACHE"], ignore_errors=True)




@pytest.fixture(scope="session", autouse=True)
def ray_workers_forked(request):
    """A session with slow tests (most run a whole sweep) starts this process's worker zygote
    before its first test and its session fixtures (the main job), so that the Ray instances
    they start fork their workers (tests/worker_zygote.py); the quick lane starts none."""
    if any(item.get_closest_marker("slow") is not None for item in request.session.items):
        worker_zygote.session_workers()
    yield


@pytest.fixture(autouse=True)
def plain_processes_when_marked(request):
    """A test marked real_process starts its commands as plain subprocesses."""
    if request.node.get_closest_marker("real_process") is None:
        yield
        return
    zygote.enabled = False
    try:
        yield
    finally:
        zygote.enabled = os.environ.get("ACCELSWEEP_TEST_ZYGOTE", "1") != "0"


def pytest_collection_modifyitems(config, items):
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("host_timing") is not None and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=HOST_TIMING_RERUNS, reruns_delay=5))


# The session's Ray instance (shared_ray, ray_session); a module that needs another
# disconnects, starts its own, and joins the session's again (shared_ray_instance.connect).
SESSION_CPUS = 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCELSWEEP = os.path.join(os.path.dirname(sys.executable), "accelsweep")  # the installed command

# Fake credentials, each in the shape of the real thing: in the shared sweep's environment,
# and hunted for in everything it writes (test_secrets.py, test_secret_leak.py).
FAKE_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYFAKEKEY0001",
    "HF_TOKEN": "hf_FakeTokenForTests0123456789abcdefgh",
    "MY_DB_PASSWORD": "correct-horse-battery-staple",
    "SOME_CREDENTIALS_FILE": "/run/secrets/fake-credentials.json",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-fake-password-42",
}


# Variables a sweep's driver sets in its own process, which every later subprocess of the
# test session would inherit: mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI (another
# test's sweep would write to that store); a driver given a loopback address sets Ray's
# no-clusters switch (a later `ray start --address` refuses to join).
PROCESS_WIDE_VARIABLES = ("MLFLOW_TRACKING_URI", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


@pytest.fixture(autouse=True)
def tracking_uri_not_leaked():
    """Each test ends with PROCESS_WIDE_VARIABLES as it began, and Ray's switch too."""
    from ray._private import ray_constants

    before = {name: os.environ.get(name) for name in PROCESS_WIDE_VARIABLES}
    clusters_before = ray_constants.ENABLE_RAY_CLUSTER
    yield
    ray_constants.ENABLE_RAY_CLUSTER = clusters_before
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def shared_ray():
    """The session's one Ray instance (tests/shared_ray.py): a command joins it with
    ``shared_ray.flags``, this process through ``ray_session``."""
    instance = shared_ray_instance.start(num_cpus=SESSION_CPUS)
    yield instance
    shared_ray_instance.stop(instance)


@pytest.fixture(scope="session")
def ray_session(shared_ray):
    import ray

    shared_ray_instance.connect(shared_ray)
    yield ray
    ray.shutdown()


@pytest.fixture
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


@dataclass(frozen=True)
class MainJob:
    """A finished run of the main job: its store, output and folders."""

    folder: Path  # where it ran (its cwd), holding the store and Tune's storage path
    tracking_uri: str
    experiment: str
    price_per_hour: float
    stdout: str
    stderr: str

    @property
    def storage(self) -> Path:
        return self.folder / "ray"

    def copy_to(self, folder: Path) -> str:
        """Its store copied into ``folder`` (for a test that writes to it); the copy's URI.
        Artifacts stay where the runs recorded them (the original's folder)."""
        shutil.copy(self.folder / "m.db", folder / "m.db")
        return f"sqlite:///{folder}/m.db"


def shared_temporary_folder(tmp_path_factory, worker_id: str) -> Path:
    """The run's temporary folder, the same for every pytest-xdist worker."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def run_once(folder: Path, name: str, run) -> dict:
    """``run()``'s result (a JSON-able dict), computed by the first pytest-xdist worker that
    asks; the others wait for it and read it (a lock and a file in ``folder``)."""
    import fcntl
    import json

    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done_file = folder / f"{name}.json"
        if not done_file.exists():
            done_file.write_text(json.dumps(run()))
        return json.loads(done_file.read_text())


@pytest.fixture(scope="session")
def main_job(tmp_path_factory, worker_id) -> MainJob:
    """The README's main job, --smoke, run once for the whole session as a user runs it:
    by the installed command, from a folder that is not the checkout, with secrets in its
    environment and Ray's default token auth. Tests only read what it left; one that
    writes works on ``copy_to``. With pytest-xdist, the first worker that needs it runs it
    and the others wait for it (run_once)."""
    shared = shared_temporary_folder(tmp_path_factory, worker_id)
    folder, uri, price = shared / "main-job", f"sqlite:///{shared}/main-job/m.db", 0.357

    def run() -> dict:
        folder.mkdir(exist_ok=True)  # a worker that died running it left it
        env = {**os.environ, **FAKE_SECRETS}
        env.pop("RAY_AUTH_MODE", None)  # the default a user gets (this file turns it off for the rest)
        done = subprocess.run(
            [ACCELSWEEP, "run", "neuron_vit", "--smoke", "--num-samples", "4", "--tracking-uri", uri,
             "--storage-path", str(folder / "ray"), "--price-per-hour", str(price), "--experiment", "X"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    done = run_once(shared, "main-job", run)
    assert done["returncode"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:]
    return MainJob(folder, uri, "X", price, done["stdout"], done["stderr"])


@pytest.fixture(scope="session")
def worker_id(request) -> str:
    """pytest-xdist's worker name ("gw0", ...), or "master" in a run without it (xdist
    brings a fixture of this name; this one stands in where it is not installed)."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


@dataclass(frozen=True)
class SecondSweep:
    """A second run of the main job, --smoke with 2 trials, in a copy of its store: warm
    started from it, priced differently, on the session's Ray instance."""

    tracking_uri: str  # the copy's: the main job's sweep and this one
    experiment: str
    warm_start: str  # the main job's sweep, by name
    price_per_hour: float
    stdout: str


@pytest.fixture(scope="session")
def second_sweep(main_job, shared_ray, tmp_path_factory, worker_id) -> SecondSweep:
    """What a comparison of two sweeps (test_compare.py) and a warm start
    (test_warm_start.py) both need, run once (run_once): they only read it."""
    from mlflow.tracking import MlflowClient

    shared = shared_temporary_folder(tmp_path_factory, worker_id)
    folder = shared / "second-sweep"
    uri, experiment, price = f"sqlite:///{folder}/m.db", "warm", 2.0

    def run() -> dict:
        folder.mkdir(exist_ok=True)
        main_job.copy_to(folder)
        client = MlflowClient(uri)
        (first,) = client.search_runs([client.get_experiment_by_name(main_job.experiment).experiment_id],
                                      filter_string="tags.kind = 'sweep'")
        done = subprocess.run(
            [sys.executable, "sweeps/neuron_vit.py", "--smoke", "--num-samples", "2", "--confirm-rounds", "0",
             "--price-per-hour", str(price), "--tracking-uri", uri, "--storage-path", str(folder / "ray"),
             "--experiment", experiment, "--warm-start", first.info.run_name, *shared_ray.flags],
            cwd=REPO, capture_output=True, text=True, timeout=600)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "warm_start": first.info.run_name}

    done = run_once(shared, "second-sweep", run)
    assert done["returncode"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:]
    return SecondSweep(uri, experiment, done["warm_start"], price, done["stdout"])
