"""Agents' batches that reach a web process in the same instant are served together
(``webapp.agent_asgi.Gathered``): one thread takes the group, and its usual batches are stored
by ONE statement (``services.store_usual_batches_together``). Each batch is still answered
only once it is committed, and a group holding a batch that cannot be stored with the others
(a resend, a reused sequence number) stores each alone, with the answers a batch alone gets.
The group's token lookups are one query (``permissions.agent_lookups_read_together``).

Through the web server's ASGI application (webapp/agent_asgi.py) with its real thread pool and
PostgreSQL; the mix of batches in a burst is generated.
"""

import asyncio
import contextlib
import json
from unittest import mock

import psycopg
import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.asgi_fronts import close_front_pool
from webapp import agent_asgi, permissions
from webapp.agent_asgi import AgentFront
from webapp.ingestion.api import lean
from webapp.ingestion.models import HostSample, StageSample
from webapp.jobs.models import Host

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("batches are stored together on PostgreSQL only (CI runs it)")


def committed(host_id: int) -> int:
    """Samples of the host as another connection sees them (committed ones only)."""
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or None, port=db["PORT"] or None, user=db["USER"],
        password=db["PASSWORD"] or None, dbname=db["NAME"], connect_timeout=10,
    ) as other:  # fmt: skip
        return other.execute(
            "SELECT count(*) FROM ingestion_hostsample WHERE host_id = %s", [host_id]
        ).fetchone()[0]


class Front:
    """The ASGI application with the lean path on; the sizes of the groups it served."""

    def __init__(self) -> None:
        async def django(scope, receive, send):
            raise AssertionError(f"not an agent's request: {scope['path']}")

        self.loop = asyncio.new_event_loop()
        self.app = AgentFront(django, threads=4)
        self.app.lean_post = lean.LeanBatchPost()
        self.app.waker.start = lambda: None  # batches only: no Redis subscription
        self.groups: list[int] = []
        serve = self.app.gathered.serve

        def counted(requests):
            self.groups.append(len(requests))
            return serve(requests)

        self.app.gathered.serve = counted
        # How many of a group's token lookups one query read ahead (permissions.py).
        self.read_ahead: list[int] = []
        read_together = agent_asgi.agent_lookups_read_together

        @contextlib.contextmanager
        def recorded(hashes):
            with read_together(hashes):
                rows = permissions._prefetched.rows
                self.read_ahead.append(sum(1 for row in (rows or {}).values() if row))
                yield

        self._patch = mock.patch.object(agent_asgi, "agent_lookups_read_together", recorded)
        self._patch.start()

    async def post(self, host_id: int, token: str, body: dict):
        path = f"/api/v1/hosts/{host_id}/metrics/"
        headers = [
            (b"host", b"127.0.0.1:8000"), (b"accept", b"*/*"),
            (b"content-type", b"application/json"), (b"authorization", f"Agent {token}".encode()),
        ]  # fmt: skip
        scope = {
            "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
        }  # fmt: skip
        messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
        sent = []

        async def receive():
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                # What another connection sees when the answer leaves: the batch is committed.
                message = {**message, "committed_then": committed(host_id)}
            sent.append(message)

        await self.app(scope, receive, send)
        start, body_message = sent
        return start["status"], json.loads(body_message["body"]), start["committed_then"]

    def burst(self, requests):
        async def all_at_once():
            return await asyncio.gather(*(self.post(*r) for r in requests))

        return self.loop.run_until_complete(all_at_once())

    def close(self) -> None:
        self._patch.stop()
        close_front_pool(self.app)
        self.loop.close()


@pytest.fixture
def front():
    f = Front()
    yield f
    f.close()


