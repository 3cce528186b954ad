"""A hang hunter for the control plane's front (gunicorn, its uvicorn worker, webapp/agent_asgi.py
and Django behind it): generated clients misbehaving over raw sockets (asyncio streams) beside a
well-behaved canary agent (httpx), against one live stack started as make demo and
docker-compose start it (tests/support/live_stack.py, the short timeouts of agent_requests).

    nice -n 5 .venv/bin/python -m tests.http_clients.front_hunt --cases 20 [--seed N | --replay N]

A case is a set of bad clients run together (requests cut at a random byte, then dropped,
half-closed or stalled; bodies sent a byte at a time then stalled; ``Expect: 100-continue``
with and without the body; chunked bodies; gzip; HTTP/1.0; pipelined requests; oversized heads
and bodies; wrong Content-Type and Content-Length; duplicate and out-of-order batches; NaN,
unicode, huge and deeply nested JSON; many long-polls held then dropped at once; a client that
never reads its answers), each against the agent endpoints or the people's API (job
registration, overrides, the schema, sign-in) with a token or a signed-in session; optionally a
``kill -9`` of the web worker or of gunicorn's master while the canary has a batch in flight
and a long-poll held. Properties:

- every complete request is answered, or its connection closed, within ``BOUND_S`` past the
  server's timeouts; no answer is a 5xx (the web log shows no traceback either);
- the canary's batches are each answered within ``BOUND_S`` (a restart aside, then it retries
  the same batch) and its samples are all stored, each exactly once;
- once the bad clients are gone the web worker holds no connection and no long-poll, and its
  threads, file descriptors and memory are back near their level before the case.

Each case's seed makes it again (``--replay``); the tally is kept in ``var/hunt-front.json``.
tests/http_clients/test_the_front_hunters_cases_hold.py runs a few cheap cases and the replays
of what it found.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import random
import re
import signal
import socket
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from tests.support.agent_requests import STAGES, TIMEOUTS, AgentPlane, agent_plane
from tests.support.raw_http import open_connections, settles, web_worker

ROOT = Path(__file__).resolve().parents[2]
SERVER_TIMEOUT_S = float(TIMEOUTS["INTUNE_REQUEST_TIMEOUT_S"])  # request, write, keep-alive
BOUND_S = 10.0  # past any server timeout: the longest an answer or a close may take here
POLL_WAIT_S = 20.0  # the canary's long-poll wait: a version it gets sooner was a wake-up
WAKE_BOUND_S = 4.0  # from an override's answer to the canary's poll answering its version
# A 5xx is a defect anywhere; 503 only while the web process restarts (the canary retries it).
ALLOWED = {100, 200, 201, 204, 301, 302, 308, 400, 401, 403, 404, 405, 408, 409, 411, 413, 414}
ALLOWED |= {415, 429, 431, 501}
LIMIT = 1024 * 1024
# Slack on the worker's resources once the bad clients are gone (it has a pool of threads that
# starts on demand, and Python keeps some memory it took).
# The threads are measured against the level after the warm-up (warm_up), as the pools that
# grow on demand (asyncio's default executor: min(32, CPUs + 4) threads) never shrink.
THREADS_SLACK, FDS_SLACK, RSS_SLACK_MB = 6, 4, 64

KINDS = [
    "cut", "slow", "expect", "chunked", "gzip", "http10", "pipelined", "oversized",
    "wrong-headers", "duplicates", "json", "polls", "noread",
]  # fmt: skip
TARGETS = ["metrics", "allocation", "jobs", "override", "schema", "token", "job-list"]
ODD_JSON = [
    "nan", "inf", "huge-float", "huge-int", "neg-zero", "unicode-name", "lone-surrogate",
    "deep-array", "deep-object", "long-string", "bom", "utf16", "dup-key", "number-string",
]  # fmt: skip

# Header fields added to a bad client's requests (drawn per client, for about a third of them).
ODD_HEADERS = {
    "second-authorization": [("Authorization", "Agent ia_\xe9\xff")],
    "cookie-junk": [("Cookie", "a=\x01; ;;=; sessionid=\xe9; csrftoken=")],
    "accept-junk": [("Accept", "application/json;q=NaN, */*;q=1e999, text/\xe9")],
    "forwarded-junk": [("X-Forwarded-For", "\xe9, ::zz"), ("Forwarded", 'for="[::1"')],
    "connection-close": [("Connection", "close")],
    "keep-alive": [("Connection", "keep-alive"), ("Keep-Alive", "timeout=999999")],
    "many-fields": [(f"X-N{i}", "v") for i in range(90)],
    "te-identity": [("Transfer-Encoding", "identity")],
    "second-content-type": [("Content-Type", "text/plain")],
    "conditional": [("Range", "bytes=0-10"), ("If-None-Match", "*"), ("If-Match", "x")],
    "upgrade": [("Connection", "Upgrade"), ("Upgrade", "websocket")],
    "underscores": [("X_Forwarded_Proto", "https"), ("Content_Type", "text/plain")],
    "second-host": [("Host", "evil.example")],
}

_seq = itertools.count(int(time.time() * 1000))


# -- generation ------------------------------------------------------------------------------
def generate(rng: random.Random) -> dict:
    """A case: bad clients (each a dict of plain values) and what happens to the web process."""
    clients = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(KINDS)
        clients.append(
            {
                "kind": kind,
                "target": rng.choice(TARGETS),
                "auth": rng.choice(["token", "session", "none"]),
                "start_s": round(rng.uniform(0, 1.5), 2),
                "cut": round(rng.random(), 3),
                "after_cut": rng.choice(["close", "half-close", "stall"]),
                "step": rng.choice([1, 1, 7, 64]),
                "pause_s": rng.choice([0.01, 0.05, 0.2]),
                "stall": rng.random() < 0.5,
                "count": rng.randint(2, 20),
                "odd": rng.choice(ODD_JSON),
                "version": rng.choice(["HTTP/1.1", "HTTP/1.0"]),
                "wrong": rng.choice(["text/plain", "form", "none", "short", "long", "ct-charset"]),
                "over": rng.choice(["header", "headers", "body", "line", "trailer"]),
                "ending": rng.choice(["close", "half-close", "read"]),
                "wait": rng.choice([0, 1, 5, 30, 60]),
            }
        )
    restart = rng.choices([None, "worker", "master"], weights=[8, 1, 1])[0]
    case = {
        "clients": clients,
        "restart": restart,
        "restart_at_s": round(rng.uniform(0.3, 2.0), 2),
        "canary_samples": rng.randint(1, 5),
    }
    # Drawn last, so that a seed's earlier draws (and the replays') stay what they were.
    for client in clients:
        odd = rng.choice(sorted(ODD_HEADERS)) if rng.random() < 0.3 else None
        client["odd_header"] = odd
    return case


# -- requests ---------------------------------------------------------------------------------
class Keys:
    """What the bad clients and the canary need of the live stack."""

    def __init__(self, plane: AgentPlane, canary_id: int, canary_token: str, session: dict):
        self.plane = plane
        self.canary_id, self.canary_token = canary_id, canary_token
        self.session = session  # {"cookie": ..., "csrf": ..., "username": ..., "password": ...}
        self.warm: dict | None = None  # the web worker's measures after the warm-up
        self.last: dict = {}  # its measures after the last case


def sample(seq: int, ts: float | None = None) -> dict:
    return {
        "seq": seq,
        "ts": time.time() if ts is None else ts,
        "host": {"cpus": 8.0, "cpu_percent": 10.0, "memory_used_mb": 1.0, "memory_limit_mb": 16384.0},
        "trainer": {"throughput": 1.0, "idle_fraction": 0.1},
        "stages": [
            {"name": name, "workers": 1, "items_per_s": 1.0, "busy_fraction": 0.5}
            for name in STAGES
        ],
    }  # fmt: skip


def odd_body(odd: str) -> bytes:
    """A batch (or any JSON body) holding one odd value."""
    good = json.dumps({"samples": [sample(next(_seq))]})
    if odd == "nan":
        return good.replace('"throughput": 1.0', '"throughput": NaN').encode()
    if odd == "inf":
        return good.replace('"busy_fraction": 0.5', '"busy_fraction": -Infinity', 1).encode()
    if odd == "huge-float":
        return good.replace('"cpus": 8.0', '"cpus": 1e999').encode()
    if odd == "huge-int":
        return re.sub(r'"seq": \d+', '"seq": ' + "9" * 5000, good).encode()
    if odd == "neg-zero":
        return good.replace('"idle_fraction": 0.1', '"idle_fraction": -0.0').encode()
    if odd == "unicode-name":
        return good.replace('"name": "read"', '"name": "r\\u00e9ad\\ud83d\\ude00"').encode()
    if odd == "lone-surrogate":
        return good.replace('"name": "read"', '"name": "\\ud800"').encode()
    if odd == "deep-array":
        return b'{"samples": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if odd == "deep-object":
        return b'{"samples": [' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"]}"
    if odd == "long-string":
        return good.replace('"name": "read"', '"name": "' + "x" * 500_000 + '"').encode()
    if odd == "bom":
        return b"\xef\xbb\xbf" + good.encode()
    if odd == "utf16":
        return good.encode("utf-16")
    if odd == "dup-key":
        return ('{"samples": [], ' + good[1:]).encode()
    return good.replace('"workers": 1', '"workers": "1"', 1).encode()  # number-string


def job_body(rng: random.Random) -> dict:
    return {
        "name": f"hunt-{uuid.uuid4().hex[:8]}",
        "stages": [{"name": "read", "max_workers": rng.randint(1, 9)}, {"name": "parse"}],
        "tuner": "static",
    }


def target_request(keys: Keys, client: dict, rng: random.Random) -> tuple[str, str, list, bytes]:
    """(method, path, headers, body) of a well-formed request to the client's target, before
    the client's own mischief."""
    plane, auth = keys.plane, client["auth"]
    people = []
    if auth == "token":
        people = [("Authorization", f"Token {plane.operator}")]
    elif auth == "session":
        people = [("Cookie", keys.session["cookie"]), ("X-CSRFToken", keys.session["csrf"])]
    agent = [("Authorization", f"Agent {plane.token}")]
    ctype = [("Content-Type", "application/json")]
    method, path, headers, body = _target_request(keys, client, rng, people, agent, ctype)
    return method, path, headers + ODD_HEADERS.get(client.get("odd_header"), []), body


