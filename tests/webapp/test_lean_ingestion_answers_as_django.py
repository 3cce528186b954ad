"""The lean path of agents' batches (webapp/ingestion/api/lean.py) answers every request as
Django's view does: the same status, body and headers, and the same rows stored.

Each request goes through the web server's ASGI application (webapp/agent_asgi.py) twice, on
twin hosts of one job: once with the lean path, once without it (Django's view, as with
``INTUNE_LEAN_INGESTION=False``). Its thread pool and the database are real (transactional
tests: the pool's threads have connections of their own).
"""

import asyncio
import json
import math
import re
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.asgi_fronts import close_front_pool
from webapp.agent_asgi import AgentFront
from webapp.ingestion import validation
from webapp.ingestion.api import lean
from webapp.ingestion.models import HostSample, StageSample
from webapp.jobs.models import Allocation

pytestmark = pytest.mark.django_db(transaction=True)


class Fronts:
    """The ASGI application with the lean path and without it, on one event loop."""

    def __init__(self) -> None:
        async def django(scope, receive, send):
            raise AssertionError(f"not an agent's request: {scope['path']}")

        self.loop = asyncio.new_event_loop()
        self.lean, self.django = AgentFront(django, threads=2), AgentFront(django, threads=2)
        self.lean.lean_post, self.django.lean_post = lean.LeanBatchPost(), None
        for front in (self.lean, self.django):
            front.waker.start = lambda: None  # no long-polls here: no Redis subscription
        self.lean_answers = 0

    def post(self, front, host_id: int, body: bytes, headers: dict, query: bytes = b""):
        path = f"/api/v1/hosts/{host_id}/metrics/"
        raw = [(b"host", b"127.0.0.1:8000")] + [
            (k.lower().encode(), v.encode()) for k, v in headers.items()
        ]
        scope = {
            "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": query, "headers": raw, "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
        }  # fmt: skip
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent = []

        async def receive():
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        self.loop.run_until_complete(front(scope, receive, send))
        start, body_message = sent
        headers = sorted((k.lower(), v) for k, v in start["headers"])
        return start["status"], headers, body_message["body"]

    def both(self, twins, body, headers: dict, query: bytes = b"", token_of=None):
        """The answer of each path, ``twins`` being ((host, token) lean, (host, token) Django)."""
        answers = []
        for front, (host, token) in zip((self.lean, self.django), twins, strict=True):
            sent_headers = {"Content-Type": "application/json", "Accept": "*/*"} | headers
            if "Authorization" not in headers:
                sent_headers["Authorization"] = f"Agent {token_of(token) if token_of else token}"
            sent_headers = {k: v for k, v in sent_headers.items() if v is not None}
            encoded = body if isinstance(body, bytes) else json.dumps(body).encode()
            answers.append(self.post(front, host.pk, encoded, sent_headers, query))
        return answers

    def close(self) -> None:
        for front in (self.lean, self.django):
            close_front_pool(front)  # each pool thread keeps its database connection (lean.py)
        self.loop.close()


@pytest.fixture
def fronts(monkeypatch):
    # One clock for both paths: a sample's refusal for being ahead of it says by how much.
    now = time.time()
    monkeypatch.setattr(validation, "clock", lambda: now)
    f = Fronts()
    yield f
    f.close()


@pytest.fixture
def twins(make_job, make_host):
    job = make_job()
    return job, (make_host(job), make_host(job))


def stored(host) -> list[tuple]:
    samples = HostSample.objects.filter(host=host).order_by("seq")
    rows = [(s.seq, s.ts, s.throughput, s.allocation_version, s.per_cpu_percent) for s in samples]
    stages = StageSample.objects.filter(host=host).order_by("ts", "stage")
    return rows + [(s.stage, s.ts, s.workers, s.busy_fraction, s.cpu_percent) for s in stages]


def assert_same(fronts, twins, body, headers=None, query=b"", token_of=None):
    job, pair = twins
    via_lean, via_django = fronts.both(pair, body, headers or {}, query, token_of)
    if (b"content-type", b"text/html; charset=utf-8") in via_lean[1]:
        # DRF's browsable API (Django answers both): a page with a fresh CSRF token each time.
        assert via_lean[0] == via_django[0]
        return via_lean
    assert via_lean == via_django
    assert stored(pair[0][0]) == stored(pair[1][0])
    return via_lean