KINDS = st.lists(st.sampled_from(["new", "new", "new", "resend", "reuse"]), min_size=2, max_size=14)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kinds=KINDS)
def test_a_burst_is_served_together_and_each_batch_answered_once_committed(
    front, make_job, make_host, sample, kinds
):
    job = make_job()
    stages = job.stage_names
    requests, expected = [], []
    for kind in kinds:
        host, token = make_host(job)
        first = {"samples": [sample(seq, stages, ts=1000.0 + seq) for seq in range(1, 6)]}
        if kind != "new":  # stored before the burst, alone
            ((status, answer, _),) = front.burst([(host.pk, token, first)])
            assert (status, answer["stored"]) == (200, 5)
        if kind == "reuse":  # the same sequence numbers for other samples: refused, 409
            first = {"samples": [sample(seq, stages, ts=2000.0 + seq) for seq in range(1, 6)]}
        requests.append((host.pk, token, first))
        expected.append(kind)
    front.groups.clear()
    front.read_ahead.clear()

    answers = front.burst(requests)

    assert max(front.groups) > 1, front.groups  # served together, not one by one
    assert max(front.groups) <= agent_asgi.GATHERED_AT_MOST
    # Each group's hosts were read by one query, every host of the burst among them.
    assert sum(front.read_ahead) == len(kinds), (front.groups, front.read_ahead)
    for kind, (host_id, _, _), (status, answer, committed_then) in zip(
        expected, requests, answers, strict=True
    ):
        if kind == "new":
            assert (status, answer["stored"], answer["duplicates"]) == (200, 5, 0)
        elif kind == "resend":
            assert (status, answer["stored"], answer["duplicates"]) == (200, 0, 5)
        else:
            assert status == 409 and "sequence number" in answer["detail"], answer
        # Every sample this host has is committed before its answer left: 5 each.
        assert committed_then == 5
        assert HostSample.objects.filter(host_id=host_id).count() == 5
        assert StageSample.objects.filter(host_id=host_id).count() == 5 * len(stages)


def statements_that_stored(host_ids: list[int]) -> int:
    """How many statements stored these hosts' sample and stage rows: a row's transaction
    (xmin) and its command within it (cmin) name the statement that inserted it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT (xmin::text, cmin::text)) FROM ("
            " SELECT xmin, cmin FROM ingestion_hostsample WHERE host_id = ANY(%s)"
            " UNION ALL SELECT xmin, cmin FROM ingestion_stagesample WHERE host_id = ANY(%s)) r",
            [host_ids, host_ids],
        )
        return cursor.fetchone()[0]


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    hosts=st.lists(
        st.tuples(st.integers(1, 2), st.integers(0, 3)),  # (batches of the host, dropped each)
        min_size=2,
        max_size=8,
    )
)
def test_a_groups_batches_are_stored_by_one_statement(front, make_job, make_host, sample, hosts):
    job = make_job()
    stages = job.stage_names
    requests, host_ids = [], []
    for batches, dropped in hosts:
        host, token = make_host(job)
        host_ids.append(host.pk)
        for b in range(batches):  # a host's second batch: the next sequence numbers
            seqs = range(1 + 5 * b, 6 + 5 * b)
            body = {"samples": [sample(seq, stages, ts=1000.0 + seq) for seq in seqs]}
            requests.append((host.pk, token, {**body, "dropped_samples": dropped}))
    front.groups.clear()

    answers = front.burst(requests)

    for status, answer, committed_then in answers:
        assert (status, answer["stored"], answer["duplicates"]) == (200, 5, 0), answer
        assert committed_then >= 5
    # One statement a group, not one a batch (each group's serving stores all its batches).
    assert statements_that_stored(host_ids) == len(front.groups) < len(requests), front.groups
    for host_id, (batches, dropped) in zip(host_ids, hosts, strict=True):
        host = Host.objects.get(pk=host_id)
        # As the batches one after the other would leave it: every one's dropped samples
        # counted, the greatest sequence number kept.
        assert (host.last_seq, host.dropped_samples) == (5 * batches, dropped * batches)
        assert HostSample.objects.filter(host_id=host_id).count() == 5 * batches
        assert StageSample.objects.filter(host_id=host_id).count() == 5 * batches * len(stages)
