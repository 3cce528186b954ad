"""A live control plane for the security tests (fuzzing, logs), shared by the package."""

import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.support.live_stack import LiveStack


@dataclass
class Plane:
    stack: LiveStack
    operator: str
    viewer: str
    host_id: int
    agent_token: str
    other_host_id: int


@contextmanager
def live_plane(directory, extra_env: dict[str, str] | None = None) -> Plane:
    """A live stack with an operator, a viewer and a job with two hosts."""
    with LiveStack(directory, extra_env=extra_env) as stack:
        operator = stack.create_user(f"op-{uuid.uuid4().hex[:6]}", role="operator")["token"]
        viewer = stack.create_user(f"view-{uuid.uuid4().hex[:6]}", role="viewer")["token"]
        with stack.client(operator) as api:
            stages = [{"name": "read"}, {"name": "parse"}]
            job = api.post("/api/v1/jobs/", json={"name": "fuzzed", "stages": stages}).json()
            hosts = [
                api.post(f"/api/v1/jobs/{job['id']}/hosts/",
                         json={"name": name, "cpus": 8, "memory_mb": 16384}).json()
                for name in ("target", "other")
            ]  # fmt: skip
        yield Plane(
            stack, operator, viewer, hosts[0]["id"], hosts[0]["agent_token"], hosts[1]["id"]
        )


@pytest.fixture(scope="package")
def plane(tmp_path_factory, redis_url) -> Plane:
    """Shared by the security tests that leave its job and hosts in place (the fuzzer, which
    deletes what it finds, has its own)."""
    with live_plane(tmp_path_factory.mktemp("security")) as shared:
        yield shared
