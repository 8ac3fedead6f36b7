"""Credentials stay out of the record, and what the tool serves stays on this machine.

Environment variables that look like secrets (KEY, SECRET, TOKEN, PASSWORD, CREDENTIAL)
never reach an MLflow param, tag or artifact, nor Tune's files; a password in a URI is
redacted; a local Ray instance starts no dashboard and keeps token auth on, because its
gRPC ports listen on every interface; the MLflow UI command binds 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import FAKE_SECRETS, REPO
from tests.test_sweep_e2e import mlflow_runs
from accelsweep.sweeps.driver.record.secrets import REDACTED, looks_secret, redact_uri, scrub

@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "MY_DB_PASSWORD",
                                  "MLFLOW_TRACKING_PASSWORD", "SOME_CREDENTIALS_FILE", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "WANDB_API_KEY", "db.passwd", "apiKey", "client-secret", "RAY_AUTH_TOKEN"])
def test_secret_looking_names(name):
    assert looks_secret(name)


@pytest.mark.parametrize("name", ["KEYBOARD", "TOKENIZERS_PARALLELISM", "MONKEY", "PWD", "HOME", "PATH",
                                  "CUDA_VISIBLE_DEVICES", "NEURON_RT_ROOT_COMM_ID", "batch_size", "keyboard_layout",
                                  "RAY_AUTH_MODE", "mlflow.parentRunId"])
def test_names_that_only_share_letters(name):
    assert not looks_secret(name)


def test_scrub_drops_secret_names_and_redacts_secret_values_anywhere(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_SECRETS["HF_TOKEN"])
    monkeypatch.setenv("USE_AUTH_TOKEN", "1")  # a flag: too short to hunt for
    token = FAKE_SECRETS["HF_TOKEN"]
    clean = scrub({
        "HF_TOKEN": token,  # a secret-looking name with text: dropped, name and value
        "env.AWS_SECRET_ACCESS_KEY": "anything",
        "pad_token_id": 0,  # a count under a secret-looking word: kept
        "compile_cache": f"s3://bucket/{token}/cache",  # an innocent name, a secret inside
        "error": "connect failed: postgresql://ml:pw-in-uri@db:5432/mlflow",
        "batch_size": 16,
        "windows": 1,
    })
    assert clean == {"pad_token_id": 0, "compile_cache": f"s3://bucket/{REDACTED}/cache",
                     "error": f"connect failed: postgresql://ml:{REDACTED}@db:5432/mlflow",
                     "batch_size": 16, "windows": 1}


@pytest.mark.parametrize("uri, shown", [
    ("postgresql+psycopg2://ml:s3cr3t@db:5432/mlflow", f"postgresql+psycopg2://ml:{REDACTED}@db:5432/mlflow"),
    ("https://user:p%40ss@mlflow.example.com", f"https://user:{REDACTED}@mlflow.example.com"),
    ("https://mlflow.example.com:443/path@x", "https://mlflow.example.com:443/path@x"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    # An unencoded '@' in the password: the password runs to the authority's last '@'.
    ("http://user:Pa55@w0rd@127.0.0.1:5000/x", f"http://user:{REDACTED}@127.0.0.1:5000/x"),
    # A token in the query string, by the parameter's name; other parameters kept.
    ("http://host:5000/?token=abc123def&x=1", f"http://host:5000/?token={REDACTED}&x=1"),
    ("https://h/api?access_token=zz;page=2", f"https://h/api?access_token={REDACTED};page=2"),
    ("refused: http://a:b@c/d, then https://h/?api_key=k", f"refused: http://a:{REDACTED}@c/d, then "
                                                          f"https://h/?api_key={REDACTED}"),
])
def test_uri_passwords_are_redacted(uri, shown):
    assert redact_uri(uri) == shown


def test_a_command_line_is_shown_without_its_secrets():
    from accelsweep.sweeps.driver.record.secrets import redact_command_line

    argv = ["python", "sweeps/neuron_vit.py", "--tracking-uri", "http://u:Pa55@w0rd@127.0.0.1:5000", "--api-token",
            "tok-123456789", "--db-password=hunter22", "--seed", "0", "--study-storage",
            "postgresql://ml:s3cr3t@db/optuna", "--tracking-uri=http://h/?token=zz"]
    shown = redact_command_line(argv)
    assert shown == ["python", "sweeps/neuron_vit.py", "--tracking-uri", "http://127.0.0.1:5000", "--api-token",
                     REDACTED, f"--db-password={REDACTED}", "--seed", "0", "--study-storage",
                     f"postgresql://ml:{REDACTED}@db/optuna", f"--tracking-uri=http://h/?token={REDACTED}"]
    for secret in ("Pa55", "w0rd", "tok-123456789", "hunter22", "s3cr3t", "zz"):
        assert not [a for a in shown if secret in a], secret


def test_ray_records_the_redacted_command_line_as_the_jobs_entrypoint(monkeypatch):
    """Ray 2.60's ray.init takes the job's entrypoint from get_entrypoint_name at connect
    time; inside the context it is the redacted command line, and Ray's own after it."""
    import psutil
    import ray._private.utils as ray_utils

    from accelsweep.sweeps.driver.record.secrets import redact_command_line
    from accelsweep.trainables import ray_adapter

    monkeypatch.setattr(psutil.Process, "cmdline",
                        lambda self: ["python", "s.py", "--tracking-uri", "http://u:Secret99@h:5000"])
    original = ray_utils.get_entrypoint_name
    with ray_adapter.entrypoint_shown_as(redact_command_line):
        assert ray_utils.get_entrypoint_name() == "python s.py --tracking-uri http://h:5000"
    assert ray_utils.get_entrypoint_name is original
    assert "Secret99" in ray_utils.get_entrypoint_name()  # Ray's own, unchanged


