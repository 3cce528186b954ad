"""An agent's metric batches: stored once per sequence number, all or nothing."""

from django.db.models import F

from webapp.ingestion.models import HostSample, StageSample
from webapp.jobs.models import Host


def url(host):
    return f"/api/v1/hosts/{host.pk}/metrics/"


def test_a_batch_is_stored_with_one_row_per_stage(api, job_and_host, sample):
    job, host, token = job_and_host
    batch = {"samples": [sample(1, job.stage_names), sample(2, job.stage_names)]}
    response = api.as_agent(token).post(url(host), batch, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"stored": 2, "duplicates": 0, "latest_allocation_version": 1}
    assert HostSample.objects.filter(host=host).count() == 2
    assert StageSample.objects.filter(sample__host=host).count() == 2 * len(job.stage_names)
    host.refresh_from_db()
    assert host.status == "online" and host.last_seq == 2


def test_a_full_batch_is_stored_whole_whatever_the_databases_limit_on_parameters(
    api, job_and_host, sample
):
    # 600 samples x 5 stages is thousands of values: more than one statement holds on SQLite.
    job, host, token = job_and_host
    batch = {"samples": [sample(i, job.stage_names, ts=1000.0 + i) for i in range(1, 601)]}
    response = api.as_agent(token).post(url(host), batch, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["stored"] == 600
    assert HostSample.objects.filter(host=host).count() == 600
    assert StageSample.objects.filter(host=host).count() == 600 * len(job.stage_names)
    # Every stage row belongs to the sample with its own timestamp.
    assert not StageSample.objects.filter(host=host).exclude(ts=F("sample__ts")).exists()


def test_a_resent_batch_is_acknowledged_and_stored_once(api, job_and_host, sample):
    job, host, token = job_and_host
    batch = {
        "samples": [sample(10, job.stage_names, ts=1000.0), sample(11, job.stage_names, ts=1001.0)]
    }
    client = api.as_agent(token)
    client.post(url(host), batch, format="json")
    again = client.post(url(host), batch, format="json")
    assert again.status_code == 200
    assert again.json()["stored"] == 0 and again.json()["duplicates"] == 2
    assert HostSample.objects.filter(host=host).count() == 2


def test_a_batch_overlapping_a_stored_one_stores_only_the_new_samples(api, job_and_host, sample):
    job, host, token = job_and_host
    client = api.as_agent(token)
    client.post(url(host), {"samples": [sample(1, job.stage_names, ts=1.0)]}, format="json")
    response = client.post(
        url(host),
        {"samples": [sample(1, job.stage_names, ts=1.0), sample(2, job.stage_names, ts=2.0)]},
        format="json",
    )
    assert response.json()["stored"] == 1 and response.json()["duplicates"] == 1
    assert sorted(HostSample.objects.values_list("seq", flat=True)) == [1, 2]


def test_a_reused_sequence_number_for_another_sample_is_refused_and_changes_nothing(
    api, job_and_host, sample
):
    job, host, token = job_and_host
    client = api.as_agent(token)
    client.post(url(host), {"samples": [sample(5, job.stage_names, ts=100.0)]}, format="json")
    response = client.post(
        url(host),
        {"samples": [sample(6, job.stage_names, ts=106.0), sample(5, job.stage_names, ts=999.0)]},
        format="json",
    )
    assert response.status_code == 409
    assert "sequence number 5" in response.json()["detail"]
    assert list(HostSample.objects.values_list("seq", flat=True)) == [5]


def test_an_invalid_sample_refuses_the_whole_batch(api, job_and_host, sample):
    job, host, token = job_and_host
    bad = sample(2, job.stage_names)
    bad["stages"][1]["busy_fraction"] = 1.7
    response = api.as_agent(token).post(
        url(host), {"samples": [sample(1, job.stage_names), bad]}, format="json"
    )
    assert response.status_code == 400
    assert (
        response.json()["detail"]
        == "samples[1].stages[1].busy_fraction: must be at most 1, got 1.7"
    )
    assert not HostSample.objects.exists()


def test_the_agent_reports_which_allocation_it_applied_and_which_it_refused(
    api, job_and_host, sample
):
    from webapp.jobs.services import create_allocation

    job, host, token = job_and_host
    create_allocation(host, {s: 2 for s in job.stage_names}, "policy")
    create_allocation(host, {s: 3 for s in job.stage_names}, "policy")
    batch = {
        "samples": [sample(1, job.stage_names)],
        "allocation_status": {
            "applied_version": 2,
            "refused": [{"version": 3, "reason": "over the memory budget"}],
        },
        "dropped_samples": 4,
    }
    assert api.as_agent(token).post(url(host), batch, format="json").status_code == 200
    host.refresh_from_db()
    statuses = dict(host.allocations.values_list("version", "status"))
    assert statuses == {1: "superseded", 2: "applied", 3: "refused"}
    assert host.allocations.get(version=3).refusal_reason == "over the memory budget"
    assert host.applied_version == 2 and host.dropped_samples == 4


def test_an_applied_version_never_published_is_refused(api, job_and_host, sample):
    job, host, token = job_and_host
    batch = {"samples": [sample(1, job.stage_names)], "allocation_status": {"applied_version": 99}}
    response = api.as_agent(token).post(url(host), batch, format="json")
    assert response.status_code == 400
    assert "never published" in response.json()["detail"]
    assert Host.objects.get(pk=host.pk).applied_version == 0


def test_a_status_only_report_records_the_applied_version_at_once(api, job_and_host):
    from webapp.jobs.services import create_allocation

    job, host, token = job_and_host
    create_allocation(host, {s: 2 for s in job.stage_names}, "policy")
    response = api.as_agent(token).post(
        url(host), {"samples": [], "allocation_status": {"applied_version": 2}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["stored"] == 0
    host.refresh_from_db()
    assert host.applied_version == 2 and host.allocations.get(version=2).status == "applied"


def test_an_empty_batch_without_a_status_is_refused(api, job_and_host):
    _, host, token = job_and_host
    response = api.as_agent(token).post(url(host), {"samples": []}, format="json")
    assert response.status_code == 400
    assert "must not be empty" in response.json()["detail"]
