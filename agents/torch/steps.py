"""The stage functions of ``agents.torch.DataLoader``, and what each worker does first.

Every item on the way through the pipeline is ``(epoch, samples, payload, seed)``: the epoch
it belongs to (a persistent pipeline serves several, and drops what is left of an abandoned
one), how many samples it carries (for samples/s), the payload (indices, then a list of
samples, then a batch) and the batch's seed (see ``seed_generators``). An ``EpochEnd``
payload marks the end of an epoch; it passes through every stage untouched and tells the
consumer to stop.

Repeatable randomness. torch hands batch ``k`` to worker ``k % num_workers``, whose generators
were seeded ``base_seed + id``, so the draws of a seeded run repeat. Ours hand a batch to
whichever worker is free, and the tuner changes their number mid-epoch, so a worker's stream
says nothing about a batch. Instead every step sets its process's generators (torch's, the
``random`` module's, numpy's global one) before each batch, from the batch's own seed and the
step's place in the loader: the fold-in of tf.data's stateless random ops
(``tf.random.experimental.stateless_fold_in``), applied to the global generators that
datasets and transforms written for torch draw from. A batch's draws then depend on the
epoch's base seed and the batch's place only: not on which worker runs it, how many there are,
a resize, or which steps share a process (a step reseeds whether fused or not).

Payloads travel through the runtime's shared memory (``shm_min_bytes=1``); like every payload
of the runtime they never depend on the process that sent them (``agents.pipeline.shm``), and
their containers keep their exact types (named tuples, ``torch.Size``, ``OrderedDict``, ...).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from agents.process_lock import ProcessLock

Item = tuple[int, int, Any, int]

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
MASK63 = (1 << 63) - 1
BEGIN = MASK64  # in place of a batch's index: a reader's iter(dataset), before its batches
_GOLDEN = 0x9E3779B97F4A7C15
_NUMPY = 0x6E756D7079  # folded into numpy's seed: its legacy seeding is torch's mt19937 init


def _mix(value: int) -> int:
    """SplitMix64's finalizer: a 64-bit value whose every bit depends on every bit of ``value``."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def fold(seed: int, *data: int) -> int:
    """A 64-bit seed derived from ``seed`` and each of ``data`` in turn (a batch's index, a
    step's place): different data give unrelated seeds, the same data the same seed."""
    seed &= MASK64
    for datum in data:
        seed = _mix(seed ^ _mix((datum + _GOLDEN) & MASK64))
    return seed


def seed_generators(seed: int) -> None:
    """Set this process's global generators from one 64-bit seed: torch's CPU generator (what
    ``torch.initial_seed()`` answers), ``random``'s and, once numpy is imported (torch imports
    it when it can), ``numpy.random``'s. About 15 us (measured: torch's 1 us, ``random`` 8 us,
    numpy 3 us): ``torch.manual_seed`` would cost 150 us, for the lazy CUDA seeding it queues.

    numpy's legacy seeding of a 32-bit seed is the same mt19937 initialisation as torch's, so
    numpy gets a seed of its own (torch's workers use ``_generate_state`` for the same reason).
    """
    # 63 bits for torch's: a dataset that returns ``torch.initial_seed()`` has it collated
    # into an int64 tensor, which a seed of 2**63 or more overflowed ("Overflow when
    # unpacking long long", torch's test_worker_init_fn); torch's worker seeds are below it.
    torch.default_generator.manual_seed(seed & MASK63)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(fold(seed, _NUMPY) & MASK32)


@dataclass(frozen=True)
class EpochEnd:
    """The payload that ends an epoch; of an iterable dataset read by several readers, it
    ends ``reader``'s share only (the epoch ends when every reader's has)."""

    epoch: int
    reader: int = 0
    # Why the reader's share ended early ("": it did not): the reader replaced a dead one.
    # Carried by the end rather than raised, which the runtime may deliver after the end.
    error: str = ""


@dataclass(frozen=True)
class Skipped:
    """The payload a reader answers a tick with when it has answered a later one already:
    nothing. It passes through every stage untouched, and the consumer drops it.

    A reader answers a tick with its next batch (or its end), whatever the tick; batches
    reach the consumer in tick order. The ticks a dead reader held go back to the head of
    the inbox, and a live reader that took one after later ticks put its answer ahead of
    them: an end of share given there overtook the reader's last batches, and the epoch
    ended without them (row 38 of 3 readers' 40 rows in a CI run at load 15; with the dead
    reader's ticks handed on late, rows 9 to 39 of the live reader's share, 4 runs in 4)."""


