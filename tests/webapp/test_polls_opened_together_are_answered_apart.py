"""A fleet's long-polls opened in the same instant, that nothing wakes, are answered 204 at
moments spread over the last fifth of their wait, so that their re-arms do not arrive together
for ever after; a short wait is held whole.

Why: 200 agents (httpx, as a client written from docs/agent-protocol.md) whose polls were
opened together re-armed them together every 30 s, and the batches that met those bursts gave
p99 87 to 425 ms against 37 and 46 ms with the polls answered apart (docs/benchmarks.md). The polls run through the ASGI application, both ways: the lean
re-arm and the hold Django's view hands over.
"""

import asyncio
import time

import pytest

from tests.webapp.test_lean_allocation_poll_answers_as_django import Fronts
from webapp.agent_asgi import SPREAD_FRACTION, SPREAD_MIN_WAIT_S, held_for

pytestmark = pytest.mark.django_db(transaction=True)

POLLS = 12


@pytest.fixture
def fronts():
    f = Fronts()
    yield f
    f.close()


def _answered_at(fronts, host_id: int, token: str, wait: float) -> list[tuple[int, float]]:
    """(status, seconds) of POLLS polls on each front, all opened at once."""

    async def ask():
        for front in fronts.fronts:
            front.waker.start()
        deadline = time.monotonic() + 10
        while not all(f.waker.connected for f in fronts.fronts):
            assert time.monotonic() < deadline, "the Redis subscription did not start"
            await asyncio.sleep(0.02)
        started = time.monotonic()

        async def one(front):
            status, _, _ = await fronts.get(front, host_id, token, f"after=1&wait={wait}".encode())
            return status, time.monotonic() - started

        return await asyncio.gather(*(one(f) for f in fronts.fronts for _ in range(POLLS)))

    return fronts.loop.run_until_complete(ask())


def test_polls_opened_together_that_nothing_wakes_are_answered_apart(fronts, job_and_host):
    _, host, token = job_and_host
    wait = SPREAD_MIN_WAIT_S
    answers = _answered_at(fronts, host.pk, token, wait)
    assert {status for status, _ in answers} == {204}
    for way in (answers[:POLLS], answers[POLLS:]):  # the lean re-arm's, then Django's
        seconds = sorted(at for _, at in way)
        earliest = wait * (1 - SPREAD_FRACTION)
        assert seconds[0] >= earliest - 0.1, f"answered before {earliest} s: {seconds}"
        assert seconds[-1] <= wait + 2.0, f"held past the wait: {seconds}"
        # 12 moments drawn over 2 s: all within a quarter of it has a chance of about 3e-6.
        assert seconds[-1] - seconds[0] > 0.5, f"answered together: {seconds}"


def test_a_short_wait_is_held_whole(fronts, job_and_host):
    _, host, token = job_and_host
    answers = _answered_at(fronts, host.pk, token, 1.5)
    assert {status for status, _ in answers} == {204}
    assert min(at for _, at in answers) >= 1.4


def test_the_hold_is_drawn_in_the_last_fifth_of_a_long_wait():
    assert held_for(30.0, lambda: 0.0) == 30.0
    assert held_for(30.0, lambda: 1.0) == pytest.approx(30.0 * (1 - SPREAD_FRACTION))
    assert held_for(SPREAD_MIN_WAIT_S - 0.01, lambda: 1.0) == SPREAD_MIN_WAIT_S - 0.01
    assert held_for(0.0) == 0.0
