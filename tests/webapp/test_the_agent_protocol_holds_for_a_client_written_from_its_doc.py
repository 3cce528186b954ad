"""Where docs/agent-protocol.md and the server disagreed, found by an agent written from the doc
alone in Node.js (tests/http_clients/node_agent). Each case is a request a third party's agent
sends; the server now answers as the doc says, clearly, and changes nothing when it refuses."""

import json

import pytest

from webapp.ingestion.models import HostSample
from webapp.jobs.models import Allocation, Host


def post_batch(api, host, token, body: dict, path: str | None = None):
    api.as_agent(token)
    return api.post(
        path or f"/api/v1/hosts/{host.pk}/metrics/",
        data=json.dumps(body),
        content_type="application/json",
    )


def test_a_refusal_of_a_version_never_published_is_a_400_that_changes_nothing(
    api, job_and_host, sample
):
    job, host, token = job_and_host
    newest = Host.objects.get(pk=host.pk).allocation_version
    report = {"applied_version": None, "refused": [{"version": newest + 5, "reason": "no"}]}
    response = post_batch(
        api, host, token, {"samples": [sample(1, job.stage_names)], "allocation_status": report}
    )
    # Before: 200, and the refusal went nowhere (an applied_version never published was a 400).
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith("allocation_status.refused[0].version") and "never published" in detail
    assert not HostSample.objects.exists()


def test_a_version_reported_both_applied_and_refused_is_a_400_that_changes_nothing(
    api, job_and_host, sample
):
    job, host, token = job_and_host
    version = Host.objects.get(pk=host.pk).allocation_version
    report = {"applied_version": version, "refused": [{"version": version, "reason": "no"}]}
    response = post_batch(
        api, host, token, {"samples": [sample(1, job.stage_names)], "allocation_status": report}
    )
    # Before: 200, the allocation marked refused while the host said it was applied.
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("allocation_status.refused[0].version")
    assert not HostSample.objects.exists()
    allocation = Allocation.objects.get(host=host, version=version)
    assert allocation.status != Allocation.Status.REFUSED and not allocation.refusal_reason
    assert Host.objects.get(pk=host.pk).applied_version == host.applied_version


def test_a_refusal_reported_late_beside_a_newer_applied_version_is_recorded(
    api, job_and_host, sample, operator
):
    # The legitimate case the checks above must not refuse: refused 2, then applied 3, then one
    # batch reports both.
    job, host, token = job_and_host
    api.as_user(operator)
    for workers in ({"read": 2}, {"read": 3}):
        allocation = {name: workers.get(name, 1) for name in job.stage_names}
        put = api.put(
            f"/api/v1/hosts/{host.pk}/override/",
            {"workers": allocation, "reason": "test"},
            format="json",
        )
        assert put.status_code == 200, put.content
    newest = Host.objects.get(pk=host.pk).allocation_version
    report = {"applied_version": newest, "refused": [{"version": newest - 1, "reason": "no"}]}
    response = post_batch(api, host, token, {"samples": [], "allocation_status": report})
    assert response.status_code == 200, response.content
    refused = Allocation.objects.get(host=host, version=newest - 1)
    assert refused.status == Allocation.Status.REFUSED and refused.refusal_reason == "no"


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/hosts/{id}/metrics/"])
def test_an_agent_token_where_a_persons_is_needed_is_told_so(api, job_and_host, path):
    _, host, token = job_and_host
    response = api.as_agent(token).get(path.format(id=host.pk))
    # Before: "Authentication credentials were not provided." to a client that provided some.
    assert response.status_code == 401
    detail = response.json()["detail"]
    assert "agent token" in detail and "Authorization: Token" in detail


