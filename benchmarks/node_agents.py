"""Many agents of a third party's kind in one Node.js process against a live stack: the agent
written from docs/agent-protocol.md alone (tests/http_clients/node_agent/agent.mjs, Node's
standard library, one keep-alive pool), each with a host of its own, a sample a second, a batch
every --batch-seconds, an allocation long-poll held. The loadgen's figures
(benchmarks/loadgen.py) for the same load are in docs/benchmarks.md: this says whether a client
unlike ours sees the same server.

    python -m benchmarks.node_agents --agents 200 --seconds 60 --batch-seconds 5 --shape spread

Prints (and writes with --json) the run's figures: batches stored, samples made and stored,
errors, batch latency percentiles (from just before a request to its whole answer), the Node
process's CPU a request, and the web processes' CPU a request (psutil). Bounded: the agents stop
after --seconds, the whole run after --seconds plus registration and draining bounds.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from benchmarks.loadgen import cpu_of, live_stack, web_processes

AGENT = Path(__file__).resolve().parents[1] / "tests" / "http_clients" / "node_agent" / "agent.mjs"
SHAPES = ("spread", "in-step")


def node(command: str, config: dict, directory: Path, timeout: float) -> str:
    path = directory / f"{command}.json"
    path.write_text(json.dumps(config))
    result = subprocess.run(
        ["node", str(AGENT), command, str(path)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"node agent.mjs {command} failed: {result.stderr[-2000:]}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--batch-seconds", type=int, default=5)
    parser.add_argument("--shape", choices=SHAPES, default="spread")
    parser.add_argument("--long-poll-wait", type=float, default=30)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if shutil.which("node") is None:
        print("node is not installed (Debian: apt-get install nodejs)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="intune-node-agents-"))
    stages = [{"name": f"stage{i}", "max_workers": 64} for i in range(args.stages)]
    with live_stack("uvicorn", args.agents) as stack:
        operator = stack.create_user(f"bench-{uuid.uuid4().hex[:6]}")["token"]
        common = {"url": stack.url, "stages": stages, "cpus": 64, "memory_mb": 262144}
        registered = json.loads(
            node(
                "register",
                common | {"operator_token": operator, "hosts": args.agents, "job_name": "node"},
                directory,
                timeout=600,
            )
        )
        load_average = os.getloadavg()
        web = web_processes(stack)
        web_before = cpu_of(web)
        out = node(
            "run",
            common
            | {
                "hosts": registered["hosts"],
                "quiet": True,
                "shape": args.shape,
                "sample_interval_s": 1,
                "batch_every": args.batch_seconds,
                "poll_wait_s": args.long_poll_wait,
                "seconds": args.seconds,
                "drain_s": 30,
            },
            directory,
            timeout=args.seconds + 120,
        )
        web_cpu = cpu_of(web) - web_before
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        (figures,) = [e for e in events if e["event"] == "figures"]
        figures["samples_in_database"] = stack.stored_samples(registered["job_id"])
        figures["web_cpu_ms_per_request"] = 1000 * web_cpu / max(1, figures["requests"])
        figures["batch_seconds"] = args.batch_seconds
        figures["seconds"] = args.seconds
        figures["load_average_before"] = [round(x, 2) for x in load_average]
    shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
