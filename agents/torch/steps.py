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
import operator
import os
import pickle
import random
import sys
import time
import traceback
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


def take(iterator: Any, most: int) -> list:
    """Up to ``most`` items of ``iterator`` by ``next()``, as torch's fetcher and sampler
    iterator take them. Not ``itertools.islice``, which calls ``iter()`` on what it is given:
    an iterator whose ``__iter__`` starts it again (an ``IterableDataset`` or sampler whose
    ``__iter__`` resets its count and returns itself) gave its first batch for ever (the
    parity hunter's seed 5000: an endless epoch of rows 0 to 12)."""
    items = []
    for _ in range(most):
        try:
            items.append(next(iterator))
        except StopIteration:
            break
    return items


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


@dataclass(frozen=True)
class BatchFailed:
    """The payload in place of an IterableDataset reader's batch that raised, in the reader
    (its rows, its ``__iter__``, its ``worker_init_fn``) or in a step after it
    (``collate_fn``): it passes through every later stage untouched, and the consumer raises
    it at that reader's turn, as torch raises a worker's error when the worker's turn comes
    round. The item keeps the batch's seed, which tells the consumer's ``_ReaderTurns`` whose
    turn it is; raised by the runtime instead (an error carries no seed), it came as it came:
    a reader that ran ahead of a slower one had its error raised before the slower one's
    batches of the turns before it (the parity hunter's seed 2110)."""

    step: str  # the step that raised: "read", "collate", a transform's name
    error: str  # "Type: message"
    traceback_text: str
    error_type: str  # "module:qualname"

    @classmethod
    def of(cls, step: str, exc: BaseException) -> BatchFailed:
        """What ``exc``, being handled in ``step``, becomes (as the runtime's ``Failure``)."""
        from agents.pipeline.worker import error_type_name

        return cls(step, f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                   error_type_name(exc))  # fmt: skip


@dataclass(frozen=True)
class CollateHere:
    """The payload in place of a batch that ``collate_fn`` made but that cannot leave the
    worker (a generator, an object of a class defined in a function, one holding a lock): the
    samples ``collate_fn`` was given, for the training process to collate. With
    ``num_workers=0`` torch collates in the training process, where any object will do; ours
    runs the loader in workers even then, and such a batch failed ("cannot pickle
    'generator' object", the parity hunter's seed 6026). It passes through every later stage
    untouched; the consumer runs ``collate_fn`` and the ``batch_transforms`` on it."""

    samples: Any


@dataclass(frozen=True)
class FetchHere:
    """The payload in place of a batch whose samples are in autograd (a tensor that
    ``requires_grad``: rows of an ``nn.Parameter`` the dataset holds), from a loader with
    ``num_workers=0``: the batch's indices, for the training process to fetch and collate
    them, as torch's single-process loader does. Pickled, such a tensor came as a new leaf
    without its graph, and ``backward()`` never reached the dataset's parameters. The
    worker's own fetch is dropped, so the dataset is read twice for such a batch."""

    indices: Any


def in_autograd(obj: Any) -> bool:
    """Whether a tensor that ``requires_grad`` is anywhere in ``obj`` (containers, and a
    plain object's fields, 32 levels and ``_AUTOGRAD_LOOK`` objects at most): its graph and
    its identity stay in the process that made it.

    Walked a level at a time, each level's tensors looked at together: 2.7 ms for a batch of
    4,096 samples of 3 tensors (making them took 47 ms), where a walk by recursion took 7 ms,
    and 18 ms for 1,024 dicts of 28 tensors (now 2.3 ms)."""
    level = [obj]
    looked = 0
    for _ in range(33):
        if not level or looked > _AUTOGRAD_LOOK:
            return False
        looked += len(level)
        if any(map(_requires_grad, [v for v in level if type(v) is torch.Tensor])):
            return True
        deeper: list = []
        for value in level:
            kind = type(value)
            if kind is torch.Tensor or kind in _PLAIN:
                continue
            if kind is tuple or kind is list:
                deeper.extend(value)
            elif kind is dict:
                deeper.extend(value.values())
            elif isinstance(value, torch.Tensor):  # a subclass: nn.Parameter
                if value.requires_grad:
                    return True
            elif isinstance(value, list | tuple):
                deeper.extend(value)
            elif isinstance(value, dict):
                deeper.extend(value.values())
            elif not isinstance(value, type):
                state = getattr(value, "__dict__", None)
                if isinstance(state, dict):
                    deeper.extend(state.values())
        level = deeper
    return False


