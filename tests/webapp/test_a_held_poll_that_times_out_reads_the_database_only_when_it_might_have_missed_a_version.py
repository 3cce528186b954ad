"""A held allocation long-poll whose wait runs out answers 204. With the Redis subscription up the
whole time it does so without reading the database again: a version published meanwhile would
have woken it (and a subscription that comes back wakes every held poll). With the subscription
down it reads the database before answering, so a version published meanwhile is not missed.

Why it matters: a fleet in step times out all its long-polls in one instant, beside its batches,
and that read was 13% of such a burst's web CPU (docs/benchmarks.md).
"""

import pytest

from tests.webapp.test_lean_allocation_poll_answers_as_django import Fronts
from webapp import agent_asgi

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fronts():
    f = Fronts()
    yield f
    f.close()


@pytest.fixture
def reads(monkeypatch):
    counted = []
    read = agent_asgi.render_newer_allocation

    def counting(host_id, after):
        counted.append(host_id)
        return read(host_id, after)

    monkeypatch.setattr(agent_asgi, "render_newer_allocation", counting)
    return counted


@pytest.mark.parametrize("subscription_up", [True, False])
def test_a_held_poll_that_times_out_reads_the_database_only_when_it_might_have_missed_a_version(
    fronts, job_and_host, reads, subscription_up
):
    _, host, token = job_and_host

    def subscription_down():
        for front in fronts.fronts:
            front.waker.connected = False  # as while its Redis connection is lost

    via_lean, via_django = fronts.both(
        host.pk, token, b"after=1&wait=1", during=None if subscription_up else subscription_down
    )
    assert via_lean == via_django and via_lean[0] == 204
    # Each front held one poll (the lean re-arm's, and the one Django's view handed over).
    assert len(reads) == (0 if subscription_up else 2), reads
