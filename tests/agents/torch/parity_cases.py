"""What the parity hunter (``parity_hunt``) draws: datasets, loader options and training loops
that ``hunt``, ``loader_cases`` and ``hostile_cases`` do not combine, as one JSON-able dict.

Datasets (map-style or iterable, importable here so that ``spawn`` and ``forkserver`` workers
can load them): items that are tensors, zero-size tensors, views sharing one storage, named
tuples, dataclasses, numpy arrays, strings, bytes, nested dicts; an item that raises
``IndexError``, ``StopIteration`` or ``KeyboardInterrupt``, forks and waits for its child,
leaves a thread running, runs a loader of its own, sleeps past the loader's ``timeout`` or
never returns; an ``IterableDataset`` whose ``__len__`` lies. Options: every start method,
``persistent_workers``, ``in_order``, ``prefetch_factor`` 1 to 8, ``batch_size=None``, a custom
``sampler`` or ``batch_sampler`` (an empty batch among them), ``drop_last``, a shuffle from a
``generator``, ``pin_memory``, a ``worker_init_fn`` that raises, sleeps or calls
``torch.set_num_threads``. Loops: whole epochs, batches taken then the iterator abandoned and
collected, ``len(loader)``, ``zip`` with a second loader, ``next()`` from three threads, a
checkpoint (``state_dict``) mid-epoch resumed by a new loader, live resizes between and
during epochs.

Added 2026-11-29 (``_more``, drawn after the rest so that an older seed draws its older
case with these on top): map datasets with ``__getitems__``, in a ``Subset``,
``ConcatDataset``, ``StackDataset``, a ``TensorDataset``, one whose ``len()`` lies; iterable
ones in a ``ChainDataset``, whose ``__iter__`` returns itself, that yield nothing for odd
workers, that never end (the loop breaks), sharded by a ``worker_init_fn``; samplers and
batch samplers as generators, lists, ranges, ``len()`` longer or shorter than what they
yield, ``sampler=`` with ``shuffle=False``, ``generator=`` without a shuffle; items None,
ragged nested lists, non-contiguous, 0-d, of mixed dtypes, one tensor object for all;
``collate_fn`` returning a generator (no workers: torch's cannot send one), the list
itself, an object, one tensor for every batch; loops that call ``iter()`` twice, ``next()``
after the end, keep an epoch's batches through the next, change the dataset between epochs,
run under ``torch.set_num_threads(1)`` or ``torch.no_grad()``; a live resize mid-epoch.

Added 2026-11-30 (``_round3``, drawn after ``_more``, same rule): items that are dicts of
tensors whose sizes differ by row (an empty one among them), nested tuples of numbers,
strings and tensors, tuples of every dtype (bool, float16, bfloat16, complex64, uint8, int8),
empty tuples and dicts, large tensors and arrays (torch's shared memory), numpy string arrays
and ints past 64 bits (torch's collate refuses both), a number a ``worker_init_fn`` set in its
worker's globals; an item that raises an exception its message cannot build again, or an
``OSError`` with an errno; a ``collate_fn`` that raises ``KeyError`` on some batches, or returns
an object holding the batch's tensors; loops that raise out of a ``for`` and keep the
exception (its traceback holds the iterator) into the next epoch, read two loaders of the
case in turns, or fork a child mid-epoch that collects and exits.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
import types
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import torch
import torch.utils.data as tud

Pair = namedtuple("Pair", ["x", "i"])
TIMEOUT_S = 1.0  # the loader's timeout where an item is slow or never returns
SLOW_S = 2.5


@dataclass
class Point:
    x: int
    y: float


_BASE = torch.arange(400.0)  # the storage the "view" items share
_GRID = torch.arange(400.0).view(20, 20)  # its columns: non-contiguous items
_SHARED = torch.tensor([7, 8, 9])  # the "same" items, and the "shared" collate's batch


def make_item(i: int, kind: str):
    """Item ``i`` of a dataset of ``kind``."""
    if kind == "tensor":
        return torch.tensor([i, -i])
    if kind == "zero":
        return torch.zeros((0, 3))
    if kind == "view":
        return _BASE[i : i + 3]
    if kind == "namedtuple":
        return Pair(torch.tensor(float(i)), i)
    if kind == "dataclass":
        return Point(i, i / 2)
    if kind == "numpy":
        return np.arange(i, i + 3, dtype=np.float32)
    if kind == "string":
        return f"row-{i}"
    if kind == "bytes":
        return f"row-{i}".encode()
    if kind == "nested":
        return {"a": {"b": torch.tensor(i), "c": [i, f"{i}"]}, "d": np.int64(i)}
    if kind == "none":
        return None
    if kind == "ragged":  # nested lists of different lengths: torch's collate refuses them
        return [[i] * (i % 3), [i]]
    if kind == "noncontig":
        return _GRID[:, i % 20]
    if kind == "scalar":
        return torch.tensor(i)
    if kind == "dtypes":
        return torch.tensor([i], dtype=torch.int32 if i % 2 else torch.float64)
    if kind == "same":  # one tensor object, every item
        return _SHARED
    return make_round3_item(i, kind)


_DTYPES = (torch.bool, torch.float16, torch.bfloat16, torch.complex64, torch.uint8, torch.int8)
WORKER_STATE: dict = {}  # what the "state" worker_init_fn sets, in its worker only


def make_round3_item(i: int, kind: str):
    """Item ``i`` of the kinds added on 2026-11-30 (``_round3``)."""
    if kind == "ragged_dict":  # sizes 0, 1, 2 by row: a batch of mixed sizes cannot stack
        return {"x": torch.arange(float(i % 3)), "name": f"r{i}", "n": i}
    if kind == "deep_tuple":
        return (i, (f"s{i}", (torch.tensor([i, i]), 1.5 * i)), [np.int32(i), b"b"])
    if kind == "all_dtypes":
        return tuple(torch.tensor([i % 2, 1], dtype=dtype) for dtype in _DTYPES)
    if kind == "empties":
        return ((), {}, [], torch.empty(0, dtype=torch.int64))
    if kind == "big":  # past any inline size: each item its own shared memory
        return {"t": torch.full((60_000,), float(i)), "a": np.full(30_000, i, dtype=np.int16)}
    if kind == "np_strings":  # torch's collate refuses a numpy array of strings
        return np.array([f"a{i}", "b"])
    if kind == "bigint":  # past int64: torch.tensor() refuses it in the collate
        return 2**70 + i
    if kind == "state":  # 0 without workers: worker_init_fn runs in workers only
        return torch.tensor([i, WORKER_STATE.get("x", 0)])
    raise AssertionError(kind)


def misbehave(fault: str, i: int, loader_class: str) -> None:
    """What item ``i``'s fault does before the item is made."""
    if fault == "IndexError":
        raise IndexError(f"item {i} is not there")
    if fault == "StopIteration":
        raise StopIteration
    if fault == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if fault == "two_args":
        raise TwoArgsError(i, "is bad")
    if fault == "OSError":
        raise OSError(2, "No such file or directory", f"/data/part-{i}")
    if fault == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    elif fault == "thread":
        threading.Thread(target=time.sleep, args=(0.5,)).start()
    elif fault == "slow":
        time.sleep(SLOW_S)
    elif fault == "never":
        time.sleep(600)
    elif fault == "nested":
        inner = loader_of(loader_class)(list(range(4)), batch_size=2, num_workers=1)
        list(inner)


