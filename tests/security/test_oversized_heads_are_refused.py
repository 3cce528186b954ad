"""A request whose head is too large is refused by the web server itself (gunicorn's uvicorn
worker, webapp/stack/web_worker.py) with a 431 before any of it reaches Django, and the server
goes on answering. Without the bound, uvicorn's httptools protocol passed a megabyte of headers
to the application. Raw sockets: an HTTP client library would refuse to send some of these."""

import socket
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = pytest.mark.slow


def exchange(url: str, head: bytes, body: bytes = b"", timeout: float = 20) -> bytes:
    """Send ``head`` (and ``body``) on a fresh connection; everything answered until it closes,
    or the first answer's head where the server keeps the connection open."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as conn:
        try:
            conn.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we still sent: the answer is still there to read
        answer = b""
        while b"\r\n\r\n" not in answer:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        return answer


def request_head(plane, fields: list[tuple[str, str]], path: str = "/healthz") -> bytes:
    host = urlsplit(plane.stack.url).netloc
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "fields, reason",
    [
        ([("X-Big", "a" * 9000)], b"a header field is over 8190 bytes"),
        ([(f"X-F{i}", "v") for i in range(120)], b"more than 100 header fields"),
        ([(f"X-F{i}", "v" * 8000) for i in range(40)], b"head is over 65536 bytes"),
        ([("X-Huge", "b" * 2_000_000)], b"over"),
    ],
    ids=["one-field-too-long", "too-many-fields", "head-too-large", "two-megabytes"],
)
def test_an_oversized_head_gets_431_and_the_server_goes_on(plane, fields, reason):
    answer = exchange(plane.stack.url, request_head(plane, fields))
    assert status_of(answer) == 431, answer[:300]
    assert reason in answer
    assert httpx.get(f"{plane.stack.url}/healthz", timeout=10).status_code == 200


def test_heads_within_the_limits_and_large_bodies_pass(plane):
    # 90 fields of 8,000 bytes each would pass gunicorn's per-field limits but not the head's
    # total; 60 small fields and a long cookie are what a browser sends at worst.
    fields = [(f"X-F{i}", "v" * 10) for i in range(60)] + [("Cookie", "c=" + "x" * 8000)]
    assert status_of(exchange(plane.stack.url, request_head(plane, fields))) == 200
    # A body far larger than the head limit, arriving with its head, is not a head: it reaches
    # the application, which answers it (401: no credentials), not the server's 431.
    body = b'{"samples": [' + b" " * 300_000 + b"]}"
    head = request_head(
        plane,
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        path=f"/api/v1/hosts/{plane.host_id}/metrics/",
    ).replace(b"GET ", b"POST ", 1)
    assert status_of(exchange(plane.stack.url, head, body)) == 401
