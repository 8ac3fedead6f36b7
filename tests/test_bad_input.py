"""Bad input is refused before any trial starts, and the message names the field, the
allowed values and the value given. Each case checks the whole message; a few go
through the command line and check that nothing ran (no MLflow store, no Tune
storage)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from accelsweep.kernels.registry import OPS, installed_ops
from tests.conftest import REPO
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.metrics import TRAINING_METRICS
from accelsweep.trainables.harness.microbench import KernelConfig


def closed_port() -> int:
    """A local TCP port nothing listens on: the kernel's pick for an ephemeral bind,
    released at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


CLOSED_PORT = closed_port()
MICRO = dict(model="vit-micro", batch_size=16)
CONFIG_FIELDS = ", ".join(TrialConfig.make(**MICRO).to_dict())  # the base's keys: generic fields, then cpu's knobs
FITS_HINT = ("A local run has this machine only, and Tune would wait forever for the rest: lower {lower}, "
             "or pass --address to run on a cluster.")


def no_trainable(searched, base, cost=None):
    raise AssertionError("a refused sweep must never run a trial")


no_trainable.metrics = TRAINING_METRICS  # what it would report: the training loop's (declare_metrics)


def categorical(name, choices):
    def space(trial):
        trial.suggest_categorical(name, choices)

    return space


def plan(base=None, tracking_uri=None, **sweep):
    from accelsweep import Sweep, plan_sweep

    sweep.setdefault("space", categorical("batch_size", [16, 32]))
    return plan_sweep(Sweep(name="bad_input", trainable=no_trainable, base=base or TrialConfig.make(**MICRO),
                            tracking_uri=tracking_uri or "sqlite:///mlflow.db", **sweep))


def fits_locally(base, space, local):
    from accelsweep.sweeps.driver.define.preflight import check_fits_locally

    check_fits_locally(plan(base=base, space=space), local=local)


def local_cpus() -> int:
    from accelsweep.sweeps.driver.define.preflight import local_resources

    return int(local_resources()["CPU"])


def kernel(**values):
    from accelsweep.trainables.harness.microbench import KernelConfig

    KernelConfig.make(**values)


def cost(instance_type=None, price_per_hour=None):
    from accelsweep.trainables.cost import resolve_cost_basis

    resolve_cost_basis(instance_type, price_per_hour, detect=False)


def tracking(uri):
    from accelsweep.sweeps.driver.record.tracking import validate_tracking_uri

    validate_tracking_uri(uri)


def tracking_store(uri):
    from accelsweep.sweeps.driver.define.store_checks import check_tracking_store

    check_tracking_store(uri)


def storage_path(path):
    from accelsweep.sweeps.driver.define.store_checks import check_storage_path

    check_storage_path(path)


def ray_address(address):
    from accelsweep.sweeps.driver.define.preflight import check_ray_address

    check_ray_address(address)


URI_ALLOWED = "a URI with scheme sqlite, http, https, postgresql, mysql, mssql, databricks (e.g. sqlite:///mlflow.db)"
ADDRESS_ALLOWED = "a reachable Ray cluster address (host:port, ray://host:port or auto)"
with open(os.path.join(REPO, "README.md"), "rb") as _readme:
    README_START = _readme.read(16)  # how a text file given as a sqlite store is shown
SEED_RANGE = "seed must be an integer from 0 to 4294967295 (2**32 - 1); "
STORAGE_ALLOWED = ("a writable folder with at least 64 MiB free (--storage-path; default $ACCELSWEEP_STORAGE_PATH, "
                   "else ~/ray_results)")
SQLITE_ALLOWED = "sqlite:///<path> naming the MLflow store (a sqlite file, or a new one in a writable folder)"