def assert_no_secret(text: str, where: str) -> None:
    for name, value in FAKE_SECRETS.items():
        assert value not in text, f"the value of {name} in {where}"
        assert name not in text, f"{name} in {where}"


def test_tracker_scrubs_every_param_and_tag(monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from accelsweep.sweeps.driver.record.tracking import SweepTracker

    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)
    leaky = {f"env.{name}": value for name, value in FAKE_SECRETS.items()}
    leaky["compile_cache"] = f"s3://bucket/{FAKE_SECRETS['HF_TOKEN']}"
    leaky["cost_basis"] = f"priced with {FAKE_SECRETS['MY_DB_PASSWORD']}"
    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = SweepTracker(uri, "leaky")
    parent = tracker.start_sweep("sweep", {**leaky, "seed": 0}, {**leaky, "kind": "sweep"})
    child = tracker.start_trial("trial-001", {**leaky, "batch_size": 8}, {**leaky, "status": "running"})
    tracker.reopen(child, tags=leaky)
    tracker.finish(child, "FAILED", tags={**leaky, "error": f"token {FAKE_SECRETS['HF_TOKEN']} refused"})
    client = MlflowClient(uri)
    for run_id in (parent, child):
        data = client.get_run(run_id).data
        assert_no_secret(json.dumps([data.params, data.tags]), f"run {run_id}")
    data = client.get_run(child).data
    assert data.params["batch_size"] == "8" and data.params["compile_cache"] == f"s3://bucket/{REDACTED}"
    assert data.tags["error"] == f"token {REDACTED} refused"


def test_a_tracking_server_is_opened_at_its_own_address():
    from accelsweep.sweeps.driver.record.tracking import ui_command

    assert ui_command("http://user:Pa55word@127.0.0.1:5000") == \
        "open http://127.0.0.1:5000 in a browser (the tracking server serves MLflow's UI)"
    assert ui_command("databricks").startswith("open the experiment in your Databricks workspace")


def test_ui_command_binds_localhost_and_hides_a_database_password(tmp_path):
    from accelsweep.sweeps.driver.record.tracking import SweepTracker

    tracker = SweepTracker(f"sqlite:///{tmp_path}/m.db", "ui")
    assert tracker.ui_command().endswith("--host 127.0.0.1 --port 5000")
    tracker.tracking_uri = "postgresql://ml:s3cr3t-pw@db/mlflow"
    assert "s3cr3t-pw" not in tracker.ui_command() and f"ml:{REDACTED}@db" in tracker.ui_command()


