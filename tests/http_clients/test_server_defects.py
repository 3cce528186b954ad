"""One test per defect the web server had with clients other than ours (issue 14: "the control
plane holds for any client"). Each failed before its fix; the fixes are in
webapp/stack/web_worker.py (the connection), webapp/agent_asgi.py (bodies, HEAD) and
webapp/gunicorn_conf.py (keep-alive). The server runs with 2 s timeouts (agent_requests.TIMEOUTS).
"""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.agent_requests import batch
from tests.support.raw_http import Wire, open_connections, request, settles

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024  # INTUNE_MAX_BODY_BYTES's default
BOUND = 2.0  # each of the server's timeouts in these tests
SLACK = 3.0  # what a wait on a timeout allows beyond it (a busy 2-core machine)


def test_a_connection_that_never_sends_a_request_is_closed_after_the_keepalive(plane):
    with Wire(plane.url) as wire:
        started = time.monotonic()
        assert wire.closed_within(BOUND + SLACK), "an idle new connection was held open"
        assert wire.buffer == b"" and time.monotonic() - started >= BOUND - 0.5


def test_a_head_sent_a_byte_at_a_time_is_answered_408_and_closed(plane):
    head = request("GET", plane.allocation_path(), plane.host, plane.agent_headers())
    with Wire(plane.url) as wire:
        deadline = time.monotonic() + BOUND + SLACK
        for byte in head[:-2]:  # never the last CRLF: the head never ends
            if time.monotonic() > deadline or not wire.send(bytes([byte])):
                break
            time.sleep(0.2)
        answer = wire.answer(timeout=SLACK)
        assert answer is not None and answer.status == 408 and answer.closes
        assert b"did not arrive whole" in answer.body
        assert wire.closed_within(SLACK)


def test_a_body_that_stops_short_is_answered_408_and_frees_its_task(plane, worker, baseline):
    body = batch()
    head = request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), body)
    with Wire(plane.url) as wire:
        wire.send(head[: -len(body) // 2])  # the head and half the body, then nothing
        answer = wire.answer(timeout=BOUND + SLACK)
        assert answer is not None and answer.status == 408 and answer.closes
        assert wire.closed_within(SLACK)
    assert settles(lambda: open_connections(worker, plane.port), baseline, SLACK) <= baseline


def test_answers_a_client_never_reads_end_its_connection_after_the_write_timeout(
    plane, worker, baseline
):
    # Pipelined requests whose answers (the API schema, ~100 KB each) the client never reads:
    # the server's buffers fill and its task waits to write. Before: forever.
    one = request("GET", "/api/schema/", plane.host)
    wire = Wire(plane.url, receive_buffer=4096)
    try:
        sent = 0
        wire.sock.settimeout(1.0)
        try:
            for _ in range(200):
                wire.sock.sendall(one)
                sent += 1
        except (TimeoutError, OSError):
            pass  # the server stopped reading: its answers are not read
        assert sent > 0
        held = settles(lambda: open_connections(worker, plane.port), baseline, 12)
        assert held <= baseline, f"{held - baseline} connection(s) still held by the server"
    finally:
        wire.close()


def test_a_client_that_half_closes_after_its_request_gets_its_answer(plane):
    body = batch()
    with Wire(plane.url) as wire:
        wire.send(request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), body))
        wire.half_close()
        answer = wire.answer(timeout=10)
        assert answer is not None and answer.status == 200, answer
        assert json.loads(answer.body)["stored"] == 1
        assert wire.closed_within(SLACK)


def test_a_client_gone_with_requests_pipelined_lets_its_held_long_poll_go(plane):
    after = plane.current_version()
    poll = request("GET", plane.allocation_path(after, 30), plane.host, plane.agent_headers())
    queued = request("GET", "/healthz", plane.host)
    with Wire(plane.url) as wire:
        wire.send(poll + queued)
        assert settles(lambda: -plane.held_long_polls(), -1, 5) == -1  # the poll is held
    # Before: the held poll waited out its 30 s (only the queued request was told).
    assert settles(plane.held_long_polls, 0, SLACK) == 0


def test_a_header_value_with_trailing_whitespace_is_read_without_it(plane):
    with Wire(plane.url) as wire:
        headers = [("Authorization", f"Agent {plane.token}\t"), ("Accept", "*/* ")]
        head = request("GET", plane.allocation_path(), plane.host + "  ", headers)
        wire.send(head)
        answer = wire.answer()
        # Before: "127.0.0.1:PORT  " was not an allowed host: 400.
        assert answer is not None and answer.status == 200, answer


def test_no_100_continue_is_sent_to_an_http10_client(plane):
    body = batch()
    headers = [*plane.agent_headers(), ("Expect", "100-continue")]
    head = request("POST", plane.metrics_path(), plane.host, headers, body, version="HTTP/1.0")
    with Wire(plane.url) as wire:
        wire.send(head[: -len(body)])
        time.sleep(0.5)  # time for a 100 Continue to come, if one does
        wire.send(body)
        answer = wire.answer(timeout=10)
        assert answer is not None and answer.status == 200, answer


