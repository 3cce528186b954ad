"""Soak (make soak): 200 simulated agents (real HTTP clients in processes of their own) at 1 Hz
for five minutes against a real server: every sample stored once, no error. The figures go to
docs/reliability.md; the same run is ``python -m benchmarks.loadgen --agents 200 --seconds 300``."""

import json

import pytest

from benchmarks import loadgen
from tests.support.live_stack import LiveStack

pytestmark = pytest.mark.soak
AGENTS, SECONDS = 200, 300


def test_two_hundred_agents_for_five_minutes_lose_nothing(tmp_path, redis_url):
    extra = {"WEB_CONCURRENCY": "2", "INTUNE_WEB_THREADS": str(AGENTS + 64),
             "INTUNE_AGENT_RATE": "100000/min", "INTUNE_ACCESS_LOG": ""}  # fmt: skip
    with LiveStack(tmp_path / "soak", extra_env=extra) as stack:
        person = stack.create_user("soak-op", role="operator")
        # Batches as the real agent sends them (every 5 s); the harsher one-request-per-sample
        # case is measured by the benchmark (docs/benchmarks.md).
        figures = loadgen.run(stack.url, person["token"], agents=AGENTS, stages=8, seconds=SECONDS,
                              processes=2, long_poll=True, batch_seconds=5)  # fmt: skip
        stored = stack.stored_samples(figures["job_id"])
    figures.pop("host_ids")
    print(json.dumps(figures | {"samples_stored": stored}, indent=2))
    assert figures["errors"] == 0, figures["first_errors"]
    assert figures["samples_acknowledged"] == figures["samples_sent"] == stored
    # Each simulated agent sends its next sample once the last is answered, so an overloaded
    # server shows as a rate below 1 Hz, not as loss: the rate is reported (docs/reliability.md),
    # not asserted, as it measures the machine as much as the code.
    print(f"rate held: {figures['samples_sent'] / (AGENTS * SECONDS):.0%} of 1 Hz")
