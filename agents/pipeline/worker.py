"""The loop every stage worker runs, in a process or in a thread.

A worker takes ``(seq, item)`` from its stage's input queue, applies the stage's function and
puts ``(seq, result)`` on the output queue. It leaves only between items, when its own retire
flag is set (a live resize) or the pipeline's stop flag is set, so an item it took is never
lost. Its counters live in a shared array the pipeline reads for metrics.
"""

from __future__ import annotations

import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.pipeline import heap, shm

# How often a waiting worker looks at its retire and stop flags. It bounds how long a retired
# worker lingers, not how fast items flow (a waiting get() returns as soon as an item comes).
POLL_S = 0.02

# Per-worker counters in the stage's shared array, at slot * WIDTH + field.
ITEMS, BUSY_S, FIRST_OUTPUT_AT, WIDTH = 0, 1, 2, 3


@dataclass
class Failure:
    """An item a stage (or the source) raised on; it flows on to the consumer, in order."""

    stage: str
    error: str
    traceback_text: str


@dataclass
class WorkerSpec:
    """What one worker needs; the same object drives a process or a thread worker."""

    stage: str
    fn: Callable[[Any], Any]
    in_queue: Any
    out_queue: Any
    retire: Any  # threading.Event or multiprocessing.Event
    stop: Any  # the pipeline's stop flag
    counters: Any  # shared array of doubles
    slot: int
    in_process: bool
    pack_prefix: str | None  # shared-memory prefix, or None to send results by pickle
    shm_min_bytes: int
    cpu_affinity: list[int] | None
    parent_pid: int
    keep_heap: bool = True  # see agents.pipeline.heap


def run_worker(spec: WorkerSpec) -> None:
    """Serve items until retired or stopped (the target of every worker)."""
    if spec.in_process:
        _settle_process(spec)
    try:
        _serve(spec)
    finally:
        if spec.in_process:
            shm.release_pool()
            if os.getppid() != spec.parent_pid and spec.pack_prefix is not None:
                # The pipeline's process died: nobody will read what is in flight.
                shm.sweep(spec.pack_prefix)
        if spec.in_process and (spec.stop.is_set() or os.getppid() != spec.parent_pid):
            # A stopped pipeline discards what is in flight: do not block exit flushing it.
            # A retired worker, on the contrary, flushes its last result before it exits.
            spec.out_queue.cancel_join_thread()


def _serve(spec: WorkerSpec) -> None:
    base = spec.slot * WIDTH
    counters = spec.counters
    while not (spec.retire.is_set() or spec.stop.is_set()):
        try:
            seq, payload = spec.in_queue.get(timeout=POLL_S)
        except queue.Empty:
            if spec.in_process and os.getppid() != spec.parent_pid:
                return  # the pipeline's process died: do not linger as an orphan
            continue
        started = time.perf_counter()
        if isinstance(payload, Failure):
            result = payload
        else:
            try:
                item = shm.unpack(payload) if isinstance(payload, shm.SharedPacket) else payload
                result = spec.fn(item)
                if spec.pack_prefix is not None:
                    result = shm.pack(result, spec.pack_prefix, spec.shm_min_bytes)
            except Exception as exc:  # the consumer gets it, in order, as StageFailed
                result = Failure(spec.stage, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        counters[base + BUSY_S] += time.perf_counter() - started
        if not _put(spec, (seq, result)):
            return
        counters[base + ITEMS] += 1
        if counters[base + FIRST_OUTPUT_AT] == 0.0:
            counters[base + FIRST_OUTPUT_AT] = time.time()


def _put(spec: WorkerSpec, message: tuple[int, Any]) -> bool:
    """Put a result downstream, waiting for room; give up only when the pipeline stops."""
    while True:
        try:
            spec.out_queue.put(message, timeout=POLL_S)
            return True
        except queue.Full:
            if spec.stop.is_set() or (spec.in_process and os.getppid() != spec.parent_pid):
                if isinstance(message[1], shm.SharedPacket):
                    shm.discard(message[1])
                return False


def _settle_process(spec: WorkerSpec) -> None:
    """Prepare a freshly started worker process: threads, CPUs, and a quiet exit."""
    torch = sys.modules.get("torch")
    if torch is not None:
        # As DataLoader does: one intra-op thread per worker, or workers fight over the cores.
        torch.set_num_threads(1)
    if spec.keep_heap:
        heap.keep_freed_memory()
    if spec.cpu_affinity:
        try:
            os.sched_setaffinity(0, spec.cpu_affinity)
        except (AttributeError, OSError):
            pass