class TwoArgsError(Exception):
    """An error whose constructor takes two arguments: torch's worker cannot build it again
    from a message (torch raises a RuntimeError in its place)."""

    def __init__(self, row: int, why: str) -> None:
        super().__init__(f"row {row} {why}")
        self.row = row


def loader_of(name: str):
    if name == "ours":
        from agents.torch import DataLoader

        return DataLoader
    return tud.DataLoader


class MapItems(tud.Dataset):
    """``n`` items; ``len()`` off by ``lie`` (an index past ``n`` raises ``IndexError``);
    ``offset`` (changed between epochs by the loop) added to each item's number."""

    def __init__(
        self, n: int, kind: str, fault: str, at: int, loader_class: str, lie: int = 0
    ) -> None:
        self.n, self.kind, self.fault, self.at, self.loader_class = n, kind, fault, at, loader_class
        self.lie = lie
        self.offset = 0

    def __len__(self) -> int:
        return max(0, self.n + self.lie)

    def __getitem__(self, i: int):
        if i >= self.n:
            raise IndexError(f"index {i} is past the {self.n} items")
        if i == self.at:
            misbehave(self.fault, i, self.loader_class)
        return make_item(i + self.offset, self.kind)


class MapItemsInBatches(MapItems):
    """With ``__getitems__``, which torch's fetcher calls for a whole batch: each item says
    how many indices the call got."""

    def __getitems__(self, indices: list):
        return [Pair(self[i], len(indices)) for i in indices]


