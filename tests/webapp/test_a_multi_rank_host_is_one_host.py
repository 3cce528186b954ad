"""A host with several local ranks (torchrun --nproc-per-node N) is one host: registered once
with its ranks, its samples hold the host's totals and each rank's trainer, the metrics answer
shows each rank and the slowest, and the tuner sees one rank's share of the host, whose
allocation every rank runs within the host's budget."""

import time

import pytest

from agents.budget import cpu_slots
from webapp.ingestion.models import HostSample, RankSample
from webapp.jobs.models import Host
from webapp.jobs.services import register_host
from webapp.tuning.observations import build_observation
from webapp.tuning.services import check_allocation


def two_rank_sample(make_sample, seq, stages, *, per_rank_workers=1, rates=(600.0, 400.0)):
    """A host sample of 2 ranks: stages summed over the ranks, each rank's trainer listed."""
    sample = make_sample(
        seq, stages, workers=dict.fromkeys(stages, 2 * per_rank_workers), throughput=sum(rates)
    )
    sample["host"]["ranks"] = 2
    sample["ranks"] = [
        {"rank": rank, "throughput": rate, "idle_fraction": 0.1 + 0.3 * rank, "step_ms": 5.0,
         "wait_ms": 1.0 + rank, "workers": dict.fromkeys(stages, per_rank_workers)}
        for rank, rate in enumerate(rates)
    ]  # fmt: skip
    return sample


@pytest.fixture
def two_rank_host(make_job, operator):
    job = make_job()
    host, token = register_host(
        job=job, user=operator, name="trainer-2", cpus=2, memory_mb=16384,
        worker_budget=None, ranks=2,
    )  # fmt: skip
    return job, host, token


def test_registering_with_ranks_gives_one_slot_per_stage_of_each_rank(api, make_job, operator):
    job = make_job()
    response = api.as_user(operator).post(
        f"/api/v1/jobs/{job.pk}/hosts/",
        {"name": "trainer-1", "cpus": 2, "memory_mb": 8192, "ranks": 2},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["ranks"] == 2
    assert body["worker_budget"] == cpu_slots(2, len(job.stage_names), 2) == 2 + 2 * 5
    assert body["allocation"]["workers"] == dict.fromkeys(job.stage_names, 1)
    assert Host.objects.filter(job=job).count() == 1


def test_each_ranks_figures_are_stored_and_the_slowest_rank_is_named(api, two_rank_host, sample):
    job, host, token = two_rank_host
    now = time.time()
    batch = {"samples": [two_rank_sample(sample, i, job.stage_names) for i in (1, 2, 3)]}
    for i, s in enumerate(batch["samples"]):
        s["ts"] = now - 3 + i
    response = api.as_agent(token).post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
    assert response.status_code == 200, response.content
    assert set(HostSample.objects.filter(host=host).values_list("ranks", flat=True)) == {2}
    assert RankSample.objects.filter(host=host).count() == 6
    answer = api.as_user(host.job.created_by).get(
        f"/api/v1/hosts/{host.pk}/metrics/", {"since": now - 60}
    )
    assert answer.status_code == 200, answer.content
    metrics = answer.json()
    assert sorted(metrics["ranks"]) == ["0", "1"]
    assert metrics["ranks"]["1"]["throughput"][-1] == pytest.approx(400.0)
    assert metrics["ranks"]["1"]["idle_fraction"][-1] == pytest.approx(0.4)
    assert metrics["slowest_rank"] == 1
    assert metrics["series"]["throughput"][-1] == pytest.approx(1000.0), "the host's total"
    assert metrics["rank_workers"] == {
        "0": dict.fromkeys(job.stage_names, 1),
        "1": dict.fromkeys(job.stage_names, 1),
    }


def test_a_rank_beyond_the_hosts_ranks_refuses_the_batch_naming_it(api, two_rank_host, sample):
    job, host, token = two_rank_host
    bad = two_rank_sample(sample, 1, job.stage_names)
    bad["ranks"][1]["rank"] = 2
    response = api.as_agent(token).post(
        f"/api/v1/hosts/{host.pk}/metrics/", {"samples": [bad]}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("samples[0].ranks[1].rank: must be between 0 and 1")
    assert not HostSample.objects.filter(host=host).exists()


def test_a_single_rank_sample_without_ranks_is_rank_0_of_1(api, job_and_host, sample):
    job, host, token = job_and_host
    response = api.as_agent(token).post(
        f"/api/v1/hosts/{host.pk}/metrics/",
        {"samples": [sample(1, job.stage_names)]},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert HostSample.objects.get(host=host).ranks == 1
    assert not RankSample.objects.filter(host=host).exists()


def test_the_tuner_sees_one_ranks_share_and_its_allocation_fits_the_host_once_per_rank(
    api, two_rank_host, sample
):
    job, host, token = two_rank_host
    now = time.time()
    samples = [two_rank_sample(sample, i, job.stage_names) for i in range(1, 4)]
    for i, s in enumerate(samples):
        s["ts"] = now - 3 + i
        s["host"]["worker_budget"] = None
        s["host"]["cpus"] = 2.0
    api.as_agent(token).post(
        f"/api/v1/hosts/{host.pk}/metrics/", {"samples": samples}, format="json"
    )
    observation = build_observation(host, list(HostSample.objects.filter(host=host).order_by("ts")))
    assert observation.allocation == dict.fromkeys(job.stage_names, 1), "per rank, not summed"
    assert observation.throughput == pytest.approx(500.0), "the host's 1000 samples/s over 2 ranks"
    assert observation.host.cpus == pytest.approx(1.0)
    assert observation.host.worker_budget == (2 + 2 * 5) // 2
    # 12 slots hold 2 ranks x 6 workers: one more worker per rank fits, two do not.
    one_more = dict.fromkeys(job.stage_names, 1) | {"parse": 2}
    assert check_allocation(host, one_more) == one_more
    with pytest.raises(Exception, match=r"takes 14 CPU slots \(2 ranks x"):
        check_allocation(host, dict.fromkeys(job.stage_names, 1) | {"parse": 3})


def test_the_job_page_lists_the_host_once_with_its_ranks_and_a_chart_per_rank(
    client, operator, two_rank_host
):
    job, host, _ = two_rank_host
    client.force_login(operator)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert html.count(f'<tr data-host-id="{host.pk}"') == 1
    assert "12 CPU slots · 2 ranks" in html
    assert 'id="chart-ranks"' in html
    overview = client.get(f"/dashboard/api/hosts/{host.pk}/overview/").json()
    assert overview["ranks"] == 2 and overview["budget"]["ranks"] == 2