def batch(job, sample, seqs=(1, 2), **status) -> dict:
    body = {"samples": [sample(seq, job.stage_names, ts=1_700_000_000.0 + seq) for seq in seqs]}
    if status:
        body["allocation_status"] = status
    return body


def test_a_valid_batch_is_stored_and_answered_as_django_does(fronts, twins, sample):
    job, _ = twins
    status, headers, body = assert_same(fronts, twins, batch(job, sample, applied_version=1))
    assert status == 200 and json.loads(body) == {
        "stored": 2,
        "duplicates": 0,
        "latest_allocation_version": 1,
    }
    assert (b"x-frame-options", b"DENY") in headers
    # JSON whatever Accept says (webapp/negotiation.py): the answer does not vary by it.
    assert not any(name == b"vary" for name, _ in headers)
    # A resend is acknowledged, not stored again; an empty batch that reports a status too.
    status, _, body = assert_same(fronts, twins, batch(job, sample, seqs=(2, 3)))
    assert status == 200 and json.loads(body)["duplicates"] == 1
    assert assert_same(fronts, twins, {"samples": [], "allocation_status": {"applied_version": 1}})[0] == 200  # fmt: skip


def test_the_lean_path_answers_the_usual_batch_itself(fronts, twins, sample, monkeypatch):
    """Not a fallback in disguise: Django's view is not reached for a valid batch."""
    from webapp.ingestion.api.views import HostMetricsView

    job, ((host, token), _) = twins
    monkeypatch.setattr(HostMetricsView, "post", lambda *a, **k: pytest.fail("Django reached"))
    status, _, _ = fronts.post(
        fronts.lean,
        host.pk,
        json.dumps(batch(job, sample)).encode(),
        {"Content-Type": "application/json", "Authorization": f"Agent {token}"},
    )
    assert status == 200 and HostSample.objects.filter(host=host).count() == 2


@pytest.mark.parametrize(
    "headers, query, expected",
    [
        ({"Authorization": None}, b"", 401),
        ({"Authorization": "Token abc"}, b"", 401),
        ({"Authorization": "Agent"}, b"", 401),
        ({"Authorization": "Agent ia_not-a-token"}, b"", 401),
        ({"Authorization": "Agent a b"}, b"", 401),
        ({"Content-Type": "text/plain"}, b"", 415),
        ({"Content-Type": None}, b"", 415),
        ({"Content-Type": "application/json; charset=latin-1"}, b"", 200),
        ({"Accept": "text/html"}, b"", 200),
        ({"Accept": "application/json; indent=4"}, b"", 200),
        # JSON whatever Accept says (webapp/negotiation.py; before: 406, not in the protocol)
        ({"Accept": "application/xml"}, b"", 200),
        ({}, b"format=json", 200),
        ({"Accept": None}, b"", 200),
    ],
)
def test_unusual_headers_are_answered_as_django_does(
    fronts, twins, sample, headers, query, expected
):
    job, _ = twins
    answer = assert_same(fronts, twins, batch(job, sample), headers, query)
    assert answer[0] == expected


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"", 400),
        (b"not json", 400),
        (b"[1, 2]", 400),
        (b'{"samples": NaN}', 400),
        (b"\xff\xfe{}", 400),
        (b"[" * 5000 + b"]" * 5000, 400),
        (b'{"samples": "x"}', 400),
        (b'{"samples": []}', 400),
        (b'{"samples": [], "allocation_status": {"applied_version": 7}}', 400),
        (b'{"samples": [{"seq": 18446744073709551616}]}', 400),
        (b"x" * (1024 * 1024 + 1), 413),
    ],
)
def test_bodies_django_refuses_are_refused_with_its_words(fronts, twins, body, expected):
    assert assert_same(fronts, twins, body)[0] == expected