class Box:
    """What the "object" collate returns."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def __repr__(self) -> str:
        return f"Box({self.batch!r})"


def collate_generator(batch):
    return (item for item in batch)


def collate_identity(batch):
    return batch


def collate_object(batch):
    return Box(len(batch))


def collate_shared(batch):
    return _SHARED


class Held:
    """What the "held" collate returns: an object of the user's holding the collated batch
    (its tensors too), with a ``pin_memory`` of its own as torch's docs show."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def pin_memory(self):
        return self

    def __repr__(self) -> str:
        return f"Held({canon(self.batch)!r})"


def collate_held(batch):
    return Held(tud.default_collate(batch))


def collate_key_error(batch):
    """``KeyError`` on a batch of an even size (torch's wraps its message in quotes)."""
    if len(batch) % 2 == 0:
        raise KeyError(f"no key for a batch of {len(batch)}")
    return tud.default_collate(batch)


COLLATES = {"generator": collate_generator, "identity": collate_identity,
            "object": collate_object, "shared": collate_shared, "held": collate_held,
            "key_error": collate_key_error}  # fmt: skip


class StreamItems(tud.IterableDataset):
    """Rows split among the workers by ``get_worker_info()``; ``len()`` off by ``lie``."""

    def __init__(
        self, n: int, kind: str, fault: str, at: int, loader_class: str, lie: int, flavour: str = ""
    ):
        self.n, self.kind, self.fault, self.at, self.loader_class = n, kind, fault, at, loader_class
        self.lie = lie
        self.flavour = flavour  # "", "empty_some", "forever", "init_shard"
        self.offset = 0
        self.shard = (0, 1)  # set by init_shard's worker_init_fn

    def __len__(self) -> int:
        return max(0, self.n + self.lie)

    def __iter__(self):
        info = tud.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.flavour == "init_shard":
            k, of = self.shard
        if self.flavour == "empty_some" and k % 2:
            return
        i = k
        while i < self.n or self.flavour == "forever":
            if i == self.at:
                misbehave(self.fault, i, self.loader_class)
            yield make_item(i + self.offset, self.kind)
            i += of


class StreamSelf(tud.IterableDataset):
    """An ``IterableDataset`` whose ``__iter__`` returns itself (restarting its count)."""

    def __init__(self, n: int, kind: str) -> None:
        self.n, self.kind = n, kind
        self.offset = 0
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        info = tud.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        i = k + self.i * of
        if i >= self.n:
            raise StopIteration
        self.i += 1
        return make_item(i + self.offset, self.kind)


class Batches(tud.Sampler):
    """A custom ``batch_sampler`` (or ``sampler``): these lists (or indices), in order."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches) + self.lie

    lie = 0


class LyingBatches(Batches):
    """``Batches`` whose ``len()`` says 2 more than it yields."""

    lie = 2


class ShortBatches(Batches):
    """``Batches`` whose ``len()`` says 1 fewer than it yields (0 at least)."""

    def __len__(self) -> int:
        return max(0, len(self.batches) - 1)


def sampler_of(form: str, order: list):
    """The custom sampler (or batch sampler) in ``form``: a ``Sampler``, one whose ``len()``
    lies, a generator (consumed by its first epoch), a plain list or a range."""
    if form == "sampler":
        return Batches(order)
    if form == "longer":
        return LyingBatches(order)
    if form == "shorter":
        return ShortBatches(order)
    if form == "generator":
        return (x for x in order)
    if form == "list":
        return list(order)
    if form == "range":
        return range(len(order))
    raise AssertionError(form)


def init_raises(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


def init_sleeps(worker_id: int) -> None:
    time.sleep(0.3)


def init_threads(worker_id: int) -> None:
    torch.set_num_threads(1)


def init_seed(worker_id: int) -> None:
    info = tud.get_worker_info()
    assert info.seed == torch.initial_seed(), (info.seed, torch.initial_seed())


def init_shard(worker_id: int) -> None:
    """torch's documented sharding: ``worker_init_fn`` gives each worker's copy its share."""
    info = tud.get_worker_info()
    info.dataset.shard = (info.id, info.num_workers)


def init_state(worker_id: int) -> None:
    """State set in the worker's globals, read by the "state" items."""
    WORKER_STATE["x"] = 1000