CASES = [
    ("unknown platform", lambda: TrialConfig.make(platform="tpu9"),
     "platform must be one of cpu, cuda, xla, neuron, tpu, neuron-standin-cpu; got 'tpu9'"),
    ("precision no platform has", lambda: TrialConfig.make(platform="neuron", precision="fp16"),
     "precision must be one of fp32, bf16-autocast, bf16, fp16-autocast; got 'fp16'"),
    ("precision the implementation cannot do", lambda: kernel(op="matmul", impl="torch-matmul", dtype="bfloat16"),
     "dtype must be one of int8, float32; got 'bfloat16'. (dtypes of torch-matmul; op matmul has int8, bfloat16, "
     "float32)"),
    ("batch size 0", lambda: TrialConfig.make(batch_size=0), "batch_size must be an integer >= 1; got 0"),
    ("batch size < 0", lambda: TrialConfig.make(batch_size=-8), "batch_size must be an integer >= 1; got -8"),
    ("optlevel 4", lambda: TrialConfig.make(platform="neuron", neuron_optlevel=4),
     "neuron_optlevel must be one of 1, 2, 3; got 4"),
    ("neuron compiler flag on cpu", lambda: TrialConfig.make(neuron_model_type="transformer"),
     "neuron_model_type must be None on platform 'cpu' (its knobs: allocator, channels_last, numa_bind, threads); "
     "got 'transformer'. "
     "neuron_model_type does not apply to cpu: it is a knob of neuron."),
    ("neuron compiler flag on cuda", lambda: TrialConfig.make(platform="cuda", neuron_optlevel=3),
     "neuron_optlevel must be None on platform 'cuda' (its knobs: accelerator_type, channels_last); got 3. "
     "neuron_optlevel does not apply to cuda: it is a knob of neuron."),
    ("torch.compile backend the cpu has not", lambda: TrialConfig.make(torch_compile="openxla"),
     "torch_compile must be one of none, inductor, max-autotune; got 'openxla'. "
     "Platform 'cpu' supports these torch.compile modes."),
    ("empty define-by-run space", lambda: plan(space=lambda trial: None),
     "search space must be at least one searched knob (suggest_* call or Tune domain); got {}"),
    ("empty dict space", lambda: plan(space={}), "search space must be at least one searched knob; got {}"),
    ("define-by-run lambda returning a value",
     lambda: plan(space=lambda trial: trial.suggest_categorical("batch_size", [16])),
     "search space must be a define-by-run function returning None or a dict of fixed values; got 16. A lambda "
     "returns what its last suggest_* call returned: use a def, or return {name: trial.suggest_...(...)}."),
    ("unknown knob in the space", lambda: plan(space=categorical("batchsize", [16, 32])),
     f"search space knob must be a config field ({CONFIG_FIELDS}); got 'batchsize'"),
    ("space proposing batch size 0", lambda: plan(space=categorical("batch_size", [0, 16])),
     "batch_size must be valid for every config the search space can propose; got {'batch_size': 0}. Refused: "
     "batch_size must be an integer >= 1; got 0"),
    ("space proposing a neuron knob on cpu", lambda: plan(space=categorical("neuron_optlevel", [None, 3])),
     "neuron_optlevel must be valid for every config the search space can propose; got {'neuron_optlevel': 3}. "
     "Refused: neuron_optlevel must be None on platform 'cpu' (its knobs: allocator, channels_last, numa_bind, "
     "threads); got 3. "
     "neuron_optlevel does not apply to cpu: it is a knob of neuron."),
    ("time budget 0", lambda: plan(time_budget_s=0), "time_budget_s must be a number of seconds > 0, or None; got 0"),
    ("time budget < 0", lambda: plan(time_budget_s=-5.0),
     "time_budget_s must be a number of seconds > 0, or None; got -5.0"),
    ("num_samples 0", lambda: plan(num_samples=0), "num_samples must be an integer >= 1; got 0"),
    ("unknown scheduler", lambda: plan(scheduler="hyperband"),
     "scheduler must be one of asha, median, none; got 'hyperband'"),
    ("unknown sampler", lambda: plan(sampler="cmaes"), "sampler must be one of tpe, grid; got 'cmaes'"),
    ("more CPUs than present (local)",
     lambda: fits_locally(TrialConfig.make(**MICRO, workers=2, cpus_per_worker=2), categorical("batch_size", [16]),
                          {"CPU": 2}),
     "cpus_per_worker x workers must be at most 2 (the CPUs of this machine; a local run); got '2 x 2'. "
     + FITS_HINT.format(lower="cpus_per_worker (--cpus-per-worker) or workers")),
    ("more workers than NeuronCores (local)",
     lambda: fits_locally(TrialConfig.make(**MICRO, platform="neuron"), categorical("workers", [1, 4]),
                          {"CPU": 8, "neuron_cores": 2}),
     "workers must be at most 2 (the NeuronCores of this machine; a local run); got 4. The search space proposes "
     "{'workers': 4}. " + FITS_HINT.format(lower="workers")),
    ("a device this machine lacks (local)",
     lambda: fits_locally(KernelConfig.make(op="giou", impl="nki", platform="neuron", boxes=256),
                          categorical("batch", [1, 2]), {"CPU": 2, "neuron_cores": 0}),
     "platform must be a platform whose devices this machine has (it has no NeuronCores; a local run); got "
     "'neuron'. Tune would wait forever for them: pass --address to run on a cluster that has them, or --dry-run "
     "to plan the sweep here."),
    ("instance type with no price", lambda: cost("m5.large"),  # from Python: the argument, not the flag
     "instance_type must be one of trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, inf2.xlarge, g5.xlarge, "
     "g5.2xlarge, c7i.xlarge, c7i.2xlarge, m7i.2xlarge (or give price_per_hour); got 'm5.large'. "
     "The price table has no entry for it."),
    ("negative price", lambda: cost(price_per_hour=-1.0), "price_per_hour must be a finite number > 0; got -1.0"),
    ("price NaN", lambda: cost(price_per_hour=float("nan")), "price_per_hour must be a finite number > 0; got nan"),
    ("seed above 2**32 - 1 (what the samplers take)", lambda: plan(seed=2**32), SEED_RANGE + "got 4294967296"),
    ("seed < 0", lambda: plan(seed=-1), SEED_RANGE + "got -1"),
    ("seed not an integer", lambda: plan(seed=1.5), SEED_RANGE + "got 1.5"),
    ("seed of a config above 2**32 - 1", lambda: TrialConfig.make(**MICRO, seed=2**32), SEED_RANGE + "got 4294967296"),
    ("retries < 0", lambda: plan(retries=-1), "retries must be an integer >= 0; got -1"),
    ("storage path: a file", lambda: storage_path(os.path.join(REPO, "README.md")),
     f"storage_path must be {STORAGE_ALLOWED}; got '{REPO}/README.md'. It is not a folder."),
    ("storage path: under a file", lambda: storage_path(os.path.join(REPO, "README.md", "ray")),
     f"storage_path must be {STORAGE_ALLOWED}; got '{REPO}/README.md/ray'. It is under {REPO}/README.md, which is not "
     "a folder."),
    ("tracking store: a folder", lambda: tracking_store(f"sqlite:///{REPO}"),
     f"tracking_uri must be {SQLITE_ALLOWED}; got 'sqlite:///{REPO}'. {REPO} is a folder; name a file in it, e.g. "
     f"sqlite:///{REPO}/mlflow.db."),
    ("tracking store: not a database", lambda: tracking_store(f"sqlite:///{REPO}/README.md"),
     f"tracking_uri must be {SQLITE_ALLOWED}; got 'sqlite:///{REPO}/README.md'. {REPO}/README.md is not a sqlite "
     f"database (it starts with {README_START!r}). Name another file, or move this one away."),
    ("tracking store: nothing listening (http)", lambda: tracking_store(f"http://127.0.0.1:{CLOSED_PORT}"),
     "tracking_uri must be the address of an MLflow tracking server that answers; got "
     f"'http://127.0.0.1:{CLOSED_PORT}'. "
     f"Nothing answered at http://127.0.0.1:{CLOSED_PORT}/api/2.0/mlflow/experiments/search?max_results=1 "
     "(ConnectionError: connection refused; 3 s to connect, 5 s to answer). Is the server up (mlflow server ...) and "
     "its address right?"),
    ("tracking store: database password kept out of the message",
     lambda: tracking_store(f"postgresql://user:hunter2secret@127.0.0.1:{CLOSED_PORT}/mlflow"),
     f"tracking_uri must be a database server that accepts a connection from here; got "
     f"'postgresql://user:<redacted>@127.0.0.1:{CLOSED_PORT}/mlflow'. Nothing answers at 127.0.0.1:{CLOSED_PORT} "
     "within 3 s: [Errno 111] Connection refused. Is the database up, and its port open to this machine?"),
    ("tracking URI: a bare file name", lambda: tracking("mlflow.db"),
     f"tracking_uri must be {URI_ALLOWED}; got 'mlflow.db'. MLflow 3.17 refuses the file store; use "
     "sqlite:///mlflow.db for a local file."),
    ("tracking URI: sqlite with one slash", lambda: tracking("sqlite:/x.db"),
     "tracking_uri must be sqlite:///<path> (three slashes, then a file path); got 'sqlite:/x.db'"),
    ("tracking URI: the file store", lambda: tracking("file:///tmp/x"),
     f"tracking_uri must be {URI_ALLOWED}; got 'file:///tmp/x'. MLflow 3.17 refuses the file store; use "
     "sqlite:///mlflow.db for a local file."),
    ("tracking URI: http without its colon", lambda: tracking("http//host:5000"),
     f"tracking_uri must be {URI_ALLOWED}; got 'http//host:5000'. It starts with 'http' but not 'http://': a "
     "character is missing."),
    ("tracking URI: password kept out of the message", lambda: tracking("htp://user:hunter2secret@db:5000"),
     f"tracking_uri must be {URI_ALLOWED}; got 'htp://user:<redacted>@db:5000'"),
    ("unreachable Ray address", lambda: ray_address(f"127.0.0.1:{CLOSED_PORT}"),
     f"address must be {ADDRESS_ALLOWED}; got '127.0.0.1:{CLOSED_PORT}'. Nothing answers at 127.0.0.1:{CLOSED_PORT} "
     "within 3 s: [Errno 111] Connection refused. Is the cluster up (`ray status` on its head) and its port open to "
     "this machine?"),
    ("unreachable Ray client address", lambda: ray_address(f"ray://127.0.0.1:{CLOSED_PORT}"),
     f"address must be {ADDRESS_ALLOWED}; got 'ray://127.0.0.1:{CLOSED_PORT}'. Nothing answers at "
     f"127.0.0.1:{CLOSED_PORT} within 3 s: [Errno 111] Connection refused. Is the cluster up (`ray status` on its "
     "head) and its port open to this machine?"),
    ("Ray address without a port", lambda: ray_address("head-node"),
     f"address must be {ADDRESS_ALLOWED}; got 'head-node'. It is not of that form."),
    ("Ray address with another scheme", lambda: ray_address("http://127.0.0.1:8265"),
     f"address must be {ADDRESS_ALLOWED}; got 'http://127.0.0.1:8265'. It is not of that form."),
    ("kernel op unknown", lambda: kernel(op="conv9"),
     f"op must be one of the built-in ops ({', '.join(OPS)}), an op installed under entry point group accelsweep.ops "
     f"({', '.join(sorted(installed_ops())) or 'none installed'}), or an import path 'package.module:ATTR' naming an "
     "OpSpec; got 'conv9'"),
    ("kernel impl unknown", lambda: kernel(op="giou", impl="cuda-magic"),
     "impl must be one of torch-naive, torch-compile, jax-jit, pallas, triton-fused, nki, gpsimd-cpp for op 'giou'; "
     "got 'cuda-magic'"),
    ("kernel impl not on this platform", lambda: kernel(op="giou", impl="triton-fused", platform="cpu"),
     "impl must be an implementation that runs on cpu (torch-naive, torch-compile, jax-jit, pallas); got "
     "'triton-fused'. triton-fused runs on cuda."),
]


