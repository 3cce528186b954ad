"""The agent's batches reuse one connection across its batch period, and a connection the
server closed while idle is replaced without a failed batch.

Before, the agent's httpx clients kept an idle connection 5 s (httpx's default), the agent's
own batch period: every batch opened a connection of its own (a TCP handshake each, and a TLS
one behind a TLS proxy). The server here is a plain HTTP/1.1 server of the standard library
that records the client port of every request (a real server, not a mock: the agent's client
is what is tested)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.client import KEEPALIVE_S, ControlPlaneClient

# Past httpx's default keep-alive (5 s), as the agent's shipper waits 5 s after each answer.
BATCH_GAP_S = 5.5


class _Recording(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, idle_close_s: float | None) -> None:
        self.ports: list[int] = []
        self.idle_close_s = idle_close_s
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        if self.server.idle_close_s is not None:
            # A proxy's idle limit shorter than the agent's: the connection is closed by the
            # server side once it has been idle that long.
            self.connection.settimeout(self.server.idle_close_s)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.ports.append(self.client_address[1])
        body = json.dumps({"stored": 1, "duplicates": 0, "latest_allocation_version": 1})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve():
    servers = []

    def start(idle_close_s: float | None = None) -> _Recording:
        server = _Recording(idle_close_s)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _client(server: _Recording) -> ControlPlaneClient:
    return ControlPlaneClient(f"http://127.0.0.1:{server.server_address[1]}", 1, "t", timeout_s=5)


def test_batches_a_batch_period_apart_share_one_connection(serve):
    assert KEEPALIVE_S > BATCH_GAP_S
    server = serve()
    client = _client(server)
    try:
        assert client.post_metrics({"samples": []})["stored"] == 1
        time.sleep(BATCH_GAP_S)
        assert client.post_metrics({"samples": []})["stored"] == 1
    finally:
        client.close()
    assert len(server.ports) == 2
    assert len(set(server.ports)) == 1, f"a connection per batch: client ports {server.ports}"


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error(serve):
    server = serve(idle_close_s=0.3)
    client = _client(server)
    try:
        for _ in range(3):
            assert client.post_metrics({"samples": []})["stored"] == 1
            time.sleep(1.0)  # the server has closed the idle connection by now
    finally:
        client.close()
    assert len(server.ports) == 3
    assert len(set(server.ports)) == 3