INITS = {"raises": init_raises, "sleeps": init_sleeps, "threads": init_threads,
         "seed": init_seed}  # fmt: skip
# Drawn among INITS (seeds before 2026-11-29 draw the same cases); "shard" goes with the
# "init_shard" flavour of iterable dataset only.
ALL_INITS = {**INITS, "shard": init_shard, "state": init_state}
KINDS = ["tensor", "tensor", "zero", "view", "namedtuple", "dataclass", "numpy", "string",
         "bytes", "nested"]  # fmt: skip
NEW_KINDS = ["none", "ragged", "noncontig", "scalar", "dtypes", "same"]
FAULTS = ["none"] * 6 + ["IndexError", "StopIteration", "KeyboardInterrupt", "fork", "thread",
                         "slow", "never", "nested"]  # fmt: skip


def generate(rng: random.Random) -> dict:
    """One case: a dataset, torch's options, and the training loop's operations."""
    iterable = rng.random() < 0.3
    n = rng.randint(0, 40)
    workers = rng.choice([0, 1, 1, 2, 2, 3])
    fault = rng.choice(FAULTS)
    if fault in ("slow", "never") and workers == 0:
        fault = "none"  # torch's timeout needs workers; without, a hang in both
    options: dict = {"num_workers": workers, "batch_size": rng.choice([None, 1, 3, 7])}
    options["drop_last"] = bool(options["batch_size"]) and rng.random() < 0.3
    if workers:
        options["persistent_workers"] = rng.random() < 0.5
        options["prefetch_factor"] = rng.choice([None, 1, 2, 3, 5, 8])
        options["in_order"] = rng.random() < 0.75
        context = rng.choice([None] * 5 + ["fork", "fork", "spawn", "forkserver"])
        if fault in ("slow", "never") and context in ("spawn", "forkserver"):
            context = None  # torch's spawned workers take more than the 1 s timeout to start
        if context:
            options["multiprocessing_context"] = context
        options["timeout"] = TIMEOUT_S if fault in ("slow", "never") else rng.choice([0, 0, 30])
    options["pin_memory"] = rng.random() < 0.2
    init = rng.choice([None] * 4 + list(INITS))
    sampling = "sequential"
    order: list = []
    if not iterable:
        sampling = rng.choice(["sequential", "shuffle", "sampler", "batch_sampler"])
        if sampling == "sampler":
            order = rng.sample(range(n), rng.randint(0, n))
        elif sampling == "batch_sampler":
            left = rng.sample(range(n), rng.randint(0, n))
            while left:
                size = rng.randint(0 if rng.random() < 0.05 else 1, 5)
                order.append(left[:size])
                left = left[size:]
    ops = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["epoch", "epoch", "take", "abandon", "len", "zip", "threads",
                           "resize", "checkpoint"])  # fmt: skip
        if kind == "take":
            ops.append(["take", rng.randint(1, 6)])
        elif kind == "zip":
            ops.append(["zip", rng.randint(0, 5)])
        elif kind == "resize":
            ops.append(["resize", rng.randint(1, 4)])
        elif kind == "checkpoint":
            ops.append(["checkpoint", rng.randint(0, 5)])
        else:
            ops.append([kind])
    ops.append(["epoch"])
    if fault in ("slow", "never") or iterable:
        # A resumed loader loads the slow item again where torch's iterator waits on it;
        # state_dict() covers map-style datasets only (documented).
        ops = [op for op in ops if op[0] != "checkpoint"]
    case = {
        "iterable": iterable,
        "n": n,
        "kind": rng.choice(KINDS),
        "fault": fault,
        "at": rng.randint(0, max(n - 1, 0)),
        "lie": rng.choice([0, 0, 0, -3, 4]) if iterable else 0,
        "options": options,
        "init": init,
        "sampling": sampling,
        "order": order,
        "seed": rng.randint(0, 2**16),
        "ops": ops,
    }
    _more(rng, case)
    _round3(rng, case)
    return case


