"""A stage: a named function applied to every item by its own pool of workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# A stage with no declared ceiling may still not grow past this: it bounds the per-worker
# counters the runtime keeps in shared memory.
HARD_MAX_WORKERS = 128


@dataclass
class Stage:
    """One step of a pipeline.

    ``fn`` maps one item to one item; it should not depend on the order in which items reach
    it (workers run side by side, as with DataLoader workers).

    - ``workers``: initial worker count; ``apply()`` changes it live.
    - ``kind``: ``"process"`` (default; the work runs outside the consumer's GIL) or
      ``"thread"`` (for I/O-bound stages, or cheap ones whose output is big).
    - ``max_workers``: the most workers this stage may have (``None``: 128).
    - ``ordered``: whether the stage keeps its items in order. When every stage is ordered the
      consumer receives items in source order; otherwise in completion order.
    - ``cpu_affinity``: the CPUs this stage's workers run on; ``None`` leaves it to the
      pipeline's ``pin_cpus`` option (or to the operating system).
    - ``shared_memory``: move this stage's results to the next process through shared memory
      (process stages only; results under ``shm_min_bytes`` still go by pickle).
    - ``init``: called once in every worker, before its first item, with the worker's slot
      (a small integer, unique among the stage's live workers), as DataLoader's
      ``worker_init_fn``; if it raises, every item that worker takes fails with its error.
    """

    name: str
    fn: Callable[[Any], Any]
    workers: int = 1
    kind: Literal["process", "thread"] = "process"
    max_workers: int | None = None
    ordered: bool = True
    cpu_affinity: Sequence[int] | None = None
    shared_memory: bool = True
    shm_min_bytes: int = 64 * 1024
    init: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a stage needs a non-empty name")
        if self.kind not in ("process", "thread"):
            raise ValueError(
                f"stage '{self.name}' has kind {self.kind!r}; use 'process' or 'thread'"
            )
        if self.max_workers is not None and not 1 <= self.max_workers <= HARD_MAX_WORKERS:
            raise ValueError(
                f"stage '{self.name}' has max_workers={self.max_workers}; "
                f"use a number from 1 to {HARD_MAX_WORKERS}"
            )
        if not isinstance(self.workers, int) or not 1 <= self.workers <= self.ceiling:
            raise ValueError(
                f"stage '{self.name}' starts with {self.workers} workers; "
                f"use a number from 1 to {self.ceiling}"
            )

    @property
    def ceiling(self) -> int:
        """The most workers this stage may have."""
        return self.max_workers if self.max_workers is not None else HARD_MAX_WORKERS
