"""A real ``mlflow server`` for the tests that need one (the UI in a browser, a server lost
mid-sweep, a server behind basic auth): on a free port of 127.0.0.1 (or of a test host's
address), in a session of its own (so that it and its workers stop together), started and
stopped as often as a test needs on the same port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from tests.browser import stop_group

# Two cores shared with other test sessions: a server starts in 10-30 s, sometimes more.
START_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers_health(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


class MlflowServer:
    """``mlflow server`` on ``backend_store_uri`` (default: a sqlite store in ``folder``),
    one worker and no job runner (six processes that run GenAI jobs, of no use here and a
    3-4x slower start on 2 cores). ``ready(uri)`` says when it serves (default: /health)."""

    def __init__(self, folder: Path, backend_store_uri: Optional[str] = None, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] = (), ready: Callable[[str], bool] = answers_health, host: str = "127.0.0.1"):
        self.folder, self.port, self.host = Path(folder), free_port(), host
        self.uri = f"http://{host}:{self.port}"
        self.backend_store_uri = backend_store_uri or f"sqlite:///{self.folder}/m.db"
        self.extra_args, self.env, self.ready = list(extra_args), dict(env), ready
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "MlflowServer":
        with open(self.folder / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend_store_uri,
                 "--host", self.host, "--port", str(self.port), "--workers", "1", *self.extra_args],
                cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                     **self.env})
        deadline = time.monotonic() + START_S
        while not self.ready(self.uri):
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"mlflow server never served in {START_S} s: " + self.log()
            time.sleep(0.3)
        return self

    def kill(self) -> None:
        """SIGKILL, the server and its workers: no goodbye to its clients (a lost server)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)

    def log(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")[-3000:]