def _more(rng: random.Random, case: dict) -> None:
    """The dimensions added on 2026-11-29, drawn after the others (so that an older seed
    draws its older case, with these on top): wrapped datasets, sampler forms, more item
    kinds, odd collate_fns, more loops, a resize mid-epoch, torch's thread count."""
    workers = case["options"]["num_workers"]
    faultless = case["fault"] == "none"
    if rng.random() < 0.4:
        case["kind"] = rng.choice(NEW_KINDS)
    case["wrap"] = ""
    if case["iterable"]:
        case["wrap"] = rng.choice(["", "", "", "self", "chain", "empty_some", "forever",
                                   "init_shard"])  # fmt: skip
        if case["wrap"] == "self" and not faultless:
            case["wrap"] = ""  # its items come from __next__: no fault to place
        if case["wrap"] == "init_shard":
            case["init"] = "shard"
        elif case["init"] == "shard":
            case["init"] = None
    else:
        case["wrap"] = rng.choice(["", "", "", "getitems", "subset", "concat", "stack",
                                   "tensor", "lies"])  # fmt: skip
        if case["wrap"] == "lies":
            case["lie"] = rng.choice([-2, 3])
        if case["sampling"] in ("sampler", "batch_sampler") and rng.random() < 0.6:
            forms = ["longer", "shorter", "generator", "list"]
            if case["sampling"] == "sampler":
                forms.append("range")
            case["form"] = rng.choice(forms)
        elif case["sampling"] == "sequential" and rng.random() < 0.3:
            case["sampling"] = "sampler"  # sampler= with shuffle=False said
            case["form"] = "sampler"
            case["options"]["shuffle"] = False
            case["order"] = rng.sample(range(case["n"]), case["n"])
    case.setdefault("form", "sampler")
    if case["sampling"] != "shuffle" and rng.random() < 0.3:
        case["generator"] = rng.randint(0, 2**16)  # generator= without a shuffle
    collates = ["identity", "object", "shared"] + (["generator"] if workers == 0 else [])
    # A generator cannot be sent from torch's worker (pickling fails in its queue's feeder
    # thread, and the loop waits for ever): drawn without workers only.
    case["collate"] = rng.choice(collates) if rng.random() < 0.25 else None
    for _ in range(rng.randint(0, 3)):
        k = rng.randint(0, len(case["ops"]) - 1)
        extra = rng.choice(["twice", "after_end", "keep", "mutate", "threads1", "no_grad"])
        case["ops"].insert(k, [extra, rng.randint(1, 4)])
    case["mid"] = [rng.randint(0, 6), rng.randint(1, 4)] if rng.random() < 0.5 else None
    if case["wrap"] == "forever":
        # An endless epoch: the loop breaks out of it (_drain's limit); no threads (their
        # limit is per thread, so the count taken differs by design).
        case["ops"] = [op for op in case["ops"] if op[0] != "threads"]


ROUND3_KINDS = ["ragged_dict", "deep_tuple", "all_dtypes", "empties", "big", "np_strings",
                "bigint", "state"]  # fmt: skip


def _round3(rng: random.Random, case: dict) -> None:
    """The dimensions added on 2026-11-30, drawn after ``_more`` (an older seed draws its
    older case, with these on top): item kinds, faults, collates and loops (the module's
    docstring)."""
    if rng.random() < 0.45:
        case["kind"] = rng.choice(ROUND3_KINDS)
        if case["kind"] == "state" and case["init"] is None and case.get("wrap") != "init_shard":
            case["init"] = "state"
    if case["fault"] == "none" and rng.random() < 0.15 and case.get("wrap") != "self":
        case["fault"] = rng.choice(["two_args", "OSError"])
    if case.get("collate") is None and rng.random() < 0.15:
        case["collate"] = rng.choice(["held", "key_error"])
    for _ in range(rng.randint(0, 2)):
        k = rng.randint(0, len(case["ops"]) - 1)
        extra = rng.choice(["raise_in_loop", "two_loaders", "fork"])
        case["ops"].insert(k, [extra, rng.randint(0, 4)])


