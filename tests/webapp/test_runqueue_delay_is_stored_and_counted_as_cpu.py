"""A stage's ``runqueue_percent`` (time its workers waited for a CPU) is stored with its sample,
reads as 0 when an older agent leaves it out, and the control plane's budget counts it as CPU:
a stage that computes but was held back by other work is not given a waiting stage's many
workers."""

import pytest

from webapp.ingestion.models import StageSample

STAGES = ["fetch", "decode"]


def sample(seq: int, decode_runqueue: float | None) -> dict:
    """fetch's 4 threads wait on I/O (0.02 CPU each); decode's process was busy 95% of the time
    on 0.4 of a CPU, held back from one for ``decode_runqueue`` percent of the time."""
    decode = {"name": "decode", "workers": 1, "items_per_s": 150.0, "busy_fraction": 0.95,
              "cpu_percent": 40.0, "rss_mb": 120.0}  # fmt: skip
    if decode_runqueue is not None:
        decode["runqueue_percent"] = decode_runqueue
    return {
        "seq": seq,
        "ts": 1763702400.0 + seq,
        "allocation_version": 1,
        "host": {"cpus": 2.0, "cpu_percent": 60.0, "memory_used_mb": 900.0,
                 "memory_limit_mb": 8192.0, "worker_budget": 4},
        "trainer": {"throughput": 150.0, "idle_fraction": 0.3},
        "stages": [
            {"name": "fetch", "workers": 4, "items_per_s": 150.0, "busy_fraction": 0.95,
             "cpu_percent": 7.6, "runqueue_percent": 0.4, "rss_mb": 0.0},
            decode,
        ],
    }  # fmt: skip


@pytest.fixture
def host_and_token(make_job, make_host):
    return make_host(make_job(stages=STAGES), cpus=2, memory_mb=8192)


def report(api, host, token, decode_runqueue: float | None) -> None:
    batch = {"samples": [sample(seq, decode_runqueue) for seq in range(1, 6)]}
    response = api.as_agent(token).post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
    assert response.status_code == 200, response.content


def override(api, operator, host, workers: dict):
    return api.as_user(operator).put(
        f"/api/v1/hosts/{host.pk}/override/", {"workers": workers, "reason": "x"}, format="json"
    )


def test_the_run_queue_delay_is_stored_and_an_older_agent_reads_as_zero(
    api, operator, host_and_token
):
    host, token = host_and_token
    report(api, host, token, decode_runqueue=None)
    decode = StageSample.objects.filter(stage="decode")
    assert set(decode.values_list("runqueue_percent", flat=True)) == {0.0}
    api.as_agent(token).post(
        f"/api/v1/hosts/{host.pk}/metrics/",
        {"samples": [sample(seq, 55.0) for seq in range(6, 8)]},
        format="json",
    )
    stored = StageSample.objects.filter(stage="decode", ts__gt=1763702405.5)
    assert sorted(stored.values_list("runqueue_percent", flat=True)) == [55.0, 55.0]
    series = (
        api.as_user(operator)
        .get(f"/api/v1/hosts/{host.pk}/metrics/", {"since": 0, "until": 1763702500})
        .json()
    )
    # The series averages samples into buckets: the newest holds the measured ones.
    assert series["stages"]["decode"]["runqueue_percent"][-1] > 0


def test_without_the_run_queue_a_held_back_decoder_reads_as_waiting(api, operator, host_and_token):
    host, token = host_and_token
    report(api, host, token, decode_runqueue=None)  # 0.4 / 0.95 = 0.42 of a CPU: "waits"
    assert override(api, operator, host, {"fetch": 4, "decode": 6}).status_code == 200


def test_with_the_run_queue_a_held_back_decoder_takes_a_whole_slot(api, operator, host_and_token):
    host, token = host_and_token
    report(api, host, token, decode_runqueue=55.0)  # (40 + 55) / 95: a whole CPU wanted
    response = override(api, operator, host, {"fetch": 4, "decode": 6})
    assert response.status_code == 400
    assert "decode 6 x 1" in response.json()["detail"]
    budget = api.as_user(operator).get(f"/api/v1/hosts/{host.pk}/").json()["budget"]
    stages = {s["name"]: s for s in budget["stages"]}
    assert not stages["decode"]["waits"] and stages["decode"]["worker_cpu"] == 1.0
    assert stages["fetch"]["waits"] and stages["fetch"]["worker_cpu"] == pytest.approx(0.02)
