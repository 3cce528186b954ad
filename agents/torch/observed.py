"""torch's own DataLoader, measured for the control plane: what ``intune-run`` does with the
loader of an ``IterableDataset`` read by several workers.

torch splits such a dataset among its workers by their ids: worker ``i`` of ``n`` reads its
share (``get_worker_info()``), so the number of workers decides what each one reads, and
changing it in the middle of an epoch would read items twice or never. ``intune-run`` keeps
that loader torch's own, with torch's workers. It is still, as a rule, the training set's
loader of a streaming job, and whether the trainer waits for it is the first thing a team
wants to see. So it is observed: the agent reports it as one stage, ``read+collate``, of
``num_workers`` workers (torch's, their CPU, run-queue delay and own memory read from their
processes), and the trainer's samples/s and waiting (the time spent in ``next()``), as for a
loader it tunes. The stage allows exactly ``num_workers`` workers: an allocation asking for
another number is refused, with that reason, and changes nothing.

What is read of torch's iterator is its ``_workers`` (the worker processes), as torch has kept
it since 1.x; without it the stage reports no worker figures, and training goes on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import torch.utils.data

from agents.pipeline.errors import AllocationError
from agents.pipeline.pipeline import Readings, anonymous_memory, process_readings, usage_since
from agents.torch.loader import _ConsumerStats

#: The one stage an observed loader reports: torch's workers read and collate.
STAGE = "read+collate"

_TORCH = torch.utils.data.DataLoader

log = logging.getLogger("agents.autorun")

#: Called with the loader as each of its iterations starts (``intune-run`` sets it to its
#: choice of the loader to attach: ``agents.torch.auto``); ``None``: nothing is called.
on_iteration: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class ObservedStage:
    """The stage as the agent's checks see it: process workers, exactly ``max_workers``."""

    name: str
    max_workers: int
    kind: str = "process"

    @property
    def ceiling(self) -> int:
        return self.max_workers


class ObservedDataLoader(_TORCH):
    """torch's ``DataLoader``, unchanged in what it loads, that answers ``agents.attach`` with
    what it can say: its workers' figures and the training loop's (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._observed = _Observation(self)

    def __reduce__(self) -> tuple:
        # Copied or pickled as torch's is, by this module's function: the class goes by torch's
        # name, which pickle would look up and find another class under. The copy's figures
        # start anew.
        state = {k: v for k, v in self.__dict__.items() if k != "_observed"}
        return _rebuilt, (state,)

    # -- what agents.attach reads ------------------------------------------------------

    @property
    def stage_names(self) -> list[str]:
        return [STAGE]

    @property
    def stages(self) -> list[ObservedStage]:
        return [ObservedStage(STAGE, self.num_workers)]

    @property
    def allocation(self) -> dict[str, int]:
        return {STAGE: self.num_workers}

    def check(self, allocation: dict[str, int]) -> list[str]:
        """What is wrong with ``allocation`` (empty: nothing): any other number of workers."""
        asked = dict(allocation)
        if asked == self.allocation:
            return []
        return [
            f"torch's DataLoader of an IterableDataset keeps its num_workers={self.num_workers} "
            f"workers (each reads its share by its worker id; another number would read items "
            f"twice or never): asked {asked}"
        ]

    def apply(self, allocation: dict[str, int]) -> None:
        problems = self.check(allocation)
        if problems:
            raise AllocationError("; ".join(problems))

    def metrics(self) -> list[dict[str, Any]]:
        return [self._observed.row()]

    def consumer_stats(self) -> dict[str, Any]:
        return self._observed.consumer_stats()

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Any:
        if on_iteration is not None:
            try:
                on_iteration(self)
            except Exception:  # noqa: BLE001 - observing never stops training
                log.exception("intune-run: choosing the loader to tune failed; training goes on")
        iterator = super().__iter__()
        self._observed.started(iterator)
        return _TimedIterator(iterator, self._observed)


def _rebuilt(state: dict[str, Any]) -> ObservedDataLoader:
    """An observed loader from a copy's state (``ObservedDataLoader.__reduce__``)."""
    loader = ObservedDataLoader.__new__(ObservedDataLoader)
    loader.__dict__.update(state)  # torch's __setattr__ refuses some names once initialized
    loader.__dict__["_observed"] = _Observation(loader)
    return loader


ObservedDataLoader.__name__ = ObservedDataLoader.__qualname__ = "DataLoader"
ObservedDataLoader.__module__ = "torch.utils.data.dataloader"