# Where orjson (the lean path's parser) and json (DRF's) read a body differently: a number out
# of a double's range, an integer beyond 64 bits, an escaped lone surrogate, text beyond ASCII.
@pytest.mark.parametrize(
    "old, new",
    [
        (b'"cpu_percent": 55.0', b'"cpu_percent": 1e400'),
        (b'"cpu_percent": 55.0', b'"cpu_percent": -1e400'),
        (b'"memory_used_mb": 4096.0', b'"memory_used_mb": 123456789012345678901234567890'),
        (b'"memory_used_mb": 4096.0', b'"memory_used_mb": 18446744073709551615'),
        (b'"step_ms": 8.0', b'"step_ms": 1e-320'),
        (b'"step_ms": 8.0', b'"step_ms": 0.30000000000000004'),
        (b'"worker_budget": 13', b'"worker_budget": 123456789012345678901234567890'),
        (b'"worker_budget": 13', b'"worker_budget": 13.0'),
        (b'"seq": 1', b'"seq": -9223372036854775809'),
        (b'"device": "cpu"', b'"device": "\\ud800"'),
        (b'"device": "cpu"', b'"device": "\\u00e9\\u4e2d"'),
        (b'"device": "cpu"', '"device": "é中"'.encode()),
        (b'"device": "cpu"', b'"device": "\\u0000"'),
    ],
)
def test_a_body_read_otherwise_by_json_is_answered_and_stored_as_django_does(
    fronts, twins, sample, old, new
):
    job, _ = twins
    body = json.dumps(batch(job, sample, seqs=(1,))).encode()
    assert old in body
    assert_same(fronts, twins, body.replace(old, new, 1))


def test_a_non_finite_value_is_never_stored_as_null():
    from webapp.ingestion.inserts import samples_json

    assert json.loads(samples_json([{"a": [1.5, None, "x"]}])) == [{"a": [1.5, None, "x"]}]
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError):
            samples_json([{"stages": [{"cpu_percent": value}]}])


def test_another_hosts_token_is_403_and_a_reused_sequence_number_409(fronts, twins, sample):
    job, ((lean_host, lean_token), (django_host, django_token)) = twins
    crossed = {lean_token: django_token, django_token: lean_token}
    answer = assert_same(fronts, twins, batch(job, sample), token_of=crossed.__getitem__)
    assert answer[0] == 403
    assert assert_same(fronts, twins, batch(job, sample, seqs=(5,)))[0] == 200
    reused = {"samples": [sample(5, job.stage_names, ts=1.0)]}
    assert assert_same(fronts, twins, reused)[0] == 409


def test_a_refused_allocation_is_recorded_as_django_records_it(fronts, twins, sample):
    job, ((lean_host, _), (django_host, _)) = twins
    # A version reported both applied and refused is refused (400), the same both ways.
    both = {"applied_version": 1, "refused": [{"version": 1, "reason": "too many workers"}]}
    assert assert_same(fronts, twins, batch(job, sample, **both))[0] == 400
    status = {"applied_version": None, "refused": [{"version": 1, "reason": "too many workers"}]}
    assert assert_same(fronts, twins, batch(job, sample, **status))[0] == 200
    recorded = [
        (allocation.status, allocation.refusal_reason, allocation.host.applied_version)
        for allocation in Allocation.objects.filter(
            host__in=[lean_host, django_host], version=1
        ).select_related("host")
    ]
    assert recorded == [("refused", "too many workers", lean_host.applied_version)] * 2


def test_the_agent_rate_limit_holds_on_the_lean_path(fronts, twins, sample, monkeypatch):
    from rest_framework.settings import api_settings
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(
        SimpleRateThrottle,
        "THROTTLE_RATES",
        {**api_settings.DEFAULT_THROTTLE_RATES, "agent": "2/min"},
    )
    job, _ = twins
    codes = [assert_same(fronts, twins, batch(job, sample, seqs=(i,)))[0] for i in range(1, 4)]
    assert codes == [200, 200, 429]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
PLACES = [
    ("seq",), ("ts",), ("allocation_version",), ("host", "cpus"), ("host", "cpu_percent"),
    ("host", "per_cpu_percent"), ("host", "worker_budget"), ("host", "ranks"),
    ("trainer", "throughput"), ("trainer", "idle_fraction"), ("trainer", "device"),
    ("stages", 0, "name"), ("stages", 0, "workers"), ("stages", 1, "busy_fraction"),
    ("stages", 2, "rss_mb"), ("stages", 3, "runqueue_percent"), ("ranks",),
]  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(place=st.sampled_from(PLACES), value=JSON)
def test_any_value_anywhere_in_a_sample_is_answered_as_django_answers_it(
    fronts, make_job, make_host, sample, place, value
):
    job = make_job()
    twins = (job, (make_host(job), make_host(job)))
    body = batch(job, sample, seqs=(1,))
    target = body["samples"][0]
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = value
    assert_same(fronts, twins, body)


