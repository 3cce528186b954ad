"""An outside client's malformed requests, sent raw to a real server (gunicorn, its uvicorn
worker, webapp/agent_asgi.py, the lean paths and Django): each is answered with a 4xx whose
JSON ``detail`` says what was wrong, and the database is the same after it as before
(tests/support/db_fingerprint.py). docs/agent-protocol.md documents each refusal; the first
three of issue 14's strictness audit were accepted before their fixes (a request without a
Host header, a sample from the future, an override expiry without a UTC offset)."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.agent_requests import batch
from tests.support.db_fingerprint import changed, fingerprint
from tests.support.raw_http import Wire, request

pytestmark = pytest.mark.slow

SKEW_S = 300.0  # INTUNE_MAX_CLOCK_SKEW_S's default


def refused(plane, data: bytes, status: int, *, method: str = "GET") -> dict:
    """Send ``data`` on a new connection; assert its answer is ``status`` with a JSON detail and
    that no table changed; return the answer's JSON."""
    before = fingerprint(plane.stack.database.url)
    with Wire(plane.url) as wire:
        wire.send(data)
        _, answer = wire.final_answer(timeout=10, method=method)
    assert answer.status == status, (answer.status, answer.body[:300])
    assert (answer.header(b"content-type") or b"").startswith(b"application/json")
    content = json.loads(answer.body)
    assert isinstance(content["detail"], str) and content["detail"], content
    assert changed(before, fingerprint(plane.stack.database.url)) == []
    return content


def without_host(data: bytes, host: str) -> bytes:
    return data.replace(f"Host: {host}\r\n".encode(), b"", 1)


def operator(plane) -> list[tuple[str, str]]:
    return [("Authorization", f"Token {plane.operator}"), ("Content-Type", "application/json")]


@pytest.mark.parametrize("endpoint", ["metrics", "allocation", "jobs", "override"])
def test_an_http11_request_without_a_host_header_is_refused(plane, endpoint):
    if endpoint == "metrics":
        data = request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), batch())
    elif endpoint == "allocation":
        data = request("GET", plane.allocation_path(wait=5), plane.host, plane.agent_headers())
    elif endpoint == "jobs":
        data = request("GET", "/api/v1/jobs/", plane.host, operator(plane))
    else:
        body = json.dumps({"workers": {"read": 1, "parse": 1}, "reason": "no host"}).encode()
        path = f"/api/v1/hosts/{plane.host_id}/override/"
        data = request("PUT", path, plane.host, operator(plane), body)
    method = data.split(b" ", 1)[0].decode()
    detail = refused(plane, without_host(data, plane.host), 400, method=method)["detail"]
    assert "no Host header" in detail
    twice = data.replace(b"\r\n\r\n", f"\r\nHost: {plane.host}\r\n\r\n".encode(), 1)
    assert "2 Host headers" in refused(plane, twice, 400, method=method)["detail"]


def test_an_http10_request_without_a_host_header_is_answered(plane):
    data = request(
        "GET", plane.allocation_path(), plane.host, plane.agent_headers(), version="HTTP/1.0"
    )
    with Wire(plane.url) as wire:
        wire.send(without_host(data, plane.host))
        answer = wire.answer(timeout=10)
    assert answer.status == 200 and json.loads(answer.body)["version"] >= 1


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(ahead=st.floats(min_value=SKEW_S + 5, max_value=1e9), which=st.integers(0, 2))
def test_a_batch_with_a_sample_from_the_future_is_refused_naming_it(plane, ahead, which):
    body = json.loads(batch(3))
    body["samples"][which]["ts"] = time.time() + ahead
    data = request(
        "POST", plane.metrics_path(), plane.host, plane.agent_headers(), json.dumps(body).encode()
    )
    detail = refused(plane, data, 400, method="POST")["detail"]
    assert detail.startswith(f"samples[{which}].ts: ") and "s ahead" in detail, detail


def test_an_override_expiry_without_a_utc_offset_is_refused_naming_it(plane):
    body = {"workers": {"read": 1, "parse": 1}, "reason": "x", "expires_at": "2100-01-01T00:00:00"}
    path = f"/api/v1/hosts/{plane.host_id}/override/"
    data = request("PUT", path, plane.host, operator(plane), json.dumps(body).encode())
    assert refused(plane, data, 400, method="PUT")["detail"].startswith("expires_at: ")


def _batch_with(change) -> bytes:
    body = json.loads(batch())
    change(body)
    return json.dumps(body).encode()


