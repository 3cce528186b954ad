"""An agent's requests as any client would send them: the bodies, headers and paths of the agent
endpoints (docs/agent-protocol.md), and a live control plane with one registered host to send
them to. For tests that drive the web server with clients other than ours."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.live_stack import LiveStack

STAGES = ("read", "parse")
# Statuses docs/agent-protocol.md documents for the agent endpoints and the web server's own
# answers ("HTTP"): anything else (a 5xx above all) is a defect.
DOCUMENTED = {200, 204, 400, 401, 403, 404, 405, 408, 409, 413, 414, 415, 429, 431}
# Short bounds, so that tests of the timeouts take seconds; the defaults are 30 s each.
TIMEOUTS = {
    "INTUNE_KEEPALIVE_S": "2",
    "INTUNE_REQUEST_TIMEOUT_S": "2",
    "INTUNE_WRITE_TIMEOUT_S": "2",
}

_seq = itertools.count(int(time.time() * 1000))


def batch(samples: int = 1) -> bytes:
    """A valid metrics batch of ``samples`` new samples (fresh sequence numbers)."""
    now = time.time()
    return json.dumps(
        {
            "samples": [
                {
                    "seq": next(_seq),
                    "ts": now,
                    "host": {
                        "cpus": 8.0,
                        "cpu_percent": 10.0,
                        "memory_used_mb": 1.0,
                        "memory_limit_mb": 16384.0,
                    },
                    "trainer": {"throughput": 1.0, "idle_fraction": 0.1},
                    "stages": [
                        {"name": name, "workers": 1, "items_per_s": 1.0, "busy_fraction": 0.5}
                        for name in STAGES
                    ],
                }  # fmt: skip
                for _ in range(samples)
            ]
        }
    ).encode()


@dataclass
class AgentPlane:
    """A live control plane with one host whose agent sends the requests."""

    stack: LiveStack
    host_id: int
    token: str
    operator: str

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def port(self) -> int:
        return self.stack.port

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.stack.port}"

    def metrics_path(self) -> str:
        return f"/api/v1/hosts/{self.host_id}/metrics/"

    def allocation_path(self, after: int = 0, wait: float = 0) -> str:
        return f"/api/v1/hosts/{self.host_id}/allocation/?after={after}&wait={wait:g}"

    def agent_headers(self, content_type: bool = True) -> list[tuple[str, str]]:
        headers = [("Authorization", f"Agent {self.token}")]
        return headers + ([("Content-Type", "application/json")] if content_type else [])

    def held_long_polls(self) -> float:
        """The web server's gauge of allocation long-polls held now (its /metrics)."""
        import httpx

        scraped = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.operator}"}, timeout=10
        )
        line = next(
            ln for ln in scraped.text.splitlines() if ln.startswith("intune_held_long_polls ")
        )
        return float(line.split()[1])

    def current_version(self) -> int:
        import httpx

        answer = httpx.get(
            f"{self.url}{self.allocation_path()}",
            headers={"Authorization": f"Agent {self.token}"},
            timeout=10,
        )
        return answer.json()["version"]


@contextmanager
def agent_plane(directory: Path, extra_env: dict[str, str] | None = None):
    """A live stack (one web worker, the short TIMEOUTS) with a static job of STAGES and one
    host; yields its AgentPlane."""
    env = TIMEOUTS | {"INTUNE_AGENT_RATE": "100000/min"} | (extra_env or {})
    with LiveStack(directory, extra_env=env) as stack:
        operator = stack.create_user(f"op-{uuid.uuid4().hex[:6]}", role="operator")["token"]
        _, host_id, token = stack.register_job_and_host(
            operator,
            {"name": "clients", "stages": [{"name": s} for s in STAGES], "tuner": "static"},
            {"name": "clients-host", "cpus": 8, "memory_mb": 16384},
        )
        yield AgentPlane(stack, host_id, token, operator)