def test_expect_100_continue_with_a_body_over_the_limit_gets_413_before_any_100(plane):
    headers = [*plane.agent_headers(), ("Expect", "100-continue")]
    head = request("POST", plane.metrics_path(), plane.host, headers, length=5 * LIMIT)
    with Wire(plane.url) as wire:
        wire.send(head)  # the body is never sent: a 100 Continue would invite it
        answer = wire.answer(timeout=10)
        assert answer is not None and answer.status == 413, answer
        assert "limit" in json.loads(answer.body)["detail"] and answer.closes
        assert wire.closed_within(SLACK)


def test_a_gzip_encoded_body_is_refused_415_saying_why(plane):
    answer = requests.post(
        f"{plane.url}{plane.metrics_path()}",
        data=gzip.compress(batch()),
        headers=dict(plane.agent_headers()) | {"Content-Encoding": "gzip"},
        timeout=10,
    )
    # Before: the compressed bytes were read as JSON: 400 "JSON parse error".
    assert answer.status_code == 415, answer.text
    assert "Content-Encoding" in answer.json()["detail"]
    assert answer.headers["Accept-Encoding"] == "identity"


def test_a_chunked_body_reaches_django_with_its_length(plane):
    job = json.dumps({"name": "chunked", "stages": [{"name": "read"}]}).encode()
    headers = [("Authorization", f"Token {plane.operator}"), ("Content-Type", "application/json")]
    with Wire(plane.url) as wire:
        wire.send(request("POST", "/api/v1/jobs/", plane.host, headers, job, chunked=True))
        answer = wire.answer(timeout=10)
        # Before: DRF read a body without a Content-Length as empty: 400 "required".
        assert answer is not None and answer.status == 201, answer


def test_a_chunked_body_over_the_limit_is_refused_413(plane):
    headers = [("Authorization", f"Token {plane.operator}"), ("Content-Type", "application/json")]
    body = b'{"name": "' + b"x" * (2 * LIMIT) + b'"}'
    with Wire(plane.url) as wire:
        wire.send(request("POST", "/api/v1/jobs/", plane.host, headers, body, chunked=True))
        answer = wire.answer(timeout=10)
        # Before: Django read it whole (no limit on a chunked body), and DRF took it for empty.
        assert answer is not None and answer.status == 413, answer


def test_the_keepalive_is_read_from_INTUNE_KEEPALIVE_S():  # noqa: N802 - the setting's name
    code = "import webapp.gunicorn_conf as conf; print(conf.keepalive)"

    def read(value: str) -> subprocess.CompletedProcess:
        env = dict(os.environ) | {
            "INTUNE_KEEPALIVE_S": value,
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
        }
        return subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    assert read("7").stdout.strip() == "7"
    refused = read("7s")
    assert refused.returncode != 0 and "INTUNE_KEEPALIVE_S='7s'" in refused.stderr


def test_head_long_polls_are_held_without_a_thread_each(plane, worker):
    after = plane.current_version()
    head = request("HEAD", plane.allocation_path(after, 4), plane.host, plane.agent_headers())
    threads, held = worker.num_threads(), plane.held_long_polls()
    wires = [Wire(plane.url) for _ in range(30)]
    try:
        for wire in wires:
            wire.send(head)
        assert settles(lambda: -plane.held_long_polls(), -(held + 30), 5) == -(held + 30)
        # Before: a HEAD went to Django's handler, whose view waited in a thread of its own (30
        # more). At most the agents' pool may start its threads (8).
        assert worker.num_threads() - threads <= 10
        for wire in wires:
            held = wire.answer(timeout=10, method="HEAD")
            assert held is not None and held.status == 204
    finally:
        for wire in wires:
            wire.close()


def test_a_header_name_with_an_underscore_is_dropped_as_gunicorn_does(plane):
    headers = [("Authorization", f"Agent {plane.token}"), ("Content_Type", "application/json")]
    body = batch()
    with Wire(plane.url) as wire:
        wire.send(request("POST", plane.metrics_path(), plane.host, headers, body))
        answer = wire.answer(timeout=10)
        # Before: Content_Type passed for Content-Type on the agent endpoints (and
        # X_Forwarded_Proto for X-Forwarded-Proto): 200.
        assert answer is not None and answer.status == 415, answer


@pytest.mark.parametrize("path", ["/healthz", "/api/schema/", "/api/v1/jobs/"])
def test_a_client_that_half_closes_is_answered_on_djangos_paths_too(plane, path):
    headers = [("Authorization", f"Token {plane.operator}")] if path.startswith("/api/v1") else []
    statuses = []
    for _ in range(12):  # the EOF raced the answer: about half the tries failed before
        with Wire(plane.url) as wire:
            wire.send(request("GET", path, plane.host, headers))
            wire.half_close()
            answer = wire.answer(timeout=10)
            statuses.append(answer.status if answer is not None else None)
            assert wire.closed_within(SLACK)
    # Before: Django's handler, its request read, took the wake of the EOF for another request
    # ("Invalid ASGI message after request body") and answered 500.
    assert statuses == [200] * 12, statuses