def test_readme_serves_mlflow_on_localhost_only():
    with open(os.path.join(REPO, "README.md")) as readme:
        commands = [line for line in readme if re.search(r"mlflow (ui|server)\b", line)]
    assert commands, "README shows no mlflow ui command"
    for line in commands:
        assert "--host 127.0.0.1" in line, line


def test_cluster_yaml_exports_no_secret():
    """test_cluster_yaml.test_no_credentials looks for AWS key shapes; this one for any
    secret-looking variable given a value in the nodes' shell commands."""
    with open(os.path.join(REPO, "cluster.yaml")) as config:
        code = [line.split("#", 1)[0] for line in config]
    assignments = re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S*)", "\n".join(code))
    assert assignments, "no VAR=value found: the pattern no longer matches cluster.yaml"
    for name, value in assignments:
        assert not looks_secret(name), f"cluster.yaml sets {name}"


@pytest.mark.slow
def test_a_smoke_sweep_records_no_secret(main_job, tmp_path):
    """The shared main job ran with FAKE_SECRETS in its environment (tests/conftest.py)."""
    uri, storage = main_job.tracking_uri, main_job.storage
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parents, children = mlflow_runs(uri, main_job.experiment)
    assert len(parents) == 1 and len(children) >= 4
    for run in parents + children:
        run_id = run.info.run_id
        assert_no_secret(json.dumps([run.data.params, run.data.tags, run.info.run_name]), f"run {run_id}")
        pending = [""]
        while pending:
            for item in client.list_artifacts(run_id, pending.pop() or None):
                if item.is_dir:
                    pending.append(item.path)
                else:
                    local = client.download_artifacts(run_id, item.path, str(tmp_path / "artifacts"))
                    with open(local, "rb") as artifact:
                        assert_no_secret(artifact.read().decode("utf-8", "replace"), f"artifact {item.path}")
    # Tune's own files (experiment state, trial configs) are records too.
    written = [os.path.join(d, f) for d, _, files in os.walk(storage) for f in files]
    assert written, "Tune wrote nothing under --storage-path"
    for path in written:
        with open(path, "rb") as record:
            assert_no_secret(record.read().decode("utf-8", "replace"), path)
    assert_no_secret(main_job.stdout + main_job.stderr, "the sweep's output")


# Run in a child process: it starts a local instance the way a sweep does, then lists
# the listening TCP sockets of its own process tree from /proc (Linux).
LISTENERS = r'''
import json, os, socket, sys, time
os.environ.pop("RAY_AUTH_MODE", None)
from accelsweep.sweeps.driver.run.lifecycle import connect_ray
connect_ray(None)
time.sleep(5)  # Ray starts its workers and agents after ray.init returns

def parent_of(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])

pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
parents = {}
for pid in pids:
    try:
        parents[pid] = parent_of(pid)
    except OSError:
        pass
tree, todo = set(), [os.getpid()]
while todo:
    pid = todo.pop()
    tree.add(pid)
    todo += [child for child, parent in parents.items() if parent == pid]

def address(hex_address):
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)

listening = {}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as lines:
        for line in list(lines)[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                listening[fields[9]] = address(fields[1])
found = []
for pid in sorted(tree):
    try:
        command = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
        if pid == os.getpid():
            command = "this driver"  # its own command line is this script
        environ = open(f"/proc/{pid}/environ").read().split("\0")
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        inode = target[len("socket:["):-1] if target.startswith("socket:[") else None
        if inode in listening:
            host, port = listening[inode]
            found.append({"pid": pid, "command": command[:300], "host": host, "port": port,
                          "driver": pid == os.getpid()})
    if "gcs_server" in command or "dashboard.py" in command:
        found.append({"pid": pid, "command": command[:2000], "host": None, "port": None, "driver": False,
                      "auth": [e for e in environ if e.startswith("RAY_AUTH_MODE=")]})
print("LISTENERS " + json.dumps(found))
# The job table (what `ray list jobs` and the dashboard show), and every Ray process's
# command line and environment: none may hold the password this driver was given in its
# command line (--tracking-uri) and in MLFLOW_TRACKING_PASSWORD.
import ray._private.state as state
leaks = []
for pid in sorted(tree - {os.getpid()}):
    try:
        seen = open(f"/proc/{pid}/cmdline").read() + open(f"/proc/{pid}/environ").read()
    except OSError:
        continue
    if "Hunter2" + "Secret" in seen:  # split: this program's own text is in its command line
        leaks.append(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:200])
commands = []
for pid in sorted(tree - {os.getpid()}):
    try:
        commands.append(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:300])
    except OSError:
        pass
print("JOBS " + json.dumps({"entrypoints": [job.get("Entrypoint", "") for job in state.state.job_table()],
                            "leaks": leaks, "commands": commands}))
'''



