"""The allocation long-poll: immediate when a newer version exists, else woken by a publish."""

import threading
import time

import httpx
import pytest

from webapp.jobs.services import create_allocation


def poll(live_server, host, token, after, wait):
    return httpx.get(
        f"{live_server.url}/api/v1/hosts/{host.pk}/allocation/",
        params={"after": after, "wait": wait},
        headers={"Authorization": f"Agent {token}"},
        timeout=wait + 10,
    )


@pytest.mark.django_db(transaction=True)
def test_a_newer_version_is_answered_at_once(live_server, job_and_host):
    _, host, token = job_and_host
    started = time.monotonic()
    response = poll(live_server, host, token, after=0, wait=20)
    assert response.status_code == 200
    assert time.monotonic() - started < 5
    assert response.json()["version"] == 1 and response.json()["source"] == "default"


@pytest.mark.django_db(transaction=True)
def test_a_held_poll_is_woken_by_a_publish(live_server, job_and_host):
    job, host, token = job_and_host
    timer = threading.Timer(
        1.0, lambda: create_allocation(host, {s: 2 for s in job.stage_names}, "policy")
    )
    timer.start()
    started = time.monotonic()
    response = poll(live_server, host, token, after=1, wait=30)
    elapsed = time.monotonic() - started
    timer.join(timeout=10)
    assert response.status_code == 200
    assert response.json()["version"] == 2 and response.json()["workers"]["read"] == 2
    assert 0.8 < elapsed < 5, f"answered after {elapsed:.2f} s; a publish should wake it at once"


@pytest.mark.django_db(transaction=True)
def test_nothing_newer_within_the_wait_answers_204(live_server, job_and_host):
    _, host, token = job_and_host
    started = time.monotonic()
    response = poll(live_server, host, token, after=1, wait=1.5)
    assert response.status_code == 204
    assert 1.4 < time.monotonic() - started < 5


@pytest.mark.parametrize(
    "params",
    # "²" and "--5" pass str.isdigit() once stripped of "-", and int() refuses them (were 500s).
    [{"after": "x"}, {"after": "-1"}, {"after": "²"}, {"after": "--5"}, {"wait": "600"},
     {"wait": "soon"}],
)  # fmt: skip
def test_bad_parameters_are_refused(api, job_and_host, params):
    _, host, token = job_and_host
    response = api.as_agent(token).get(f"/api/v1/hosts/{host.pk}/allocation/", params)
    assert response.status_code == 400
    assert list(params)[0] in response.json()["detail"]