def _target_request(keys: Keys, client: dict, rng: random.Random, people, agent, ctype):
    """target_request's request before the client's odd header fields."""
    plane, target = keys.plane, client["target"]
    if target == "metrics":
        body = json.dumps({"samples": [sample(next(_seq)) for _ in range(rng.randint(0, 3))]})
        return "POST", plane.metrics_path(), agent + ctype, body.encode()
    if target == "allocation":
        wait = min(client["wait"], 5)
        return "GET", plane.allocation_path(10**6, wait), agent, b""
    if target == "jobs":
        return "POST", "/api/v1/jobs/", people + ctype, json.dumps(job_body(rng)).encode()
    if target == "override":
        body = {"workers": {s: rng.randint(1, 2) for s in STAGES}, "reason": "hunt"}
        path = f"/api/v1/hosts/{plane.host_id}/override/"
        return "PUT", path, people + ctype, json.dumps(body).encode()
    if target == "schema":
        return "GET", "/api/schema/", people, b""
    if target == "token":
        creds = {"username": keys.session["username"], "password": keys.session["password"]}
        return "POST", "/api/v1/auth/token/", ctype, json.dumps(creds).encode()
    return "GET", "/api/v1/jobs/", people, b""  # "job-list": a person's read


def encode(
    method: str,
    path: str,
    host: str,
    headers: list,
    body: bytes,
    *,
    version: str = "HTTP/1.1",
    chunks: list[int] | None = None,
    length: int | None = None,
    trailers: list[tuple[str, str]] = (),
) -> bytes:
    lines = [f"{method} {path} {version}", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if chunks is not None:
        lines.append("Transfer-Encoding: chunked")
        payload, at = b"", 0
        for size in chunks + [len(body)]:
            piece = body[at : at + max(1, size)]
            if not piece:
                break
            payload += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
            at += len(piece)
        payload += b"0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in trailers) + b"\r\n"
    else:
        if body or length is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body) if length is None else length}")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


