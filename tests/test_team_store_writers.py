"""Many writers on one team store (issue 30, item 2): four sweeps started together against
one MLflow server and one study database. Where this machine can make network namespaces
(root, ``ip netns``: sweeps/driver/ops/cluster_hosts.py), two drivers run on each of two hosts,
each host a namespace with its own address, and the store is bound to the bridge's address
as a team's store host would be; else four processes here. Each driver brings its own
private local Ray, as four people each sweeping on their own machine would.

Checked: each trial is exactly one run under exactly its parent, each study has one trial
per searched run, nothing is left RUNNING, and PostgreSQL's client connections (read from
pg_stat_activity while the sweeps run) stay within the server's pools plus each driver's
bound however many trials run; on hosts, the study writes came from both hosts' addresses.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading

import pytest

from accelsweep.sweeps.driver.ops import cluster_hosts

from accelsweep.sweeps.driver.ops import team_store
from tests.conftest import ACCELSWEEP, REPO
from tests.team_store_fixture import needs_postgresql, running_store

HOSTS_UNAVAILABLE = cluster_hosts.unavailable_reason()
pytestmark = [needs_postgresql, pytest.mark.slow]

SWEEPS = 4
TRIALS = 12
EXAMPLE = os.path.join(REPO, "examples", "user_trainable.py")


@pytest.fixture(scope="module")
def writers():
    """(store, hosts): the store on the bridge's address and the worker hosts, or on
    loopback and no hosts where namespaces cannot be made."""
    with contextlib.ExitStack() as stack:
        hosts = []
        if HOSTS_UNAVAILABLE is None:
            hosts = [host for host in stack.enter_context(cluster_hosts.hosts_network(workers=2))
                     if host.role == "worker"]
        address = cluster_hosts.BRIDGE_ADDRESS if hosts else "127.0.0.1"
        yield stack.enter_context(running_store(address)), hosts


class ConnectionWatch:
    """The peak of PostgreSQL's client connections per database, and every client address
    seen per database, read every 0.3 s from pg_stat_activity while the block runs."""

    def __init__(self, store: team_store.TeamStore):
        self.store = store
        self.peak: dict[str, int] = {"mlflow": 0, "optuna": 0}
        self.addresses: dict[str, set[str]] = {"mlflow": set(), "optuna": set()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ConnectionWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(0.3):
            try:
                now = team_store.clients(self.store)
            except Exception:  # noqa: BLE001 - a busy moment (the store full, say); the next read counts
                continue
            for database in self.peak:
                self.peak[database] = max(self.peak[database], sum(name == database for name, _ in now))
                self.addresses[database].update(address for name, address in now if name == database and address)


@pytest.mark.host_timing
def test_four_sweeps_at_once_keep_every_record_and_the_connections_bounded(writers, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    import optuna

    from accelsweep.sweeps.driver.define.cli import NOTHING_MEASURED_EXIT
    from accelsweep.sweeps.driver.record.optuna_study import DRIVER_CONNECTIONS

    store, hosts = writers
    env = {**os.environ, "PGPASSFILE": store.credentials, "RAY_AUTH_MODE": "disabled"}
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):  # each driver its own private local Ray
        env.pop(name, None)
    sweeps, logs = [], []
    with ConnectionWatch(store) as watch:
        for n in range(SWEEPS):
            folder = tmp_path / f"sweep{n}"
            folder.mkdir()
            argv = [ACCELSWEEP, "run", EXAMPLE, "--smoke", "--num-samples", str(TRIALS), "--seed", str(n),
                    "--tracking-uri", store.tracking_uri, "--study-storage", store.study_storage,
                    "--experiment", "many"]
            if hosts:  # two drivers on each host
                argv = ["ip", "netns", "exec", hosts[n % len(hosts)].name, *argv]
            logs.append(open(folder / "output.log", "w"))
            # Its own session: a signal a driver sends its group stays there.
            sweeps.append(subprocess.Popen(argv, cwd=folder, env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                           start_new_session=True))
        try:
            for sweep in sweeps:
                sweep.wait(timeout=600)
        finally:
            for sweep, log in zip(sweeps, logs):
                if sweep.poll() is None:
                    sweep.kill()
                log.close()
    outputs = [(tmp_path / f"sweep{n}" / "output.log").read_text() for n in range(SWEEPS)]
    # Four sweeps' trials on two cores contend: a sweep whose every window was contended
    # ranks nothing and ends with NOTHING_MEASURED_EXIT. What is checked here is the record.
    assert all(sweep.returncode in (0, NOTHING_MEASURED_EXIT) for sweep in sweeps), \
        "\n\n".join(o[-2000:] for o in outputs)
    client = MlflowClient(store.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("many").experiment_id], max_results=1000)
    parents = {r.info.run_id: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert len(parents) == SWEEPS and all(r.info.status != "RUNNING" for r in runs)
    monkeypatch.setenv("PGPASSFILE", store.credentials)
    for parent_id, parent in parents.items():
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
        numbers = [r.data.tags["trial_number"] for r in children]
        assert len(numbers) == len(set(numbers)) and children, numbers  # one run per trial, none lost
        searched = [r for r in children if r.data.tags.get("status") != "reused"]
        study = optuna.load_study(study_name=parent.data.tags["optuna_study"], storage=store.study_storage)
        assert len(study.trials) == len(searched) and {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    # The drivers' study connections: DRIVER_CONNECTIONS each at most (plus the one of its
    # check of the store before it starts), however many trials; the server's: its pools'.
    assert 0 < watch.peak["optuna"] <= SWEEPS * (DRIVER_CONNECTIONS + 1), watch.peak
    assert 0 < watch.peak["mlflow"] <= team_store.SERVER_CONNECTIONS, watch.peak
    if hosts:  # the study writes came over the network from both hosts
        assert {host.address for host in hosts} <= watch.addresses["optuna"], watch.addresses
        assert watch.addresses["mlflow"] == {store.host}, watch.addresses  # the server, on the store's host
    print(f"peak connections, four sweeps at once ({'two hosts' if hosts else 'one host'}): {watch.peak}; "
          f"clients: {watch.addresses}")
