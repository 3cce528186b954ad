"""The workers of one stage: start, retire, reap, and the counters they leave behind."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from agents.pipeline import shm
from agents.pipeline.stage import Stage
from agents.pipeline.worker import BUSY_S, FIRST_OUTPUT_AT, ITEMS, WIDTH, WorkerSpec, run_worker


@dataclass
class WorkerHandle:
    """One running (or retiring) worker of a stage."""

    slot: int
    handle: Any  # multiprocessing Process or threading.Thread
    retire: Any
    started_at: float
    pid: int | None = None
    native_id: int | None = None
    process: psutil.Process | None = field(default=None, repr=False)

    def alive(self) -> bool:
        """Say whether the worker is still running."""
        return self.handle.is_alive()


class StagePool:
    """Keeps a stage's worker count at its target while the pipeline runs.

    Growing starts workers at once; shrinking sets the retire flag of the newest workers, which
    leave after the item they hold, and are reaped later. Each worker owns one slot of a shared
    array of counters (items, busy seconds, time of first output); a slot is reused only after
    its previous owner exited, so counters only grow and per-interval figures are differences.
    """

    def __init__(
        self,
        stage: Stage,
        in_queue: Any,
        out_queue: Any,
        context: Any,
        stop: Any,
        pack_prefix: str | None,
        keep_heap: bool = True,
    ) -> None:
        self.stage = stage
        self.in_queue = in_queue
        self.out_queue = out_queue
        self.context = context
        self.stop_flag = stop
        self.pack_prefix = pack_prefix
        self.keep_heap = keep_heap
        # Room for a full pool and as many retiring workers again, twice over.
        self.slots = 4 * stage.ceiling
        self.counters = context.RawArray("d", self.slots * WIDTH)
        self.active: list[WorkerHandle] = []
        self.retiring: list[WorkerHandle] = []
        self.affinity: list[int] | None = list(stage.cpu_affinity) if stage.cpu_affinity else None
        self._worker_seconds = 0.0
        self._counted_at = time.monotonic()

    @property
    def target(self) -> int:
        """The worker count the stage runs at (retiring workers not included)."""
        return len(self.active)

    def resize(self, count: int) -> list[int]:
        """Grow or shrink to ``count`` workers; return the slots of the workers started."""
        self._account()
        self.reap()
        started = []
        while len(self.active) < count:
            started.append(self._start_worker().slot)
        while len(self.active) > count:
            worker = self.active.pop()
            worker.retire.set()
            self.retiring.append(worker)
        return started

    def _free_slot(self) -> int:
        used = {w.slot for w in self.active} | {w.slot for w in self.retiring}
        for slot in range(self.slots):
            if slot not in used:
                return slot
        # Every slot belongs to a live worker: wait for the retiring ones to leave.
        for worker in self.retiring:
            worker.handle.join()
        self.reap()
        return self._free_slot()

    def _start_worker(self) -> WorkerHandle:
        slot = self._free_slot()
        self.counters[slot * WIDTH + FIRST_OUTPUT_AT] = 0.0
        in_process = self.stage.kind == "process"
        retire = self.context.Event() if in_process else threading.Event()
        spec = WorkerSpec(
            stage=self.stage.name,
            fn=self.stage.fn,
            in_queue=self.in_queue,
            out_queue=self.out_queue,
            retire=retire,
            stop=self.stop_flag,
            counters=self.counters,
            slot=slot,
            in_process=in_process,
            pack_prefix=self.pack_prefix if in_process and self.stage.shared_memory else None,
            shm_min_bytes=self.stage.shm_min_bytes,
            cpu_affinity=self.affinity,
            parent_pid=os.getpid(),
            keep_heap=self.keep_heap,
        )
        name = f"intune-{self.stage.name}-{slot}"
        if in_process:
            handle = self.context.Process(target=run_worker, args=(spec,), name=name, daemon=True)
        else:
            handle = threading.Thread(target=run_worker, args=(spec,), name=name, daemon=True)
        handle.start()
        worker = WorkerHandle(slot, handle, retire, time.time())
        if in_process:
            worker.pid = handle.pid
            try:
                worker.process = psutil.Process(handle.pid)
            except psutil.Error:
                worker.process = None
        else:
            worker.native_id = handle.native_id
        self.active.append(worker)
        return worker

    def pin(self, cpus: list[int] | None) -> None:
        """Pin this stage's workers, now and future, to ``cpus`` (``None``: leave as is)."""
        if self.stage.cpu_affinity:
            cpus = list(self.stage.cpu_affinity)  # the stage's own choice wins
        self.affinity = cpus
        if not cpus or self.stage.kind != "process":
            return
        for worker in self.active:
            try:
                os.sched_setaffinity(worker.pid, cpus)
            except (OSError, AttributeError):
                pass  # it exited meanwhile, or the platform cannot pin

    def reap(self) -> None:
        """Forget retired workers that have exited."""
        still = []
        for worker in self.retiring:
            if worker.alive():
                still.append(worker)
            elif self.stage.kind == "process":
                worker.handle.join(0)
        self.retiring = still

    def first_outputs(self, slots: list[int]) -> list[float]:
        """The wall time each given slot's worker first produced an item (0.0: not yet)."""
        return [self.counters[s * WIDTH + FIRST_OUTPUT_AT] for s in slots]

    def totals(self) -> tuple[float, float]:
        """Items produced and busy seconds, summed over every worker this stage ever had."""
        items = sum(self.counters[s * WIDTH + ITEMS] for s in range(self.slots))
        busy = sum(self.counters[s * WIDTH + BUSY_S] for s in range(self.slots))
        return items, busy

    def _account(self) -> None:
        now = time.monotonic()
        self._worker_seconds += (now - self._counted_at) * len(self.active)
        self._counted_at = now

    def worker_seconds(self) -> float:
        """Seconds of worker time the stage had (its count integrated over time)."""
        self._account()
        return self._worker_seconds

    def processes(self) -> list[psutil.Process]:
        """The live worker processes (active and retiring), for CPU and memory figures."""
        return [w.process for w in self.active + self.retiring if w.process is not None]

    def thread_ids(self) -> list[int]:
        """The native thread ids of a thread stage's workers."""
        return [w.native_id for w in self.active + self.retiring if w.native_id is not None]

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop every worker; escalate to terminate, then kill, for any that do not leave."""
        workers = self.active + self.retiring
        self.active, self.retiring = [], []
        for worker in workers:
            worker.retire.set()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.handle.join(max(0.0, deadline - time.monotonic()))
        if self.stage.kind != "process":
            return  # a thread stuck inside fn cannot be killed; it is a daemon thread
        for worker in workers:
            if worker.handle.is_alive():
                worker.handle.terminate()
                worker.handle.join(0.5)
            if worker.handle.is_alive():
                worker.handle.kill()
                worker.handle.join(0.5)

    def discard_pending(self) -> None:
        """Empty the stage's input queue, dropping shared-memory results nobody will read."""
        _drain(self.in_queue)


def _drain(q: Any) -> None:
    while True:
        try:
            _, payload = q.get_nowait()
        except Exception:
            return
        if isinstance(payload, shm.SharedPacket):
            shm.discard(payload)
