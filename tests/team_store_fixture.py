"""The ``store`` fixture of the team-store tests (tests/test_team_store.py,
tests/test_team_store_faults.py): a team store (sweeps/driver/ops/team_store.py) of the
module's own in a folder under /tmp, on free ports, stopped and removed after it;
``running_store`` makes one bound to another address (tests/test_team_store_writers.py).

While it is up, this process's environment holds the MLflow server's login
(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, as a team member exports them): the
tests' MlflowClient and the sweeps they start (whose environment is a copy of this one)
log in with it. Put back as it was after the module."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile

import pytest

from accelsweep.sweeps.driver.ops import team_store
from tests.mlflow_server import free_port

LOGIN_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")

needs_postgresql = pytest.mark.skipif(
    not (shutil.which("initdb") or os.path.isdir("/usr/lib/postgresql")),
    reason="PostgreSQL's server programs are not installed here (apt install postgresql)")


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


@contextlib.contextmanager
def environment(**values):
    """This process's environment with ``values`` set, put back as it was after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def running_store(host: str = "127.0.0.1"):
    """A team store bound to ``host`` in a folder of its own, with its login in this
    process's environment; stopped, checked gone and removed after."""
    # Under /tmp itself: as root the server runs as postgres, which cannot enter pytest's
    # own 0700 folder.
    folder = tempfile.mkdtemp(prefix="asw-team-store-", dir="/tmp")
    try:
        started = team_store.up(folder, host=host, pg_port=free_port(), mlflow_port=free_port(),
                                say=lambda line: None)
        with environment(**dict(zip(LOGIN_VARIABLES, started.mlflow_login()))):
            try:
                yield started
            finally:
                team_store.down(folder)
        assert not listening(started.pg_port, host) and not listening(started.mlflow_port, host)
        assert team_store.read(folder) is None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def store():
    with running_store() as started:
        yield started