@dataclass(frozen=True)
class SamplerFailed:
    """The payload in place of a batch whose indices the sampler raised on (in the loader's
    process): it passes through every stage untouched, and the consumer raises it, as
    torch's iterator raises the sampler's error in place of that batch."""

    error: str  # "Type: message"
    traceback_text: str
    error_type: str  # "module:qualname"


# The process that a WorkerSetup has set up (a forked child inherits its parent's pid here).
_set_up_in: int | None = None
# What worker_init_fn raised in this process (with the process's pid), raised again for
# every item it would serve (see WorkerSetup.ensure).
_init_failed: tuple[int, BaseException] | None = None


@dataclass
class WorkerSetup:
    """What a worker process does before its first item, as torch's DataLoader workers do:
    seed ``random``, torch and numpy from ``base_seed`` and the worker's id, set
    ``torch.utils.data.get_worker_info()``, then call ``worker_init_fn(worker_id)``.

    ``as_workers`` False (``num_workers=0``): torch loads in the training process, where
    ``get_worker_info()`` is ``None`` and ``worker_init_fn`` is never called; so here too,
    though our stages still run in worker processes (which are seeded all the same).

    ``repeatable``: every step then reseeds the generators before each batch
    (``seed_generators``, from the item's seed), after this setup: ``worker_init_fn`` and
    ``get_worker_info().seed`` see torch's per-worker seed, the batches their own.

    Worker ids come from ``counter`` (shared by the loader's worker processes, so every
    process gets its own id, a worker started by a live resize the next one); a reader of an
    iterable dataset passes its own id to ``ensure`` instead (reader ``i`` is worker ``i`` of
    ``num_workers``, as torch's worker ``i`` is).
    """

    dataset: Any
    base_seed: int
    num_workers: int
    worker_init_fn: Callable[[int], None] | None = None
    # An agents.process_lock.SharedCount shared by the loader's workers: a worker killed while
    # it takes its id cannot leave its lock held (a multiprocessing Value's lock it would, and
    # every later worker of the loader would wait on it for ever).
    counter: Any = None
    as_workers: bool = True
    repeatable: bool = False
    _pid: int = field(default_factory=os.getpid)

    def ensure(self, worker_id: int | None = None) -> None:
        """Set this process up once (as worker ``worker_id`` if given); nothing in the
        process that built the loader."""
        global _set_up_in, _init_failed
        if _init_failed is not None and _init_failed[0] == os.getpid():
            # torch never takes a batch from a worker whose worker_init_fn raised (it dies);
            # ours served the rest of its items without the user's setup.
            raise _init_failed[1].with_traceback(_init_failed[1].__traceback__)
        if self._pid == os.getpid() or _set_up_in == os.getpid():
            return
        # Once per process, whichever setup comes first: in a fused stage the reader's (its
        # worker id) comes before collate's, which must not give the process another id.
        self._pid = _set_up_in = os.getpid()
        if worker_id is None:
            worker_id, num_workers = self._identity()
        else:
            num_workers = self.num_workers
        seed = self.base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        _seed_numpy(self.base_seed, worker_id)
        if not self.as_workers:
            return
        _set_worker_info(worker_id, num_workers, seed, self.dataset)
        if self.worker_init_fn is not None:
            try:
                self.worker_init_fn(worker_id)
            except BaseException as exc:
                _init_failed = (os.getpid(), exc)
                raise

    def _identity(self) -> tuple[int, int]:
        if self.counter is None:
            return 0, self.num_workers
        return self.counter.add(1), self.num_workers


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
class PrivateCollate:
    """torch's ``default_collate`` with ``get_worker_info()`` hidden while it runs, so that it
    stacks each batch in the worker's own memory. In a worker it otherwise puts every batch
    in a new shared-memory segment of torch's (for torch's own result queue), which ours
    never use: the runtime ships results through ``agents.pipeline.shm``, which copies the
    batch once more and, where ``/dev/shm`` is full (Docker's 64 MiB), falls back to the
    worker's pipe; torch's segment instead raised "unable to allocate shared memory(shm)"
    there, every batch. Only torch's own collate is wrapped: a ``collate_fn`` of the user's
    sees ``get_worker_info()`` as in torch's workers."""

    fn: Callable[[Any], Any]

    def __call__(self, batch: Any) -> Any:
        from torch.utils.data._utils import worker

        info, worker._worker_info = worker._worker_info, None
        try:
            return self.fn(batch)
        finally:
            worker._worker_info = info


