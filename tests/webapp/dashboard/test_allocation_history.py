"""The allocation history behind the stacked-area chart and its change markers."""

import time
from datetime import timedelta

from webapp.jobs.models import Allocation
from webapp.jobs.services import create_allocation


def test_the_history_is_oldest_first_with_source_author_and_status(
    client, operator, api, job_and_host
):
    job, host, _ = job_and_host
    create_allocation(
        host, {s: 2 if s == "parse" else 1 for s in job.stage_names}, Allocation.Source.POLICY
    )
    workers = {s: 1 for s in job.stage_names} | {"read": 3}
    api.as_user(operator).put(
        f"/api/v1/hosts/{host.pk}/override/", {"workers": workers, "reason": "hunch"}, format="json"
    )
    client.force_login(operator)

    history = client.get(f"/dashboard/api/hosts/{host.pk}/allocations/").json()["allocations"]

    assert [a["version"] for a in history] == [1, 2, 3]
    assert [a["source"] for a in history] == ["default", "policy", "override"]
    assert history[2]["created_by"] == "olivia" and history[2]["workers"] == workers
    assert history[1]["status"] == "superseded" and history[2]["status"] == "pending"
    assert history[0]["created_at"] <= history[1]["created_at"] <= history[2]["created_at"]


def test_a_range_starts_with_the_allocation_already_in_force(client, viewer, job_and_host):
    job, host, _ = job_and_host
    old = create_allocation(host, {s: 2 for s in job.stage_names}, Allocation.Source.POLICY)
    Allocation.objects.filter(host=host).update(created_at=old.created_at - timedelta(hours=2))
    create_allocation(host, {s: 1 for s in job.stage_names} | {"read": 2}, Allocation.Source.POLICY)
    client.force_login(viewer)

    since = time.time() - 3600
    history = client.get(f"/dashboard/api/hosts/{host.pk}/allocations/?since={since}").json()[
        "allocations"
    ]

    # v1 is older than v2, which was in force when the range began; v3 came within it.
    assert [a["version"] for a in history] == [2, 3]


def test_a_since_that_is_not_a_number_is_refused_with_the_reason(client, viewer, job_and_host):
    _, host, _ = job_and_host
    client.force_login(viewer)
    response = client.get(f"/dashboard/api/hosts/{host.pk}/allocations/?since=yesterday")
    assert response.status_code == 400
    assert "since" in response.json()["detail"] and "Unix seconds" in response.json()["detail"]


def test_a_since_no_date_can_hold_is_refused_not_a_server_error(client, viewer, job_and_host):
    _, host, _ = job_and_host
    client.force_login(viewer)
    for since in ("6.84e16", "-1"):
        response = client.get(f"/dashboard/api/hosts/{host.pk}/allocations/?since={since}")
        assert response.status_code == 400, (since, response.content)
        assert "since" in response.json()["detail"]
