"""Bodies as clients other than ours send them, raw to a real server (gunicorn, its uvicorn
worker, webapp/agent_asgi.py, the lean paths and Django): chunked with any chunk sizes,
extensions and trailer fields; labelled with a charset; holding escapes JSON allows but text
does not. Each defect here was found by this file and failed before its fix (docs/reliability.md,
"The control plane under any client"): a trailer field read as a header, a trailer that grew the
server without bound, a lone surrogate that answered 500, a body decoded by its charset label,
a ``wait`` of ``1_0`` held 10 s."""

import json
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.agent_requests import batch
from tests.support.db_fingerprint import changed, fingerprint
from tests.support.raw_http import Wire, request

pytestmark = pytest.mark.slow

ANSWER_S = 10.0  # the longest any answer here may take (the server's timeouts are 2 s)


def chunked_head(plane, path: str, extra: bytes = b"") -> bytes:
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: {plane.host}\r\nAuthorization: Agent {plane.token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        ).encode()
        + extra
        + b"\r\n"
    )


def chunks(body: bytes, sizes: list[int], extensions: list[bytes]) -> bytes:
    """``body`` in chunks of ``sizes`` (cycled), each size line with its extension, and the
    last chunk's line (``0``) with none: the trailer section follows it."""
    out, i, n = [], 0, 0
    while i < len(body):
        size = sizes[n % len(sizes)]
        piece = body[i : i + size]
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), extensions[n % len(extensions)], piece))
        i, n = i + size, n + 1
    return b"".join(out) + b"0\r\n"


def answer_json(wire: Wire) -> tuple[int, dict]:
    _, answer = wire.final_answer(timeout=ANSWER_S, method="POST")
    return answer.status, json.loads(answer.body) if answer.body else {}


TRAILER_NAMES = ["X-Checksum", "Authorization", "Content-Type", "Host", "Expect", "Server-Timing"]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    extensions=st.lists(st.sampled_from([b"", b";a=1", b';name="x y"', b";x"]), min_size=1),
    trailers=st.lists(
        st.tuples(st.sampled_from(TRAILER_NAMES), st.sampled_from(["1", "Agent ia_other", "x"])),
        max_size=4,
    ),
)
def test_a_chunked_batch_is_stored_once_whatever_its_chunks_and_trailers(
    plane, sizes, extensions, trailers
):
    """Any chunking of a batch stores it once, its resend on the same connection is a
    duplicate, and no trailer field changes what the request is (before, a trailer
    ``Authorization`` joined the head's and the batch was refused 401)."""
    body = batch(2)
    trailer = b"".join(f"{name}: {value}\r\n".encode() for name, value in trailers) + b"\r\n"
    data = chunked_head(plane, plane.metrics_path()) + chunks(body, sizes, extensions) + trailer
    with Wire(plane.url) as wire:
        wire.send(data)
        status, content = answer_json(wire)
        assert (status, content.get("stored"), content.get("duplicates")) == (200, 2, 0), content
        wire.send(data)
        status, content = answer_json(wire)
        assert (status, content.get("stored"), content.get("duplicates")) == (200, 0, 2), content


def test_a_trailer_field_is_not_taken_for_a_header(plane):
    """A trailer's ``Authorization`` with another token is not the request's: the head's token
    stores the batch."""
    data = (
        chunked_head(plane, plane.metrics_path())
        + chunks(batch(), [64], [b""])
        + b"Authorization: Agent ia_not-this-hosts-token\r\n\r\n"
    )
    with Wire(plane.url) as wire:
        wire.send(data)
        status, content = answer_json(wire)
    assert status == 200 and content["stored"] == 1, content


def test_a_trailer_that_never_ends_is_refused_431_before_the_request_timeout(plane):
    """A trailer field's value is gathered whole by the HTTP parser before anyone sees it:
    a client sending one for ever grew the web process by all it sent until the request
    timeout (2 s here, 30 s by default). It is counted as a head is, and refused past 64 KiB."""
    data = chunked_head(plane, plane.metrics_path()) + chunks(batch(), [4096], [b""]) + b"X-T: "
    piece = b"a" * 65536
    with Wire(plane.url) as wire:
        wire.send(data)
        started = time.monotonic()
        sent = 0
        while sent < 4 * 1024 * 1024 and wire.send(piece):
            sent += len(piece)
            time.sleep(0.005)  # pieces arrive as reads of their own
            if time.monotonic() - started > 1.5:
                break
        answer = wire.answer(timeout=ANSWER_S, method="POST")
    assert answer is not None and answer.status == 431 and answer.closes, answer
    assert b"trailer" in answer.body


@pytest.mark.parametrize(
    "reason", [r"\ud800", r"a\udfffb", r"\ude00\ud83d"], ids=["high", "low", "reversed-pair"]
)
def test_a_lone_surrogate_in_a_refusal_reason_is_refused_400_naming_it(plane, reason):
    """``"\\ud800"`` is valid JSON but not text: PostgreSQL's driver could not encode it and
    the batch answered 500. Refused by the parser, on every endpoint, and nothing stored."""
    body = batch()[:-1] + (
        b', "allocation_status": {"applied_version": null, "refused": '
        b'[{"version": 1, "reason": "' + reason.encode() + b'"}]}}'
    )
    before = fingerprint(plane.stack.database.url)
    with Wire(plane.url) as wire:
        wire.send(request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), body))
        status, content = answer_json(wire)
    assert status == 400 and "surrogate" in content["detail"], content
    assert changed(before, fingerprint(plane.stack.database.url)) == []


