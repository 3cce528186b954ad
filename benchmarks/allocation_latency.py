"""How long from an allocation being stored to the agent having applied it (target p95 < 1 s).

    python -m benchmarks.allocation_latency --changes 30

Starts a live stack and a real agent (``intune-agent`` with the light counting pipeline, so the
figure is the control plane's and the agent's, not the DLRM pipeline's start-up), then stores
allocations one after another (through the override API, the same publish path as a policy
decision) and reads back when the agent's report of applying each arrived. Both instants are the
server's clock: ``Allocation.created_at`` and ``Allocation.applied_at``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

STAGES = ["s0", "s1", "s2"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.allocation_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--changes", type=int, default=30, help="allocations to publish (default 30)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    latencies = []
    with LiveStack(Path(tempfile.mkdtemp(prefix="intune-alloc-bench-"))) as stack:
        person = stack.create_user("bench-operator", role="operator")
        with stack.client(person["token"]) as api:
            job = api.post(
                "/api/v1/jobs/",
                json={"name": "alloc-bench", "stages": [{"name": s} for s in STAGES]},
            ).json()
            host = api.post(
                f"/api/v1/jobs/{job['id']}/hosts/",
                json={"name": "h", "cpus": os.cpu_count() or 1, "memory_mb": 4096},
            ).json()
            stack.start_agent(
                host["id"],
                host["agent_token"],
                "--pipeline",
                "agents.pipeline.examples:counting",
                "--no-train",
            )
            state = lambda: api.get(f"/api/v1/hosts/{host['id']}/").json()  # noqa: E731
            wait_until(
                lambda: state()["applied_version"] >= 1,
                60,
                what="the agent to apply its first allocation",
            )
            for i in range(args.changes):
                workers = {s: 2 if k == i % len(STAGES) else 1 for k, s in enumerate(STAGES)}
                put = api.put(
                    f"/api/v1/hosts/{host['id']}/override/",
                    json={"workers": workers, "reason": f"bench {i}"},
                )
                put.raise_for_status()
                version = put.json()["version"]

                def settled(v=version):
                    current = state()
                    if current["allocation"]["status"] == "refused":
                        raise SystemExit(
                            f"the agent refused version {v}: {current['allocation']['refusal_reason']}"
                        )
                    return current if current["applied_version"] >= v else None

                allocation = wait_until(
                    settled, 30, interval=0.05, what=f"version {version} applied"
                )["allocation"]
                created = _parse(allocation["created_at"])
                applied = _parse(allocation["applied_at"])
                latencies.append(applied - created)
                time.sleep(0.3)
    latencies.sort()
    figures = {
        "changes": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def _parse(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
