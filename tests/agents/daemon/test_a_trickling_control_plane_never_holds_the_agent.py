"""A control plane (or a proxy before it) that answers a byte at a time, each byte within the
read timeout, holds none of the agent's requests past its bound: httpx bounds each read, not
a request, and before, such an answer held a POST with timeout_s=2 for as long as it
trickled (over 20 s for 200 bytes; forever for a chunked body that never ends). Generated
answers, each case under a watchdog that dumps every stack rather than hang."""

import faulthandler
import socket
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.client import ControlPlaneClient, ControlPlaneError, register_host

# Twice the slowest trickle's gap between bytes (0.3 s), so every byte still comes within the
# read timeout; 1.0 before, and every case waited out the bound: 17 s for the module.
TIMEOUT_S = 0.6
SLACK_S = 2.0  # a busy CPU's delay on top of the bound


class Trickler:
    """Answers every request with ``answer``, one byte every ``gap_s``, then (``endless``)
    chunk after chunk forever."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.part, self.gap_s = "body", 0.1
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self.listener.accept()[0]
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                if self.part == "head":
                    head, body = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 400, b""
                elif self.part == "body":
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    head += b"Content-Length: 400\r\n\r\n"
                    body = b"{" + b" " * 398 + b"}"
                else:  # chunked, endless
                    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    body = b"1\r\n \r\n" * 100_000
                conn.sendall(head if self.part != "head" else b"")
                for byte in head if self.part == "head" else body:
                    if self._stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(self.gap_s)
            except OSError:
                return


@pytest.fixture(scope="module")
def trickler():
    server = Trickler()
    yield server
    server.close()


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    part=st.sampled_from(["head", "body", "chunked"]),
    gap_s=st.sampled_from([0.02, 0.1, 0.3]),
    call=st.sampled_from(["post_metrics", "poll_allocation"]),
)
def test_every_request_to_a_trickling_control_plane_ends_within_its_bound(
    trickler, part, gap_s, call
):
    trickler.part, trickler.gap_s = part, gap_s
    client = ControlPlaneClient(trickler.url, 1, "token", timeout_s=TIMEOUT_S)
    if call == "post_metrics":
        attempt, bound = (lambda: client.post_metrics({"samples": []})), TIMEOUT_S
    else:  # the long-poll's bound is its wait plus the timeout
        attempt, bound = (lambda: client.poll_allocation(0, wait_s=1.0)), 1.0 + TIMEOUT_S
    try:
        _raises_within(attempt, bound)
    finally:
        client.close()


def test_registering_with_a_trickling_control_plane_gives_up_within_its_bound(trickler):
    trickler.part, trickler.gap_s = "head", 0.1
    # Five attempts of the bound, and tenacity's backoff between them (0.5 + 1 + 2 + 4 s at most).
    _raises_within(
        lambda: register_host(
            trickler.url, 1, "t", name="h", cpus=1, memory_mb=1, timeout_s=TIMEOUT_S
        ),
        5 * TIMEOUT_S + 7.5,
    )


def _raises_within(attempt, bound: float) -> None:
    faulthandler.dump_traceback_later(bound + 20, exit=True, file=sys.stderr)
    began = time.monotonic()
    try:
        with pytest.raises(ControlPlaneError):
            attempt()
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert time.monotonic() - began < bound + SLACK_S
