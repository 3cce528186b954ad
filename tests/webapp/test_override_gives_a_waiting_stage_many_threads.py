"""The control plane checks a person's override with the agent's rule (agents.budget): once
the agent's samples show that a stage's workers wait, that stage may have many threads, while
workers that compute still take one CPU slot each. The API shows the budget in those terms."""

import pytest

STAGES = ["fetch", "decode"]


def sample(seq: int, host_cpu_percent: float = 45.0) -> dict:
    """One agent sample: fetch's 4 threads busy 95% of the time on 0.076 CPU in all (0.02 each),
    decode's one process busy 80% on 0.78 CPU."""
    return {
        "seq": seq,
        "ts": 1763702400.0 + seq,
        "allocation_version": 1,
        "host": {"cpus": 2.0, "cpu_percent": host_cpu_percent, "memory_used_mb": 900.0,
                 "memory_limit_mb": 8192.0, "worker_budget": 4},
        "trainer": {"throughput": 150.0, "idle_fraction": 0.3},
        "stages": [
            {"name": "fetch", "workers": 4, "items_per_s": 150.0, "busy_fraction": 0.95,
             "cpu_percent": 7.6, "rss_mb": 0.0},
            {"name": "decode", "workers": 1, "items_per_s": 150.0, "busy_fraction": 0.8,
             "cpu_percent": 78.0, "rss_mb": 120.0},
        ],
    }  # fmt: skip


@pytest.fixture
def host_and_token(make_job, make_host):
    return make_host(make_job(stages=STAGES), cpus=2, memory_mb=8192)


def report(api, host, token, count: int = 5) -> None:
    batch = {"samples": [sample(seq) for seq in range(1, count + 1)]}
    response = api.as_agent(token).post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
    assert response.status_code == 200, response.content


def override(api, operator, host, workers: dict):
    return api.as_user(operator).put(
        f"/api/v1/hosts/{host.pk}/override/", {"workers": workers, "reason": "x"}, format="json"
    )


def test_before_anything_is_measured_every_worker_takes_a_whole_slot(api, operator, host_and_token):
    host, _ = host_and_token
    response = override(api, operator, host, {"fetch": 30, "decode": 1})
    assert response.status_code == 400
    assert "the host budget is 4 CPU slots (2 CPUs)" in response.json()["detail"]


def test_a_measured_waiting_stage_may_have_thirty_threads_on_two_cpus(
    api, operator, host_and_token
):
    host, token = host_and_token
    report(api, host, token)
    response = override(api, operator, host, {"fetch": 30, "decode": 2})
    assert response.status_code == 200, response.content
    assert response.json()["workers"] == {"fetch": 30, "decode": 2}


def test_computing_workers_over_the_slots_and_waiting_ones_over_64_are_refused(
    api, operator, host_and_token
):
    host, token = host_and_token
    report(api, host, token)
    too_many_decoders = override(api, operator, host, {"fetch": 1, "decode": 4})
    assert too_many_decoders.status_code == 400
    assert "takes 4.02 CPU slots" in too_many_decoders.json()["detail"]
    too_many_threads = override(api, operator, host, {"fetch": 65, "decode": 1})
    assert too_many_threads.status_code == 400
    assert "at most 64" in too_many_threads.json()["detail"]


def test_the_host_api_shows_the_budget_in_cpu_slots_and_cpu_used(api, operator, host_and_token):
    host, token = host_and_token
    report(api, host, token)
    assert override(api, operator, host, {"fetch": 30, "decode": 2}).status_code == 200
    budget = api.as_user(operator).get(f"/api/v1/hosts/{host.pk}/").json()["budget"]
    assert budget["cpu_slots"] == 4 and budget["cpus"] == 2
    assert budget["cpu_used"] == pytest.approx(0.856)  # 0.076 + 0.78, as the agent measured
    assert budget["cpu_slots_taken"] == pytest.approx(30 * 0.02 + 2)
    stages = {s["name"]: s for s in budget["stages"]}
    assert stages["fetch"]["waits"] and stages["fetch"]["worker_cpu"] == pytest.approx(0.02)
    assert stages["fetch"]["most_workers"] == 64
    assert not stages["decode"]["waits"] and stages["decode"]["most_workers"] == 3
    assert "CPU 0.9 of 2 used by the pipeline" in budget["summary"]
    assert "takes 2.6 of 4 CPU slots (fetch waits" in budget["summary"]
