"""Headless Chromium driven over the Chrome DevTools Protocol, for tests that look at a
web UI the way a person would (tests/test_mlflow_ui.py opens MLflow's).

    with Chromium.start(tmp_path) as page:
        page.navigate("http://127.0.0.1:5000/")
        page.wait_for("document.querySelectorAll('a').length > 3")
        png = page.screenshot()

Debian's ``chromium`` package, not a pip browser package: playwright and pyppeteer
download a browser build of their own, which this project's machines cannot fetch.
env/browser.sh installs it. The DevTools websocket is spoken by the small stdlib client
below (text frames, masking, ping and close: all CDP needs), so the dev environment gains
no dependency for one test.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "env" / "browser.sh"


def find_chromium() -> tuple[Optional[str], str]:
    """(path of the chromium binary, "") once env/browser.sh has it installed, or
    (None, why it cannot be had) for the caller to skip with."""
    done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return None, reason[-1] if reason else f"{INSTALL_SCRIPT.name} exited {done.returncode}"
    return done.stdout.strip().splitlines()[-1], ""


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a process started with start_new_session=True and everything it started
    (Chromium's renderers, the MLflow server's workers): SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


class CdpError(RuntimeError):
    pass


class _WebSocket:
    """A client websocket (RFC 6455) over a plain TCP socket: enough for CDP on localhost."""

    def __init__(self, url: str, timeout_s: float):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        # No Origin header: Chromium refuses DevTools connections from a web origin
        # it was not told to allow, and a header-less client is not one.
        self.sock.sendall((f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CdpError(f"DevTools closed the connection during the handshake: {head!r}")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise CdpError(f"DevTools refused the websocket: {status.decode(errors='replace')}")
        self._buffer = head.split(b"\r\n\r\n", 1)[1]

    def send_text(self, text: str) -> None:
        self._send(0x1, text.encode())

    def _send(self, opcode: int, payload: bytes) -> None:
        # Clients must mask every frame (RFC 6455 5.3).
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise CdpError("DevTools closed the websocket")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def receive_text(self) -> str:
        """The next whole text message; pings are answered, fragments joined."""
        message = b""
        while True:
            first, second = self._read(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._read(8))
            payload = self._read(length)  # servers never mask
            if opcode == 0x8:
                raise CdpError("DevTools closed the websocket")
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode in (0x0, 0x1, 0x2):
                message += payload
                if first & 0x80:
                    return message.decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send(0x8, b"")
        self.sock.close()


class Page:
    """One browser tab: navigate, run JavaScript, wait for a condition, screenshot."""

    def __init__(self, websocket_url: str, timeout_s: float = 30.0):
        self._ws = _WebSocket(websocket_url, timeout_s)
        self._next_id = 0

    def call(self, method: str, **params: Any) -> dict:
        """Send one CDP command and return its result; events in between are dropped
        (these tests poll the page instead of following events)."""
        self._next_id += 1
        self._ws.send_text(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.receive_text())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(f"{expression!r} threw: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout_s: float = 60.0, what: str = "") -> Any:
        """Poll a JavaScript expression until it is truthy and return its value. The
        timeout only ends a wait that would never succeed: it asserts nothing about speed."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.evaluate(expression)
            except CdpError as error:
                # Asked while the page was replaced by the next one: ask the new one.
                if not any(gone in str(error) for gone in ("context was destroyed", "Cannot find context")):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen in the browser after {timeout_s:.0f} s: {what or expression}\n"
                                     f"page text: {self.text()[:2000]!r}")
            time.sleep(0.25)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, clip: Optional[dict] = None) -> bytes:
        """PNG of the viewport, or of ``clip`` ({x, y, width, height} in CSS pixels)."""
        params: dict[str, Any] = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        self._ws.close()


class Chromium:
    """A headless Chromium with one tab, in its own process group and profile folder."""

    @classmethod
    @contextlib.contextmanager
    def start(cls, workdir: Path, binary: str = "chromium", width: int = 1440,
              height: int = 1000, timeout_s: float = 60.0) -> Iterator[Page]:
        profile = Path(workdir) / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a reused profile's is stale: wait for this browser's
        with contextlib.ExitStack() as cleanup:  # undone in reverse, also when a step fails
            # Its singleton lock folder goes to TMPDIR and outlives the stop: a folder of this
            # browser's own, removed after it. Short, in /tmp: the lock is a Unix socket, whose path
            # may not pass 107 bytes (a pytest-xdist worker's tmp_path does).
            scratch = tempfile.mkdtemp(prefix="asw-chromium-")
            cleanup.callback(shutil.rmtree, scratch, ignore_errors=True)
            log = cleanup.enter_context(open(Path(workdir) / "chromium.log", "wb"))
            # --no-sandbox: CI and the dev machines run as root, where Chromium's sandbox
            # refuses to start. Port 0: Chromium picks a free one and writes it to
            # DevToolsActivePort in the profile, so two tests never race for a port.
            proc = subprocess.Popen(
                [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
                 "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "TMPDIR": scratch})
            cleanup.callback(stop_group, proc)
            port = cls._devtools_port(proc, port_file, Path(log.name), timeout_s)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as reply:
                targets = json.load(reply)
            tab = next(t for t in targets if t.get("type") == "page")
            page = Page(tab["webSocketDebuggerUrl"], timeout_s)
            cleanup.callback(page.close)
            page.call("Page.enable")
            page.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=1, mobile=False)
            yield page

    @staticmethod
    def _devtools_port(proc: subprocess.Popen, port_file: Path, log: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise CdpError(f"chromium exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
            if port_file.exists():
                lines = port_file.read_text().splitlines()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.1)
        raise CdpError(f"chromium opened no DevTools port in {timeout_s:.0f} s: "
                       f"{log.read_text(errors='replace')[-2000:]}")
