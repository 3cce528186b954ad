"""The stage functions of ``agents.torch.DataLoader``, and what each worker does first.

Every item on the way through the pipeline is ``(epoch, samples, payload)``: the epoch it
belongs to (a persistent pipeline serves several, and drops what is left of an abandoned
one), how many samples it carries (for samples/s), and the payload: indices, then a list of
samples, then a batch. An ``EpochEnd`` payload marks the end of an epoch; it passes through
every stage untouched and tells the consumer to stop.

Payloads travel through the runtime's shared memory (``shm_min_bytes=1``); like every payload
of the runtime they never depend on the process that sent them (``agents.pipeline.shm``), and
their containers keep their exact types (named tuples, ``torch.Size``, ``OrderedDict``, ...).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Item = tuple[int, int, Any]


@dataclass(frozen=True)
class EpochEnd:
    """The payload that ends an epoch."""

    epoch: int


@dataclass
class WorkerSetup:
    """What a worker process does before its first item, as torch's DataLoader workers do:
    seed ``random``, torch and numpy from ``base_seed`` and the worker's id, set
    ``torch.utils.data.get_worker_info()``, then call ``worker_init_fn(worker_id)``.

    Worker ids come from ``counter`` (shared by the loader's worker processes, so every
    process gets its own id, a worker started by a live resize the next one); ``fixed_id``
    gives the same id to every worker of a stage instead (the reader of an iterable dataset
    is worker 0 of 1).
    """

    dataset: Any
    base_seed: int
    num_workers: int
    worker_init_fn: Callable[[int], None] | None = None
    counter: Any = None  # a multiprocessing.Value("i") shared by the loader's workers
    fixed_id: int | None = None
    _pid: int = field(default_factory=os.getpid)

    def ensure(self) -> None:
        """Set this process up once; nothing in the process that built the loader."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        worker_id, num_workers = self._identity()
        seed = self.base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        _seed_numpy(self.base_seed, worker_id)
        _set_worker_info(worker_id, num_workers, seed, self.dataset)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)

    def _identity(self) -> tuple[int, int]:
        if self.fixed_id is not None:
            return self.fixed_id, 1
        if self.counter is None:
            return 0, self.num_workers
        with self.counter.get_lock():
            worker_id = self.counter.value
            self.counter.value += 1
        return worker_id, self.num_workers


def _seed_numpy(base_seed: int, worker_id: int) -> None:
    try:
        import numpy as np
        from torch.utils.data._utils.worker import _generate_state
    except ImportError:  # pragma: no cover - numpy is a dependency; torch may move its helper
        return
    np.random.seed(_generate_state(base_seed, worker_id))


def _set_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer in this process as in torch's."""
    from torch.utils.data._utils import worker

    worker._worker_info = worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


@dataclass(frozen=True)
class Fetch:
    """Map-style access, as torch's fetcher does it: a list of samples for a list of indices
    (``dataset.__getitems__`` when the dataset has one), one sample without auto-batching."""

    dataset: Any
    batched: bool

    def __call__(self, indices: Any) -> Any:
        """Return the samples at ``indices``."""
        if not self.batched:
            return self.dataset[indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems:
            return getitems(indices)
        return [self.dataset[i] for i in indices]


@dataclass(frozen=True)
class Step:
    """One stage of the loader: ``fn`` on the payload (``per_sample``: on each sample of a
    batched payload), keeping the epoch and sample count; ``EpochEnd`` passes untouched."""

    fn: Callable[[Any], Any]
    setup: WorkerSetup
    per_sample: bool = False
    batched: bool = True

    def __call__(self, item: Item) -> Item:
        """Apply the step to one item."""
        epoch, samples, payload = item
        if isinstance(payload, EpochEnd):
            return item
        self.setup.ensure()
        if self.per_sample and self.batched:
            payload = [self.fn(sample) for sample in payload]
        else:
            payload = self.fn(payload)
        return epoch, samples, payload


class Read:
    """Iterable-style access: one worker iterates the dataset, as torch's fetcher does with
    ``num_workers=0`` (or 1): ``batch_size`` samples per item (fewer at the end, none with
    ``drop_last``), one sample per item without auto-batching. A new epoch (the item's tag)
    starts a new ``iter(dataset)``; an exhausted one answers ``EpochEnd``."""

    def __init__(
        self, dataset: Any, batch_size: int | None, drop_last: bool, setup: WorkerSetup
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.setup = setup
        self._epoch: int | None = None
        self._iterator: Any = None
        self._ended = False

    def __call__(self, tick: Item) -> Item:
        """Read the next item of the tick's epoch."""
        epoch = tick[0]
        self.setup.ensure()
        if epoch != self._epoch:
            self._epoch, self._ended = epoch, False
            self._iterator = iter(self.dataset)
        end = (epoch, 0, EpochEnd(epoch))
        if self._ended:
            return end
        if self.batch_size is None:
            try:
                return epoch, 1, next(self._iterator)
            except StopIteration:
                self._ended = True
                return end
        samples = list(itertools.islice(self._iterator, self.batch_size))
        if len(samples) < self.batch_size:
            self._ended = True
            if not samples or self.drop_last:
                return end
        return epoch, len(samples), samples


def stage_names(transforms: Any, reserved: Sequence[str]) -> list[tuple[str, Callable]]:
    """Name the functions of a ``transforms`` argument: a mapping's keys, else each
    function's ``__name__`` (``transform1``, ... for lambdas and the like), made unique."""
    if transforms is None:
        return []
    if callable(transforms):
        transforms = [transforms]
    if hasattr(transforms, "items"):
        pairs = [(str(name), fn) for name, fn in transforms.items()]
    else:
        pairs = []
        for i, fn in enumerate(transforms, 1):
            name = getattr(fn, "__name__", "")
            pairs.append((name if name.isidentifier() else f"transform{i}", fn))
    taken = set(reserved)
    named = []
    for name, fn in pairs:
        if not callable(fn):
            raise TypeError(f"transform {name!r} is {fn!r}; give a function of one sample/batch")
        if "+" in name or "," in name or not name:
            raise ValueError(f"transform name {name!r} may not be empty nor hold '+' or ','")
        unique, n = name, 2
        while unique in taken:
            unique, n = f"{name}_{n}", n + 1
        taken.add(unique)
        named.append((unique, fn))
    return named
