"""The agent endpoints and the operator API driven by curl and by Python's plain urllib (a new
connection per request, no keep-alive), as a third party's scripts drive them: what
docs/agent-protocol.md ("HTTP") promises each of them, checked on a real server. The server runs
with 2 s timeouts (agent_requests.TIMEOUTS)."""

import gzip
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.support.agent_requests import batch
from tests.support.raw_http import Wire, request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
]

CURL_S = 20  # the bound on any one curl run


def curl(*args: str, body: bytes | None = None) -> subprocess.CompletedProcess:
    """curl with ``args`` (-sS, a bound of its own), ``body`` on its stdin."""
    return subprocess.run(
        ["curl", "-sS", "--max-time", str(CURL_S - 5), *args],
        input=body, capture_output=True, timeout=CURL_S,
    )  # fmt: skip


def agent(plane) -> list[str]:
    return ["-H", f"Authorization: Agent {plane.token}"]


def as_json(plane) -> list[str]:
    return [*agent(plane), "-H", "Content-Type: application/json"]


def status_and_body(result: subprocess.CompletedProcess) -> tuple[int, bytes]:
    """For curl run with ``-w '\\n%{http_code}'``."""
    body, _, code = result.stdout.rpartition(b"\n")
    return int(code), body


WRITE_OUT = ["-w", "\n%{http_code}"]


# -- curl ------------------------------------------------------------------------------------
def test_curl_with_http2_prior_knowledge_is_told_http11_is_required(plane):
    result = curl(
        "-v", "--http2-prior-knowledge", *agent(plane), plane.url + plane.allocation_path()
    )
    # Before: an HTTP/1.1 "400 Invalid HTTP request" the HTTP/2 client cannot read, and curl
    # failed writing into the closed connection ("(55) Send failure: Broken pipe").
    assert result.returncode == 16, result.stderr  # CURLE_HTTP2: the server's GOAWAY
    assert b"GOAWAY, error=13" in result.stderr  # HTTP_1_1_REQUIRED
    again = curl(*WRITE_OUT, *agent(plane), plane.url + plane.allocation_path())
    assert status_and_body(again)[0] == 200


def test_an_http2_preface_is_answered_goaway_http11_required_then_closed(plane):
    settings_frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    with Wire(plane.url) as wire:
        wire.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings_frame)
        deadline = time.monotonic() + 10
        while len(wire.buffer) < 9 + 17 and wire._fill(deadline):
            pass
        frames = []
        data = wire.buffer
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            frames.append((data[3], data[9 : 9 + length]))
            data = data[9 + length :]
        assert [kind for kind, _ in frames] == [0x4, 0x7], wire.buffer  # SETTINGS, GOAWAY
        goaway = frames[1][1]
        assert int.from_bytes(goaway[4:8], "big") == 0xD  # HTTP_1_1_REQUIRED
        assert b"HTTP/1.1" in goaway[8:]
        assert wire.closed_within(5)


def test_curl_http10_is_answered_and_closed(plane):
    result = curl("--http1.0", "-D", "-", *agent(plane), plane.url + plane.allocation_path())
    head = result.stdout.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 200") and b"connection: close" in head, result.stdout
    assert b"content-length:" in head and b"transfer-encoding" not in head


def test_curl_keeps_one_connection_for_requests_in_a_row(plane):
    url = plane.url + plane.allocation_path()
    result = curl("-v", *agent(plane), url, url, plane.url + "/healthz", "-o", "/dev/null",
                  "-o", "/dev/null", "-o", "/dev/null")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(b"Re-using existing connection") == 2, result.stderr
    assert result.stderr.count(b"Connected to") == 1


def test_curl_posts_a_batch_with_expect_100_continue(plane):
    result = curl("-v", *WRITE_OUT, *as_json(plane), "-H", "Expect: 100-continue",
                  "--data-binary", "@-", plane.url + plane.metrics_path(), body=batch())  # fmt: skip
    assert b"< HTTP/1.1 100 Continue" in result.stderr
    status, body = status_and_body(result)
    assert status == 200 and json.loads(body)["stored"] == 1


def test_curl_posts_a_batch_chunked(plane):
    result = curl(*WRITE_OUT, *as_json(plane), "-H", "Transfer-Encoding: chunked",
                  "--data-binary", "@-", plane.url + plane.metrics_path(), body=batch(3))  # fmt: skip
    status, body = status_and_body(result)
    assert status == 200 and json.loads(body)["stored"] == 3


def test_curl_with_a_gzip_body_is_told_to_send_it_as_it_is(plane):
    result = curl("-D", "-", *as_json(plane), "-H", "Content-Encoding: gzip",
                  "--data-binary", "@-", plane.url + plane.metrics_path(),
                  body=gzip.compress(batch()))  # fmt: skip
    head, _, body = result.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 415"), result.stdout
    assert b"accept-encoding: identity" in head.lower()
    assert "Content-Encoding" in json.loads(body)["detail"]


@pytest.mark.parametrize("seconds, status", [(1.0, 200), (4.0, 408)])
def test_curl_sending_its_body_slowly_is_answered_within_the_request_timeout(
    plane, seconds, status
):
    body = batch()
    rate = max(1, int(len(body) / seconds))
    started = time.monotonic()
    result = curl(*WRITE_OUT, *as_json(plane), "--limit-rate", str(rate), "--data-binary", "@-",
                  plane.url + plane.metrics_path(), body=body)  # fmt: skip
    # The doc: head and body within INTUNE_REQUEST_TIMEOUT_S (2 s here) of the first byte, else
    # 408 and the connection closed (curl may see the close first: no status then).
    if status == 200:
        assert status_and_body(result)[0] == 200, result
    else:
        code = status_and_body(result)[0] if result.stdout.strip() else 0
        assert code in (408, 0), result
        assert time.monotonic() - started < seconds + 3


