"""The REST API (/api/v1/hosts/{id}/) and the dashboard's host panel show a host's state and its
override in force the same way: one definition of each, not two that can drift apart."""

from datetime import timedelta

from django.utils import timezone

from webapp.jobs.models import Host


def both_views(client, api, operator, host):
    client.force_login(operator)
    dashboard = client.get(f"/dashboard/api/hosts/{host.pk}/overview/")
    rest = api.as_user(operator).get(f"/api/v1/hosts/{host.pk}/")
    assert dashboard.status_code == rest.status_code == 200
    return dashboard.json(), rest.json()


def test_a_host_is_new_then_online_then_offline_in_both(client, api, operator, job_and_host):
    _, host, _ = job_and_host
    states = []
    for silent_s in (None, 1, 3600):
        last_seen = None if silent_s is None else timezone.now() - timedelta(seconds=silent_s)
        Host.objects.filter(pk=host.pk).update(last_seen=last_seen)
        dashboard, rest = both_views(client, api, operator, host)
        assert dashboard["state"] == rest["state"]
        states.append(rest["state"])
    assert states == ["new", "online", "offline"]


def test_the_override_in_force_reads_the_same_in_both(client, api, operator, job_and_host):
    job, host, _ = job_and_host
    workers = {s: 1 for s in job.stage_names} | {"parse": 3}
    expires = timezone.now() + timedelta(hours=1)
    response = api.as_user(operator).put(
        f"/api/v1/hosts/{host.pk}/override/",
        {"workers": workers, "reason": "parse is slow", "expires_at": expires.isoformat()},
        format="json",
    )
    assert response.status_code in (200, 201), response.content
    dashboard, rest = both_views(client, api, operator, host)
    assert dashboard["override"] == rest["override"]
    assert rest["override"]["workers"] == workers and rest["override"]["created_by"] == "olivia"
    assert rest["override"]["expires_at"] is not None
    assert dashboard["allocation"] == rest["allocation"]
