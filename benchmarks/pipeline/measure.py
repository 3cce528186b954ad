"""The pipeline benchmarks: scaling with cores, DataLoader side by side, resize latency.

Each function runs real pipelines on real cores (restricted with ``sched_setaffinity``; the
workers inherit it) and returns plain dicts, so the command can print, save and document them.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agents.budget import cpu_slots
from agents.dlrm import build_pipeline
from agents.dlrm.generate import load_index
from agents.dlrm.stages import Transform, chunk_tasks, collate, parse, read
from agents.pipeline import Pipeline, Stage, consume_until, fuse_groups, heap

PROCESS_STAGES = ["read", "parse", "transform", "collate"]

# The stage layouts the scaling benchmark tries: one process per stage, two fused halves, and
# every step in one worker (the layout of DataLoader's workers). None: no fusion.
LAYOUTS: dict[str, str | None] = {
    "staged": None,
    "halves": "read+parse,transform+collate",
    "fused": "read+parse+transform+collate",
}


def layout_stages(fuse: str | None) -> list[str]:
    """The process stages of the DLRM pipeline under a fusion layout."""
    return [s.name for s in fuse_groups([Stage(n, str) for n in PROCESS_STAGES], fuse)]


def default_core_counts(cores: int) -> list[int]:
    """Every count up to 4 cores, then doubling, and ``cores`` itself: a geometric few on a
    big host (each count costs a climb per layout)."""
    counts = list(range(1, min(cores, 4) + 1))
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    return sorted(set(counts + [cores]))


@contextmanager
def on_cores(cores: list[int]) -> Iterator[None]:
    """Run the block (and every process it forks) on ``cores`` only."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def consume_rate(batches: Iterator[Any], seconds: float, warmup: float) -> float:
    """Batches per second a consumer that discards them gets, after a warm-up."""
    end_warm = time.monotonic() + warmup
    for _ in batches:
        if time.monotonic() >= end_warm:
            break
    count, began = 0, time.monotonic()
    for _ in batches:
        count += 1
        if time.monotonic() - began >= seconds:
            break
    return count / (time.monotonic() - began)


def sequential_rate(data_dir: Path, seconds: float, table_sizes: Any = None) -> float:
    """Batches per second of the whole preprocessing in one loop in this process."""
    tasks = chunk_tasks(data_dir, load_index(data_dir))
    transform = Transform(tuple(table_sizes)) if table_sizes else Transform()

    def endless() -> Iterator[Any]:
        while True:
            for task in tasks:
                yield collate(transform(parse(read(task))))

    return consume_rate(endless(), seconds, warmup=min(1.0, seconds / 3))


def _one_worker(data_dir: Path, seconds: float, core: int, keep_heap: bool, out: Any) -> None:
    os.sched_setaffinity(0, [core])
    torch.set_num_threads(1)
    if keep_heap:
        heap.keep_freed_memory()
    out.put(sequential_rate(data_dir, seconds))


def one_worker_rate(data_dir: Path, seconds: float, core: int, keep_heap: bool = True) -> float:
    """Batches per second of one worker: the whole preprocessing in one loop, on one core,
    in a fresh process set up as the pipeline sets up its workers (one torch thread, the
    heap kept): the ideal's unit, free of any hand-off."""
    context = multiprocessing.get_context("fork")
    out = context.SimpleQueue()
    worker = context.Process(target=_one_worker, args=(data_dir, seconds, core, keep_heap, out))
    worker.start()
    worker.join()
    if worker.exitcode != 0:
        raise RuntimeError(f"the one-worker measurement exited with code {worker.exitcode}")
    return out.get()


def pipeline_rate(
    data_dir: Path,
    batch_size: int,
    allocation: dict[str, int],
    seconds: float,
    warmup: float,
    fuse: str | None = None,
) -> tuple[float, list[dict]]:
    """Batches per second of the DLRM pipeline (fused as ``fuse`` says) at ``allocation``,
    and its stage metrics."""
    pipeline = build_pipeline(data_dir, batch_size=batch_size, workers=allocation, fuse=fuse)
    with pipeline:
        batches = iter(pipeline)
        rate = consume_rate(batches, seconds, warmup)
        metrics = pipeline.metrics()
    return rate, metrics


