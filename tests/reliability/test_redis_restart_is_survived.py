"""Redis killed and restarted under a running system: the agent trains on, the web app answers
every request (degraded, never a 500), and tuning tasks and long-polls recover by themselves."""

import time

import httpx
import pytest

from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

from .conftest import count_samples, register, start_agent
from .servers import PrivateRedis

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("private-redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    extra = {"REDIS_URL": redis_server.url, "INTUNE_STALLED_AFTER_S": "4"}
    with LiveStack(tmp_path_factory.mktemp("redis-fault"), beat=True, extra_env=extra) as stack:
        yield stack


def steps(api, job_id: int) -> int:
    return api.get(f"/api/v1/jobs/{job_id}/tuning/").raise_for_status().json()[0]["steps"]


def test_a_redis_restart_loses_nothing_and_recovers_by_itself(stack, redis_server, agent_state):
    host = register(stack, decision_interval_s=1)
    # Samples twice a second (once by default here): the waits on stored samples below take
    # half as long for the same counts.
    start_agent(stack, host, agent_state, interval=0.5, batch_seconds=0.5)
    api = stack.client(host.api_token)
    agent = httpx.Client(base_url=stack.url, headers={"Authorization": f"Agent {host.token}"})
    api.post(f"/api/v1/jobs/{host.job_id}/tuning/", json={"tuner": "random"}).raise_for_status()
    wait_until(lambda: steps(api, host.job_id) >= 2, 90, what="two decisions before the fault")

    redis_server.stop()
    down_at = time.monotonic()
    samples_before = count_samples(stack, host.host_id)["n"]
    # While Redis is away every page and endpoint answers; none with a 5xx.
    answers = {
        "healthz": httpx.get(f"{stack.url}/healthz"),
        "jobs": api.get("/api/v1/jobs/"),
        "host": api.get(f"/api/v1/hosts/{host.host_id}/"),
        "series": api.get(f"/api/v1/hosts/{host.host_id}/metrics/"),
        "long-poll": agent.get(
            f"/api/v1/hosts/{host.host_id}/allocation/", params={"after": 999, "wait": 2}
        ),
        "override": api.put(
            f"/api/v1/hosts/{host.host_id}/override/",
            json={"workers": {"s0": 1, "s1": 2, "s2": 1}, "reason": "during the Redis outage"},
        ),
        "stop tuning": api.delete(f"/api/v1/jobs/{host.job_id}/tuning/"),
        "start tuning": api.post(f"/api/v1/jobs/{host.job_id}/tuning/", json={"tuner": "random"}),
    }
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert all(code < 500 for code in statuses.values()), statuses
    assert answers["healthz"].json()["redis"].startswith("unavailable")
    assert statuses["override"] == 200 and statuses["start tuning"] == 201, statuses
    # The agent gets the override without pub/sub (its long-poll reads the database) and keeps
    # sending samples: metrics need only the database.
    wait_until(lambda: count_samples(stack, host.host_id)["applied"] >= 2, 60,
               what="the agent applying the override made while Redis was down")  # fmt: skip
    wait_until(lambda: count_samples(stack, host.host_id)["n"] >= samples_before + 5, 60,
               what="samples stored while Redis is down")  # fmt: skip
    outage_s = time.monotonic() - down_at

    redis_server.start()
    back_at = time.monotonic()
    # Long-polls are woken by pub/sub again: a new version reaches a waiting poll at once.
    wait_until(
        lambda: httpx.get(f"{stack.url}/healthz").json()["redis"] == "ok", 30, what="redis ok"
    )
    api.delete(f"/api/v1/hosts/{host.host_id}/override/").raise_for_status()
    # The session started during the outage never got its first task: the watchdog (beat)
    # queues it, and decisions go on.
    wait_until(lambda: steps(api, host.job_id) >= 3, 120, what="decisions after Redis came back")
    recovered_s = time.monotonic() - back_at
    stats = count_samples(stack, host.host_id)
    assert stats["n"] == stats["distinct"] == stats["last"] - stats["first"] + 1, stats
    assert stats["dropped"] == 0
    dead = stack.group.poll_dead()
    assert not dead, f"processes died during the Redis outage: {dead}"
    api.close()
    agent.close()
    print(
        f"Redis down {outage_s:.0f} s: all answers < 500 ({statuses}); tuning resumed "
        f"{recovered_s:.1f} s after it came back; {stats['n']} samples, none lost"
    )