AGENT_BODIES = {
    "NaN": (lambda: batch().replace(b'"busy_fraction": 0.5', b'"busy_fraction": NaN', 1), 400),
    "a sequence number over 64 bits": (
        lambda: _batch_with(lambda b: b["samples"][0].update(seq=10**30)),
        400,
    ),
    "a stage name with a Cyrillic a": (
        lambda: _batch_with(lambda b: b["samples"][0]["stages"][0].update(name="re\u0430d")),
        400,
    ),
    "a stage name with a trailing space": (
        lambda: _batch_with(lambda b: b["samples"][0]["stages"][0].update(name="read ")),
        400,
    ),
    "an overlong device": (
        lambda: _batch_with(lambda b: b["samples"][0]["trainer"].update(device="x" * 100_000)),
        400,
    ),
    "a negative ts": (lambda: _batch_with(lambda b: b["samples"][0].update(ts=-1)), 400),
    "an array": (lambda: b"[]", 400),
    "an empty body": (lambda: b"", 400),
    "a byte order mark": (lambda: b"\xef\xbb\xbf" + batch(), 400),
    "a deep nesting": (lambda: b'{"samples": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 400),
}


@pytest.mark.parametrize("case", sorted(AGENT_BODIES))
def test_a_malformed_batch_is_refused_and_changes_nothing(plane, case):
    make, status = AGENT_BODIES[case]
    data = request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), make())
    refused(plane, data, status, method="POST")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_a_batch_that_is_not_json_is_refused_415(plane, content_type):
    headers = [("Authorization", f"Agent {plane.token}")]
    headers += [("Content-Type", content_type)] if content_type else []
    data = request("POST", plane.metrics_path(), plane.host, headers, batch())
    refused(plane, data, 415, method="POST")


@pytest.mark.parametrize(
    "query",
    [
        "wait=-1",
        "wait=nan",
        "wait=0&wait=1",
        "after=1e3",
        "after=99999999999999999999999",
        "bogus=1",
    ],
)
def test_long_poll_parameters_out_of_their_bounds_are_refused(plane, query):
    path = f"/api/v1/hosts/{plane.host_id}/allocation/?{query}"
    refused(plane, request("GET", path, plane.host, plane.agent_headers()), 400)


OVERRIDES = {
    "an unknown stage": {"workers": {"read": 1, "parse": 1, "bogus": 1}, "reason": "x"},
    "more workers than the host's CPUs": {"workers": {"read": 100, "parse": 1}, "reason": "x"},
    "an expiry past what a date can hold": {
        "workers": {"read": 1, "parse": 1},
        "reason": "x",
        "expires_at": "9999-12-31T23:59:59-14:00",
    },
    "an expiry in the past": {
        "workers": {"read": 1, "parse": 1},
        "reason": "x",
        "expires_at": "2001-01-01T00:00:00Z",
    },
    "a reason over 2,000 characters": {"workers": {"read": 1, "parse": 1}, "reason": "x" * 3000},
    "zero workers": {"workers": {"read": 0, "parse": 1}, "reason": "x"},
}


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_an_invalid_override_is_refused_and_publishes_nothing(plane, case):
    path = f"/api/v1/hosts/{plane.host_id}/override/"
    version = plane.current_version()
    data = request("PUT", path, plane.host, operator(plane), json.dumps(OVERRIDES[case]).encode())
    refused(plane, data, 400, method="PUT")
    assert plane.current_version() == version


def _job_with_a_host(plane) -> tuple[int, int, str]:
    return plane.stack.register_job_and_host(
        plane.operator,
        {
            "name": f"audit-{time.monotonic_ns()}",
            "stages": [{"name": "read"}, {"name": "parse"}],
            "tuner": "static",
        },
        {"name": "audit-host", "cpus": 8, "memory_mb": 8192},
    )


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(puts=st.integers(2, 12))
def test_concurrent_overrides_each_publish_one_version_and_the_last_is_in_force(plane, puts):
    _, host_id, _ = _job_with_a_host(plane)
    path = f"/api/v1/hosts/{host_id}/override/"

    def put(i: int):
        with plane.stack.client(plane.operator) as api:
            return api.put(
                path, json={"workers": {"read": 1 + i % 3, "parse": 1}, "reason": f"r{i}"}
            )

    with ThreadPoolExecutor(puts) as pool:
        answers = list(pool.map(put, range(puts)))
    assert {a.status_code for a in answers} <= {200, 503}, [a.text for a in answers]
    versions = [a.json()["version"] for a in answers if a.status_code == 200]
    assert len(set(versions)) == len(versions) and versions
    with plane.stack.client(plane.operator) as api:
        active = api.get(path).json()
        newest = api.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]
    assert active["version"] == newest["version"] == max(versions)
    assert newest["source"] == "override" and newest["workers"] == active["workers"]