_requires_grad = operator.attrgetter("requires_grad")
# How many objects in_autograd looks at in one batch at most (an object graph with cycles).
_AUTOGRAD_LOOK = 1_000_000


def sendable(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` can be pickled to the next stage, told without pickling the tensors,
    arrays and containers a batch is made of: only an object of another kind is pickled to
    find out (its class first: a generator's, a class defined in a function, fails there)."""
    if obj is None or isinstance(obj, torch.Tensor | str | bytes | int | float | complex):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray | numpy.generic):
        return obj.dtype != object or _pickles(obj)
    if depth > 32:
        return _pickles(obj)
    kind = type(obj)
    if isinstance(obj, list | tuple | dict):
        if kind not in (list, tuple, dict) and not _pickles(kind):
            return False  # a named tuple or dict subclass defined in a function
        values = obj.values() if isinstance(obj, dict) else obj
        keys = obj.keys() if isinstance(obj, dict) else ()
        everything = itertools.chain(keys, values)
        if all(type(v) in _PLAIN for v in everything):
            return True  # a batch of strings or tensors: a look at each type only
        return all(sendable(v, depth + 1) for v in itertools.chain(keys, values))
    if not _pickles(kind):
        return False
    state = getattr(obj, "__dict__", None)
    if (
        state is not None
        and kind.__reduce_ex__ is object.__reduce_ex__
        and kind.__getstate__ is object.__getstate__
        and not hasattr(obj, "__slots__")
    ):
        return all(sendable(v, depth + 1) for v in state.values())  # a plain object's fields
    return _pickles(obj)


# Types whose objects always pickle (exactly these: a subclass may not).
_PLAIN = frozenset({str, bytes, int, float, complex, bool, type(None), torch.Tensor})


def _pickles(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - whatever stops the pickling stops the sending
        return False
    return True


# The process that a WorkerSetup has set up (a forked child inherits its parent's pid here).
_set_up_in: int | None = None
# What worker_init_fn raised in this process (with the process's pid), raised again for
# every item it would serve (see WorkerSetup.ensure).
_init_failed: tuple[int, BaseException] | None = None


# Deaths in worker_init_fn after which a pipeline's new workers no longer run it (see
# InitWatch): one retry, for a worker killed from outside while in it (the OOM killer).
INIT_DEATHS_LIMIT = 2


class InitWatch:
    """Which of a pipeline's workers are inside ``worker_init_fn`` now, and how many died
    there: shared by the pipeline's processes (arrays and a lock inherited by fork).

    torch's worker that exits in ``worker_init_fn`` (``sys.exit``, ``os._exit``, a crash) is
    dead, and its iterator raises "DataLoader worker (pid(s) ...) exited unexpectedly". Ours
    are started again by the runtime, and the replacement ran ``worker_init_fn`` again, died
    again, for ever: every worker dying as it started, with no item lost by most deaths, no
    item ever failed and the epoch never ended (a map-style loader with split stages gave no
    outcome in 120 s). So each worker marks itself here while in ``worker_init_fn``; a worker
    that finds ``INIT_DEATHS_LIMIT`` marks of dead processes does not run it, and fails every
    batch it takes with an error naming the dead worker, as a worker whose ``worker_init_fn``
    raised does (a batch ends, an end of epoch passes): the epoch ends, with errors.

    Only deaths that say something of ``worker_init_fn`` count: a worker that dies with its
    launcher (killed, or the OOM killer's pick: the runtime starts another launcher and its
    workers) is not counted, and a worker that comes out of ``worker_init_fn`` sets the count
    back to 0 (the deaths must come in a row). Otherwise a slow ``worker_init_fn`` in a
    persistent loader whose workers were killed from outside a few times while in it failed
    every later batch of every epoch.

    The deaths are counted per reader of an IterableDataset (reader ``i``'s replacement is
    worker ``i`` again, and its ``worker_init_fn`` does what the dead one's did), and once for
    the other workers (each a new worker id): a reader's deaths are reset by that reader
    coming out of ``worker_init_fn`` only, and stop that reader only. With one count for all,
    the live readers set the dead reader's count back to 0 as they came out after its first
    death, and the runtime's limit of three deaths per item failed an item before ours (a
    second error); a live reader slow to start found the dead one's two deaths and refused its
    own share. 3 readers, reader 1's ``worker_init_fn`` exiting, under two busy CPUs: 4 epochs
    of 16 failed so, none of 16 since (in CI about 28 replacements died in a row).

    Every worker also stops once the deaths in a row of any workers (none came out between
    them) come from ``INIT_DEATHS_LIMIT`` counts: a ``worker_init_fn`` that kills every
    reader stops them all after two deaths, as one count did. Counted per reader alone, two
    readers died twice each, a tick went from one dying reader to the other, and its third
    death failed it in the runtime before ours (``test_every_worker_runs_worker_init_fn_as_
    it_starts_as_torchs.py``)."""

    SLOTS = 256  # workers inside worker_init_fn at once that are watched (more: not marked)

    def __init__(self, readers: int = 0) -> None:
        self.readers = readers  # worker ids below it are an IterableDataset's readers
        context = multiprocessing.get_context("fork")
        # (pid, worker id, launcher pid) of a worker in init, or 0s
        self.marks = context.RawArray("q", 3 * self.SLOTS)
        # Per count (one per reader, then the other workers'): deaths in a row, the first
        # dead pid, its worker id.
        self.deaths = context.RawArray("q", 3 * (readers + 1))
        # The deaths in a row of any workers: per count, whether it has one among them; then
        # how many, the first dead pid, its worker id.
        self.row = context.RawArray("q", readers + 4)
        self.lock = ProcessLock("the loader's table of workers in worker_init_fn", timeout=60)

    def entering(self, worker_id: int) -> int | None:
        """Mark this process as inside ``worker_init_fn``; the mark's place (``None``: no
        free place)."""
        with self.lock:
            for place in range(self.SLOTS):
                if self.marks[3 * place] == 0:
                    self.marks[3 * place] = os.getpid()
                    self.marks[3 * place + 1] = worker_id
                    self.marks[3 * place + 2] = os.getppid()
                    return place
        return None

    def count_of(self, worker_id: int) -> int:
        """Which count ``worker_id``'s deaths go to: its own for a reader, else the others'."""
        return worker_id if 0 <= worker_id < self.readers else self.readers

    def left(self, place: int | None, worker_id: int) -> None:
        """This process, worker ``worker_id``, came out of ``worker_init_fn`` (returned or
        raised): the deaths so far of its count were not in a row."""
        if place is None:
            return
        with self.lock:
            if self.marks[3 * place] == os.getpid():
                self.marks[3 * place] = 0
            self.deaths[3 * self.count_of(worker_id)] = 0
            for at in range(len(self.row)):
                self.row[at] = 0

    def died(self, worker_id: int) -> int:
        """How many workers of ``worker_id``'s count died inside ``worker_init_fn`` in a row,
        or from how many counts the deaths in a row of any workers came, whichever is more
        (counting the newly found deaths)."""
        with self.lock:
            for place in range(self.SLOTS):
                pid = self.marks[3 * place]
                if pid and pid != os.getpid() and not _alive(pid):
                    self.marks[3 * place] = 0
                    if not _alive(self.marks[3 * place + 2]):
                        continue  # died with its launcher: says nothing of worker_init_fn
                    dead = self.marks[3 * place + 1]
                    count = self.count_of(dead)
                    if self.deaths[3 * count] == 0:
                        self.deaths[3 * count + 1], self.deaths[3 * count + 2] = pid, dead
                    self.deaths[3 * count] += 1
                    row = self.readers + 1
                    if self.row[row] == 0:
                        self.row[row + 1], self.row[row + 2] = pid, dead
                    self.row[row] += 1
                    self.row[count] = 1
            return max(int(self.deaths[3 * self.count_of(worker_id)]), self._row_counts())

    def _row_counts(self) -> int:
        """From how many counts the deaths in a row of any workers came."""
        return sum(int(self.row[count]) for count in range(self.readers + 1))

    def inside(self) -> list[tuple[int, int]]:
        """``(worker id, pid)`` of the live workers inside ``worker_init_fn`` now."""
        marks = [(self.marks[3 * p + 1], self.marks[3 * p]) for p in range(self.SLOTS)]
        return [(worker, pid) for worker, pid in marks if pid and _alive(pid)]

    def error(self, worker_id: int) -> RuntimeError:
        """The error this worker fails its batches with, naming the first dead one."""
        at = 3 * self.count_of(worker_id)
        count, pid, dead = (int(v) for v in self.deaths[at : at + 3])
        if count < INIT_DEATHS_LIMIT:  # stopped by the deaths of several counts in a row
            at = self.readers + 1
            count, pid, dead = (int(v) for v in self.row[at : at + 3])
        which = f"reader {dead} of the IterableDataset, " if dead < self.readers else ""
        return RuntimeError(
            f"DataLoader worker {dead} ({which}pid {pid}) exited unexpectedly in its "
            f"worker_init_fn: {count} worker processes of this loader died there, so worker "
            f"{worker_id} does not run it and fails every batch it takes (torch's worker dies "
            "and its iterator raises)"
        )


@dataclass
class WorkerSetup:
    """What a worker process does as it starts (``StartWorker``, the stages' ``init``), as
    torch's DataLoader workers do:
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
    # The pipeline's workers in worker_init_fn (None: not watched).
    watch: InitWatch | None = None
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
        if self.worker_init_fn is None:
            return
        watch = self.watch
        if watch is not None and watch.died(worker_id) >= INIT_DEATHS_LIMIT:
            exc = watch.error(worker_id)
            _init_failed = (os.getpid(), exc)
            raise exc
        place = watch.entering(worker_id) if watch is not None else None
        try:
            self.worker_init_fn(worker_id)
        except Exception as exc:
            # Not a death: the worker lives on and fails its batches with it, as torch's.
            if watch is not None:
                watch.left(place, worker_id)
            _init_failed = (os.getpid(), exc)
            raise
        except BaseException:
            # sys.exit, KeyboardInterrupt: the worker dies (as torch's), its mark left for
            # the others to count.
            raise
        if watch is not None:
            watch.left(place, worker_id)

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
    sees ``get_worker_info()`` as in torch's workers.

    In a worker, tensors are stacked as torch's worker stacks them, into a batch of the first
    tensor's dtype (``_stack_as_torchs_worker``): hidden from ``get_worker_info()``, torch's
    ``stack`` promoted instead, and a batch of an int32 and a float64 tensor came as float64
    where torch's worker raises TypeError (the parity hunter's seed 6039); float32 then
    float64 came as float64 where torch's is float32."""

    fn: Callable[[Any], Any]

    def __call__(self, batch: Any) -> Any:
        from torch.utils.data._utils import collate, worker

        info, worker._worker_info = worker._worker_info, None
        try:
            if info is None:
                return self.fn(batch)
            # torch's map as it is now (a user may have extended it in place), but tensors.
            kinds = dict(collate.default_collate_fn_map)
            if kinds.get(torch.Tensor) is collate.collate_tensor_fn:
                kinds[torch.Tensor] = _stack_as_torchs_worker
            return collate.collate(batch, collate_fn_map=kinds)
        finally:
            worker._worker_info = info


def _stack_as_torchs_worker(batch: list, *, collate_fn_map: Any = None) -> torch.Tensor:
    """torch's ``collate_tensor_fn`` as its worker runs it (into an ``out`` of the first
    tensor's dtype and shape), in this process's own memory rather than a shared segment."""
    from torch.utils.data._utils.collate import collate_tensor_fn

    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # torch's error
    # torch's worker sizes its segment first: a sample that is not a tensor (a namedtuple
    # after a tensor) raises its AttributeError there, not stack's TypeError (the parity
    # hunter's seed 2201).
    sum(x.numel() for x in batch)
    out = elem.new_empty((len(batch), *elem.size()))
    return torch.stack(batch, 0, out=out)


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
    # The step's name; set for an IterableDataset's steps only, whose error then goes on as
    # the batch (BatchFailed) to be raised at its reader's turn.
    name: str = ""
    # The collate step of a loader with num_workers=0: a batch that cannot leave the worker
    # goes back as its samples, collated by the training process as torch does (CollateHere).
    collates_here: bool = False
    # The fetch step of a map-style loader with num_workers=0: a batch whose samples are in
    # autograd goes back as its indices, fetched by the training process (FetchHere).
    fetches_here: bool = False

    def __call__(self, item: Item) -> Item:
        """Apply the step to one item."""
        epoch, samples, payload, seed = item
        if isinstance(
            payload, EpochEnd | SamplerFailed | Skipped | BatchFailed | CollateHere | FetchHere
        ):
            return item
        given = payload
        try:
            self.setup.ensure()
            if self.setup.repeatable:
                seed_generators(fold(seed, self.position))
            if self.per_sample and self.batched:
                payload = [self.fn(sample) for sample in payload]
            else:
                payload = self.fn(payload)
        except BaseException as exc:  # noqa: BLE001 - as the runtime's worker catches it
            if not self.name:
                raise
            return epoch, 0, BatchFailed.of(self.name, exc), seed
        if self.fetches_here and in_autograd(payload):
            return epoch, samples, FetchHere(given), seed
        if (
            self.collates_here
            and (not sendable(payload) or in_autograd(payload))
            and sendable(given)
            and not in_autograd(given)
        ):
            return epoch, samples, CollateHere(given), seed
        return epoch, samples, payload, seed


@dataclass(frozen=True)
class StartWorker:
    """A stage's per-worker setup (``Stage.init``): set the worker up as it starts, as
    torch's workers run ``worker_init_fn`` at their start, not before their first batch (a
    worker that never got one never ran it: files, connections, thread counts a
    ``worker_init_fn`` sets up were missing in it). ``read``: the ``read`` stage's, whose
    worker is the reader it claims (its worker id). What ``worker_init_fn`` raised fails
    each batch the worker takes (``WorkerSetup.ensure``), an end of epoch passing; an exit in
    it kills the worker, as torch's (``InitWatch``)."""

    setup: WorkerSetup
    read: Any = None  # the stage's Read, for the read stage

    def __call__(self, slot: int) -> None:
        """Set up the worker in ``slot`` of its stage."""
        worker_id = None
        if self.read is not None:
            set_reader_slot(slot)
            worker_id = self.read.claim()
            if worker_id < 0:
                return  # the first tick says so (Read.__call__)
        try:
            self.setup.ensure(worker_id=worker_id)
        except Exception:  # noqa: BLE001 - kept by ensure; each batch raises it
            pass


# How long a reader ahead of the consumer answers its ticks with Skipped on end before it
# forgives itself the excess and reads on (Read): only a batch the consumer could not tell
# whose it was (more failed batches of one reader in a row than _ReaderTurns.LOOK_AHEAD)
# leaves it ahead for good; or the loop is away that long.
SKIP_LIMIT_S = 5.0
# The longest a reader ahead of the consumer watches for the consumer's count to move before
# it answers a tick with Skipped (Read._ahead_of_consumer).
SKIP_WAIT_S = 0.002

# How long a reader process that found every reader number taken waits at a tick for one to
# be freed (Read.claim): a worker the pipeline gave up on (its launcher stopped past the
# request's timeout) but the launcher forked later holds one until the pipeline closes its
# pipes, within the monitor's next rounds.
CLAIM_WAIT_S = 5.0
CLAIM_POLL_S = 0.01

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
    know where that one was, so it fails the epoch instead of reading its share twice.

    ``handed`` (a shared array: the epoch, then per reader how many of its batches of that
    epoch the consumer has handed out, which the consumer's ``_ReaderTurns`` writes): a
    reader ``ahead`` batches or more ahead of the consumer answers its tick with ``Skipped``
    rather than read on, as torch's worker gets no index past ``prefetch_factor`` batches
    ahead. Never waiting: the pipeline hands answers out in tick order, and a reader holding
    a tick would hold back the slow reader's batches behind it. So however slow one reader
    is, the others' batches wait in the consumer for their turn by at most ``ahead`` each, and
    the epoch holds torch's order. Before, the others read on, and past the consumer's bound
    (4 x the queue) the batch held longest went out of turn: torch's order up to batch 6 of
    60 with one reader 10 ms a row slower. A reader that has skipped for ``SKIP_LIMIT_S`` on
    end forgives itself the excess and reads on (the consumer's bound holds, as before): what
    it waits for may never come (a batch the consumer could not tell whose it was), or the
    training loop is away (a validation pass)."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        drop_last: bool,
        setup: WorkerSetup,
        readers: int = 1,
        begun: Any = None,
        handed: Any = None,
        ahead: int = 2,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.setup = setup
        self.readers = readers
        self.begun = begun
        self.handed = handed
        self.ahead = max(1, ahead)
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
        self._produced = 0  # of those, the batches it gave (not the ones that raised)
        self._skipping_since: float | None = None
        self._skips = 0  # ticks skipped in a row
        self._forgiven = 0  # batches no longer counted as ahead (SKIP_LIMIT_S)

    def __call__(self, tick: Item) -> Item:
        """Read this reader's next item of the tick's epoch."""
        epoch, _, number, epoch_seed = tick
        reader = self.claim(CLAIM_WAIT_S)
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
            # worker_init_fn ran as the process started (StartWorker); one that kills the
            # process is InitWatch's: after two such deaths the replacement does not run it,
            # and gives its error here once, then the end of its share. Before (when it ran
            # here), every replacement died, each tick failed (WorkerDied) and no reader
            # lived to end the share: an endless epoch of errors.
            self._epoch, self._ended, self._iterator = epoch, True, None
            self._batches_read = self._produced = self._forgiven = 0
            self._skipping_since = None
            self._lost = self._begin(epoch, reader)
            if not self._lost:
                try:
                    self.setup.ensure(worker_id=reader)
                    if self.setup.repeatable:
                        seed_generators(fold(epoch_seed, reader, BEGIN))
                    self._iterator = iter(self.dataset)
                except BaseException as exc:  # noqa: BLE001 - as the runtime's worker catches it
                    # In the reader's first turn, as torch's worker gives it for its first
                    # index; then the end of its share (_ended stays set).
                    self._batches_read = self._produced = 1
                    failed = BatchFailed.of("read", exc)
                    return epoch, 0, failed, fold(epoch_seed, reader, 0)
                self._ended = False
        end = (epoch, 0, EpochEnd(epoch, reader, self._lost), 0)
        if self._ended:
            return end
        if self._ahead_of_consumer(epoch, reader):
            return epoch, 0, Skipped(), 0
        seed = fold(epoch_seed, reader, self._batches_read)
        self._batches_read += 1
        if self.setup.repeatable:
            seed_generators(fold(seed, 0))
        try:
            if self.batch_size is None:
                try:
                    sample = next(self._iterator)
                except StopIteration:
                    self._ended = True
                    return end
                self._produced += 1
                return epoch, 1, sample, seed
            samples = take(self._iterator, self.batch_size)
        except BaseException as exc:  # noqa: BLE001 - as the runtime's worker catches it
            self._produced += 1
            return epoch, 0, BatchFailed.of("read", exc), seed
        if len(samples) < self.batch_size:
            self._ended = True
            if not samples or self.drop_last:
                return end
        self._produced += 1
        return epoch, len(samples), samples, seed

    def _ahead_of_consumer(self, epoch: int, reader: int) -> bool:
        """Whether this reader is ``ahead`` batches or more ahead of the consumer in
        ``epoch`` (and has not skipped for ``SKIP_LIMIT_S`` on end)."""
        handed = self.handed
        if handed is None:
            return False
        now = time.monotonic()
        if self._skipping_since is None:
            if self._lead(epoch, reader) < self.ahead:
                return False
            self._skipping_since, self._skips = now, 0
        if now - self._skipping_since >= SKIP_LIMIT_S:
            # Forgive the excess and read on: the rule holds again from here (a count that
            # never catches up cost 5 s once, not 5 s a batch, nor the rule for the epoch).
            self._forgiven += self._lead(epoch, reader) - (self.ahead - 1)
            self._skipping_since = None
            return False
        # A skip costs a tick's round trip through the pipeline (about 0.3 ms of CPU over
        # the processes): a reader that keeps skipping first watches the consumer's count a
        # little, up to SKIP_WAIT_S, reading at once if it moves. Bounded, so that a slow
        # reader's batch in the next tick is held back by as much at most.
        wait = min(SKIP_WAIT_S, 0.000125 * (1 << min(self._skips, 8)))
        self._skips += 1
        deadline = now + wait
        while True:
            if self._lead(epoch, reader) < self.ahead:
                self._skipping_since = None
                return False
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.0002)

    def _lead(self, epoch: int, reader: int) -> int:
        """How many of this reader's batches of ``epoch`` the consumer has not handed out
        (less those forgiven after ``SKIP_LIMIT_S``)."""
        handed = self.handed
        taken = int(handed[1 + reader]) if handed[0] == epoch else 0
        return self._produced - self._forgiven - taken

    def claim(self, wait_s: float = 0.0) -> int:
        """The reader this process is (claimed at its start, ``StartWorker``); -1: none yet,
        after waiting up to ``wait_s`` for a reader's process to leave.

        A failed claim is not kept: every reader may look alive for a while after a death.
        A worker whose start the pipeline gave up (the launcher stopped past its request
        timeout) is still forked once the launcher runs again, claims the dead reader's
        number, and leaves only when the pipeline closes its pipes; the replacement started
        meanwhile found no reader free. Kept, that -1 failed its every tick (a "bug of
        agents.torch" for each), the dead reader's share never ended, and the epoch waited
        for ever (``tests.agents.torch.hunt --replay 90028``)."""
        if self._reader is None or self._reader < 0:
            deadline = time.monotonic() + max(0.0, wait_s)
            while True:
                reader = self._claim(_reader_slot)
                if reader >= 0 or time.monotonic() >= deadline:
                    break
                time.sleep(CLAIM_POLL_S)
            self._reader = reader if reader >= 0 else None
            return reader
        return self._reader

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