class _TimedIterator:
    """torch's iterator, with the training loop's waiting counted: the time in ``next()``."""

    def __init__(self, iterator: Any, observation: _Observation) -> None:
        self._iterator = iterator
        self._observation = observation

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        stats = self._observation
        stats.waiting()
        try:
            batch = next(self._iterator)
        except BaseException:
            stats.taken(None)
            raise
        stats.taken(batch)
        return batch

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        # torch's iterator's own attributes (``_num_yielded``, ``_dataset``, ...), for code
        # that reads them.
        return getattr(self._iterator, name)


class _Observation:
    """The figures of one observed loader, over every epoch: what the training loop waited
    and took, and its workers' processes (each epoch's, or the persistent ones)."""

    def __init__(self, loader: ObservedDataLoader) -> None:
        self._loader = weakref.ref(loader)
        self._lock = threading.Lock()
        self._iterators: weakref.WeakSet = weakref.WeakSet()
        self._inherited = 0.0  # the training process's anonymous memory when workers forked
        self._seen: Readings = {}  # the workers' last CPU and run-queue readings
        self._processes: dict[int, psutil.Process] = {}
        self._metrics_at = time.monotonic()
        self._batches_since_row = 0
        self._stats = _ConsumerStats()  # the training loop's, as agents.torch.DataLoader's

    # -- the training loop -----------------------------------------------------------------

    def started(self, iterator: Any) -> None:
        """An iteration began on ``iterator`` (a persistent loader's is the same each epoch):
        its workers were forked now, mapping what the training process holds."""
        with self._lock:
            if iterator in self._iterators:
                return
            self._iterators.add(iterator)
        with contextlib.suppress(psutil.Error):
            self._inherited = anonymous_memory(psutil.Process().memory_info())

    def waiting(self) -> None:
        self._stats.waiting()

    def taken(self, batch: Any) -> None:
        if batch is None:
            self._stats.taken(0, batch=False)
            return
        self._stats.taken(self._samples_in(batch))
        with self._lock:
            self._batches_since_row += 1

    def _samples_in(self, batch: Any) -> int:
        """The samples of a batch: the first dimension of its first tensor, else the loader's
        batch size (1 without auto-batching)."""
        found = _first_tensor(batch, depth=0)
        if found is not None and found.dim() > 0:
            return int(found.shape[0])
        loader = self._loader()
        return int(getattr(loader, "batch_size", None) or 1)

    def consumer_stats(self) -> dict[str, Any]:
        """The training loop since the previous read (``Pipeline.consumer_stats``'s keys)."""
        return self._stats.read()

    # -- the workers -----------------------------------------------------------------------

    def _worker_pids(self) -> list[int]:
        with self._lock:
            iterators = list(self._iterators)
        pids = []
        for iterator in iterators:
            for worker in list(getattr(iterator, "_workers", None) or []):
                pid = getattr(worker, "pid", None)
                if isinstance(pid, int):
                    pids.append(pid)
        return pids

    def row(self) -> dict[str, Any]:
        """The stage's figures since the previous call (``Pipeline.metrics``'s keys). Busy is
        the CPU the workers used or waited for, per worker: a worker that waits on storage
        reads as less busy than it is."""
        loader = self._loader()
        workers = int(getattr(loader, "num_workers", 0) or 0)
        now = time.monotonic()
        with self._lock:
            wall = max(now - self._metrics_at, 1e-9)
            self._metrics_at = now
            batches, self._batches_since_row = self._batches_since_row, 0
        processes = []
        for pid in self._worker_pids():
            try:
                processes.append(self._processes.get(pid) or psutil.Process(pid))
            except psutil.Error:
                continue
        self._processes = {process.pid: process for process in processes}
        current, rss = process_readings(processes, self._seen, self._inherited)
        cpu_s, runqueue_s = usage_since(self._seen, current)
        self._seen = current
        queue = max(1, (getattr(loader, "prefetch_factor", None) or 2) * max(1, workers))
        busy = (cpu_s + runqueue_s) / wall / workers if workers else 0.0
        return {
            "name": STAGE,
            "workers": workers,
            "items_per_s": batches / wall,
            "busy_fraction": min(1.0, max(0.0, busy)),
            "in_queue": 0,
            "out_queue": 0,
            "queue_capacity": queue,
            "cpu_percent": 100.0 * cpu_s / wall,
            "fn_cpu_percent": 100.0 * cpu_s / wall,
            "runqueue_percent": 100.0 * runqueue_s / wall,
            "rss_mb": rss / 2**20,
        }


def _first_tensor(value: Any, depth: int) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if depth > 3:
        return None
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None
