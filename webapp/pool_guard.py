"""Reconnect to PostgreSQL within seconds of its return, however long it was away.

psycopg_pool retries a failed connection attempt with a delay that doubles each time (1, 2, 4,
8, 16, 32 s ...) and has no maximum: after an outage of T seconds the pool's next attempt may be
up to T seconds after PostgreSQL is back, and every request meanwhile waits out the pool timeout
and answers 503. Measured with the pool alone (min_size 2): PostgreSQL away 38 s, requests
refused for 19.2 s after it was back. The generated fault test
(tests/reliability/test_generated_fault_sequences_lose_nothing.py) showed the start of it, a
503 after /healthz had answered 200 once PostgreSQL restarted. The guard caps the delay.
"""

from psycopg_pool.base import AttemptWithBackoff

_original_update_delay = AttemptWithBackoff.update_delay
_delay_max_s = 2.0


def _update_delay(self, now: float) -> None:
    _original_update_delay(self, now)
    # The next delay doubles this one: capped here, it stays capped.
    self.delay = min(self.delay, _delay_max_s)


def install(delay_max_s: float) -> None:
    """Cap the pool's reconnection delay at ``delay_max_s`` seconds (idempotent)."""
    global _delay_max_s
    if delay_max_s <= 0:
        raise ValueError(f"a reconnection delay of {delay_max_s:g} s: give a bound above 0")
    _delay_max_s = delay_max_s
    AttemptWithBackoff.update_delay = _update_delay
