"""The lean re-arm of an allocation long-poll (webapp/jobs/api/lean.py) answers as Django's view
does: a held poll answers the same 204 when nothing newer comes and the same 200 when a version is
published meanwhile; every other request is Django's to answer.

Each request goes through the web server's ASGI application (webapp/agent_asgi.py) twice: once
with the lean re-arm, once without it (Django's view hands the wait over, as before). Its thread
pool, its Redis subscription and the database are real (transactional tests).
"""

import asyncio
import time

import pytest

from tests.support.asgi_fronts import close_front_pool
from webapp.agent_asgi import AgentFront
from webapp.jobs.api import lean
from webapp.jobs.services import create_allocation

pytestmark = pytest.mark.django_db(transaction=True)


class Fronts:
    """The ASGI application with the lean re-arm and without it, on one event loop."""

    def __init__(self) -> None:
        async def django(scope, receive, send):
            raise AssertionError(f"not an agent's request: {scope['path']}")

        self.loop = asyncio.new_event_loop()
        self.lean, self.django = AgentFront(django, threads=2), AgentFront(django, threads=2)
        self.lean.lean_poll, self.django.lean_poll = lean.LeanAllocationPoll(), None
        self.django_runs = {id(self.lean): 0, id(self.django): 0}
        for front in (self.lean, self.django):
            run = front._run

            def counted(environ, front=front, run=run):
                self.django_runs[id(front)] += 1
                return run(environ)

            front._run = counted

    async def get(self, front, host_id: int, token: str, query: bytes, headers=None):
        path = f"/api/v1/hosts/{host_id}/allocation/"
        sent_headers = {"Host": "127.0.0.1:8000", "Accept": "*/*"}
        if token is not None:
            sent_headers["Authorization"] = f"Agent {token}"
        sent_headers |= headers or {}
        raw = [(k.lower().encode(), v.encode()) for k, v in sent_headers.items() if v is not None]
        scope = {
            "type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
            "query_string": query, "headers": raw, "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
        }  # fmt: skip
        messages = [{"type": "http.request", "body": b"", "more_body": False}]
        sent = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)  # the client stays connected

        async def send(message):
            sent.append(message)

        front.waker.start()
        await asyncio.wait_for(front(scope, receive, send), timeout=40)
        start, body_message = sent
        return (
            start["status"],
            sorted((k.lower(), v) for k, v in start["headers"]),
            body_message["body"],
        )

    def both(self, host_id, token, query, headers=None, during=None):
        """The answers of the lean front and of Django's, asked at the same time."""

        async def ask():
            await asyncio.gather(*(f.waker.start() or asyncio.sleep(0) for f in self.fronts))
            deadline = time.monotonic() + 10
            while not all(f.waker.connected for f in self.fronts):
                assert time.monotonic() < deadline, "the Redis subscription did not start"
                await asyncio.sleep(0.02)
            asked = [
                asyncio.ensure_future(self.get(f, host_id, token, query, headers))
                for f in self.fronts
            ]
            if during is not None:
                await asyncio.sleep(0.5)
                await asyncio.get_running_loop().run_in_executor(None, during)
            return await asyncio.gather(*asked)

        return self.loop.run_until_complete(ask())

    @property
    def fronts(self):
        return (self.lean, self.django)

    def close(self) -> None:
        for front in self.fronts:
            self.loop.run_until_complete(front.waker.stop())
            close_front_pool(front)
        self.loop.close()


@pytest.fixture
def fronts():
    f = Fronts()
    yield f
    f.close()


def test_a_re_arm_with_nothing_newer_is_held_without_django_and_answers_204(fronts, job_and_host):
    _, host, token = job_and_host
    started = time.monotonic()
    via_lean, via_django = fronts.both(host.pk, token, b"after=1&wait=1.5")
    assert 1.4 < time.monotonic() - started < 10
    assert via_lean == via_django and via_lean[0] == 204
    assert fronts.django_runs == {id(fronts.lean): 0, id(fronts.django): 1}


def test_a_re_arm_on_the_lean_path_wakes_on_a_new_allocation(fronts, job_and_host):
    job, host, token = job_and_host
    started = time.monotonic()
    via_lean, via_django = fronts.both(
        host.pk,
        token,
        b"wait=30&after=1",
        during=lambda: create_allocation(host, {s: 2 for s in job.stage_names}, "policy"),
    )
    elapsed = time.monotonic() - started
    assert via_lean == via_django and via_lean[0] == 200, (via_lean, via_django)
    assert b'"version":2' in via_lean[2]
    assert elapsed < 10, f"answered after {elapsed:.2f} s; the publish should wake it at once"
    assert fronts.django_runs[id(fronts.lean)] == 0


@pytest.mark.parametrize(
    "query, headers, token",
    [
        (b"after=0&wait=1", None, "own"),  # a newer version: answered at once
        (b"after=1&wait=0", None, "own"),  # no wait
        (b"after=1", None, "own"),
        (b"after=1&wait=1&after=1", None, "own"),  # repeated
        (b"after=%31&wait=1", None, "own"),  # escaped
        (b"after=x&wait=1", None, "own"),
        (b"after=1&wait=600", None, "own"),  # over the longest wait
        (b"after=99999999999&wait=1", None, "own"),
        (b"after=1&wait=1&x=1", None, "own"),  # another name
        (b"after=1&wait=1", None, "wrong"),
        (b"after=1&wait=1", None, None),
        (b"after=1&wait=1", None, "other"),  # another host's token
        (b"after=1&wait=1", {"Accept": "text/html"}, "own"),
        (b"after=1&wait=1", {"Host": "evil.example"}, "own"),
    ],
)
def test_every_other_request_is_answered_by_django(
    fronts, job_and_host, make_host, query, headers, token
):
    job, host, own = job_and_host
    _, other = make_host(job)
    token = {"own": own, "other": other, "wrong": "not-a-token", None: None}[token]
    via_lean, via_django = fronts.both(host.pk, token, query, headers)
    assert via_lean[0] == via_django[0]
    if b"text/html" not in dict(via_lean[1]).get(b"content-type", b""):
        assert via_lean == via_django
    # Django's view answered on both fronts (once: the lean path counted nothing twice).
    assert fronts.django_runs == {id(fronts.lean): 1, id(fronts.django): 1}


def test_the_agent_rate_limit_holds_on_the_lean_path(fronts, job_and_host, monkeypatch):
    from webapp.throttles import AgentRateThrottle

    _, host, token = job_and_host
    monkeypatch.setattr(AgentRateThrottle, "THROTTLE_RATES", {"agent": "2/min"})

    async def three():
        return [await fronts.get(fronts.lean, host.pk, token, b"after=1&wait=0.2") for _ in "abc"]

    answers = fronts.loop.run_until_complete(three())
    assert [a[0] for a in answers] == [204, 204, 429]
    assert fronts.django_runs[id(fronts.lean)] == 1  # the refused one, by Django's throttle
