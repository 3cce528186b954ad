"""An HTTP proxy in front of an S3 stand-in (moto's ``ThreadedMotoServer``) that misbehaves
on the requests a test picks, as S3 and the gateways in front of it do: a body that stops
half-way and stays silent, a connection reset in the middle of a body, a ``Content-Length``
longer than the body sent, an error status (503 SlowDown with or without ``Retry-After``,
500, 403 ExpiredToken) in place of the answer, or an answer held back a while (a slow
gateway: "delay", ``delay_s``).

    proxy = FaultyS3(upstream=server.get_host_and_port())
    proxy.add("GET", "day_0", "reset_mid", times=1)  # the next GET of a key holding "day_0"
    options = {"endpoint_url": proxy.url, ...}

Every request not picked is forwarded as it is. ``proxy.seen`` lists ``(method, path,
fault)`` of every request, so a test can count attempts.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "expired": (403, "ExpiredToken", "The provided token has expired."),
    "denied": (403, "AccessDenied", "Access Denied"),
}


@dataclass
class _Fault:
    method: str
    needle: str
    action: str
    times: int
    retry_after: str | None = None


class FaultyS3:
    """The proxy: ``add`` a fault, point the client at ``url``; ``close`` when done."""

    def __init__(
        self, upstream: tuple[str, int], stall_s: float = 30.0, delay_s: float = 0.5
    ) -> None:
        self.upstream = upstream
        self.stall_s = stall_s
        self.delay_s = delay_s
        self.faults: list[_Fault] = []
        self.seen: list[tuple[str, str, str]] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def add(
        self,
        method: str,
        needle: str,
        action: str,
        times: int = 1,
        retry_after: str | None = None,
    ) -> None:
        """Misbehave (``action``) on the next ``times`` requests of ``method`` whose path
        holds ``needle``: "stall_mid", "reset_mid", "short", "delay", or one of ``_ERRORS``."""
        with self._lock:
            self.faults.append(_Fault(method, needle, action, times, retry_after))

    def take(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and fault.needle in path:
                    fault.times -= 1
                    return fault
        return None

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultyS3

    def log_message(self, *args: object) -> None:
        pass

    def _any(self) -> None:
        try:
            self._answer()
        except OSError:  # the client went away (it gave up on a stalled answer)
            self.close_connection = True

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self.owner.take(self.command, self.path)
        self.owner.seen.append((self.command, self.path, fault.action if fault else ""))
        if fault is not None and fault.action in _ERRORS:
            self._error(fault)
            return
        if fault is not None and fault.action == "delay":
            self.owner.closing.wait(self.owner.delay_s)
        upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        upstream.close()
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding",
                                    "server", "date"):  # fmt: skip
                self.send_header(name, value)
        action = fault.action if fault else ""
        if self.command == "HEAD":  # no body: the object's own length
            self.send_header("Content-Length", answer.getheader("Content-Length") or "0")
        else:
            extra = 1000 if action == "short" else 0
            self.send_header("Content-Length", str(len(data) + extra))
        self.end_headers()
        if action in ("stall_mid", "reset_mid") and len(data) > 1:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            if action == "stall_mid":
                self.owner.closing.wait(self.owner.stall_s)
            else:  # an RST, not a FIN: SO_LINGER with a zero timeout
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            self.close_connection = True
            return
        self.wfile.write(data)
        self.wfile.flush()
        if action == "short":
            time.sleep(0.05)
            self.close_connection = True

    def _error(self, fault: _Fault) -> None:
        status, code, message = _ERRORS[fault.action]
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>x</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if fault.retry_after is not None:
            self.send_header("Retry-After", fault.retry_after)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any
