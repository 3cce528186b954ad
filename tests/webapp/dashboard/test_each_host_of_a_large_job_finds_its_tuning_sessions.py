"""The job page shows one host's tuning sessions. It asked for the job's (the newest 200) and kept
the host's: on a job of more hosts than that, most hosts' running sessions were left out and the
page said "No tuning session on this host yet" (300 of 500 hosts measured, docs/benchmarks.md
"Dashboard"), while each refresh read and sent every host's sessions."""

from webapp.jobs.models import Host
from webapp.tuning.models import TuningSession

SESSIONS_LISTED = 200  # the newest a job's list holds (webapp/tuning/api/views.py)


def test_a_host_finds_its_session_on_a_job_of_more_hosts_than_a_list_holds(
    api, viewer, job_and_host
):
    job, first, _ = job_and_host
    others = Host.objects.bulk_create(
        Host(job=job, name=f"trainer-{i:03d}", cpus=8, memory_mb=16384, worker_budget=8,
             token_hash=f"hash-{i}")
        for i in range(SESSIONS_LISTED)
    )  # fmt: skip
    TuningSession.objects.bulk_create(
        TuningSession(job=job, host=host, tuner="intune", status=TuningSession.Status.RUNNING)
        for host in [first, *others]  # the first host's session is the oldest
    )
    client = api.as_user(viewer)
    everyone = client.get(f"/api/v1/jobs/{job.pk}/tuning/").json()
    assert len(everyone) == SESSIONS_LISTED
    assert first.pk not in {s["host"] for s in everyone}  # why the page asks for its host's

    mine = client.get(f"/api/v1/jobs/{job.pk}/tuning/", {"host": first.pk})
    assert mine.status_code == 200, mine.content
    assert [s["host"] for s in mine.json()] == [first.pk]
    assert mine.json()[0]["status"] == "running"


def test_a_host_that_is_not_an_id_is_refused_saying_so(api, viewer, job_and_host):
    job, _, _ = job_and_host
    answer = api.as_user(viewer).get(f"/api/v1/jobs/{job.pk}/tuning/", {"host": "h000"})
    assert answer.status_code == 400
    assert answer.json()["errors"]["host"] == "must be a host id"
