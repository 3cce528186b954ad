"""After a PostgreSQL outage the web server's pool tries to reconnect every 2 s at most, not
after a delay that doubled through the outage (psycopg_pool's own: 1, 2, 4, ... 64 s, no cap;
PostgreSQL away 38 s left the pool refusing requests 19 s after it was back)."""

import pytest
from psycopg_pool.base import AttemptWithBackoff

from webapp import pool_guard


def delays(outage_s: float) -> list[float]:
    """The delays of a pool's connection attempts through an outage of ``outage_s`` seconds."""
    attempt = AttemptWithBackoff(timeout=300)
    now, seen = 0.0, []
    while now < outage_s and not attempt.time_to_give_up(now):
        attempt.update_delay(now)
        seen.append(attempt.delay)
        now += attempt.delay
    return seen


def test_psycopg_pools_own_delay_doubles_without_a_cap(monkeypatch):
    monkeypatch.setattr(AttemptWithBackoff, "update_delay", pool_guard._original_update_delay)
    assert max(delays(120)) > 30  # what the guard exists for


def test_the_guarded_delay_never_passes_its_cap(monkeypatch):
    pool_guard.install(2.0)
    seen = delays(240)
    assert 0.8 < seen[0] <= 1.1  # the first retry as before, after about a second
    assert max(seen) == pytest.approx(2.0)
    assert len(seen) > 100  # it keeps trying through the whole outage


def test_a_cap_of_zero_is_refused():
    with pytest.raises(ValueError, match="bound above 0"):
        pool_guard.install(0)
