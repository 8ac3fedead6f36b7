"""A tracking server's password, and the other secrets in a sweep's environment, reach
no file the sweep writes and none of its output; --resume refuses a command whose
defining flags differ from the stopped run's, naming each difference.

One sweep (tests/fault_sweep.py, 4 trials) against a real MLflow server with basic auth
on 127.0.0.1, its URI ``http://admin:PASSWORD@127.0.0.1:PORT``: interrupted after its
second trial, refused on --resume with another --seed and --tracking-uri, resumed with
the right flags to its end. Then every file under the test's directory (Tune's storage
path, the server's backend store and artifact root, the Optuna study, the server's log)
and every command's stdout and stderr are searched for each secret.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from tests.conftest import REPO
from tests.mlflow_server import MlflowServer
from tests.test_secrets import FAKE_SECRETS

# '@' must be percent-encoded in the URI: the sweep must decode it to log in.
PASSWORD = "Leak-Test-P@ss-7f3a9c"
USER = "admin"
TRIALS = 4
CRASH_SIGNS = ("Traceback", "*** SIG", "Stack trace", "Aborted", "core dumped")


def status_of(url: str, auth: bool) -> int:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture
def auth_server(tmp_path):
    """``mlflow server --app-name basic-auth`` on 127.0.0.1 (needs Flask-WTF, MLflow's
    ``auth`` extra): admin's password from MLFLOW_AUTH_ADMIN_PASSWORD, read by MLflow when
    it creates the admin user (mlflow/server/auth/config.py, read_auth_config)."""
    pytest.importorskip("flask_wtf", reason="mlflow server --app-name basic-auth needs Flask-WTF (mlflow[auth])")
    folder = tmp_path / "server"
    folder.mkdir()
    config = folder / "basic_auth.ini"
    config.write_text("[mlflow]\ndefault_permission = READ\n"
                      f"database_uri = sqlite:///{folder}/basic_auth.db\nadmin_username = {USER}\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                      # A checked password is remembered for a minute: without it the server
                      # spends most of its CPU in scrypt, checking it again on each of the
                      # sweep's requests (the team store shortens the admin's hash instead).
                      "auth_cache_ttl_seconds = 60\n")
    search = "/api/2.0/mlflow/experiments/search?max_results=1"
    server = MlflowServer(
        folder, f"sqlite:///{folder}/store.db",
        ["--app-name", "basic-auth", "--artifacts-destination", str(folder / "artifacts")],
        env={"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
             "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-of-a-test-server"},
        ready=lambda uri: _status_or_none(uri + search) == 200)
    try:
        server.start()
        assert status_of(server.uri + search, auth=False) == 401, "the server answers without a password: auth is off"
        yield server.port
    finally:
        server.stop()


def _status_or_none(url: str):
    try:
        return status_of(url, auth=True)
    except OSError:
        return None


def sweep(tmp_path, uri: str, *extra: str, seed: int = 0) -> list[str]:
    return [sys.executable, "-m", "tests.fault_sweep", "--tracking-uri", uri, "--storage-path", str(tmp_path / "ray"),
            "--num-samples", str(TRIALS), "--scheduler", "none", "--max-concurrent-trials", "1",
            "--seed", str(seed), *extra]


@pytest.mark.slow
def test_no_secret_reaches_a_file_or_the_output_and_resume_checks_its_flags(tmp_path, auth_server, monkeypatch):
    port = auth_server
    uri = f"http://{USER}:{quote(PASSWORD, safe='')}@127.0.0.1:{port}"
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, **FAKE_SECRETS, "FAULT_SWEEP_MARKERS": str(markers),
           # An innocent name whose value holds the password, in a URI.
           "MY_ENDPOINT": f"http://{USER}:{quote(PASSWORD, safe='')}@mlflow.example.com/api"}
    outputs = {}

    # 1. Started, interrupted after its second trial (SIGINT: the sweep stops cleanly).
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(sweep(tmp_path, uri), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        deadline = time.monotonic() + 300
        while len(list(markers.glob("end-*"))) < 2 and driver.poll() is None:
            assert time.monotonic() < deadline, "no two trials ended in 300 s"
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=180)
    outputs["first"] = (tmp_path / "first.log").read_text()
    assert driver.returncode == 130, outputs["first"][-3000:]

    # 2. --resume with another seed and another store: refused before anything starts.
    other_store = f"sqlite:///{tmp_path}/other.db"
    refused = subprocess.run(sweep(tmp_path, other_store, "--resume", seed=1), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    outputs["refused"] = refused.stdout + refused.stderr
    assert refused.returncode == 2, outputs["refused"][-3000:]
    assert not any(sign in outputs["refused"] for sign in CRASH_SIGNS), outputs["refused"][-3000:]
    said = refused.stderr
    assert said.startswith("error: --resume: "), said
    assert "the stopped run used --seed 0, this command --seed 1" in said, said
    assert (f"the stopped run used --tracking-uri http://127.0.0.1:{port}, this command --tracking-uri "
            f"sqlite:///{tmp_path}/other.db") in said, said
    assert not os.path.exists(tmp_path / "other.db"), "the refused command opened the other store"
    assert len(list((tmp_path / "ray").glob("fault_sweep-*"))) == 1

    # 3. --resume with the stopped run's flags: it finishes the sweep.
    resumed = subprocess.run(sweep(tmp_path, uri, "--resume"), cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=400)
    outputs["resumed"] = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, outputs["resumed"][-3000:]
    assert "resuming" in resumed.stdout

    # The runs are on the server: the sweep logged in.
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    client = MlflowClient(f"http://127.0.0.1:{port}")
    experiment = client.get_experiment_by_name("fault_sweep")
    assert experiment is not None, "the sweep created no experiment on the server"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED"
              and r.data.tags.get("status") == "finished"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [r.info for r in parents]
    assert len(trials) == TRIALS, [(r.info.run_name, r.info.status, r.data.tags.get("status")) for r in runs]
    assert client.list_artifacts(parents[0].info.run_id), "the report was not logged on the parent run"

    # Nothing written or printed holds a secret: the password as given, percent-encoded
    # and as a basic-auth header; the environment's secrets; the innocent-looking URI.
    secrets = {"the password": PASSWORD, "the password in the URI": quote(PASSWORD, safe=""),
               "the basic-auth header": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
               "MY_ENDPOINT": env["MY_ENDPOINT"], **FAKE_SECRETS}
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert any("tuner.pkl" in path for path in written) and any("store.db" in path for path in written)
    assert any(os.sep + "artifacts" + os.sep in path and path.endswith("report.md") for path in written)
    for path in written:
        with open(path, "rb") as record:
            content = record.read()
        for name, value in secrets.items():
            assert value.encode() not in content, f"{name} in {path}"
    for command, output in outputs.items():
        assert "View run" not in output, f"MLflow's per-run URL lines in the {command} command's output"
        for name, value in secrets.items():
            assert value not in output, f"{name} in the output of the {command} command"