@pytest.mark.slow
def test_a_local_instance_serves_nothing_beyond_what_ray_needs(tmp_path):
    """Every listener of the instance (GCS, raylet, workers, agents, the driver's own core
    worker) on 127.0.0.1 only, token auth on; the job table and every Ray process free of
    the password the driver was given."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    # Ray's default token auth writes its token to ~/.ray/auth_token: a home of the test's own,
    # not the user's (whose token a later `ray start` of theirs would read).
    env["HOME"] = str(tmp_path)
    env["MLFLOW_TRACKING_PASSWORD"] = "Hunter2Secret"  # exported, and in the command line below
    done = subprocess.run([sys.executable, "-c", LISTENERS, "--tracking-uri",
                           "http://user:Hunter2Secret@127.0.0.1:5000"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.split("LISTENERS ", 1)[1].split("\nJOBS ", 1)[0])
    jobs = json.loads(done.stdout.split("\nJOBS ", 1)[1])
    assert jobs["entrypoints"] and all("Hunter2Secret" not in e for e in jobs["entrypoints"]), jobs
    assert any("--tracking-uri http://127.0.0.1:5000" in e for e in jobs["entrypoints"]), jobs
    assert jobs["leaks"] == [], "a Ray process holds the password in its command line or environment"
    # Only what a private instance uses: no autoscaler monitor (no node to add), no log
    # monitor (no --verbose to copy workers' output for): ray_adapter.without_idle_processes.
    assert any("raylet" in command for command in jobs["commands"]), jobs["commands"]
    assert not [c for c in jobs["commands"] if "autoscaler/_private/monitor.py" in c or "log_monitor.py" in c]
    sockets = [s for s in found if s["port"] is not None]
    assert sockets, "no listening socket found: the /proc walk no longer sees Ray's processes"
    loopback = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}  # the last: IPv4 loopback on an IPv6 socket
    for listener in sockets:
        # No dashboard, no MLflow server: nothing serves HTTP to people on this machine's ports.
        assert listener["port"] not in (8265, 5000), listener
        assert "dashboard.py" not in listener["command"] and "mlflow" not in listener["command"], listener
        assert listener["host"] in loopback, listener
    gcs = [s for s in found if "gcs_server" in s["command"] and s["port"] is None]
    assert gcs and all(s["auth"] == ["RAY_AUTH_MODE=token"] for s in gcs), gcs
    assert (tmp_path / ".ray" / "auth_token").stat().st_size > 0  # the token Ray made for it
    for dashboard in (s for s in found if "dashboard.py" in s["command"] and s["port"] is None):
        # Ray runs a minimal dashboard head even with include_dashboard=False: no web
        # frontend, and bound to 127.0.0.1 should it ever listen.
        assert "--host=127.0.0.1" in dashboard["command"] and "--disable-frontend" in dashboard["command"]


def test_a_server_password_goes_to_mlflow_variables_not_the_uri(monkeypatch):
    from accelsweep.sweeps.driver.record.secrets import (credentials_to_environment, mlflow_credentials_restored,
                                               shown_uri, split_http_credentials)

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with mlflow_credentials_restored():
        # The URI asked for wins over the variables; '%40' is an '@' in the password.
        assert credentials_to_environment("https://ml:p%40ss-w0rd@mlflow.example.com:5000/x") == \
            "https://mlflow.example.com:5000/x"
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "ml"
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "p@ss-w0rd"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "someone-else" and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    # Other schemes keep their URI (SQLAlchemy reads the password from it); shown redacted.
    database = "postgresql://ml:s3cr3t-pw@db:5432/mlflow"
    assert credentials_to_environment(database) == database and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    assert shown_uri(database) == f"postgresql://ml:{REDACTED}@db:5432/mlflow"
    assert shown_uri("http://u:pw-of-u@127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert split_http_credentials("http://127.0.0.1:5000") == ("http://127.0.0.1:5000", None, None)


def fault_plan(tracking_uri, study_storage=None, seed=0, windows=2):
    from accelsweep import Objective, Sweep, plan_sweep
    from tests.fault_sweep import FaultSweepConfig, sleepy_trainable

    return plan_sweep(Sweep(name="fault_sweep", trainable=sleepy_trainable, base=FaultSweepConfig(windows=windows),
                            space=lambda trial: {"x": trial.suggest_categorical("x", [0, 1, 2])},
                            objectives=[Objective("throughput_samples_per_s", "max")], tracking_uri=tracking_uri,
                            study_storage=study_storage, seed=seed))


def test_what_tune_pickles_holds_no_database_password():
    """Tune pickles the sweep callback (its tracker's URI, its study) and the plan (bound
    methods of it are the trials' resources and the callback's config): a database
    password stays in the driver's memory."""
    import ray.cloudpickle as cloudpickle

    from accelsweep.sweeps.driver.run.callbacks import SweepCallback
    from accelsweep.sweeps.driver.record.optuna_study import SweepStudy

    uri, study_url = "postgresql://ml:tracking-db-pw-1@db/mlflow", "postgresql://ml:study-db-pw-22@db/optuna"
    plan = fault_plan(uri, study_storage=study_url)

    class Tracker:  # what the callback reads of a SweepTracker
        tracking_uri, experiment, parent_run_id = uri, "fault_sweep", "run-1"

    study = SweepStudy(study_url, "fault_sweep-1", plan.objectives, plan.space.distributions)
    callback = SweepCallback(Tracker(), plan.complete_config, plan.resources_of, plan.baseline_point, None, {}, 4,
                             study=study)
    pickled = cloudpickle.dumps(callback)
    for password in ("tracking-db-pw-1", "study-db-pw-22"):
        assert password.encode() not in pickled
    assert callback.tracking_uri == uri and study.url == study_url  # the live objects keep them
    restored = cloudpickle.loads(pickled)
    assert restored.tracking_uri == f"postgresql://ml:{REDACTED}@db/mlflow"
    assert restored.complete_config({"x": 1})["x"] == 1  # the plan still works
    assert plan.sweep.tracking_uri == uri  # the caller's Sweep is left as it is


def test_resume_compares_the_defining_flags_not_the_password(tmp_path):
    from accelsweep.sweeps.driver.define.resume_check import ResumeMismatch, check_same_sweep, defining_flags

    stopped = {"defines": defining_flags(fault_plan(f"http://ml:old-pw-123@127.0.0.1:5000"))}
    assert "old-pw-123" not in json.dumps(stopped)
    check_same_sweep(fault_plan("http://ml:rotated-pw-456@127.0.0.1:5000"), stopped, "dir")  # same store
    check_same_sweep(fault_plan("sqlite:///elsewhere.db", seed=3), {"status": "interrupted"}, "dir")  # old marker
    with pytest.raises(ResumeMismatch) as refused:
        check_same_sweep(fault_plan(f"sqlite:///{tmp_path}/m.db", seed=1, windows=3), stopped, "dir")
    said = str(refused.value)
    assert said.startswith("--resume: the stopped run used --tracking-uri http://127.0.0.1:5000, this command "
                           f"--tracking-uri sqlite:///{tmp_path}/m.db; "), said
    assert "the stopped run used --seed 0, this command --seed 1" in said
    assert "windows=2, this command base config (--smoke, --platform, the study's own flags) windows=3" in said
    assert "--experiment" not in said and "search space" not in said