def test_curl_following_a_redirect_for_a_missing_slash_still_posts_the_batch(plane):
    result = curl("-L", *WRITE_OUT, *as_json(plane), "--data-binary", "@-",
                  plane.url + plane.metrics_path().rstrip("/"), body=batch())  # fmt: skip
    # Before: 301, which curl -L follows with a GET: 401 of the people's endpoint.
    status, body = status_and_body(result)
    assert status == 200 and json.loads(body)["stored"] == 1, result


# -- urllib (one connection a request) -------------------------------------------------------
def urlopen(plane, method: str, path: str, body=None, *, token: str | None = None):
    """(status, headers, parsed JSON body or None); HTTP errors are answers too."""
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    auth = f"Agent {plane.token}" if token is None else f"Token {token}"
    req = urllib.request.Request(plane.url + path, data=data, method=method)
    req.add_header("Authorization", auth)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as answer:
            raw = answer.read()
            return answer.status, answer.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, error.headers, json.loads(raw) if raw else None


def test_urllib_ships_a_batch_and_holds_a_long_poll(plane):
    status, _, stored = urlopen(plane, "POST", plane.metrics_path(), batch(2))
    assert status == 200 and stored["stored"] == 2
    version = plane.current_version()
    started = time.monotonic()
    status, headers, body = urlopen(plane, "GET", plane.allocation_path(version, 1))
    assert status == 204 and body is None and time.monotonic() - started >= 0.9
    status, _, body = urlopen(plane, "GET", plane.allocation_path(version - 1, 1))
    assert status == 200 and body["version"] == version


def test_urllib_errors_say_what_was_wrong_as_json(plane):
    status, headers, body = urlopen(plane, "GET", plane.allocation_path(0, 61))
    assert status == 400 and body["detail"].startswith("wait:")
    status, headers, body = urlopen(plane, "POST", plane.metrics_path(), b'{"samples": [')
    assert status == 400 and "JSON" in body["detail"]
    status, headers, body = urlopen(plane, "GET", "/api/v1/jobs/")
    assert status == 401 and "agent token" in body["detail"]


def override(plane, body):
    return urlopen(plane, "PUT", f"/api/v1/hosts/{plane.host_id}/override/", body,
                   token=plane.operator)  # fmt: skip


def test_urllib_overrides_an_allocation_and_the_agent_poll_sees_it(plane):
    before = plane.current_version()
    status, _, created = override(plane, {"workers": {"read": 2, "parse": 3}, "reason": "urllib"})
    assert status == 200 and created["version"] == before + 1, created
    status, _, allocation = urlopen(plane, "GET", plane.allocation_path(before, 5))
    assert status == 200 and allocation["workers"] == {"read": 2, "parse": 3}
    assert allocation["source"] == "override"


@pytest.mark.parametrize(
    "workers, expected",
    [
        ({"read": 2}, "parse"),  # a stage missing
        ({"read": 2, "parse": 1, "mystery": 1}, "mystery"),  # an unknown stage
        ({"read": "2", "parse": 1}, "whole numbers"),
        ({"read": 2.5, "parse": 1}, "whole numbers"),
        ({"read": True, "parse": 1}, "whole numbers"),
        ({"read": 0, "parse": 1}, "read"),
        ({"read": 500, "parse": 1}, "budget"),  # over the host's CPU slots
    ],
)
def test_urllib_a_bad_override_is_a_400_that_changes_nothing(plane, workers, expected):
    before = plane.current_version()
    status, _, body = override(plane, {"workers": workers, "reason": "bad"})
    assert status == 400, body
    assert expected in body["detail"], body
    assert plane.current_version() == before


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/hosts/1/allocation/", "/dashboard/"])
def test_curl_with_a_host_not_allowed_gets_a_400_with_a_content_length(plane, path):
    result = curl("-D", "-", "-H", "Host: evil.example", *agent(plane), plane.url + path)
    head, _, body = result.stdout.partition(b"\r\n\r\n")
    head = head.lower()
    # Before: the people's API and the dashboard answered Django's HTML page chunked.
    assert head.startswith(b"http/1.1 400"), result.stdout
    assert b"transfer-encoding" not in head and b"content-length:" in head
    if path.startswith("/api/"):
        assert "Host header" in json.loads(body)["detail"]


def test_curl_asking_for_h2c_posts_its_batch_over_http11(plane):
    # curl --http2 (and other clients on http://) asks to upgrade to h2c; the server upgrades
    # to nothing and serves the request as HTTP/1.1 (RFC 9110 7.8).
    result = curl("-v", "--http2", *WRITE_OUT, *as_json(plane), "--data-binary", "@-",
                  plane.url + plane.metrics_path(), body=batch())  # fmt: skip
    assert b"Upgrade: h2c" in result.stderr
    status, body = status_and_body(result)
    # Before: the parser took the request for an upgraded one and skipped its body: 400
    # "samples: must be a list".
    assert status == 200 and json.loads(body)["stored"] == 1, result


def test_a_request_asking_for_an_upgrade_does_not_swallow_the_one_pipelined_behind_it(plane):
    upgrade = [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
               ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")]  # fmt: skip
    first = request("GET", plane.allocation_path(), plane.host, plane.agent_headers() + upgrade)
    second = request("GET", "/healthz", plane.host, [("Connection", "close")])
    with Wire(plane.url) as wire:
        wire.send(first + second)
        answers = [wire.answer(timeout=10), wire.answer(timeout=10)]
    # Before: the bytes after the first head were taken for the upgraded protocol's: one answer.
    assert [a.status if a else None for a in answers] == [200, 200]
