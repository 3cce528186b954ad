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
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
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
    raise AssertionError(kind)


def misbehave(fault: str, i: int, loader_class: str) -> None:
    """What item ``i``'s fault does before the item is made."""
    if fault == "IndexError":
        raise IndexError(f"item {i} is not there")
    if fault == "StopIteration":
        raise StopIteration
    if fault == "KeyboardInterrupt":
        raise KeyboardInterrupt
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


def loader_of(name: str):
    if name == "ours":
        from agents.torch import DataLoader

        return DataLoader
    return tud.DataLoader


class MapItems(tud.Dataset):
    def __init__(self, n: int, kind: str, fault: str, at: int, loader_class: str) -> None:
        self.n, self.kind, self.fault, self.at, self.loader_class = n, kind, fault, at, loader_class

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.at:
            misbehave(self.fault, i, self.loader_class)
        return make_item(i, self.kind)


class StreamItems(tud.IterableDataset):
    """Rows split among the workers by ``get_worker_info()``; ``len()`` off by ``lie``."""

    def __init__(self, n: int, kind: str, fault: str, at: int, loader_class: str, lie: int):
        self.n, self.kind, self.fault, self.at, self.loader_class = n, kind, fault, at, loader_class
        self.lie = lie

    def __len__(self) -> int:
        return max(0, self.n + self.lie)

    def __iter__(self):
        info = tud.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, self.n, of):
            if i == self.at:
                misbehave(self.fault, i, self.loader_class)
            yield make_item(i, self.kind)


class Batches(tud.Sampler):
    """A custom ``batch_sampler`` (or ``sampler``): these lists (or indices), in order."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def init_raises(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


def init_sleeps(worker_id: int) -> None:
    time.sleep(0.3)


def init_threads(worker_id: int) -> None:
    torch.set_num_threads(1)


def init_seed(worker_id: int) -> None:
    info = tud.get_worker_info()
    assert info.seed == torch.initial_seed(), (info.seed, torch.initial_seed())


INITS = {"raises": init_raises, "sleeps": init_sleeps, "threads": init_threads,
         "seed": init_seed}  # fmt: skip
KINDS = ["tensor", "tensor", "zero", "view", "namedtuple", "dataclass", "numpy", "string",
         "bytes", "nested"]  # fmt: skip
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
    return {
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


def build(case: dict, loader_class: str):
    """The case's loader, of torch's class (``"torch"``) or ours (``"ours"``)."""
    if case["iterable"]:
        dataset = StreamItems(case["n"], case["kind"], case["fault"], case["at"], loader_class,
                              case["lie"])  # fmt: skip
    else:
        dataset = MapItems(case["n"], case["kind"], case["fault"], case["at"], loader_class)
    kwargs = {k: v for k, v in case["options"].items() if v is not None}
    if case["init"]:
        kwargs["worker_init_fn"] = INITS[case["init"]]
    if case["sampling"] == "shuffle":
        kwargs["shuffle"] = True
        kwargs["generator"] = torch.Generator().manual_seed(case["seed"])
    elif case["sampling"] == "sampler":
        kwargs["sampler"] = Batches(case["order"])
    elif case["sampling"] == "batch_sampler":
        kwargs.pop("batch_size", None)
        kwargs.pop("drop_last", None)
        kwargs["batch_sampler"] = Batches(case["order"])
    return loader_of(loader_class)(dataset, **kwargs)


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
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return ("V", type(value).__name__, value)
    return ("O", type(value).__name__, repr(value))


def collect() -> None:
    gc.collect()