@pytest.mark.parametrize("make_error, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_the_whole_message(make_error, expected):
    with pytest.raises(ConfigError) as caught:
        make_error()
    assert str(caught.value) == expected
    assert str(caught.value).startswith(f"{caught.value.field} must be ")


def test_an_unreachable_address_is_refused_in_seconds_not_minutes():
    # ray.init on this address retries for minutes (still retrying after 170 s here).
    from accelsweep.sweeps.driver.define.preflight import CONNECT_TIMEOUT_S

    started = time.monotonic()
    with pytest.raises(ConfigError):
        ray_address(f"127.0.0.1:{CLOSED_PORT}")
    assert time.monotonic() - started < CONNECT_TIMEOUT_S


def test_connect_ray_checks_the_address_before_ray_init(monkeypatch):
    import ray

    from accelsweep.sweeps.driver.run.lifecycle import connect_ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called with an unreachable address"))
    with pytest.raises(ConfigError, match=re.escape(f"got '127.0.0.1:{CLOSED_PORT}'. Nothing answers")):
        connect_ray(f"127.0.0.1:{CLOSED_PORT}")


@pytest.mark.parametrize("case", ["unreachable address", "more CPUs than this machine"])
def test_run_sweep_checks_where_it_runs_before_anything_starts(case, monkeypatch, tmp_path):
    """A script or user that calls run_sweep alone gets the same checks: nothing waits
    forever, no Ray instance starts, no MLflow store is opened."""
    import ray

    from accelsweep import Sweep, run_sweep

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called before the checks"))
    store = tmp_path / "mlflow.db"
    if case == "unreachable address":
        sweep, expected = dict(address=f"127.0.0.1:{CLOSED_PORT}"), f"got '127.0.0.1:{CLOSED_PORT}'. Nothing answers"
    else:
        sweep = dict(base=TrialConfig.make(**MICRO, workers=local_cpus() + 1))
        expected = "cpus_per_worker x workers must be at most"
    sweep.setdefault("base", TrialConfig.make(**MICRO))
    with pytest.raises(ConfigError, match=re.escape(expected)):
        run_sweep(Sweep(name="bad_input", trainable=no_trainable, space=categorical("batch_size", [16, 32]),
                        tracking_uri=f"sqlite:///{store}", storage_path=str(tmp_path / "ray"), **sweep))
    assert not store.exists() and not (tmp_path / "ray").exists()


def test_a_cluster_run_is_not_limited_by_this_machine(monkeypatch):
    """The local fit check is for local runs: on a cluster the autoscaler adds nodes."""
    import ray

    from accelsweep import Sweep, preflight
    from accelsweep.sweeps.driver.define.preflight import check_fits_locally

    too_big = TrialConfig.make(**MICRO, workers=local_cpus() + 1)
    with pytest.raises(ConfigError, match=r"^cpus_per_worker x workers must be at most"):
        check_fits_locally(plan(base=too_big))
    # A driver not yet connected to Ray, as a user's is: this test process may be connected to
    # the session's instance by an earlier test, and preflight then checks that address instead.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        sweep = Sweep(name="bad_input", trainable=no_trainable, base=too_big, address=address,
                      space=categorical("batch_size", [16, 32]))
        assert preflight(sweep).base_dict["workers"] == too_big.workers


