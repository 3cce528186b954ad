"""Fixtures of the fault tests: live stacks on servers of their own, and the real agent."""

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.live_stack import LiveStack

from .pipelines import STAGES

AGENT_PIPELINE = "tests.reliability.pipelines:gentle"


@dataclass
class Registered:
    job_id: int
    host_id: int
    token: str
    api_token: str


def register(stack: LiveStack, stages=STAGES, **job_settings) -> Registered:
    """A fresh operator, a job with these stages and one host, through the REST API."""
    person = stack.create_user(f"op-{uuid.uuid4().hex[:6]}", role="operator")
    with stack.client(person["token"]) as api:
        job = api.post(
            "/api/v1/jobs/",
            json={"name": f"job-{uuid.uuid4().hex[:6]}", "stages": [{"name": s} for s in stages]}
            | job_settings,
        )
        job.raise_for_status()
        host = api.post(
            f"/api/v1/jobs/{job.json()['id']}/hosts/",
            json={"name": f"host-{uuid.uuid4().hex[:6]}", "cpus": 4, "memory_mb": 8192},
        )
        host.raise_for_status()
    return Registered(
        job.json()["id"], host.json()["id"], host.json()["agent_token"], person["token"]
    )


def start_agent(stack: LiveStack, host: Registered, state_dir: Path, name: str = "agent", **flags):
    """The real agent (``python -m agents``) as a child process of the stack's group."""
    argv = ["--pipeline", AGENT_PIPELINE]
    for flag, value in ({"interval": 1.0, "batch_seconds": 1.0, "poll_wait": 10} | flags).items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return stack.start_agent(host.host_id, host.token, *argv, instance=name, state_dir=state_dir)


def count_samples(stack: LiveStack, host_id: int) -> dict:
    """What the database holds for the host: samples, distinct and first/last sequence numbers."""
    import json

    script = f"""
import json
from django.db.models import Count, Max, Min
from webapp.ingestion.models import HostSample
from webapp.jobs.models import Host
q = HostSample.objects.filter(host_id={host_id})
a = q.aggregate(
    n=Count("id"), distinct=Count("seq", distinct=True), first=Min("seq"), last=Max("seq")
)
h = Host.objects.get(pk={host_id})
a.update(dropped=h.dropped_samples, applied=h.applied_version, version=h.allocation_version)
print(json.dumps(a))
"""
    return json.loads(stack.manage("shell", "-c", script).strip().splitlines()[-1])


@pytest.fixture
def agent_state(tmp_path):
    return tmp_path / "agent-state"


@pytest.fixture(scope="package")
def fault_stack(tmp_path_factory, redis_url):
    """Web server and worker on a fresh database, shared by the fault tests that need nothing
    special; agents silent for 3 s are shown offline (15 s in production) to keep tests short."""
    extra = {"INTUNE_AGENT_OFFLINE_AFTER_S": "3"}
    with LiveStack(tmp_path_factory.mktemp("faults"), extra_env=extra) as stack:
        yield stack
