"""Generated request sequences on raw sockets against a real server (gunicorn, its uvicorn worker,
the agents' ASGI front): methods and paths of the agent endpoints, header names in any case and
values with whitespace around them, bodies small, large and over the limit, by Content-Length or
chunked, with or without ``Expect: 100-continue``, HTTP/1.1 and 1.0, pipelined up to four deep,
sent in pieces with pauses, then read, half-closed, dropped, or left incomplete.

Whatever the sequence: every complete request gets exactly one well-formed answer, in order, with
a status docs/agent-protocol.md documents and never a 5xx (an incomplete one gets a 408 or
nothing); and once the client is gone the server holds nothing for it: its connections, held
long-polls and threads come back to where they were. Every wait is bounded.
"""

import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.agent_requests import DOCUMENTED, batch
from tests.support.raw_http import Wire, open_connections, request, settles

pytestmark = pytest.mark.slow

LIMIT = 1024 * 1024
ANSWER_S = 10.0  # the longest any one answer may take here (a held poll waits 0.5 s)


@dataclass
class Spec:
    method: str
    target: str  # "metrics", "allocation", "other-host", "bad-token"
    body: str  # "batch", "bad-json", "padded", "over-limit", "gzip", "none"
    chunked: bool
    expect: bool
    version: str
    wait: float


specs = st.builds(
    Spec,
    method=st.sampled_from(["GET", "POST", "HEAD"]),
    target=st.sampled_from(["metrics", "metrics", "allocation", "other-host", "bad-token"]),
    body=st.sampled_from(["batch", "batch", "bad-json", "padded", "over-limit", "gzip", "none"]),
    chunked=st.booleans(),
    expect=st.booleans(),
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]),
    wait=st.sampled_from([0, 0, 0.5]),
)
# After sending: read the answers; half-close first; drop the connection; or cut the last
# request in half, then half-close, drop, or stall (the server's request timeout answers). Each
# ending has its examples (a parameter, not drawn: Hypothesis favours a list's first items).
ENDINGS = ["read", "half-close", "drop", "cut-half-close", "cut-drop", "cut-stall"]
sessions = st.fixed_dictionaries(
    {
        "specs": st.lists(specs, min_size=1, max_size=4),
        "casing": st.sampled_from(["title", "lower", "upper"]),
        "padding": st.sampled_from(["", " ", "\t", "  \t"]),
        "pieces": st.lists(st.floats(0.0, 1.0), max_size=3),
        "pause": st.sampled_from([0.0, 0.0, 0.02]),
    }
)


def encode(plane, spec: Spec, casing: str, padding: str, after: int) -> bytes:
    host_id = plane.host_id + (1000 if spec.target == "other-host" else 0)
    token = "ia_not-a-token" if spec.target == "bad-token" else plane.token
    if spec.target == "allocation" or spec.method != "POST":
        path = f"/api/v1/hosts/{host_id}/allocation/?after={after}&wait={spec.wait:g}"
    else:
        path = f"/api/v1/hosts/{host_id}/metrics/"
    body = b""
    headers = [("Authorization", f"Agent {token}"), ("Accept", "application/json")]
    if spec.method == "POST":
        body = {
            "batch": batch(),
            "bad-json": b'{"samples": [',
            "padded": batch() + b" " * 70_000,
            "over-limit": b" " * (LIMIT + 1),
            "gzip": batch(),
            "none": b"",
        }[spec.body]
        headers.append(("Content-Type", "application/json"))
        if spec.body == "gzip":
            headers.append(("Content-Encoding", "gzip"))
        if spec.expect and body:
            headers.append(("Expect", "100-continue"))
    cased = []
    for name, value in headers:
        name = {"title": name, "lower": name.lower(), "upper": name.upper()}[casing]
        cased.append((name, f"{padding}{value}{padding}"))
    chunked = spec.chunked and spec.version == "HTTP/1.1" and spec.method == "POST"
    return request(
        spec.method, path, plane.host, cased, body, version=spec.version, chunked=chunked
    )


def closes_after(spec: Spec) -> bool:
    """Whether the server closes the connection after answering this request."""
    return spec.version == "HTTP/1.0"


@pytest.fixture(scope="module")
def after(plane) -> int:
    return plane.current_version()


@pytest.fixture(scope="module")
def threads(plane, worker) -> int:
    """The worker's threads once its pool of agents' threads has started (a burst of batches)."""
    wires = [Wire(plane.url) for _ in range(12)]
    for wire in wires:
        wire.send(request("POST", plane.metrics_path(), plane.host, plane.agent_headers(), batch()))
    for wire in wires:
        wire.answer(timeout=ANSWER_S)
        wire.close()
    return worker.num_threads()


@pytest.mark.parametrize("ending", ENDINGS)
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(session=sessions)
def test_every_request_gets_one_documented_answer_and_nothing_is_held(
    plane, worker, after, threads, ending, session
):
    specs = session["specs"]
    # Requests after one the server closes on (HTTP/1.0) are never read: not sent.
    for index, spec in enumerate(specs):
        if closes_after(spec):
            specs = specs[: index + 1]
            break
    wire_requests = [
        encode(plane, spec, session["casing"], session["padding"], after) for spec in specs
    ]
    event(f"pipelined: {len(specs)}")
    cut = ending.startswith("cut-")
    data = b"".join(wire_requests)
    complete = len(specs)
    if cut:
        last = wire_requests[-1]
        data = data[: len(data) - len(last) + max(1, len(last) // 2)]
        complete -= 1
    offsets = sorted({int(f * len(data)) for f in session["pieces"]} | {0, len(data)})

    with Wire(plane.url, timeout=ANSWER_S) as wire:
        for start, end in zip(offsets, offsets[1:], strict=False):
            if not wire.send(data[start:end]):
                break
            time.sleep(session["pause"])
        if ending in ("drop", "cut-drop"):
            wire.close()
        else:
            if ending in ("half-close", "cut-half-close"):
                wire.half_close()
            answered = 0
            for spec in specs[:complete]:
                method = spec.method
                answer = wire.answer(timeout=ANSWER_S, method=method)
                while answer is not None and answer.status < 200:
                    # An interim 100 Continue: only to an HTTP/1.1 request that asked for it.
                    assert answer.status == 100 and spec.expect and spec.version == "HTTP/1.1"
                    answer = wire.answer(timeout=ANSWER_S, method=method)
                if answer is None:
                    break
                answered += 1
                assert answer.status in DOCUMENTED, answer
                if spec.version == "HTTP/1.0":
                    assert answer.header(b"transfer-encoding") is None, answer
                if answer.closes:
                    # Only an HTTP/1.0 answer, a body refused unsent (413/415 to Expect), or
                    # the last answer to a client that half-closed.
                    last = answered == complete and "half-close" in ending
                    assert last or spec.version == "HTTP/1.0" or answer.status in (413, 415), answer
                    break
            else:
                if ending == "cut-stall":
                    # 408, or a refusal from its head alone (its body over the limit, encoded).
                    late = wire.answer(timeout=ANSWER_S)
                    while late is not None and late.status == 100 and specs[-1].expect:
                        late = wire.answer(timeout=ANSWER_S)
                    assert late is not None and late.status in (408, 413, 415), late
            if answered < complete:
                # The server closed early: only after an answer that said so.
                assert wire.closed_within(ANSWER_S)
            if ending != "read":
                assert wire.closed_within(ANSWER_S), "the server kept a finished connection"

    assert settles(lambda: open_connections(worker, plane.port), 0, 10) == 0
    assert settles(plane.held_long_polls, 0, 10) == 0
    assert worker.num_threads() <= threads + 2
