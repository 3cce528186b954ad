"""What the tuner sees of memory, from what an agent sends: a stage whose workers hold nothing
of their own (thread workers, or process workers that only share the trainer's pages) costs 0
MB a worker, not an unknown the tuner would take from the host's whole use; and what the host
holds besides the workers (the trainer and its embedding tables) is left out of their room.
Stored through the agents' endpoint, read back by the observation the tuning step builds."""

import time

import pytest

from webapp.ingestion.models import HostSample
from webapp.tuning.observations import build_observation


@pytest.mark.parametrize("own_mb", [0.0, 40.0])
def test_the_observation_carries_the_workers_own_memory_and_what_the_host_holds_besides(
    api, job_and_host, sample, own_mb
):
    job, host, token = job_and_host
    now = time.time()
    samples = [sample(i, job.stage_names, ts=now - 3 + i) for i in range(1, 4)]
    for s in samples:
        s["host"]["memory_used_mb"] = 12_000.0  # the trainer's 12 GB, and the workers' own
        for stage in s["stages"]:
            stage["rss_mb"] = own_mb
    response = api.as_agent(token).post(
        f"/api/v1/hosts/{host.pk}/metrics/", {"samples": samples}, format="json"
    )
    assert response.status_code == 200, response.content
    observation = build_observation(host, list(HostSample.objects.filter(host=host).order_by("ts")))
    assert [s.memory_mb_per_worker for s in observation.stages] == [own_mb] * len(job.stage_names)
    held = own_mb * len(job.stage_names)
    assert observation.host.memory_outside_mb == pytest.approx(12_000.0 - held)
