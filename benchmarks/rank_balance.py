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

``--drift`` measures the host agent's re-split on a timer (``HostPipelines.rebalance``) through
the real code: both ranks attach over a local socket to a ``HostPipelines`` (as in a torchrun
job), the allocation arrives while they measure alike (``--light-ms`` both) and is split evenly;
then rank 1's fetch slows to ``--heavy-ms``. Each round measures, in turn first, the split the
allocation got (even: what the host ran before rebalancing existed) and the split the host
agent moves to once the ranks have reported the drift.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from agents.budget import rank_need, split_across_ranks
from agents.daemon.ranks import HostPipelines, RankLink, StageInfo, bind_listener, socket_address
from agents.pipeline import Pipeline, Stage


class Wait:
    """A stage function that waits ``ms`` per item (a read from a store), then passes it on."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, item: int) -> int:
        """Return ``item`` after ``ms`` milliseconds."""
        time.sleep(self.ms / 1000.0)
        return item


def rank_pipeline(fetch_ms: float, workers: int, fetch: Wait | None = None) -> Pipeline:
    """One rank's input pipeline: ``fetch`` (``workers`` threads, ``fetch_ms`` a record, or
    ``fetch`` when given) then ``decode`` (1 ms)."""
    return Pipeline(
        iter(range(10**12)),
        [
            Stage("fetch", fetch or Wait(fetch_ms), workers=workers, kind="thread", max_workers=64),
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


def run_drift(light_ms: float, heavy_ms: float, workers: int, seconds: float, rounds: int) -> dict:
    """Even split against the host agent's rebalance after rank 1 slowed, ``rounds`` times."""
    allocation = {"fetch": workers, "decode": 1}
    fetches = [Wait(light_ms), Wait(light_ms)]
    pipelines = [rank_pipeline(light_ms, workers, fetch) for fetch in fetches]
    for pipeline in pipelines:
        pipeline.start()
    iterators = [iter(p) for p in pipelines]
    address = socket_address(f"@rank-balance-{os.getpid()}")
    interval = 0.5
    hub = HostPipelines(
        bind_listener(address),
        2,
        stages=[StageInfo("fetch", "thread", 64), StageInfo("decode", "thread", 64)],
        interval_s=interval,
        rebalance_s=None,  # called below, after the reports that show the drift
    ).start()
    links = [
        RankLink(p, rank, 2, address, trainer_stats=dict, interval_s=interval).start()
        for rank, p in enumerate(pipelines)
    ]
    warmup = min(1.0, seconds / 2)
    rows = []
    try:
        deadline = time.monotonic() + 10
        while len(hub.connected_ranks()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        lockstep(iterators, 4 * interval)  # both ranks report alike
        hub.apply(allocation)
        split_on_arrival = hub.rank_workers()
        fetches[1].ms = heavy_ms  # rank 1's records now cost more

        def measure_even() -> float:
            for pipeline in pipelines:
                pipeline.apply(allocation)
            lockstep(iterators, warmup)
            return lockstep(iterators, seconds)

        def measure_rebalanced() -> tuple[float, bool, dict]:
            for pipeline in pipelines:
                pipeline.apply(allocation)  # each round starts from the split on arrival
            lockstep(iterators, 3 * interval)  # reports that show the drift
            moved = hub.rebalance()
            used = hub.rank_workers()
            lockstep(iterators, warmup)
            return lockstep(iterators, seconds), moved, used

        for round_ in range(rounds):
            if round_ % 2 == 0:
                even = measure_even()
                rebalanced, moved, used = measure_rebalanced()
            else:
                rebalanced, moved, used = measure_rebalanced()
                even = measure_even()
            rows.append(
                {
                    "even_samples_per_s": round(even, 1),
                    "rebalanced_samples_per_s": round(rebalanced, 1),
                    "ratio": round(rebalanced / even, 3),
                    "moved": moved,
                    "split": used,
                }
            )
            print(
                f"even {even:8.1f} samples/s   rebalanced {rebalanced:8.1f} samples/s   "
                f"ratio {rebalanced / even:5.2f}   moved {moved}   split {used}",
                flush=True,
            )
    finally:
        for link in links:
            link.stop()
        hub.stop()
        for pipeline in pipelines:
            pipeline.stop()
    return {
        "mode": "drift",
        "light_ms": light_ms,
        "heavy_ms": heavy_ms,
        "workers_per_rank": workers,
        "seconds": seconds,
        "split_on_arrival": split_on_arrival,
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
    parser.add_argument(
        "--drift",
        action="store_true",
        help="rank 1 slows after the allocation arrived: even split against the host agent's "
        "rebalance (HostPipelines.rebalance)",
    )
    args = parser.parse_args(argv)
    measure = run_drift if args.drift else run
    result = measure(args.light_ms, args.heavy_ms, args.workers, args.seconds, args.rounds)
    which = "rebalanced" if args.drift else "measured split"
    print(f"median ratio, {which} / even split: {result['median_ratio']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