def test_auto_with_no_platform_present_that_the_study_supports_is_refused():
    """--platform auto means the same in every study (sweeps/driver/define/cli.py): the best
    platform present, among those the study has implementations for."""
    from types import SimpleNamespace

    from accelsweep.sweeps.driver.define.cli import platform_from_args

    args = SimpleNamespace(platform="auto", address=None, dry_run=False)
    assert platform_from_args(args, ("cpu", "tpu"), "implementations of x")[0] == "cpu"  # no TPU here
    with pytest.raises(ConfigError, match=r"^platform must be a platform present on this machine with "
                                          r"implementations of x \(auto looks at neuron, tpu, cuda, cpu\); got "
                                          r"'auto'\. neuron has no implementations of x; no tpu: .*; cuda has no "
                                          r"implementations of x; cpu has no implementations of x\.$"):
        platform_from_args(args, ("tpu",), "implementations of x")


def cli_cases():
    uri_tail = "got 'http//host:5000'. It starts with 'http' but not 'http://': a character is missing."
    cpus = local_cpus()
    return [
        # argparse's own message; Python 3.12.8+ lists the choices without quotes.
        ("unknown platform", ["--platform", "ipu"], re.compile(
            r"error: argument --platform: invalid choice: 'ipu' \(choose from "
            + ", ".join(f"'?{name}'?" for name in ("auto", "cpu", "cuda", "xla", "neuron", "tpu", "neuron-standin-cpu")) + r"\)$")),
        ("num-samples 0", ["--num-samples", "0"], "error: argument --num-samples: must be an integer >= 1; got '0'"),
        ("time budget 0", ["--time-budget-s", "0"],
         "error: argument --time-budget-s: must be a number of seconds > 0; got '0'"),
        ("cpus-per-worker 0", ["--cpus-per-worker", "0"],
         "error: argument --cpus-per-worker: must be an integer >= 1; got '0'"),
        ("instance type with no price", ["--instance-type", "m5.large"],
         "error: instance_type must be one of trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, inf2.xlarge, "
         "g5.xlarge, g5.2xlarge, c7i.xlarge, c7i.2xlarge, m7i.2xlarge (or give --price-per-hour); got 'm5.large'. "
         "The price table has no entry for it."),
        ("malformed tracking URI", ["--tracking-uri", "http//host:5000"],
         f"error: tracking_uri must be {URI_ALLOWED}; {uri_tail}"),
        ("study storage not a database URL", ["--study-storage", "optuna.db"],
         "error: study_storage must be an SQLAlchemy database URL (sqlite:///optuna.db, postgresql://host/db, "
         "mysql://...); got 'optuna.db'"),
        ("study storage in a missing folder", ["--study-storage", "sqlite:////nonexistent-dir/o.db"],
         "error: study_storage must be a sqlite file in an existing directory; got 'sqlite:////nonexistent-dir/o.db'. "
         "Directory '/nonexistent-dir' does not exist."),
        ("more CPUs than this machine", ["--cpus-per-worker", str(cpus + 1)],
         f"error: cpus_per_worker x workers must be at most {cpus} (the CPUs of this machine; a local run); got "
         f"'{cpus + 1} x 1'. " + FITS_HINT.format(lower="cpus_per_worker (--cpus-per-worker) or workers")),
        ("seed above 2**32 - 1", ["--seed", "4294967296"], "error: " + SEED_RANGE + "got 4294967296"),
        ("retries < 0", ["--retries", "-1"], "error: retries must be an integer >= 0; got -1"),
        ("price NaN", ["--price-per-hour", "nan"], "error: price_per_hour must be a finite number > 0; got nan"),
        ("experiment name over MLflow's 500 characters", ["--experiment", "x" * 600],
         "error: experiment must be a non-empty MLflow experiment name of at most 500 characters (MLflow's limit), "
         f"or None for the sweep's name; got '{'x' * 40}...'. It has 600."),
        ("unreachable Ray address", ["--address", f"127.0.0.1:{CLOSED_PORT}"],
         f"error: address must be {ADDRESS_ALLOWED}; got '127.0.0.1:{CLOSED_PORT}'. Nothing answers at "
         f"127.0.0.1:{CLOSED_PORT} within 3 s: [Errno 111] Connection refused. Is the cluster up (`ray status` on its "
         "head) and its port open to this machine?"),
    ]


CLI_CASES = cli_cases()


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_the_command_line_refuses_before_any_trial(args, expected, tmp_path):
    store, storage = tmp_path / "mlflow.db", tmp_path / "ray"
    argv = ["--smoke", "--tracking-uri", f"sqlite:///{store}", "--storage-path", str(storage)]
    if "--tracking-uri" in args:
        argv = argv[:1] + argv[3:]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", *argv, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    last_line = done.stderr.strip().splitlines()[-1]
    if isinstance(expected, re.Pattern):
        assert expected.search(last_line), done.stderr[-2000:]
    else:
        assert last_line.endswith(expected), done.stderr[-2000:]
    # Nothing ran: no MLflow store was opened, Tune wrote nothing, no Ray instance started.
    assert not store.exists() and not storage.exists()
    assert "started a local Ray instance" not in done.stdout and "connected to Ray" not in done.stdout
    assert took < 120, f"refusing took {took:.0f} s"  # imports included; ray.init on a closed port takes minutes

