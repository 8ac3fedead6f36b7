"""The team store's MLflow server sets TCP_NODELAY on each connection
(sweeps/driver/ops/server_protocol.py): uvicorn's own socket of several workers has
protocol number 0, on which asyncio does not set it, and every request then waited 40 ms
(Nagle's algorithm against the client's delayed ACK). A server of the user's own that
stalls so is named before the sweep, with the way out."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from uvicorn.config import Config
from uvicorn.importer import import_from_string
from uvicorn.server import ServerState

from accelsweep.sweeps.driver.define import store_checks
from accelsweep.sweeps.driver.ops import team_store


def accepted_connection() -> tuple[socket.socket, socket.socket]:
    """A TCP connection accepted on a listening socket made as uvicorn makes it for its
    workers: ``socket.socket(family)``, protocol number 0."""
    listening = socket.socket(socket.AF_INET)
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    client = socket.create_connection(listening.getsockname())
    served, _ = listening.accept()
    listening.close()
    return client, served


def nodelay(connection: socket.socket) -> int:
    return connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def app(scope, receive, send) -> None:  # an ASGI app that is never called
    raise AssertionError("no request was sent")


def test_the_servers_protocol_sets_nodelay_where_asyncio_does_not():
    option, name = team_store.UVICORN_OPTS.split()
    assert option == "--http"
    protocol_class = import_from_string(name)  # what uvicorn loads from the server's command line
    client, served = accepted_connection()
    loop = asyncio.new_event_loop()
    try:
        async def serve() -> tuple[int, int]:
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, served)
            left_alone = nodelay(served)  # asyncio's own transport: proto 0, not set
            config = Config(app=app)
            config.load()
            protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
            protocol.connection_made(transport)
            made = nodelay(served)
            transport.close()
            return left_alone, made

        left_alone, made = loop.run_until_complete(serve())
        assert served.proto == 0 and left_alone == 0  # the case, as uvicorn's workers meet it
        assert made != 0
    finally:
        loop.close()
        client.close()
        served.close()


def test_the_team_store_serves_with_it(monkeypatch, tmp_path):
    started = []

    class Started:
        pid = 4242

        def poll(self):
            return None

    monkeypatch.setattr(team_store.subprocess, "Popen", lambda argv, **kwargs: started.append(argv) or Started())
    monkeypatch.setattr(team_store, "_answers", lambda uri: True)
    monkeypatch.setattr(team_store, "_fast_admin_hash", lambda store, password: None)
    store = team_store.TeamStore(str(tmp_path), "127.0.0.1", 5432, 5000, None)
    monkeypatch.setattr(team_store.TeamStore, "mlflow_login", lambda self: ("admin", "pw"))
    team_store._start_mlflow(store, say=lambda line: None)
    (argv,) = started
    assert argv[argv.index("--uvicorn-opts") + 1] == team_store.UVICORN_OPTS


def json_server(nodelay: bool) -> ThreadingHTTPServer:
    """An HTTP/1.1 server that answers every GET with MLflow's empty search (headers, then
    the body: two writes), its connections with or without TCP_NODELAY."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = nodelay

        def do_GET(self) -> None:
            body = b'{"experiments": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_whose_replies_stall_is_named_with_the_way_out():
    """The note a sweep prints before its trials (store_checks.check_tracking_store): a server
    without TCP_NODELAY (a reply's body waits for the client's delayed ACK, 40 ms) is named,
    with the options that fix it; one with it is not."""
    for nodelay in (False, True):
        server = json_server(nodelay)
        try:
            note = store_checks.check_tracking_store(f"http://127.0.0.1:{server.server_address[1]}")
        finally:
            server.shutdown()
            server.server_close()
        if nodelay:
            assert note is None
        else:
            assert note is not None and "answers a kept connection" in note
            assert f"--uvicorn-opts '{team_store.UVICORN_OPTS}'" in note