# -- reading answers --------------------------------------------------------------------------
class Closed(Exception):
    """The server closed the connection before an answer began."""


async def read_answer(reader: asyncio.StreamReader, timeout: float, method: str = "GET") -> dict:
    """One answer ({"status", "headers", "body"}); Closed at end of stream before it began;
    TimeoutError past ``timeout``; AssertionError when the bytes are not an HTTP answer."""

    async def read() -> dict:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise AssertionError(
                    f"the connection ended in a status line {exc.partial!r}"
                ) from None
            raise Closed from None
        except ConnectionResetError:
            raise Closed from None
        parts = line.split(b" ", 2)
        assert parts[0] in (b"HTTP/1.1", b"HTTP/1.0") and parts[1].isdigit(), line
        status, headers = int(parts[1]), {}
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode()] = value.strip().decode("latin-1")
        body = b""
        if status >= 200 and status not in (204, 304) and method != "HEAD":
            if headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    body += (await reader.readexactly(size + 2))[:-2]
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
            elif "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            else:
                body = await reader.read()
        return {"status": status, "headers": headers, "body": body}

    return await asyncio.wait_for(read(), timeout)


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server ends the connection within ``timeout`` (what it sends is dropped)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            if not chunk:
                return True
    except TimeoutError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    return False


async def connect(plane: AgentPlane, rcvbuf: int | None = None):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", plane.port)), BOUND_S
    )
    return await asyncio.open_connection(sock=sock, limit=2**22)


async def send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    try:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), BOUND_S)
        return True
    except (OSError, TimeoutError):
        return False


def half_close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.write_eof()
    except OSError:
        pass


def drop(writer: asyncio.StreamWriter) -> None:
    try:
        writer.transport.abort()
    except Exception:
        pass


class Findings(list):
    """What broke a property, one line each."""

    def check_status(self, where: str, answer: dict, restarting: bool = False) -> None:
        status = answer["status"]
        if status in ALLOWED or (restarting and status in (502, 503)):
            return
        self.append(f"{where}: answered {status} {answer['body'][:300]!r}")


# -- the bad clients --------------------------------------------------------------------------
async def answers_then(
    found: Findings, where: str, reader, count: int, method: str, bound: float
) -> list[dict]:
    """Read up to ``count`` final answers (interim 100s skipped); a close ends the reading."""
    got = []
    while len(got) < count:
        try:
            answer = await read_answer(reader, bound, method)
        except Closed:
            break
        except TimeoutError:
            found.append(f"{where}: no answer nor close within {bound:.0f} s")
            break
        except (AssertionError, asyncio.IncompleteReadError, ValueError) as exc:
            found.append(f"{where}: malformed answer: {exc!r}"[:400])
            break
        if answer["status"] == 100:
            continue
        found.check_status(where, answer)
        got.append(answer)
    return got


