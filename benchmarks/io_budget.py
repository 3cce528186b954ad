"""The I/O-bound pipeline's best allocation under the old worker budget and under the new one.

``python -m benchmarks.io_budget [--seconds 4] [--rounds 2] [--json OUT]``

The pipeline is ``agents.pipeline.examples:object_store_text``: a thread stage that waits
25 ms per record as a GET from an object store does, then three CPU-bound text stages in
processes. The old budget counted every worker as a CPU (``CPUs + stages`` workers in all,
so at most 3 fetch threads on 2 cores); the new one (``agents.budget``) counts what a worker
was measured to use, so a waiting stage may grow to 64 threads while the CPU allows.

Every candidate is measured in one run, alternately, ``--rounds`` times (the median is kept);
each is marked with the budget(s) that allow it, the new rule judged with the CPU per worker
measured in that very run. It prints and writes the best of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from tqdm import tqdm

from agents.budget import (
    HostBudget,
    StageBudget,
    WorkerCpuMeter,
    allocation_problems,
    cpu_slots,
)
from agents.pipeline.cli import measure
from agents.pipeline.examples import object_store_text

STAGES = ["fetch", "decode", "tokenize", "pack"]


def candidates(cpus: int) -> list[dict[str, int]]:
    """Allocations worth measuring: the fetch stage from 1 to 48 threads, the text stages at
    one or two processes."""
    found = []
    for fetch in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48):
        for tokenize in (1, 2):
            found.append({"fetch": fetch, "decode": 1, "tokenize": tokenize, "pack": 1})
    return found


def run(seconds: float, rounds: int, warmup: float) -> dict:
    """Measure every candidate ``rounds`` times, alternately; return the table and the bests."""
    cpus = len(os.sched_getaffinity(0))
    slots = cpu_slots(cpus, len(STAGES))
    table = {
        json.dumps(c, sort_keys=True): {"allocation": c, "rates": [], "metrics": []}
        for c in candidates(cpus)
    }
    total = rounds * len(table)
    with tqdm(total=total, desc="allocations", unit="run") as bar:
        for _ in range(rounds):
            for row in table.values():
                pipeline = object_store_text()
                pipeline.apply(row["allocation"])
                with pipeline:
                    result = measure(pipeline, seconds, warmup, progress=False)
                row["rates"].append(result["samples_per_s"])
                row["metrics"].append(result["stages"])
                bar.update()
    rows = []
    for row in table.values():
        meter = WorkerCpuMeter()
        for stages in row["metrics"]:
            meter.update(stages, host_cpu_percent=None)
        cost = meter.worker_cpu()
        budget = [StageBudget(n, max_workers=64, worker_cpu=cost.get(n, 1.0)) for n in STAGES]
        new_ok = not allocation_problems(row["allocation"], budget, HostBudget(slots))
        rows.append(
            {
                "allocation": row["allocation"],
                "samples_per_s": statistics.median(row["rates"]),
                "rates": row["rates"],
                "cpu_percent": statistics.median(
                    sum(s["cpu_percent"] for s in stages) for stages in row["metrics"]
                ),
                "old_budget_allows": sum(row["allocation"].values()) <= slots,
                "new_budget_allows": new_ok,
            }
        )
    old = max((r for r in rows if r["old_budget_allows"]), key=lambda r: r["samples_per_s"])
    new = max((r for r in rows if r["new_budget_allows"]), key=lambda r: r["samples_per_s"])
    return {
        "cpus": cpus,
        "cpu_slots": slots,
        "seconds": seconds,
        "rounds": rounds,
        "rows": rows,
        "best_old": old,
        "best_new": new,
        "ratio": new["samples_per_s"] / old["samples_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.io_budget``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.io_budget", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="measurements per allocation")
    parser.add_argument("--json", dest="json_out", help="write the result here")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.rounds, args.warmup)
    for row in sorted(result["rows"], key=lambda r: -r["samples_per_s"]):
        print(
            f"{row['allocation']}  {row['samples_per_s']:7.1f}/s  CPU {row['cpu_percent']:5.0f}%"
            f"  old:{'yes' if row['old_budget_allows'] else 'no ':3}"
            f"  new:{'yes' if row['new_budget_allows'] else 'no'}"
        )
    print(
        f"best under the old budget {result['best_old']['allocation']} "
        f"{result['best_old']['samples_per_s']:.1f}/s; under the new "
        f"{result['best_new']['allocation']} {result['best_new']['samples_per_s']:.1f}/s: "
        f"{result['ratio']:.2f}x"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
