"""HTTP/1.x spoken by hand on a socket, for tests that drive the web server as clients other than
ours do (pipelining, half-close, slow or partial senders, HTTP/1.0): the bytes sent are exactly
the test's, and every answer is parsed strictly, so a malformed one fails the test.

Every read has a deadline: a server that never answers fails the test, it never hangs it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil


@dataclass
class Answer:
    """One HTTP answer as read from the wire."""

    version: bytes
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    @property
    def closes(self) -> bool:
        """Whether the server says it closes the connection after this answer."""
        return (
            self.header(b"connection") or b""
        ).lower() == b"close" or self.version == b"HTTP/1.0"


class Malformed(AssertionError):
    """The server's bytes are not a well-formed HTTP/1.1 answer."""


def request(
    method: str,
    path: str,
    host: str,
    headers: list[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    version: str = "HTTP/1.1",
    chunked: bool = False,
    length: int | None = None,
) -> bytes:
    """The bytes of one request: a Content-Length (``length`` to lie about it) or, with
    ``chunked``, the body in chunks of at most 64 KiB."""
    lines = [f"{method} {path} {version}", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        step = 65536
        payload = b"".join(
            b"%x\r\n" % len(body[i : i + step]) + body[i : i + step] + b"\r\n"
            for i in range(0, len(body), step)
        )
        payload += b"0\r\n\r\n"
    else:
        if body or length is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body) if length is None else length}")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class Wire:
    """A raw TCP connection to the server at ``url``."""

    def __init__(self, url: str, *, timeout: float = 10.0, receive_buffer: int | None = None):
        parts = urlsplit(url)
        self.host = parts.netloc
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before connect(), so the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((parts.hostname, parts.port))
        self.buffer = b""
        self.closed_by_server = False

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> bool:
        """Send ``data``; False when the server has closed the connection meanwhile."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def half_close(self) -> None:
        """Shut this side's writing down (the server reads end-of-file), keep reading."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()

    def _fill(self, deadline: float) -> bool:
        """Read more into the buffer before ``deadline``; False at end of stream."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the server did not answer in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            raise TimeoutError("the server did not answer in time") from None
        if not chunk:
            self.closed_by_server = True
            return False
        self.buffer += chunk
        return True

    def _take_line(self, deadline: float) -> bytes | None:
        while b"\r\n" not in self.buffer:
            if not self._fill(deadline):
                if self.buffer:
                    raise Malformed(f"the connection ended inside an answer: {self.buffer[:200]!r}")
                return None
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _take(self, size: int, deadline: float) -> bytes:
        while len(self.buffer) < size:
            if not self._fill(deadline):
                raise Malformed(f"the connection ended {size - len(self.buffer)} bytes early")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def answer(self, timeout: float = 10.0, *, method: str = "GET") -> Answer | None:
        """The next answer (an interim 1xx is an answer too); None when the server closed the
        connection before a new one began. Raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        line = self._take_line(deadline)
        if line is None:
            return None
        parts = line.split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
            raise Malformed(f"not a status line: {line[:200]!r}")
        answer = Answer(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else b"")
        while True:
            line = self._take_line(deadline)
            if line is None:
                raise Malformed("the connection ended inside an answer's head")
            if not line:
                break
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise Malformed(f"not a header line: {line[:200]!r}")
            answer.headers.append((name, value.strip()))
        if answer.status < 200 or answer.status in (204, 304) or method == "HEAD":
            return answer
        length = answer.header(b"content-length")
        if (answer.header(b"transfer-encoding") or b"").lower() == b"chunked":
            if length is not None:
                raise Malformed("an answer with both Content-Length and chunked encoding")
            chunks = []
            while True:
                size_line = self._take_line(deadline)
                if size_line is None:
                    raise Malformed("the connection ended inside a chunked answer")
                size = int(size_line.split(b";")[0], 16)
                chunk = self._take(size + 2, deadline)
                if chunk[-2:] != b"\r\n":
                    raise Malformed("a chunk not ended by CRLF")
                if size == 0:
                    break
                chunks.append(chunk[:-2])
            answer.body = b"".join(chunks)
        elif length is not None:
            if not length.isdigit():
                raise Malformed(f"Content-Length {length!r}")
            answer.body = self._take(int(length), deadline)
        else:
            while self._fill(deadline):
                pass
            answer.body, self.buffer = self.buffer, b""
        return answer

    def final_answer(self, timeout: float = 10.0, *, method: str = "GET") -> tuple[list, Answer]:
        """The interim answers (1xx) then the final one; raises when the connection ends first."""
        deadline = time.monotonic() + timeout
        interim = []
        while True:
            answer = self.answer(max(deadline - time.monotonic(), 0.001), method=method)
            if answer is None:
                raise Malformed("the connection closed with no final answer")
            if answer.status >= 200:
                return interim, answer
            interim.append(answer)

    def closed_within(self, timeout: float) -> bool:
        """Whether the server closes the connection within ``timeout`` seconds (what it sends
        meanwhile is kept in the buffer)."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                pass
        except TimeoutError:
            return False
        return True


def web_worker(master_pid: int) -> psutil.Process:
    """The one gunicorn worker under ``master_pid`` (bounded: 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = psutil.Process(master_pid).children()
        if len(children) == 1:
            return children[0]
        time.sleep(0.1)
    raise AssertionError("no single web worker under the master")


def open_connections(worker: psutil.Process, port: int) -> int:
    """Connections the worker holds on ``port``, in any state but listening: each request's task
    belongs to one, so a task held forever keeps one here."""
    return sum(
        1
        for conn in worker.net_connections(kind="tcp")
        if conn.laddr and conn.laddr.port == port and conn.status != psutil.CONN_LISTEN
    )


def settles(probe, target, timeout: float, interval: float = 0.1):
    """Poll ``probe()`` until it is ``<= target`` or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value <= target or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