def best_allocation(
    data_dir: Path,
    batch_size: int,
    cores: int,
    seconds: float,
    warmup: float,
    log: Callable[[str], None],
    fuse: str | None = None,
) -> dict[str, Any]:
    """Climb from one worker per stage, adding a worker to the busiest stage each step.

    The best allocation found for ``cores`` cores under a fusion layout, with every
    allocation tried (as tf.data's autotuner and our ``hillclimb`` baseline do, but
    measured, not modelled). With more than two cores the climb does not start from one
    worker per stage but from the cores shared in proportion to each stage's busy time at
    one worker each (Plumber's first estimate), so a many-core host is not climbed one
    worker at a time.
    """
    stages = layout_stages(fuse)
    allocation = {name: 1 for name in stages}
    tried = []
    best: dict[str, Any] | None = None
    budget = cpu_slots(cores, len(stages))  # the agent's default budget, less prefetch
    jumped = False
    while True:
        rate, metrics = pipeline_rate(data_dir, batch_size, allocation, seconds, warmup, fuse)
        tried.append({"fuse": fuse, "allocation": dict(allocation), "batches_per_s": rate})
        log(f"  {cores} core(s) {allocation}: {rate * batch_size:,.0f} samples/s")
        busy = {m["name"]: m["busy_fraction"] for m in metrics if m["name"] in allocation}
        if best is None or rate > best["batches_per_s"]:
            best = tried[-1]
        elif rate < 0.97 * best["batches_per_s"] and not jumped:
            break  # one more worker made it worse: the cores are used up
        if sum(allocation.values()) >= budget:
            break
        if len(tried) == 1 and cores > 2 and len(stages) > 1:
            allocation = proportional_allocation(busy, cores)
            jumped = True
            continue
        jumped = False
        allocation[max(busy, key=busy.get)] += 1
    return {"best": best, "tried": tried}


def proportional_allocation(busy: dict[str, float], cores: int) -> dict[str, int]:
    """``cores`` workers shared in proportion to each stage's busy fraction at one worker
    each (which, with the same items through every stage, is in proportion to its cost per
    item); every stage keeps at least one."""
    total = sum(busy.values()) or 1.0
    return {name: max(1, round(cores * share / total)) for name, share in busy.items()}


def scaling(
    data_dir: Path,
    batch_size: int,
    cores: list[int],
    seconds: float,
    warmup: float,
    log: Callable[[str], None],
    rounds: int = 2,
    core_counts: list[int] | None = None,
) -> dict[str, Any]:
    """Best samples/s for 1..N cores (or the ``core_counts`` given), over every layout,
    against N x one worker's rate.

    For each core count the best layout and allocation of the climbs is measured again,
    alternately with one worker on one core (``rounds`` times each), so that a drift of a
    shared machine's speed falls on both sides of the ratio. Each layout's best from its
    climb is kept too, so the cost of keeping every stage apart shows.
    """
    first = one_worker_rate(data_dir, seconds, cores[0])
    log(f"one worker, one core: {first * batch_size:,.0f} samples/s")
    units, rows = [first], []
    for n in core_counts or range(1, len(cores) + 1):
        per_layout, tried = {}, []
        for layout, fuse in LAYOUTS.items():
            log(f"  layout {layout}")
            with on_cores(cores[:n]):
                found = best_allocation(data_dir, batch_size, n, seconds, warmup, log, fuse)
            per_layout[layout] = found["best"]
            tried += found["tried"]
        layout = max(per_layout, key=lambda name: per_layout[name]["batches_per_s"])
        allocation, fuse = per_layout[layout]["allocation"], LAYOUTS[layout]
        ones, ours = [], []
        for _ in range(rounds):
            ones.append(one_worker_rate(data_dir, seconds, cores[0]))
            with on_cores(cores[:n]):
                ours.append(
                    pipeline_rate(data_dir, batch_size, allocation, seconds, warmup, fuse)[0]
                )
            log(
                f"  again: one worker {ones[-1] * batch_size:,.0f}, {layout} {allocation} on "
                f"{n} core(s) {ours[-1] * batch_size:,.0f} samples/s"
            )
        units += ones
        one, rate = statistics.mean(ones), statistics.mean(ours)
        rows.append(
            {
                "cores": n,
                "layout": layout,
                "fuse": fuse,
                "allocation": allocation,
                "samples_per_s": rate * batch_size,
                "one_worker_samples_per_s": one * batch_size,
                "ideal_samples_per_s": n * one * batch_size,
                "of_ideal": rate / (n * one),
                "of_ideal_by_layout": {
                    name: best["batches_per_s"] / (n * first) for name, best in per_layout.items()
                },
                "tried": tried,
            }
        )
    return {"one_worker_samples_per_s": statistics.mean(units) * batch_size, "rows": rows}


class _ChunkDataset:
    """The same preprocessing as the pipeline, as a map-style dataset for DataLoader."""

    def __init__(self, data_dir: Path, length: int) -> None:
        self.tasks = chunk_tasks(data_dir, load_index(data_dir))
        self.transform = Transform()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return collate(self.transform(parse(read(self.tasks[i % len(self.tasks)]))))


def _keep_heap(worker_id: int) -> None:
    heap.keep_freed_memory()


