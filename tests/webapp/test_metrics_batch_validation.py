"""Hostile or malformed batches get a 4xx that says why, and store nothing."""

import json

import pytest

from webapp.ingestion.models import HostSample


def post_raw(api, host, token, body: str):
    api.as_agent(token)
    return api.post(f"/api/v1/hosts/{host.pk}/metrics/", data=body, content_type="application/json")


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda s: s["stages"].append({**s["stages"][0], "name": "mystery"}),
            "unknown stage 'mystery'",
        ),
        (lambda s: s["stages"].pop(), "missing stage(s) ['prefetch']"),
        (
            lambda s: s["stages"][0].update(workers=0),
            "samples[0].stages[0].workers: must be between 1",
        ),
        (
            lambda s: s["stages"][0].update(workers=10**9),
            "samples[0].stages[0].workers: must be between 1",
        ),
        (lambda s: s["stages"][0].update(workers="3"), "must be an integer"),
        (lambda s: s["trainer"].update(idle_fraction=-0.1), "idle_fraction: must be at least 0"),
        (lambda s: s.update(seq=-1), "samples[0].seq: must be between 0"),
        (lambda s: s["host"].update(cpu_percent=[1]), "cpu_percent: must be a number"),
        (lambda s: s.pop("trainer"), "samples[0].trainer: must be an object"),
    ],
)
def test_a_bad_sample_is_refused_with_its_place_and_reason(
    api, job_and_host, sample, mutate, expected
):
    job, host, token = job_and_host
    bad = sample(1, job.stage_names)
    mutate(bad)
    response = post_raw(api, host, token, json.dumps({"samples": [bad]}))
    assert response.status_code == 400
    assert expected in response.json()["detail"]
    assert not HostSample.objects.exists()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinities_are_refused(api, job_and_host, sample, constant):
    job, host, token = job_and_host
    body = json.dumps({"samples": [sample(1, job.stage_names, throughput=12345.0)]}).replace(
        "12345.0", constant
    )
    response = post_raw(api, host, token, body)
    assert response.status_code == 400
    assert not HostSample.objects.exists()


def test_too_many_samples_in_one_batch_are_refused_413(api, job_and_host, sample, settings):
    job, host, token = job_and_host
    settings.INTUNE = {**settings.INTUNE, "MAX_SAMPLES_PER_BATCH": 3}
    body = json.dumps({"samples": [sample(i, job.stage_names) for i in range(4)]})
    response = post_raw(api, host, token, body)
    # 413, "batch too large" (docs/agent-protocol.md): an agent sends smaller batches. A 400,
    # which an agent never retries, had agents drop the whole batch (issue 14's Node agent).
    assert response.status_code == 413
    assert "at most 3 samples" in response.json()["detail"]
    assert not HostSample.objects.exists()


def test_deeply_nested_json_is_refused(api, job_and_host):
    _, host, token = job_and_host
    body = '{"samples": ' + "[" * 5000 + "]" * 5000 + "}"
    response = post_raw(api, host, token, body)
    assert response.status_code == 400


def test_a_body_that_is_not_json_is_refused(api, job_and_host):
    _, host, token = job_and_host
    response = post_raw(api, host, token, "samples=1")
    assert response.status_code == 400
    assert "JSON" in response.json()["detail"]


def test_refusals_that_are_not_a_list_are_refused(api, job_and_host):
    # Found by schemathesis's coverage phase: {} is falsy and was read as "no refusals".
    _, host, token = job_and_host
    for refused in ({}, "", 0):
        body = {"samples": [], "allocation_status": {"applied_version": 0, "refused": refused}}
        response = post_raw(api, host, token, json.dumps(body))
        assert response.status_code == 400, (refused, response.content)
        assert "allocation_status.refused: must be a list" in response.json()["detail"]