async def run_client(keys: Keys, client: dict, rng: random.Random, found: Findings) -> None:
    await asyncio.sleep(client["start_s"])
    plane, kind = keys.plane, client["kind"]
    where = f"{kind}/{client['target']}/{client['auth']}"
    method, path, headers, body = target_request(keys, client, rng)
    host = plane.host
    bound = SERVER_TIMEOUT_S + BOUND_S
    if client["target"] == "allocation":
        bound += 5
    if kind == "polls":
        await many_polls(keys, client, found)
        return
    if kind == "noread":
        await never_reads(keys, client, found)
        return
    reader, writer = await connect(plane)
    try:
        if kind == "cut":
            data = encode(method, path, host, headers, body)
            at = max(1, int(client["cut"] * len(data)))
            if at >= len(data):
                at = len(data) - 1
            await send(writer, data[:at])
            if client["after_cut"] == "close":
                return
            if client["after_cut"] == "half-close":
                half_close(writer)
            # An incomplete request: a 400/408, or the connection closed, within the bound.
            await answers_then(found, where, reader, 1, method, bound)
            if not await closed_within(reader, bound):
                found.append(f"{where}: a cut request's connection left open past {bound:.0f} s")
        elif kind == "slow":
            data = encode(method, path, host, headers, body)
            at = 0
            deadline = time.monotonic() + SERVER_TIMEOUT_S + 1
            while at < len(data) and time.monotonic() < deadline:
                if not await send(writer, data[at : at + client["step"]]):
                    break
                at += client["step"]
                await asyncio.sleep(client["pause_s"])
            if at < len(data) and not client["stall"]:
                await send(writer, data[at:])
            await answers_then(found, where, reader, 1, method, bound)
        elif kind == "expect":
            if not body:
                method, body = "POST", b'{"samples": []}'
            head = encode(method, path, host, headers + [("Expect", "100-continue")], body)
            head, _ = head[: len(head) - len(body)], None
            await send(writer, head)
            try:
                first = await read_answer(reader, bound, method)
            except (Closed, TimeoutError) as exc:
                found.append(f"{where}: nothing after an Expect head: {exc!r}")
                return
            if first["status"] != 100:
                found.check_status(where, first)
                return
            if client["stall"]:
                # The body never comes: 408 (or a close) within the request timeout's bound.
                await answers_then(found, where, reader, 1, method, bound)
                return
            await send(writer, body)
            await answers_then(found, where, reader, 1, method, bound)
        elif kind == "chunked":
            if not body:
                body = b'{"samples": []}'
                method = "POST"
            sizes = [rng.randint(1, max(1, len(body) // 3)) for _ in range(rng.randint(1, 5))]
            trailers = [("X-Trailer", "1")] if rng.random() < 0.5 else []
            await send(
                writer, encode(method, path, host, headers, body, chunks=sizes, trailers=trailers)
            )
            await answers_then(found, where, reader, 1, method, bound)
        elif kind == "gzip":
            packed = gzip.compress(body or b"{}")
            await send(
                writer,
                encode(
                    method if body else "POST",
                    path,
                    host,
                    headers + [("Content-Encoding", "gzip")],
                    packed,
                ),
            )
            await answers_then(found, where, reader, 1, "POST", bound)
        elif kind == "http10":
            await send(writer, encode(method, path, host, headers, body, version="HTTP/1.0"))
            got = await answers_then(found, where, reader, 1, method, bound)
            if got and not await closed_within(reader, BOUND_S):
                found.append(f"{where}: an HTTP/1.0 connection kept open after its answer")
        elif kind == "pipelined":
            count = min(client["count"], 12)
            requests, methods = [], []
            for _ in range(count):
                other = dict(client, target=rng.choice(TARGETS))
                m, p, h, b = target_request(keys, other, rng)
                if other["target"] == "allocation":
                    p = plane.allocation_path(0, 0)
                requests.append(encode(m, p, host, h, b))
                methods.append(m)
            await send(writer, b"".join(requests))
            if client["ending"] == "close":
                return
            if client["ending"] == "half-close":
                half_close(writer)
            for index, m in enumerate(methods):
                got = await answers_then(found, f"{where} #{index}", reader, 1, m, bound)
                if not got or got[0]["headers"].get("connection", "").lower() == "close":
                    if not got:
                        found.append(f"{where}: {count - index} of {count} pipelined unanswered")
                    break
        elif kind == "oversized":
            over = client["over"]
            if over == "header":
                data = encode(method, path, host, headers + [("X-Big", "a" * 9000)], body)
            elif over == "headers":
                many = [(f"X-H{i}", "v") for i in range(120)]
                data = encode(method, path, host, headers + many, body)
            elif over == "line":
                data = encode(method, path + "?" + "a=1&" * 1500, host, headers, body)
            elif over == "trailer":
                big = [(f"X-T{i}", "v" * 100) for i in range(120)]
                data = encode("POST", path, host, headers, body or b"{}", chunks=[3], trailers=big)
            else:
                data = encode("POST", path, host, headers, b" " * (LIMIT + 10))
            await send(writer, data)
            await answers_then(found, where, reader, 1, method, bound)
        elif kind == "wrong-headers":
            wrong = client["wrong"]
            body = body or b'{"samples": []}'
            hs = [h for h in headers if h[0] != "Content-Type"]
            length = None
            if wrong == "text/plain":
                hs.append(("Content-Type", "text/plain"))
            elif wrong == "form":
                hs.append(("Content-Type", "application/x-www-form-urlencoded"))
            elif wrong == "ct-charset":
                hs.append(("Content-Type", 'application/json; charset=latin-1; x="y"'))
            elif wrong == "short":
                hs.append(("Content-Type", "application/json"))
                length = max(0, len(body) - 5)
            elif wrong == "long":
                hs.append(("Content-Type", "application/json"))
                length = len(body) + 50
            await send(writer, encode("POST", path, host, hs, body, length=length))
            # "long": the server waits for the missing bytes: 408 within the request timeout.
            await answers_then(found, where, reader, 1, "POST", bound)
        elif kind == "duplicates":
            await duplicates(keys, client, reader, writer, found, bound)
        elif kind == "json":
            data = odd_body(client["odd"])
            target = client["target"]
            if target not in ("metrics", "jobs", "override", "token"):
                method, path, headers = (
                    "POST",
                    plane.metrics_path(),
                    [
                        ("Authorization", f"Agent {plane.token}"),
                        ("Content-Type", "application/json"),
                    ],
                )
            await send(writer, encode(method, path, host, headers, data))
            got = await answers_then(found, where + "/" + client["odd"], reader, 1, method, bound)
            if got and got[0]["status"] in (200, 201) and client["odd"] != "neg-zero":
                found.append(f"{where}/{client['odd']}: taken ({got[0]['body'][:200]!r})")
    finally:
        drop(writer)


async def duplicates(keys, client, reader, writer, found: Findings, bound: float) -> None:
    """The same batch twice (pipelined or on two connections), and an older batch after a newer
    one: each sample stored once, the resend acknowledged as duplicates."""
    plane = keys.plane
    older, newer = [next(_seq) for _ in range(2)], [next(_seq) for _ in range(2)]
    newer_body = json.dumps({"samples": [sample(s) for s in newer]}).encode()
    older_body = json.dumps({"samples": [sample(s) for s in older]}).encode()
    hs = plane.agent_headers()
    path = plane.metrics_path()
    wire = [encode("POST", path, plane.host, hs, b) for b in (newer_body, newer_body, older_body)]
    await send(writer, b"".join(wire))
    got = await answers_then(found, "duplicates", reader, 3, "POST", bound)
    expect = [(2, 0), (0, 2), (2, 0)]
    for answer, (stored, dups) in zip(got, expect, strict=False):
        if answer["status"] == 429:
            return
        if answer["status"] != 200:
            found.append(f"duplicates: {answer['status']} {answer['body'][:200]!r}")
            return
        said = json.loads(answer["body"])
        if (said.get("stored"), said.get("duplicates")) != (stored, dups):
            found.append(f"duplicates: answered {said}, expected stored {stored}, dups {dups}")
    if len(got) < 3:
        found.append(f"duplicates: {3 - len(got)} of 3 pipelined batches unanswered")


async def many_polls(keys: Keys, client: dict, found: Findings) -> None:
    """``count`` x 8 long-polls held on their own connections, then all dropped (or
    half-closed) together; a half-closed one is answered at once. With ``after_cut`` "stall"
    the connections send nothing at all: the server closes each within its keep-alive bound."""
    plane = keys.plane
    conns = []
    for _ in range(client["count"] * 8):
        try:
            conns.append(await connect(plane))
        except (OSError, TimeoutError) as exc:
            found.append(f"polls: cannot connect: {exc!r}")
            break
    try:
        if client["after_cut"] == "stall":
            bound = SERVER_TIMEOUT_S + BOUND_S
            closed = await asyncio.gather(*(closed_within(r, bound) for r, _ in conns))
            if not all(closed):
                found.append(
                    f"polls: {closed.count(False)} of {len(conns)} idle connections open "
                    f"past {bound:g} s"
                )
            return
        path = plane.allocation_path(10**6, max(1, client["wait"]))
        data = encode("GET", path, plane.host, [("Authorization", f"Agent {plane.token}")], b"")
        for _, writer in conns:
            await send(writer, data)
        await asyncio.sleep(client["pause_s"] * 5)
        if client["ending"] == "half-close":
            for _, writer in conns:
                half_close(writer)
            results = await asyncio.gather(
                *(answers_then(found, "polls/half-close", r, 1, "GET", BOUND_S) for r, _ in conns)
            )
            unanswered = sum(1 for got in results if not got)
            if unanswered:
                found.append(f"polls: {unanswered} half-closed polls closed without an answer")
    finally:
        for _, writer in conns:
            drop(writer)


async def never_reads(keys: Keys, client: dict, found: Findings) -> None:
    """Pipelined requests for a large answer (the schema) on a small receive window of a bare
    socket never read (an asyncio stream would read it into its buffer): the server must end
    the connection within its write timeout's bound."""
    plane = keys.plane
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    people = [("Authorization", f"Token {plane.operator}")]
    agent = [("Authorization", f"Agent {plane.token}")]
    one = (
        encode("GET", "/api/schema/", plane.host, people, b"")
        if client["target"] in ("schema", "jobs", "override", "job-list", "token")
        else encode("GET", plane.allocation_path(0, 0), plane.host, agent, b"")
    )
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", plane.port)), BOUND_S)
        local_port = sock.getsockname()[1]
        try:
            # The server stops reading past its pipelining limit: the send may never end.
            await asyncio.wait_for(loop.sock_sendall(sock, one * min(client["count"] + 10, 30)), 1)
        except (TimeoutError, OSError):
            pass
        deadline = time.monotonic() + SERVER_TIMEOUT_S * 2 + BOUND_S
        while time.monotonic() < deadline:
            if not server_holds(plane, local_port):
                return
            await asyncio.sleep(0.5)
        found.append(f"noread/{client['target']}: the server still holds a client that never reads")
    finally:
        sock.close()


def server_holds(plane: AgentPlane, client_port: int) -> bool:
    """Whether any process of the web server holds an established connection to the client's
    port (the server side of the client's socket)."""
    for conn in psutil.net_connections(kind="tcp"):
        if (
            conn.laddr
            and conn.laddr.port == plane.port
            and conn.raddr
            and conn.raddr.port == client_port
            and conn.status == psutil.CONN_ESTABLISHED
        ):
            return True
    return False


# -- the canary agent -------------------------------------------------------------------------
class Canary:
    """A well-behaved agent on a host of its own: a batch of ``samples`` new samples every
    0.2 s (the same batch retried after a network error, a 5xx or a 429 until answered 200),
    and a long-poll held throughout. Records every sequence number sent and each answer's
    time."""

    def __init__(self, keys: Keys, samples: int):
        self.keys, self.samples = keys, samples
        self.seqs: list[int] = []
        self.slowest = 0.0
        self.errors: list[str] = []
        self.restarting = False  # set while the web process is being killed and comes back
        self.stop = asyncio.Event()
        self.version = 0  # the newest allocation version its long-poll answered
        self.got_version = asyncio.Event()

    def headers(self) -> dict:
        return {"Authorization": f"Agent {self.keys.canary_token}"}

    async def ship(self) -> None:
        url = self.keys.plane.url
        async with httpx.AsyncClient(base_url=url, headers=self.headers(), timeout=BOUND_S) as c:
            while not self.stop.is_set():
                seqs = [next(_seq) for _ in range(self.samples)]
                body = {"samples": [sample(s) for s in seqs]}
                self.seqs += seqs
                await self._until_stored(c, body)
                try:
                    await asyncio.wait_for(self.stop.wait(), 0.2)
                except TimeoutError:
                    pass

    async def _until_stored(self, client: httpx.AsyncClient, body: dict) -> None:
        path = f"/api/v1/hosts/{self.keys.canary_id}/metrics/"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                answer = await client.post(path, json=body)
            except httpx.HTTPError as exc:
                if not self.restarting:
                    self.errors.append(f"batch: {exc!r} after {time.monotonic() - began:.1f} s")
                await asyncio.sleep(0.3)
                continue
            took = time.monotonic() - began
            if not self.restarting:
                self.slowest = max(self.slowest, took)
            if answer.status_code == 200:
                said = answer.json()
                if said["stored"] + said["duplicates"] != len(body["samples"]):
                    self.errors.append(f"batch: answered {said} for {len(body['samples'])}")
                return
            if answer.status_code not in (429, 502, 503) or (
                answer.status_code != 429 and not self.restarting
            ):
                self.errors.append(f"batch: {answer.status_code} {answer.text[:200]}")
            await asyncio.sleep(0.3)
        self.errors.append("batch: not stored within 60 s")

    async def poll(self) -> None:
        url = self.keys.plane.url
        path = f"/api/v1/hosts/{self.keys.canary_id}/allocation/"
        after = 0
        timeout = POLL_WAIT_S + BOUND_S
        async with httpx.AsyncClient(base_url=url, headers=self.headers(), timeout=timeout) as c:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    answer = await c.get(path, params={"after": after, "wait": POLL_WAIT_S})
                except httpx.HTTPError as exc:
                    if not self.restarting:
                        self.errors.append(f"poll: {exc!r} after {time.monotonic() - began:.1f} s")
                    await asyncio.sleep(0.5)
                    continue
                if answer.status_code == 200:
                    after = self.version = answer.json()["version"]
                    self.got_version.set()
                elif answer.status_code == 204:
                    if time.monotonic() - began < POLL_WAIT_S * 0.5:
                        await asyncio.sleep(0.5)
                elif answer.status_code == 429 or (self.restarting and answer.status_code >= 500):
                    await asyncio.sleep(0.5)
                else:
                    self.errors.append(f"poll: {answer.status_code} {answer.text[:200]}")
                    await asyncio.sleep(0.5)


# -- the stack and its measures --------------------------------------------------------------
def worker_of(plane: AgentPlane) -> psutil.Process:
    return web_worker(plane.stack.group.children["web"].pid)


def measures(worker: psutil.Process) -> dict:
    return {
        "threads": worker.num_threads(),
        "fds": worker.num_fds(),
        "rss_mb": worker.memory_info().rss / 2**20,
    }


def web_listeners(plane: AgentPlane) -> set[int]:
    """The processes that listen on the web server's port: its master and its worker, and any
    process left of an earlier one (a worker orphaned by a kill -9 of its master). Asked of
    each process: psutil.net_connections() names one holder of a shared socket."""
    found = set()
    for process in psutil.process_iter():
        try:
            if any(
                conn.laddr and conn.laddr.port == plane.port and conn.status == psutil.CONN_LISTEN
                for conn in process.net_connections(kind="tcp")
            ):
                found.add(process.pid)
        except (psutil.Error, OSError):
            pass
    return found


def stored_once(plane: AgentPlane, host_id: int, seqs: list[int]) -> str:
    """'' when every one of ``seqs`` is stored once for the host, else what is wrong."""
    if not seqs:
        return ""
    path = Path(tempfile.mkdtemp()) / "seqs.json"
    path.write_text(json.dumps(seqs))
    code = (
        "import json; from webapp.ingestion.models import HostSample; "
        f"seqs = json.load(open({str(path)!r})); "
        f"rows = list(HostSample.objects.filter(host_id={int(host_id)}, seq__in=seqs)"
        ".values_list('seq', flat=True)); "
        "print(json.dumps([len(rows), len(set(rows))]))"
    )
    rows, distinct = json.loads(plane.stack.manage("shell", "-c", code).strip().splitlines()[-1])
    if rows != len(seqs) or distinct != len(seqs):
        return f"canary: {len(seqs)} samples sent, {rows} rows stored ({distinct} distinct)"
    return ""


def web_errors(plane: AgentPlane, since: int) -> list[str]:
    """Lines of the web log after byte ``since`` that tell of a 500 or a traceback."""
    path = plane.stack.directory / "logs" / "web.log"
    with open(path, "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return [
        line[:300]
        for line in text.splitlines()
        if "Traceback" in line
        or '" 500' in line
        or "Internal Server Error" in line
        or " 500 " in line
    ]


def log_size(plane: AgentPlane) -> int:
    path = plane.stack.directory / "logs" / "web.log"
    return path.stat().st_size if path.exists() else 0


async def restart(plane: AgentPlane, which: str) -> None:
    """``kill -9`` of the web worker (gunicorn's master starts another) or of the master
    (started again here, as a supervisor would); back once /healthz answers (bounded: 60 s).
    The master is started from the main thread: its PR_SET_PDEATHSIG (supervisor.py) is of
    the thread that forks it, and a thread of asyncio's executor ends with the loop."""
    stack = plane.stack
    master = stack.group.children["web"]
    old = worker_of(plane)
    if which == "worker":
        os.kill(old.pid, signal.SIGKILL)
    else:
        os.kill(master.pid, signal.SIGKILL)
        await asyncio.to_thread(master.wait, 10)
        # Its worker stops (web_worker.py): until it has, /healthz may still be its answer.
        _, alive = await asyncio.to_thread(psutil.wait_procs, [old], 30)
        if alive:
            raise AssertionError(f"the web worker {old.pid} still runs 30 s after its master")
        stack.group.children.pop("web", None)
        stack.start_service("web")
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=stack.url, timeout=2) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"the web server is not back 60 s after a kill -9 of its {which}")


@contextmanager
def hunting_plane(directory: Path):
    """A live stack (tests/support/agent_requests.py) with a second host for the canary, a
    signed-in session and a person's password."""
    with agent_plane(directory) as plane:
        stack = plane.stack
        person = stack.create_user(f"hunter-{uuid.uuid4().hex[:6]}", role="operator")
        with stack.client(person["token"]) as api:
            job = api.post(
                "/api/v1/jobs/",
                json={"name": "canary", "stages": [{"name": s} for s in STAGES], "tuner": "static"},
            ).json()["id"]
            host = api.post(
                f"/api/v1/jobs/{job}/hosts/", json={"name": "canary", "cpus": 8, "memory_mb": 16384}
            ).json()
        with httpx.Client(base_url=stack.url, timeout=30) as browser:
            browser.get("/accounts/login/")
            csrf = browser.cookies["csrftoken"]
            signed = browser.post(
                "/accounts/login/",
                data={
                    "username": person["username"],
                    "password": person["password"],
                    "csrfmiddlewaretoken": csrf,
                },
            )
            assert signed.status_code in (200, 302), signed.text[:300]
            cookies = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
            csrf = browser.cookies.get("csrftoken", csrf)
        session = {
            "cookie": cookies,
            "csrf": csrf,
            "username": person["username"],
            "password": person["password"],
        }
        keys = Keys(plane, host["id"], host["agent_token"], session)
        warm_up(keys)
        yield keys


def warm_up(keys: Keys) -> None:
    """Start the worker's pools (its agents' threads, each with its database connection, and
    Django's) with bursts of batches and people's requests, so that a case measures what it
    leaves, not what the first requests start."""
    plane = keys.plane

    async def burst() -> None:
        agent = {"Authorization": f"Agent {plane.token}"}
        person = {"Authorization": f"Token {plane.operator}"}
        async with httpx.AsyncClient(base_url=plane.url, timeout=30) as client:
            for _ in range(3):
                batches = [
                    client.post(
                        plane.metrics_path(),
                        json={"samples": [sample(next(_seq))]},
                        headers=agent,
                    )
                    for _ in range(16)
                ]
                people = [client.get("/api/v1/jobs/", headers=person) for _ in range(8)]
                people += [client.get("/api/schema/", headers=person) for _ in range(2)]
                await asyncio.gather(*batches, *people)

    asyncio.run(burst())


# -- one case ----------------------------------------------------------------------------------
def run_case(keys: Keys, case: dict, seed: int) -> list[str]:
    """Run one case against the live stack; what broke, one line each (empty: it held)."""
    plane = keys.plane
    found = Findings()
    worker = worker_of(plane)
    settles(lambda: open_connections(worker, plane.port), 0, BOUND_S)
    before = measures(worker)
    if keys.warm is None or keys.warm["pid"] != worker.pid:
        keys.warm = before | {"pid": worker.pid}
    since = log_size(plane)
    canary = Canary(keys, case["canary_samples"])
    clients_found = Findings()  # the bad clients' own

    async def main() -> None:
        ship = asyncio.create_task(canary.ship())
        poll = asyncio.create_task(canary.poll())
        rng = random.Random(seed)
        clients = [
            asyncio.create_task(run_client(keys, c, random.Random(rng.random()), clients_found))
            for c in case["clients"]
        ]
        if case["restart"]:
            await asyncio.sleep(case["restart_at_s"])
            canary.restarting = True
            await restart(plane, case["restart"])
            await asyncio.sleep(1.0)  # the canary's retries land on the new process
            canary.restarting = False
        bound = SERVER_TIMEOUT_S * 3 + BOUND_S * 3 + 10
        done, pending = await asyncio.wait(clients, timeout=bound)
        for task in pending:
            task.cancel()
            found.append(f"a bad client still running after {bound:.0f} s")
        for task in done:
            exc = task.exception()
            if exc is not None and not isinstance(exc, (ConnectionError, BrokenPipeError)):
                clients_found.append("a bad client raised: " + "".join(
                    traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]
                ).strip()[-600:])  # fmt: skip
        await asyncio.sleep(0.5)  # the canary goes on after the bad clients left
        await wakes_the_canary(keys, canary, found)
        canary.stop.set()
        poll.cancel()  # held up to POLL_WAIT_S
        await asyncio.wait([ship, poll], timeout=BOUND_S * 2)

    asyncio.run(main())
    if case["restart"]:
        # A kill -9 ends the bad clients' connections unanswered, and refuses new ones until
        # the web process is back: only an answer they should never get is a finding then.
        clients_found[:] = [line for line in clients_found if ": answered " in line]
    found += clients_found
    found += canary.errors
    if canary.slowest > BOUND_S:
        found.append(f"canary: a batch answered in {canary.slowest:.1f} s")
    problem = stored_once(plane, keys.canary_id, canary.seqs)
    if problem:
        found.append(problem)
    worker = worker_of(plane)
    left = settles(lambda: open_connections(worker, plane.port), 0, BOUND_S + SERVER_TIMEOUT_S)
    if left:
        found.append(f"the web worker holds {left} connections after the clients left")
    listeners = web_listeners(plane)
    expected = {plane.stack.group.children["web"].pid, worker.pid}
    if listeners != expected:
        found.append(f"processes listening on the port {sorted(listeners)}, not {sorted(expected)}")
    held = settles(plane.held_long_polls, 0, BOUND_S)
    if held:
        found.append(f"the web worker holds {held:g} long-polls after the clients left")
    if not case["restart"]:
        after = measures(worker)
        if after["threads"] > keys.warm["threads"] + THREADS_SLACK:
            found.append(f"threads {keys.warm['threads']} (warm) -> {after['threads']}")
        keys.last = after
        fds = settles(worker.num_fds, before["fds"] + FDS_SLACK, 5)
        if fds > before["fds"] + FDS_SLACK:
            found.append(f"file descriptors {before['fds']} -> {fds}")
        if after["rss_mb"] > before["rss_mb"] + RSS_SLACK_MB:
            found.append(f"memory {before['rss_mb']:.0f} -> {after['rss_mb']:.0f} MB")
    found += [f"web log: {line}" for line in web_errors(plane, since)]
    return list(found)


