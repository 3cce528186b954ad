"""Two ranks whose items cost differently: the host's workers split evenly, against split by
what each rank measured it needs (``agents.budget.split_across_ranks``).

``python -m benchmarks.rank_balance [--seconds 3] [--rounds 5] [--json OUT]``

Each rank is a real ``agents.pipeline.Pipeline`` with two thread stages: ``fetch``, which waits
``--light-ms`` a record on rank 0 and ``--heavy-ms`` on rank 1 (a rank whose shard sits on a
slower store, or whose records are longer), and ``decode``, alike on both. The consumer steps as
DDP does: a step takes one item from each rank, so the host goes at the pace of the slower rank.
The host's allocation is ``--workers`` fetch threads per rank, ``2 * --workers`` in all.

Every round measures both candidates in one run, one after the other on the same two pipelines
resized live, in turn first: the even split (the allocation on each rank) and the split computed
from the metrics each rank reported during the latest even phase. It prints each round's host samples/s and
the ratio, and the median ratio. The stages sleep rather than compute, so the figures hold on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from agents.budget import rank_need, split_across_ranks
from agents.pipeline import Pipeline, Stage


class Wait:
    """A stage function that waits ``ms`` per item (a read from a store), then passes it on."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, item: int) -> int:
        """Return ``item`` after ``ms`` milliseconds."""
        time.sleep(self.ms / 1000.0)
        return item


def rank_pipeline(fetch_ms: float, workers: int) -> Pipeline:
    """One rank's input pipeline: ``fetch`` (``workers`` threads) then ``decode`` (1 ms)."""
    return Pipeline(
        iter(range(10**12)),
        [
            Stage("fetch", Wait(fetch_ms), workers=workers, kind="thread", max_workers=64),
            Stage("decode", Wait(1.0), workers=1, kind="thread", max_workers=64),
        ],
        queue_size=16,
    )


def lockstep(iterators: list, seconds: float) -> float:
    """Host samples/s over ``seconds`` when each step takes one item from every rank."""
    steps = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for iterator in iterators:
            next(iterator)
        steps += 1
    return steps * len(iterators) / (time.monotonic() - start)


def run(light_ms: float, heavy_ms: float, workers: int, seconds: float, rounds: int) -> dict:
    """Measure the even and the measured split ``rounds`` times, alternately."""
    allocation = {"fetch": workers, "decode": 1}
    pipelines = [rank_pipeline(light_ms, workers), rank_pipeline(heavy_ms, workers)]
    for pipeline in pipelines:
        pipeline.start()
    iterators = [iter(p) for p in pipelines]
    warmup = min(1.0, seconds / 2)
    rows = []
    try:
        lockstep(iterators, 2 * warmup)  # threads started, queues filled: not measured
        split = None
        for round_ in range(rounds):

            def measure_even() -> tuple[float, dict]:
                for pipeline in pipelines:
                    pipeline.apply(allocation)
                lockstep(iterators, warmup)
                for pipeline in pipelines:
                    pipeline.metrics()
                rate = lockstep(iterators, seconds)
                return rate, {rank: rank_need(p.metrics()) for rank, p in enumerate(pipelines)}

            def measure_split(split: dict) -> float:
                for rank, pipeline in enumerate(pipelines):
                    pipeline.apply(split[rank])
                lockstep(iterators, warmup)
                return lockstep(iterators, seconds)

            # Alternate which goes first; the split is the one measured in the latest even phase.
            if split is None or round_ % 2 == 0:
                even, needs = measure_even()
                split = used = split_across_ranks(allocation, needs)
                measured = measure_split(used)
            else:
                used = split
                measured = measure_split(used)
                even, needs = measure_even()
                split = split_across_ranks(allocation, needs)
            rows.append(
                {
                    "even_samples_per_s": round(even, 1),
                    "measured_samples_per_s": round(measured, 1),
                    "ratio": round(measured / even, 3),
                    "needs": {r: {k: round(v, 2) for k, v in n.items()} for r, n in needs.items()},
                    "split": used,
                }
            )
            print(
                f"even {even:8.1f} samples/s   measured {measured:8.1f} samples/s   "
                f"ratio {measured / even:5.2f}   split {used}",
                flush=True,
            )
    finally:
        for pipeline in pipelines:
            pipeline.stop()
    return {
        "light_ms": light_ms,
        "heavy_ms": heavy_ms,
        "workers_per_rank": workers,
        "seconds": seconds,
        "rounds": rows,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
    }


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the median ratio, write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--light-ms", type=float, default=10.0, help="rank 0's fetch per item")
    parser.add_argument("--heavy-ms", type=float, default=30.0, help="rank 1's fetch per item")
    parser.add_argument("--workers", type=int, default=4, help="fetch threads per rank")
    parser.add_argument("--seconds", type=float, default=3.0, help="each measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = run(args.light_ms, args.heavy_ms, args.workers, args.seconds, args.rounds)
    print(f"median ratio, measured split / even split: {result['median_ratio']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
