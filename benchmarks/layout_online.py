"""The layout decision on the real DLRM pipeline, online, against the best allocation of each
fixed layout on the same cores (issue 15, part 3).

    python -m benchmarks.layout_online [--cores 2] [--seconds 4] [--warmup 1] [--json OUT]

1. For each fixed layout (``staged``, ``halves``, ``fused``) the climb of
   ``benchmarks.pipeline`` finds its best allocation on the first ``--cores`` cores.
2. The decision runs online: the pipeline starts staged at one worker per stage, and every
   ``--interval`` seconds ``tuner.layout.decide_from_metrics`` reads its per-stage metrics
   (each stage's CPU in its function, each group's hand-off) and changes the layout and
   allocation live (``Pipeline.relayout``) where it predicts a gain, ``--decisions`` times;
   then its rate is measured over ``--seconds``.
3. The best fixed layout and the decision's final layout and allocation are measured again
   alternately (A B A B, fresh pipelines), and the ratios are of those means.

About 3 to 4 minutes on 2 cores with the defaults. Figures from a loaded machine are noisy:
the command prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from agents.dlrm import build_pipeline
from agents.dlrm.workload import ensure_dataset
from agents.pipeline import consume_until
from benchmarks.pipeline.measure import LAYOUTS, best_allocation, on_cores, pipeline_rate
from tuner.layout import decide_from_metrics, layout_groups


def decision_run(
    data_dir: Path,
    batch_size: int,
    cores: int,
    interval: float,
    decisions: int,
    seconds: float,
    log,
) -> dict[str, Any]:
    """Run the pipeline staged and let the layout decision change it live; its final layout,
    allocation and rate (batches/s), and every decision made."""
    pipeline = build_pipeline(data_dir, batch_size=batch_size)
    names = list(pipeline.unit_names)
    ceilings = [s.max_workers for s in pipeline.units]
    kinds = [s.kind for s in pipeline.units]
    taken = [0]
    stop = threading.Event()

    def consume() -> None:
        def count(_item) -> None:
            taken[0] += 1

        consume_until(pipeline, stop, count)

    made = []
    with pipeline:
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        time.sleep(interval)
        pipeline.metrics(by_unit=True)
        for _ in range(decisions):
            time.sleep(interval)
            rows = pipeline.metrics(by_unit=True)
            spans = [(names.index(g[0]), names.index(g[-1]) + 1) for g in pipeline.layout]
            choice = decide_from_metrics(rows, spans, cores, ceilings, kinds)
            groups = layout_groups(names, choice.spans)
            allocation = dict(zip(groups, (int(w) for w in choice.allocation), strict=True))
            log(f"  decision: {groups} {allocation} (changed: {choice.changed})")
            made.append({"layout": groups, "allocation": allocation, "changed": choice.changed})
            if choice.changed:
                pipeline.relayout(groups, allocation, timeout_s=10.0)
            else:
                pipeline.apply(allocation)
        time.sleep(interval)  # settle
        before, began = taken[0], time.monotonic()
        time.sleep(seconds)
        rate = (taken[0] - before) / (time.monotonic() - began)
        final = {"layout": pipeline.stage_names, "allocation": pipeline.allocation}
        stop.set()
    return {"final": final, "batches_per_s": rate, "decisions": made}


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print (and optionally save) it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--decisions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    say = print
    load_before = os.getloadavg()
    data_dir = ensure_dataset(batch_size=args.batch_size)
    fixed = {}
    with on_cores(cores):
        for name, fuse in LAYOUTS.items():
            say(f"layout {name}")
            found = best_allocation(
                data_dir, args.batch_size, len(cores), args.seconds, args.warmup, say, fuse
            )
            fixed[name] = found["best"]
        say("the layout decision, online")
        online = decision_run(
            data_dir,
            args.batch_size,
            len(cores),
            args.interval,
            args.decisions,
            args.seconds,
            say,
        )
        best_name = max(fixed, key=lambda n: fixed[n]["batches_per_s"])
        best = fixed[best_name]
        final = online["final"]
        groups = [g for g in final["layout"] if g != "prefetch"]
        fuse = ",".join(g for g in groups if "+" in g) or None
        ours, theirs = [], []
        for _ in range(args.rounds):
            theirs.append(
                pipeline_rate(
                    data_dir,
                    args.batch_size,
                    best["allocation"],
                    args.seconds,
                    args.warmup,
                    best["fuse"],
                )[0]
            )
            ours.append(
                pipeline_rate(
                    data_dir, args.batch_size, final["allocation"], args.seconds, args.warmup, fuse
                )[0]
            )
    staged = fixed["staged"]["batches_per_s"]
    result = {
        "cores": len(cores),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "fixed": {
            n: {**f, "samples_per_s": f["batches_per_s"] * args.batch_size}
            for n, f in fixed.items()
        },
        "best_fixed": best_name,
        "online": online,
        "online_samples_per_s": online["batches_per_s"] * args.batch_size,
        "again_best_fixed_samples_per_s": [r * args.batch_size for r in theirs],
        "again_decision_samples_per_s": [r * args.batch_size for r in ours],
        "decision_over_best_fixed": statistics.mean(ours) / statistics.mean(theirs),
        "online_over_best_fixed": online["batches_per_s"] / best["batches_per_s"],
        "decision_over_staged_climb": statistics.mean(ours) / staged,
    }
    say(json.dumps({k: v for k, v in result.items() if k not in ("fixed", "online")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