@settings(max_examples=200, deadline=None)
@given(value=JSON)
def test_the_statement_reads_what_json_dumps_wrote(value):
    from webapp.ingestion.inserts import samples_json

    try:
        expected = json.loads(json.dumps([value], allow_nan=False))
    except ValueError:
        return
    assert json.loads(samples_json([value])) == expected


# What validation builds (dicts, lists, floats...) and what it does not (tuples, other mappings),
# with NaN and the infinities anywhere among them.
ANY_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3).map(types.MappingProxyType),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(value=ANY_FLOATS)
def test_a_non_finite_float_anywhere_is_refused_as_json_dumps_refuses_it(value):
    from webapp.ingestion.inserts import _non_finite

    def non_finite(v) -> bool:  # the plain definition
        if isinstance(v, float):
            return not math.isfinite(v)
        if isinstance(v, types.MappingProxyType | dict):
            return any(non_finite(x) for x in v.values())
        return isinstance(v, list | tuple) and any(non_finite(x) for x in v)

    assert _non_finite([value]) == non_finite(value)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ahead=st.floats(min_value=-60.0, max_value=3600.0), which=st.integers(0, 2))
def test_a_sample_from_the_future_is_refused_naming_it_and_its_skew(
    fronts, make_job, make_host, sample, ahead, which
):
    """A trainer host's clock ahead of the control plane's by more than INTUNE_MAX_CLOCK_SKEW_S:
    before, its samples were stored, and stayed the host's newest until the clock caught up."""
    job = make_job()
    twins = (job, (make_host(job), make_host(job)))
    body = batch(job, sample, seqs=(1, 2, 3))
    body["samples"][which]["ts"] = validation.clock() + ahead
    bound = validation.max_clock_skew_s()
    status, _, answer = assert_same(fronts, twins, body)
    if ahead <= bound:
        assert status == 200 and json.loads(answer)["stored"] == 3
    else:
        detail = json.loads(answer)["detail"]
        assert status == 400 and detail.startswith(f"samples[{which}].ts: "), detail
        said = re.search(r"it is (\d+) s ahead of it; at most (\S+) s is taken", detail)
        assert said and abs(int(said[1]) - ahead) <= 1 and float(said[2]) == bound, detail
        assert stored(twins[1][0][0]) == [] and stored(twins[1][1][0]) == []


@pytest.mark.parametrize(
    "old, new",
    [
        (b'{"samples": ', b'{"samples": [], "samples": '),
        (b'"seq": 1, ', b'"seq": 1, "seq": 2, '),
        (b'"busy_fraction": 0.5', b'"busy_fraction": 0.5, "busy_fraction": 0.9'),
        (b'"device": "cpu"', b'"device": "cpu", "device": "cpu"'),
    ],
)
def test_a_key_given_twice_is_refused_as_django_refuses_it(fronts, twins, sample, old, new):
    """orjson keeps a repeated key's last value: the lean path hands such a body to Django,
    whose parser refuses it (webapp/parsers.py, unique_keys)."""
    job, _ = twins
    body = json.dumps(batch(job, sample, seqs=(1,))).encode()
    assert old in body
    status, _, answer = assert_same(fronts, twins, body.replace(old, new, 1))
    assert status == 400 and "appears twice in one object" in json.loads(answer)["detail"]
    assert stored(twins[1][0][0]) == [] and stored(twins[1][1][0]) == []


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        [
            "items_per_s",
            "in_queue",
            "out_queue",
            "queue_capacity",
            "cpu_percent",
            "runqueue_percent",
            "rss_mb",
        ]
    ),
    value=st.floats(min_value=1e12 + 1, max_value=1.7976931348623157e308),
)
def test_a_stage_figure_past_its_bound_is_refused_as_django_refuses_it(
    fronts, make_job, make_host, sample, field, value
):
    """A stage's 1.7e308 items/s was stored: the sums the host's detail reads overflowed (500)."""
    job = make_job()
    twins = (job, (make_host(job), make_host(job)))
    body = batch(job, sample, seqs=(1,))
    body["samples"][0]["stages"][1][field] = value
    status, _, answer = assert_same(fronts, twins, body)
    assert status == 400
    assert json.loads(answer)["detail"].startswith(f"samples[0].stages[1].{field}: must be at most")
