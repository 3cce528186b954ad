"""Two ranks of DDP on one host: one worker per stage against the allocation InTune tuned.

    python -m benchmarks.ranks --tuning-seconds 60 --seconds 30 --repeats 2

1. Tuning: the whole control plane (web server, Celery worker, Redis, a fresh database) and
   ``torchrun --nproc-per-node 2 -m agents.dlrm.ddp`` (gloo, CPU, DLRM trained on the DLRM
   pipeline; one agent for the host, hosted by one rank), the host registered with its two
   ranks; an InTune session tunes it for ``--tuning-seconds``. Its allocation in force at the
   end (per rank) is the tuned one. ``--tuned read=1,parse=2,...`` skips this phase.
2. Measuring: the same 2-rank job without the agent, each allocation fixed, run alternately
   (one worker per stage, tuned, one per stage, tuned, ...) so that other load on the machine
   falls on both alike. A run's figure is the host's samples/s (the sum over the ranks) after
   ``--warmup`` seconds. The answer is the ratio tuned / one-per-stage per pair, and their median.

Prints a JSON summary (``--json`` writes it to a file too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console

from agents.dlrm.ddp import parse_workers
from agents.dlrm.schema import STAGE_NAMES
from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

console = Console(stderr=True)
ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def torchrun(args: list[str], env: dict[str, str], report: Path, log: Path) -> subprocess.Popen:
    """Start the 2-rank DDP job (``agents.dlrm.ddp``) writing its reports into ``report``."""
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "agents.dlrm.ddp"]
    with open(log, "w") as out:
        return subprocess.Popen(
            [*argv, *args, "--report", str(report)],
            env=os.environ | {"PYTHONPATH": str(ROOT)} | env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def tune(seconds: float, batch_size: int, rows: int) -> dict[str, int]:
    """Phase 1: tune the 2-rank host online; return the allocation in force at the end."""
    directory = Path(tempfile.mkdtemp(prefix="intune-ranks-"))
    with LiveStack(directory) as stack:
        person = stack.create_user("bench-ranks", role="operator")
        job_id, host_id, token = stack.register_job_and_host(
            person["token"],
            {
                "name": "ranks-bench",
                "stages": [{"name": s} for s in STAGE_NAMES],
                "tuner": "intune",
                "decision_interval_s": 3,
            },
            {"name": "this-host", "cpus": os.cpu_count() or 1, "memory_mb": 8192, "ranks": 2},
        )
        stop = directory / "stop"
        job = torchrun(
            ["--seconds", str(seconds + 120), "--stop-file", str(stop),
             "--batch-size", str(batch_size), "--rows", str(rows)],
            {"INTUNE_URL": stack.url, "INTUNE_HOST_ID": str(host_id), "INTUNE_AGENT_TOKEN": token,
             "INTUNE_RANK_SOCKET": f"@intune-bench-{uuid.uuid4().hex}"},
            directory, directory / "torchrun.log",
        )  # fmt: skip
        try:
            with stack.client(person["token"]) as api:
                wait_until(
                    lambda: api.get(f"/api/v1/hosts/{host_id}/").json()["state"] == "online",
                    120,
                    what="the host agent's first samples",
                )
                api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).raise_for_status()
                console.print(f"tuning the 2-rank host for {seconds:.0f} s")
                time.sleep(seconds)
                state = api.get(f"/api/v1/hosts/{host_id}/").json()
                decisions = api.get(f"/api/v1/hosts/{host_id}/decisions/").json()["results"]
        finally:
            stop.touch()
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                job.kill()
    allocation = state["allocation"]
    console.print(
        f"{len(decisions)} decisions; in force: v{allocation['version']} ({allocation['source']}, "
        f"{allocation['status']}) {allocation['workers']}"
    )
    return dict(allocation["workers"])


def measure(
    workers: dict[str, int], seconds: float, warmup: float, batch_size: int, rows: int
) -> float:
    """Phase 2, one run: the 2-rank job at a fixed allocation; the host's samples/s."""
    directory = Path(tempfile.mkdtemp(prefix="intune-ranks-run-"))
    spec = ",".join(f"{k}={v}" for k, v in workers.items())
    job = torchrun(
        ["--no-agent", "--seconds", str(seconds + warmup), "--warmup", str(warmup),
         "--batch-size", str(batch_size), "--rows", str(rows), "--workers", spec],
        {}, directory, directory / "torchrun.log",
    )  # fmt: skip
    if job.wait(seconds + warmup + 180) != 0:
        raise RuntimeError((directory / "torchrun.log").read_text()[-3000:])
    reports = [json.loads((directory / f"report-rank{r}.json").read_text()) for r in (0, 1)]
    return sum(r["samples_per_s"] for r in reports)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ranks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tuning-seconds", type=float, default=60.0)
    parser.add_argument("--tuned", default=None, help="skip tuning: this allocation per rank")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds not measured per run")
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs (default 2)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=32 * 1024)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    ones = dict.fromkeys(STAGE_NAMES, 1)
    tuned = parse_workers(args.tuned) or tune(args.tuning_seconds, args.batch_size, args.rows)
    pairs = []
    for i in range(args.repeats):
        base = measure(ones, args.seconds, args.warmup, args.batch_size, args.rows)
        better = measure(tuned, args.seconds, args.warmup, args.batch_size, args.rows)
        pairs.append({"one_per_stage": base, "tuned": better, "ratio": better / base})
        console.print(f"pair {i + 1}: one per stage {base:,.0f}, tuned {better:,.0f} samples/s")
    summary = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python -m benchmarks.ranks " + " ".join(argv or sys.argv[1:]),
        "ranks": 2,
        "tuned_allocation_per_rank": tuned,
        "pairs": pairs,
        "median_ratio": statistics.median(p["ratio"] for p in pairs),
    }
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