@pytest.mark.parametrize("content_type", ["", "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_told_which_content_type_to_send(
    api, job_and_host, sample, content_type
):
    job, host, token = job_and_host
    api.as_agent(token)
    response = api.generic(
        "POST",
        f"/api/v1/hosts/{host.pk}/metrics/",
        json.dumps({"samples": [sample(1, job.stage_names)]}),
        content_type=content_type,
    )
    # Before: 'Unsupported media type "" in request.'
    assert response.status_code == 415
    assert "Content-Type: application/json" in response.json()["detail"]
    assert not HostSample.objects.exists()


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_path_without_its_trailing_slash_is_redirected_keeping_the_method(
    api, job_and_host, method
):
    _, host, token = job_and_host
    api.as_agent(token)
    response = getattr(api, method)(f"/api/v1/hosts/{host.pk}/metrics?x=1")
    # Before: 301, which clients follow with a GET and no body (curl -L, fetch, requests).
    assert response.status_code == 308
    assert response["Location"] == f"/api/v1/hosts/{host.pk}/metrics/?x=1"


@pytest.mark.parametrize("generic", [False, True], ids=["postgres-statement", "generic"])
def test_a_resent_batch_counts_its_dropped_samples_once(job_and_host, sample, generic):
    from webapp.ingestion import services
    from webapp.ingestion.validation import validate_batch

    job, host, _ = job_and_host
    names = services.stage_names_of(job)

    def store(seqs):
        body = {"samples": [sample(seq, job.stage_names, ts=1e9 + seq) for seq in seqs]}
        batch = validate_batch(body | {"dropped_samples": 7}, names, 600)
        return services.store_batch(Host.objects.get(pk=host.pk), batch, generic=generic)

    assert store([1, 2])["stored"] == 2
    # Its answer lost, the agent sends it again, alone and then with a newer sample.
    assert store([1, 2]) == {"stored": 0, "duplicates": 2, "latest_allocation_version": 1}
    assert store([1, 2, 3])["stored"] == 1
    # Before: 21, "resending a batch after a timeout is always safe" held for samples only.
    assert Host.objects.get(pk=host.pk).dropped_samples == 7
    assert store([4])["stored"] == 1  # the next overflow's report counts
    assert Host.objects.get(pk=host.pk).dropped_samples == 14


def test_a_409_names_the_sample_whose_sequence_number_was_reused(api, job_and_host, sample):
    job, host, token = job_and_host
    assert post_batch(api, host, token, {"samples": [sample(5, job.stage_names, ts=100.0)]})
    reused = [sample(6, job.stage_names, ts=106.0), sample(5, job.stage_names, ts=999.0)]
    response = post_batch(api, host, token, {"samples": reused})
    assert response.status_code == 409
    # Before: "sequence number 5 was already used ...": the place was not first, as the doc has
    # it for a 400, and an agent following the doc dropped the whole batch (sample 6 too).
    assert response.json()["detail"].startswith("samples[1].seq: sequence number 5")
    assert list(HostSample.objects.values_list("seq", flat=True)) == [5]


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/hosts/1/metrics/"])
def test_a_host_header_not_allowed_is_a_json_400_with_its_length(api, path):
    response = api.get(path, HTTP_HOST="evil.example")
    # Before: Django's HTML "Bad Request (400)" page, without a Content-Length (sent chunked).
    assert response.status_code == 400
    assert "Host header" in response.json()["detail"]
    assert response["Content-Length"] == str(len(response.content))


@pytest.mark.parametrize(
    "query, expected",
    [
        ("after=1&timeout=30", "timeout: unknown parameter"),
        ("after=1&wiat=30", "wiat: unknown parameter"),
        ("after=1&after=2&wait=0", "after: given more than once"),
        ("after=1&wait=1&wait=2", "wait: given more than once"),
    ],
)
def test_a_long_poll_with_a_parameter_it_does_not_take_is_a_400_saying_which(
    api, job_and_host, query, expected
):
    _, host, token = job_and_host
    response = api.as_agent(token).get(f"/api/v1/hosts/{host.pk}/allocation/?{query}")
    # Before: an immediate 200 or 204, the misspelt wait read as none (a tight loop of polls),
    # a repeated one read as its last.
    assert response.status_code == 400
    assert response.json()["detail"].startswith(expected)


@pytest.mark.parametrize("accept", ["text/html", "application/xml", "text/plain", "*/*"])
def test_the_agent_endpoints_answer_json_whatever_accept_says(api, job_and_host, sample, accept):
    job, host, token = job_and_host
    api.as_agent(token)
    polled = api.get(f"/api/v1/hosts/{host.pk}/allocation/", HTTP_ACCEPT=accept)
    shipped = api.post(
        f"/api/v1/hosts/{host.pk}/metrics/",
        data=json.dumps({"samples": [sample(1, job.stage_names)]}),
        content_type="application/json",
        HTTP_ACCEPT=accept,
    )
    # Before: text/html got the browsable API's HTML page, application/xml a 406.
    for answer in (polled, shipped):
        assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
        assert answer.json()