def own_collate(collate_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``collate_fn`` as the collate step runs it (``PrivateCollate`` for torch's own)."""
    if collate_fn is torch.utils.data.default_collate:
        return PrivateCollate(collate_fn)
    return collate_fn


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
    batched payload), keeping the epoch, sample count and seed; ``EpochEnd`` passes untouched.
    ``position``: the step's place in the loader (``fetch`` or ``read`` 0), folded into the
    batch's seed so that each step draws its own numbers whether fused or not."""

    fn: Callable[[Any], Any]
    setup: WorkerSetup
    per_sample: bool = False
    batched: bool = True
    position: int = 0

    def __call__(self, item: Item) -> Item:
        """Apply the step to one item."""
        epoch, samples, payload, seed = item
        if isinstance(payload, EpochEnd | SamplerFailed | Skipped):
            return item
        self.setup.ensure()
        if self.setup.repeatable:
            seed_generators(fold(seed, self.position))
        if self.per_sample and self.batched:
            payload = [self.fn(sample) for sample in payload]
        else:
            payload = self.fn(payload)
        return epoch, samples, payload, seed


# This process's slot in the ``read`` stage (``Stage.init`` sets it): which reader it is.
_reader_slot = 0


def set_reader_slot(slot: int) -> None:
    """The ``read`` stage's per-worker setup: remember which reader this process is."""
    global _reader_slot
    _reader_slot = slot


class Read:
    """Iterable-style access, as torch's workers read an ``IterableDataset``: each of
    ``readers`` worker processes iterates its own copy of the dataset as worker ``i`` of
    ``readers`` (``get_worker_info()``, so a dataset that splits its shards by it reads each
    shard once, and one that does not is read ``readers`` times, as with torch): ``batch_size``
    samples per item (fewer at the end of a reader's share, none with ``drop_last``), one
    sample per item without auto-batching. A new epoch (the tick's tag) starts a new
    ``iter(dataset)``; an exhausted reader answers ``EpochEnd(epoch, reader)``. A tick is
    ``(epoch, 0, number, epoch_seed)``, numbered within its epoch: a reader answers ticks in
    increasing order only, so its batches and its end reach the consumer in the order it read
    them; one that comes after a later one (a dead reader's, handed on) is answered ``Skipped``.

    Randomness (``setup.repeatable``): reader ``i`` sets the generators from
    ``fold(epoch_seed, i, BEGIN)`` before ``iter(dataset)`` (after ``worker_init_fn``, which
    sees torch's seed ``base_seed + i``), and from ``fold(epoch_seed, i, j)`` (step 0) before
    its ``j``-th batch of the epoch, whose seed it hands on with the batch to the steps after
    it. Reader ``i``'s draws so repeat whatever the interleaving of the readers, the resizes of
    the stages after it, and what is fused with it (the state a fused step left in the
    process, a persistent reader's next ``iter()`` included, is never drawn from).

    ``begun`` (a shared array, one entry per reader) records the last epoch each reader began:
    a reader process started again in the middle of an epoch (its predecessor died) cannot
    know where that one was, so it fails the epoch instead of reading its share twice."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        drop_last: bool,
        setup: WorkerSetup,
        readers: int = 1,
        begun: Any = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.setup = setup
        self.readers = readers
        self.begun = begun
        # Which reader each process is (its pid, 0: none yet): a reader that replaces a dead
        # one takes over the dead one's share (and worker id), whatever the runtime's slot.
        self.owners = multiprocessing.get_context("fork").RawArray("q", readers)
        # One lock for owners and begun, which a reader killed while holding it cannot leave
        # held (agents/process_lock.py): readers are killed at any instant, and a
        # multiprocessing lock left held would stop every later reader of the loader.
        self.lock = ProcessLock("the loader's table of readers", timeout=60)
        self._reader: int | None = None
        self._epoch: int | None = None
        self._iterator: Any = None
        self._ended = False
        self._lost = ""
        # The (epoch, number) of the last tick this process answered (see Skipped).
        self._answered: tuple[int, int] | None = None
        self._batches_read = 0  # of this reader's share of the current epoch

    def __call__(self, tick: Item) -> Item:
        """Read this reader's next item of the tick's epoch."""
        epoch, _, number, epoch_seed = tick
        if self._reader is None:
            self._reader = self._claim(_reader_slot)
        reader = self._reader
        if reader < 0:
            raise RuntimeError(
                f"a reader process of the IterableDataset started (slot {_reader_slot}) while "
                f"all {self.readers} readers were alive; this is a bug of agents.torch"
            )
        if self._answered is not None and (epoch, number) <= self._answered:
            # Answered with a batch, it would reach the consumer ahead of the batches this
            # reader gave before; with its end, ahead of them too, and the epoch could end
            # without them. A tick of an earlier epoch began that epoch again (and the next
            # tick failed the current one's share as if this reader had died in it).
            return epoch, 0, Skipped(), 0
        self._answered = (epoch, number)
        if epoch != self._epoch:
            # Ended until iter() returns: a dataset whose __iter__ raises (or a reader whose
            # worker_init_fn raised, or one that replaces a dead one, which _begin refuses)
            # gives its error once and then the end of its share, as a generator that raised.
            # Before, every next tick raised again, and a loop that skips failed batches never
            # saw the epoch end.
            # The epoch is recorded as begun before worker_init_fn runs: a reader whose
            # worker_init_fn kills its process died in the epoch, and its replacement (which
            # would die the same way) ends the share with one error instead of running it
            # again. Before, every replacement died before recording it, each tick failed
            # (WorkerDied) and no reader lived to end the share: an endless epoch of errors.
            self._epoch, self._ended, self._iterator = epoch, True, None
            self._batches_read = 0
            self._lost = self._begin(epoch, reader)
            if not self._lost:
                self.setup.ensure(worker_id=reader)
                if self.setup.repeatable:
                    seed_generators(fold(epoch_seed, reader, BEGIN))
                self._iterator = iter(self.dataset)
                self._ended = False
        end = (epoch, 0, EpochEnd(epoch, reader, self._lost), 0)
        if self._ended:
            return end
        seed = fold(epoch_seed, reader, self._batches_read)
        self._batches_read += 1
        if self.setup.repeatable:
            seed_generators(fold(seed, 0))
        if self.batch_size is None:
            try:
                return epoch, 1, next(self._iterator), seed
            except StopIteration:
                self._ended = True
                return end
        samples = list(itertools.islice(self._iterator, self.batch_size))
        if len(samples) < self.batch_size:
            self._ended = True
            if not samples or self.drop_last:
                return end
        return epoch, len(samples), samples, seed

    def _claim(self, slot: int) -> int:
        """The reader this process is: its slot's, if free, else one whose process died.

        The runtime starts a dead worker's replacement in another slot (past ``readers``
        while the dead one's is being cleared), so the slot alone does not say whose share
        it takes over. Before, such a replacement raised on every tick and the dead reader's
        share never ended: an endless epoch of errors (torch raises once, then ends it)."""
        with self.lock:
            order = ([slot] if slot < self.readers else []) + list(range(self.readers))
            for reader in order:
                if not _alive(self.owners[reader]):
                    self.owners[reader] = os.getpid()
                    return reader
        return -1

    def _begin(self, epoch: int, reader: int) -> str:
        """Record that ``reader`` begins ``epoch``; if another process began it already (a
        reader that died), say why this one cannot read its share (else "")."""
        if self.begun is None:
            return ""
        with self.lock:
            if self.begun[reader] >= epoch:
                # Every tick of the epoch answers this end: the runtime hands a dead worker's
                # ticks to its replacement in any order, so an error raised on the first one
                # it took could come after the end it gave the next (and be lost: the epoch
                # ended short without a word).
                return (
                    f"a reader process of the IterableDataset died mid-epoch and was replaced "
                    f"(reader {reader}, epoch {epoch}): the new one cannot resume the dead "
                    "one's share where it was, so the epoch is incomplete; see the earlier "
                    "error of that worker, then start the epoch again"
                )
            self.begun[reader] = epoch
            return ""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` (0: none) runs (a zombie, dead but not reaped, does not)."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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