async def wakes_the_canary(keys: Keys, canary: Canary, found: Findings) -> None:
    """An override of the canary's host, published: its held long-poll answers the new version
    within WAKE_BOUND_S (the process's Redis subscription wakes it; a new worker after a
    restart must have subscribed again), not at the end of its wait."""
    plane = keys.plane
    body = {"workers": {s: random.randint(1, 3) for s in STAGES}, "reason": "front hunt"}
    headers = {"Authorization": f"Token {plane.operator}"}
    async with httpx.AsyncClient(base_url=plane.url, headers=headers, timeout=BOUND_S) as api:
        answer = await api.put(f"/api/v1/hosts/{keys.canary_id}/override/", json=body)
    if answer.status_code != 200:
        found.append(f"override of the canary's host: {answer.status_code} {answer.text[:200]}")
        return
    version, began = answer.json()["version"], time.monotonic()
    while canary.version < version and time.monotonic() - began < WAKE_BOUND_S:
        canary.got_version.clear()
        try:
            await asyncio.wait_for(canary.got_version.wait(), 0.2)
        except TimeoutError:
            pass
    if canary.version < version:
        found.append(
            f"canary: version {version} published, its long-poll did not answer it within "
            f"{WAKE_BOUND_S:g} s (it holds {canary.version})"
        )