def test_a_surrogate_pair_is_read_as_its_character(plane):
    data = json.dumps(
        {"name": f"pair-{uuid.uuid4().hex[:6]}-\U0001f600", "stages": [{"name": "a"}]}
    )
    assert "\\ud83d\\ude00" in data  # json.dumps escapes it as a pair
    headers = [("Authorization", f"Token {plane.operator}"), ("Content-Type", "application/json")]
    with Wire(plane.url) as wire:
        wire.send(request("POST", "/api/v1/jobs/", plane.host, headers, data.encode()))
        status, content = answer_json(wire)
    assert status == 201 and content["name"].endswith("\U0001f600"), content


@pytest.mark.parametrize("charset", ["latin-1", "windows-1252", "us-ascii"])
def test_a_utf8_body_is_read_as_utf8_whatever_its_charset_says(plane, charset):
    """RFC 8259: JSON is UTF-8 and ``application/json`` has no charset. DRF decoded by the
    label: a job named "café" sent by a client that labels every body ``charset=latin-1`` was
    stored as "cafÃ©" (the lean batch path read the same body as UTF-8)."""
    name = f"café-{uuid.uuid4().hex[:6]}"
    body = json.dumps({"name": name, "stages": [{"name": "a"}]}, ensure_ascii=False).encode()
    headers = [
        ("Authorization", f"Token {plane.operator}"),
        ("Content-Type", f"application/json; charset={charset}"),
    ]
    with Wire(plane.url) as wire:
        wire.send(request("POST", "/api/v1/jobs/", plane.host, headers, body))
        status, content = answer_json(wire)
    assert status == 201 and content["name"] == name, content


@pytest.mark.parametrize("charset", ["utf-16", "utf-32"])
def test_a_body_in_another_encoding_is_refused_400_saying_utf8(plane, charset):
    """docs/agent-protocol.md: a body is UTF-8. A UTF-16 batch labelled so was stored."""
    body = batch().decode().encode(charset)
    headers = [
        ("Authorization", f"Agent {plane.token}"),
        ("Content-Type", f"application/json; charset={charset}"),
    ]
    before = fingerprint(plane.stack.database.url)
    with Wire(plane.url) as wire:
        wire.send(request("POST", plane.metrics_path(), plane.host, headers, body))
        status, content = answer_json(wire)
    assert status == 400 and "not UTF-8" in content["detail"], content
    assert f"charset={charset}" in content["detail"]
    assert changed(before, fingerprint(plane.stack.database.url)) == []


@pytest.mark.parametrize("wait", ["1_0", "%EF%BC%95", "%D9%A3", "%205", "5%20", "nan", "-inf"])
def test_a_wait_that_is_not_a_plain_number_is_refused(plane, wait):
    """float() takes "1_0" (10), a fullwidth "５" and an Arabic-Indic "٣": such a poll was held
    for that long where the protocol says a non-numeric wait is a 400."""
    path = f"/api/v1/hosts/{plane.host_id}/allocation/?after=0&wait={wait}"
    with Wire(plane.url) as wire:
        wire.send(request("GET", path, plane.host, plane.agent_headers()))
        status, content = answer_json(wire)
    assert status == 400 and content["detail"].startswith("wait: must be a number"), content


def test_a_trailer_too_large_after_an_early_refusal_closes_without_a_second_answer(plane):
    """A chunked body over the limit is answered 413 as soon as it passes it, and the rest is
    read and discarded; a trailer then past the head's bounds ends the connection. It must not
    add a 431 of its own: the client would read two answers to one request."""
    over = b"x" * (1024 * 1024 + 4096)
    data = chunked_head(plane, plane.metrics_path()) + chunks(over, [65536], [b""])
    with Wire(plane.url) as wire:
        wire.send(data + b"X-T: " + b"a" * 100_000)
        first = wire.answer(timeout=ANSWER_S, method="POST")
        assert first is not None and first.status == 413, first
        wire.send(b"a" * 100_000)
        assert wire.closed_within(ANSWER_S)
        assert wire.buffer == b"", f"a second answer to one request: {wire.buffer[:100]!r}"


def test_an_integer_of_thousands_of_digits_is_refused_in_the_clients_words(plane):
    """Python refuses to read an integer of more than 4,300 digits, and its message told the
    client to call ``sys.set_int_max_str_digits()``."""
    body = batch().replace(b'"seq": ', b'"seq": ' + b"9" * 5000 + b', "x": ', 1)
    with Wire(plane.url) as wire:
        wire.send(request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), body))
        status, content = answer_json(wire)
    assert status == 400 and "more than 4300 digits" in content["detail"], content
    assert "sys." not in content["detail"]