def build(case: dict, loader_class: str):
    """The case's loader, of torch's class (``"torch"``) or ours (``"ours"``)."""
    dataset = dataset_of(case, loader_class)
    kwargs = {k: v for k, v in case["options"].items() if v is not None}
    if case["init"]:
        kwargs["worker_init_fn"] = ALL_INITS[case["init"]]
    if case.get("generator") is not None:
        kwargs["generator"] = torch.Generator().manual_seed(case["generator"])
    if case.get("collate"):
        kwargs["collate_fn"] = COLLATES[case["collate"]]
    form = case.get("form", "sampler")
    if case["sampling"] == "shuffle":
        kwargs["shuffle"] = True
        kwargs["generator"] = torch.Generator().manual_seed(case["seed"])
    elif case["sampling"] == "sampler":
        kwargs["sampler"] = sampler_of(form, case["order"])
    elif case["sampling"] == "batch_sampler":
        kwargs.pop("batch_size", None)
        kwargs.pop("drop_last", None)
        kwargs["batch_sampler"] = sampler_of(form, case["order"])
    return loader_of(loader_class)(dataset, **kwargs)


def dataset_of(case: dict, loader_class: str):
    """The case's dataset: its items, wrapped as ``case["wrap"]`` says."""
    n, kind, fault, at, lie = case["n"], case["kind"], case["fault"], case["at"], case["lie"]
    wrap = case.get("wrap", "")
    if case["iterable"]:
        if wrap == "self":
            return StreamSelf(n, kind)
        if wrap == "chain":
            half = n // 2
            return tud.ChainDataset([
                StreamItems(half, kind, fault, at, loader_class, lie),
                StreamItems(n - half, kind, "none", -1, loader_class, 0),
            ])  # fmt: skip
        return StreamItems(n, kind, fault, at, loader_class, lie, wrap)
    if wrap == "getitems":
        return MapItemsInBatches(n, kind, fault, at, loader_class)
    if wrap == "subset":
        return tud.Subset(MapItems(n + 3, kind, fault, at, loader_class),
                          list(range(n + 2, 2, -1)))  # fmt: skip
    if wrap == "concat":
        half = n // 3
        return tud.ConcatDataset([MapItems(half, kind, fault, at, loader_class),
                                  MapItems(n - half, "tensor", "none", -1, loader_class)])  # fmt: skip
    if wrap == "stack":
        return tud.StackDataset(a=MapItems(n, kind, fault, at, loader_class),
                                b=MapItems(n, "tensor", "none", -1, loader_class))  # fmt: skip
    if wrap == "tensor":
        return tud.TensorDataset(torch.arange(2.0 * n).view(n, 2), torch.arange(n))
    return MapItems(n, kind, fault, at, loader_class, lie if wrap == "lies" else 0)


def shift(dataset, by: int) -> None:
    """Add ``by`` to the offset of every dataset inside ``dataset`` (the loop's "mutate")."""
    if hasattr(dataset, "offset"):
        dataset.offset += by
    inner = getattr(dataset, "datasets", None) or [getattr(dataset, "dataset", None)]
    if isinstance(inner, dict):
        inner = list(inner.values())
    for each in inner:
        if each is not None:
            shift(each, by)


def copy_offsets(source, target) -> None:
    """Give every dataset inside ``target`` the offset of its place in ``source`` (a loader
    rebuilt from the case to resume a checkpoint then sees the loop's "mutate" as the first)."""
    if hasattr(source, "offset"):
        target.offset = source.offset
    for a, b in zip(_inner(source), _inner(target), strict=True):
        if a is not None and b is not None:
            copy_offsets(a, b)


def _inner(dataset) -> list:
    inner = getattr(dataset, "datasets", None) or [getattr(dataset, "dataset", None)]
    return list(inner.values()) if isinstance(inner, dict) else list(inner)


def canon(value):
    """A batch as plain, comparable values: types, dtypes, shapes, strides and contents."""
    if isinstance(value, torch.Tensor):
        return ("T", str(value.dtype), tuple(value.shape), value.stride(), value.tolist())
    if isinstance(value, np.ndarray):
        return ("N", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, np.generic):
        return ("G", str(value.dtype), value.item())
    if isinstance(value, dict):
        return ("D", type(value).__name__, [(k, canon(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [canon(v) for v in value])
    if isinstance(value, types.GeneratorType):  # the "generator" collate's batch
        return ("Gen", [canon(v) for v in value])
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return ("V", type(value).__name__, value)
    return ("O", type(value).__name__, repr(value))


def collect() -> None:
    gc.collect()