def test_a_poll_held_when_its_job_is_deleted_answers_at_once_then_401(plane):
    """Before, it was held to the end of its wait (up to a minute): the deletion now wakes it."""
    job_id, host_id, token = _job_with_a_host(plane)
    wait = 20.0
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            httpx.get,
            f"{plane.url}/api/v1/hosts/{host_id}/allocation/?after=1&wait={wait:g}",
            headers={"Authorization": f"Agent {token}"},
            timeout=wait + 10,
        )
        time.sleep(1.0)
        deleted = time.monotonic()
        with plane.stack.client(plane.operator) as api:
            assert api.delete(f"/api/v1/jobs/{job_id}/").status_code == 204
        assert held.result().status_code == 204
        assert time.monotonic() - deleted < 5, "the held poll waited out its period"
    again = httpx.get(
        f"{plane.url}/api/v1/hosts/{host_id}/allocation/",
        headers={"Authorization": f"Agent {token}"},
        timeout=10,
    )
    assert again.status_code == 401 and again.headers["WWW-Authenticate"].startswith("Agent")


@pytest.mark.parametrize("query", ["x=1", "seq=1", "wait=1"])
def test_a_batch_with_a_query_string_is_refused(plane, query):
    path = f"{plane.metrics_path()}?{query}"
    data = request("POST", path, plane.host, plane.agent_headers(), batch())
    detail = refused(plane, data, 400, method="POST")["detail"]
    assert detail.startswith(f"{query.split('=')[0]}: unknown query parameter; this takes ")


def test_a_misspelt_filter_of_the_peoples_api_is_refused(plane):
    path = f"/api/v1/hosts/{plane.host_id}/decisions/?sesion=1"
    detail = refused(plane, request("GET", path, plane.host, operator(plane)), 400)["detail"]
    assert detail == "sesion: unknown query parameter; this takes limit, offset, session"


def test_a_request_without_a_host_is_refused_before_any_100_continue(plane):
    body = batch()
    data = request(
        "POST",
        plane.metrics_path(),
        plane.host,
        [*plane.agent_headers(), ("Expect", "100-continue")],
        body,
    )
    head = without_host(data, plane.host)[: -len(body)]  # the head alone: the body waits for 100
    with Wire(plane.url) as wire:
        wire.send(head)
        answer = wire.answer(timeout=10, method="POST")
        assert answer.status == 400 and b"no Host header" in answer.body
        assert answer.closes and wire.closed_within(5)


def test_a_pipelined_request_without_a_host_is_refused_after_the_ones_before_it(plane):
    good = request("GET", plane.allocation_path(), plane.host, plane.agent_headers())
    with Wire(plane.url) as wire:
        wire.send(good + without_host(good, plane.host) + good)
        first, second = wire.answer(timeout=10), wire.answer(timeout=10)
        assert first.status == 200 and json.loads(first.body)["version"] >= 1
        assert second.status == 400 and second.closes
        assert wire.closed_within(5) and wire.buffer == b"", wire.buffer[:200]  # no third answer


@pytest.mark.parametrize("target_host", ["evil.example", "127.0.0.1:1"])
def test_an_absolute_form_target_naming_another_host_than_host_is_refused(plane, target_host):
    """RFC 9112 3.2.2: the target's authority is the request's host. uvicorn dropped it, and
    the request was served as to the Host field's (DJANGO_ALLOWED_HOSTS checked that one)."""
    path = f"http://{target_host}{plane.metrics_path()}"
    data = request("POST", path, plane.host, plane.agent_headers(), batch())
    detail = refused(plane, data, 400, method="POST")["detail"]
    assert f"the request target names host '{target_host}'" in detail


def test_an_absolute_form_target_naming_the_host_is_served(plane):
    path = f"http://{plane.host}{plane.allocation_path()}"
    with Wire(plane.url) as wire:
        wire.send(request("GET", path, plane.host, plane.agent_headers()))
        answer = wire.answer(timeout=10)
    assert answer.status == 200 and json.loads(answer.body)["version"] >= 1


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "br , chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused_501(plane, coding):
    """The parser de-chunked "gzip, chunked" and handed the gzip-coded bytes over as the body."""
    data = request(
        "POST", plane.metrics_path(), plane.host, plane.agent_headers(), batch(), chunked=True
    )
    data = data.replace(b"Transfer-Encoding: chunked", f"Transfer-Encoding: {coding}".encode())
    refused(plane, data, 501, method="POST")
