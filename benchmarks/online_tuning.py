"""InTune on the real DLRM pipeline of this host: online tuning against the best allocation.

    python -m benchmarks.online_tuning --seconds-per-allocation 6 --tuning-seconds 60
    python -m benchmarks.online_tuning --pipeline agents.pipeline.examples:object_store_text \
        --allocations io --interval 5

``--pipeline`` takes ``dlrm`` (the default) or any ``module:factory``; ``--allocations io``
measures the I/O-bound candidates of ``benchmarks.io_budget`` instead of every allocation the
old worker-count budget allows (a waiting stage may have up to 64 threads now, too many to try
them all).

1. Exhaustive: runs the DLRM pipeline (``agents.dlrm``) once and, resizing it live, measures the
   samples/s of every allocation the host's worker budget allows (each stage at least one
   worker, the stages' own caps respected). The best of them is the reference.
2. Online: starts the whole system (web server, Celery worker, beat) and the real agent on the
   same pipeline, starting at one worker per stage, starts an InTune tuning session, and reads
   the throughput the agent reports. The figure is the mean of the last 10 s before the deadline
   (default 60 s after tuning started) divided by the exhaustive best.
3. Side by side: the best allocation and the one InTune ended on, measured alternately on one
   pipeline with the control plane stopped, so that the allocation's quality is told apart from
   what the online run shared the cores with.

Both runs consume batches without training (``--no-train``), so the figure is the pipeline's.
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import track

from agents.budget import cpu_slots
from agents.pipeline.loading import build
from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

console = Console()


def feasible_allocations(
    stages: list[str], budget: int, caps: dict[str, int | None]
) -> list[dict[str, int]]:
    """Every allocation with each stage at 1..cap workers and at most ``budget`` in all."""
    ranges = [range(1, min(budget, caps.get(s) or budget) + 1) for s in stages]
    return [
        dict(zip(stages, combo, strict=True))
        for combo in itertools.product(*ranges)
        if sum(combo) <= budget
    ]


def exhaustive(
    seconds: float, settle: float, spec: str = "dlrm", which: str = "all"
) -> tuple[dict, float, list[dict]]:
    pipeline = build(spec).start()
    stages = pipeline.stage_names
    if which == "io":
        from benchmarks.io_budget import candidates

        allocations = candidates(len(os.sched_getaffinity(0)))
    else:
        budget = cpu_slots(len(os.sched_getaffinity(0)), len(stages))
        caps = {stage.name: stage.max_workers for stage in pipeline.stages}
        allocations = feasible_allocations(stages, budget, caps)
    stop = threading.Event()

    def drain():
        for _ in pipeline:
            if stop.is_set():
                return

    consumer = threading.Thread(target=drain, daemon=True)
    consumer.start()
    results = []
    try:
        for allocation in track(
            allocations, description=f"measuring {len(allocations)} allocations", console=console
        ):
            pipeline.apply(allocation)
            time.sleep(settle)
            pipeline.consumer_stats()
            time.sleep(seconds)
            results.append(
                {"allocation": allocation, "throughput": pipeline.consumer_stats()["throughput"]}
            )
    finally:
        stop.set()
        pipeline.stop()
    best = max(results, key=lambda r: r["throughput"])
    return best["allocation"], best["throughput"], results


def side_by_side(
    allocations: list[dict], seconds: float, settle: float, spec: str, rounds: int = 3
) -> list[float]:
    """The median samples/s of each allocation, measured alternately ``rounds`` times on one
    pipeline resized live (no control plane running): whether the allocation InTune ended on
    is as good as the reference, apart from what the online run shared the cores with."""
    pipeline = build(spec).start()
    stop = threading.Event()

    def drain():
        for _ in pipeline:
            if stop.is_set():
                return

    consumer = threading.Thread(target=drain, daemon=True)
    consumer.start()
    rates: list[list[float]] = [[] for _ in allocations]
    try:
        for _ in range(rounds):
            for i, allocation in enumerate(allocations):
                pipeline.apply(allocation)
                time.sleep(settle)
                pipeline.consumer_stats()
                time.sleep(seconds)
                rates[i].append(pipeline.consumer_stats()["throughput"])
    finally:
        stop.set()
        pipeline.stop()
    return [statistics.median(r) for r in rates]


def online(tuning_seconds: float, interval: float, spec: str = "dlrm") -> dict:
    stage_names = build(spec).stage_names
    with LiveStack(Path(tempfile.mkdtemp(prefix="intune-online-")), beat=True) as stack:
        person = stack.create_user("bench-operator", role="operator")
        job_id, host_id, token = stack.register_job_and_host(
            person["token"],
            {
                "name": "online-bench",
                "stages": [{"name": s} for s in stage_names],
                "tuner": "intune",
                "decision_interval_s": interval,
            },
            {"name": "this-host", "cpus": os.cpu_count() or 1, "memory_mb": 8192},
        )
        with stack.client(person["token"]) as api:
            stack.start_agent(
                host_id, token, "--no-train", "--batch-seconds", "1", "--pipeline", spec
            )
            wait_until(
                lambda: api.get(f"/api/v1/hosts/{host_id}/").json()["applied_version"] >= 1,
                90,
                what="the agent to start",
            )
            api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).raise_for_status()
            started = time.time()
            for _ in track(
                range(int(tuning_seconds)), description="tuning online", console=console
            ):
                time.sleep(1)
            series = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": started - 5, "step": 1}
            ).json()["series"]
            decisions = api.get(
                f"/api/v1/hosts/{host_id}/decisions/", params={"limit": 500}
            ).json()["results"]
            final = api.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]
    window = [
        t
        for ts, t in zip(series["ts"], series["throughput"], strict=True)
        if ts >= started + tuning_seconds - 10
    ]
    return {
        "final_throughput": statistics.fmean(window) if window else 0.0,
        "final_allocation": final["workers"],
        "decisions": len(decisions),
        # What the tuner did, oldest first: why a run ends where it ends.
        "decision_log": [
            {
                "step": d["step"],
                "t": round(_epoch(d["created_at"]) - started, 1),
                "action": d["action"],
                "workers": d["workers"],
                "reward": d["reward"],
                "throughput": (d.get("observation") or {}).get("throughput"),
            }
            for d in sorted(decisions, key=lambda d: d["step"])
        ],
        "trajectory": [
            {"t": round(ts - started, 1), "throughput": t}
            for ts, t in zip(series["ts"], series["throughput"], strict=True)
        ],
    }


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.online_tuning",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds-per-allocation", type=float, default=6.0)
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds after each resize before measuring"
    )
    parser.add_argument("--tuning-seconds", type=float, default=60.0)
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds of fresh metrics per decision"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pipeline", default="dlrm", help="'dlrm' or module:factory")
    parser.add_argument(
        "--allocations",
        choices=["all", "io"],
        default="all",
        help="'all' that the worker-count budget allows, or the I/O-bound candidates",
    )
    args = parser.parse_args(argv)
    best_allocation, best, table = exhaustive(
        args.seconds_per_allocation, args.settle, args.pipeline, args.allocations
    )
    console.print(f"best measured: {best:,.0f} samples/s at {best_allocation}")
    result = online(args.tuning_seconds, args.interval, args.pipeline)
    ratio = result["final_throughput"] / best if best else 0.0
    console.print(
        f"online after {args.tuning_seconds:.0f} s: {result['final_throughput']:,.0f} samples/s at "
        f"{result['final_allocation']} = {ratio:.2f} of the best ({result['decisions']} decisions)"
    )
    reference, final = side_by_side(
        [best_allocation, result["final_allocation"]],
        args.seconds_per_allocation,
        args.settle,
        args.pipeline,
    )
    console.print(
        f"side by side, no control plane: best {reference:,.0f}, InTune's final allocation "
        f"{final:,.0f} samples/s = {final / reference:.2f}"
    )
    figures = {
        "best": {"allocation": best_allocation, "throughput": best},
        "online": result,
        "ratio": ratio,
        "side_by_side": {"best": reference, "final": final, "ratio": final / reference},
        "allocations_measured": table,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