def hunt(seeds: list[int], directory: Path, out: Path | None = None) -> dict:
    """Run the cases of ``seeds`` against one live stack; the tally."""
    tally = {"cases": 0, "ok": 0, "fail": 0, "longest_s": 0.0, "found": []}
    with hunting_plane(directory) as keys:
        for seed in seeds:
            case = generate(random.Random(seed))
            began = time.monotonic()
            try:
                found = run_case(keys, case, seed)
            except Exception as exc:
                found = [f"the case raised: {exc!r}"[:500]]
            took = time.monotonic() - began
            tally["cases"] += 1
            tally["longest_s"] = max(tally["longest_s"], round(took, 2))
            kinds = ",".join(c["kind"] for c in case["clients"])
            outcome = "fail" if found else "ok"
            tally[outcome] += 1
            level = " ".join(f"{k}={v:.0f}" for k, v in keys.last.items())
            print(f"seed {seed}: {outcome} in {took:.1f}s [{kinds}] {case['restart'] or ''} {level}",
                  flush=True)  # fmt: skip
            if found:
                tally["found"].append({"seed": seed, "found": found, "case": case})
                print(json.dumps(case), "\n  " + "\n  ".join(found), flush=True)
            if out is not None:
                out.write_text(json.dumps(tally, indent=1) + "\n")
    return tally


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--replay", type=int, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    var = ROOT / "var"
    var.mkdir(exist_ok=True)
    seeds = [args.replay] if args.replay is not None else [args.seed + k for k in range(args.cases)]
    with tempfile.TemporaryDirectory(prefix="front-hunt-") as directory:
        tally = hunt(seeds, Path(directory), var / "hunt-front.json")
    print(json.dumps({k: v for k, v in tally.items() if k != "found"}))


if __name__ == "__main__":
    sys.exit(main())
