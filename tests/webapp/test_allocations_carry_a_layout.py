"""An allocation may say which neighbouring stages run fused (``layout``, agents.layout): an
override with one is checked (groups of neighbours in order, workers naming the groups, each
group within its stages' lowest ceiling and the host's budget) and reaches the agent with it;
an allocation without one reads exactly as before."""

import pytest

from webapp.jobs.models import Allocation
from webapp.tuning.models import Override

STAGES = ["read", "parse", "transform", "collate", "prefetch"]
LAYOUT = [["read", "parse"], ["transform", "collate"], ["prefetch"]]


def override_url(host):
    return f"/api/v1/hosts/{host.pk}/override/"


def test_an_override_with_a_layout_is_stored_and_sent_to_the_agent_with_it(
    api, operator, job_and_host
):
    _, host, token = job_and_host
    workers = {"read+parse": 2, "transform+collate": 3, "prefetch": 1}
    response = api.as_user(operator).put(
        override_url(host), {"workers": workers, "layout": LAYOUT, "reason": "fuse"}, format="json"
    )
    assert response.status_code == 200, response.content
    newest = Allocation.objects.filter(host=host).order_by("-version").first()
    assert newest.layout == LAYOUT and newest.workers == workers
    answer = api.as_agent(token).get(f"/api/v1/hosts/{host.pk}/allocation/?after=1&wait=0")
    assert answer.status_code == 200
    assert answer.json()["layout"] == LAYOUT
    assert answer.json()["workers"] == workers


def test_an_allocation_without_a_layout_reads_as_before(api, job_and_host):
    _, host, token = job_and_host
    answer = api.as_agent(token).get(f"/api/v1/hosts/{host.pk}/allocation/?after=0&wait=0")
    assert answer.status_code == 200
    assert "layout" not in answer.json()
    assert set(answer.json()["workers"]) == set(STAGES)


@pytest.mark.parametrize(
    "layout, workers, message",
    [
        ([["parse", "read"], ["transform", "collate", "prefetch"]], {}, "pipeline order"),
        ([["read", "parse"], ["bogus"]], {}, "unknown stage(s) bogus"),
        ("read+parse", {}, "non-empty list of groups"),
        (LAYOUT, {"read": 1, "parse": 1}, "must name its groups"),
        (
            LAYOUT,
            {"read+parse": 20, "transform+collate": 1, "prefetch": 1},
            "the host budget is 13 CPU slots",
        ),
    ],
)
def test_an_override_with_a_bad_layout_is_refused_and_changes_nothing(
    api, operator, job_and_host, layout, workers, message
):
    _, host, _ = job_and_host
    response = api.as_user(operator).put(
        override_url(host),
        {"workers": workers or {"x": 1}, "layout": layout, "reason": "x"},
        format="json",
    )
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert Allocation.objects.filter(host=host).count() == 1
    assert not Override.objects.exists()


def test_the_budget_summary_counts_a_fused_allocations_groups(api, operator, job_and_host):
    from webapp.ingestion.services import budget_summary

    _, host, _ = job_and_host
    staged = {"read": 2, "parse": 2, "transform": 3, "collate": 3, "prefetch": 1}
    api.as_user(operator).put(override_url(host), {"workers": staged, "reason": "x"}, format="json")
    taken_staged = budget_summary(host)["cpu_slots_taken"]
    fused = {"read+parse": 2, "transform+collate": 3, "prefetch": 1}
    response = api.as_user(operator).put(
        override_url(host), {"workers": fused, "layout": LAYOUT, "reason": "x"}, format="json"
    )
    assert response.status_code == 200, response.content
    summary = budget_summary(host)
    # A fused worker runs its stages in turn: one slot where the staged allocation took two.
    assert 0 < summary["cpu_slots_taken"] < taken_staged
    assert summary["cpu_slots_taken"] == pytest.approx(2 + 3 + 1)