def dataloader_rate(
    data_dir: Path, workers: int, seconds: float, warmup: float, keep_heap: bool = True
) -> float:
    """Batches per second of ``torch.utils.data.DataLoader`` with ``workers`` workers.

    ``keep_heap`` gives its workers the heap setting the pipeline's workers have (through
    ``worker_init_fn``), so that the comparison is of the two runtimes, not of allocators.
    """
    import warnings

    from torch.utils.data import DataLoader

    # We try one worker more than cores on purpose, as for the pipeline's budget.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    loader = DataLoader(
        _ChunkDataset(data_dir, 10**7),
        batch_size=None,
        num_workers=workers,
        prefetch_factor=4,
        persistent_workers=False,
        worker_init_fn=_keep_heap if keep_heap else None,
    )
    batches = iter(loader)
    try:
        return consume_rate(batches, seconds, warmup)
    finally:
        batches._shutdown_workers()


def against_dataloader(
    data_dir: Path,
    batch_size: int,
    cores: list[int],
    allocation: dict,
    seconds: float,
    warmup: float,
    log: Callable[[str], None],
    fuse: str | None = None,
) -> dict:
    """The pipeline at a fixed allocation and DataLoader at its best num_workers, same cores,
    measured alternately (twice each) so a shared machine's load falls on both alike.

    DataLoader's workers get the pipeline workers' heap setting; it is also measured once
    as it comes (the allocator's defaults), for reference.
    """
    with on_cores(cores):
        loader = {}
        for workers in range(1, len(cores) + 2):
            loader[workers] = dataloader_rate(data_dir, workers, seconds, warmup)
            log(
                f"  DataLoader num_workers={workers}: {loader[workers] * batch_size:,.0f} samples/s"
            )
        best_workers = max(loader, key=loader.get)
        ours, theirs = [], [loader[best_workers]]
        for _ in range(2):
            ours.append(pipeline_rate(data_dir, batch_size, allocation, seconds, warmup, fuse)[0])
            log(f"  pipeline {allocation}: {ours[-1] * batch_size:,.0f} samples/s")
            if len(theirs) < 2:
                theirs.append(dataloader_rate(data_dir, best_workers, seconds, warmup))
                log(
                    f"  DataLoader num_workers={best_workers}: "
                    f"{theirs[-1] * batch_size:,.0f} samples/s"
                )
        as_shipped = dataloader_rate(data_dir, best_workers, seconds, warmup, keep_heap=False)
        log(
            f"  DataLoader num_workers={best_workers}, allocator defaults: "
            f"{as_shipped * batch_size:,.0f} samples/s"
        )
    pipeline_sps = statistics.mean(ours) * batch_size
    loader_sps = statistics.mean(theirs) * batch_size
    return {
        "cores": len(cores),
        "fuse": fuse,
        "allocation": allocation,
        "pipeline_samples_per_s": pipeline_sps,
        "dataloader_num_workers": best_workers,
        "dataloader_samples_per_s": loader_sps,
        "dataloader_sweep": {w: r * batch_size for w, r in loader.items()},
        "ratio": pipeline_sps / loader_sps,
        "dataloader_default_heap_samples_per_s": as_shipped * batch_size,
        "ratio_to_default_heap": pipeline_sps / (as_shipped * batch_size),
    }


def resize_latency(
    data_dir: Path, batch_size: int, resizes: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Time from ``apply()`` (one more parse worker) to the new worker's first output."""
    latencies = []
    pipeline = build_pipeline(data_dir, batch_size=batch_size, queue_size=8)
    stop = threading.Event()

    with pipeline:
        consumer = threading.Thread(target=consume_until, args=(pipeline, stop), daemon=True)
        consumer.start()
        time.sleep(1.0)
        for _ in range(resizes):
            pipeline.apply({"parse": 2})
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                latency = pipeline.last_resize()["latency_s"]
                if latency is not None:
                    latencies.append(latency)
                    break
                time.sleep(0.002)
            pipeline.apply({"parse": 1})
            time.sleep(0.2)
        stop.set()
    latencies.sort()
    log(f"  {len(latencies)} resizes: p50 {statistics.median(latencies) * 1000:.0f} ms")
    return {
        "resizes": len(latencies),
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[max(0, round(0.95 * len(latencies)) - 1)],
        "max_s": latencies[-1],
    }


def sampling_cost(pipeline: Pipeline, calls: int = 30) -> dict[str, float]:
    """CPU time of one ``metrics()`` + ``consumer_stats()`` sample, what an agent pays each
    interval, as a share of one core at 1 Hz."""
    began = time.thread_time()
    for _ in range(calls):
        pipeline.metrics()
        pipeline.consumer_stats()
    per_call = (time.thread_time() - began) / calls
    return {"cpu_ms_per_sample": per_call * 1000, "core_percent_at_1hz": per_call * 100}
