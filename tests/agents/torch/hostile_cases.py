"""Generated ``DataLoader`` cases of hostile user code, for the never-hang tests (short and soak).

What ``loader_cases`` does not generate: a dataset (map-style or iterable) whose item kills
its worker (``os._exit``, SIGKILL, a segfault), sleeps past the loader's ``timeout``, raises
an exception that torch's workers cannot rebuild (``KeyError`` with odd arguments, one whose
``__init__`` wants two arguments, one that cannot be pickled at all), or is an object that
cannot be pickled (a lambda, a lock, an open file); items that are empty tensors, numpy
arrays, record arrays, strings, dataclasses, torch.nested tensors or a 32 MB tensor; a ``collate_fn`` that returns odd things (a
generator, ``None``, a set); a ``worker_init_fn`` that raises or exits; a sampler that goes
out of range, a ``__len__`` that lies, an iterable whose workers read different counts or
nothing; and a training loop that skips failed batches, breaks, raises ``KeyboardInterrupt``
in its body, or drops the loader mid-epoch.

The oracle is torch's ``DataLoader`` with ``num_workers=0`` on the same code, where a fault
that would kill the training process (or sleep) raises a ``RuntimeError`` instead, as torch's
workers report a dead worker or a timeout: ours must give the same batches and errors of the
same types, batch for batch (timeouts aside: a slow batch raises one or more, then comes),
every call must return within ``CALL_BOUND_S``, and afterwards none of our processes,
threads or shared-memory files may be left. (torch with workers hangs for ever on an
unpicklable item or collate result; ours must raise.)
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.utils.data as tud
from hypothesis import strategies as st

from agents.torch import DataLoader
from tests.agents.torch.conftest import assert_same
from tests.agents.torch.loader_cases import assert_nothing_left, bounded, children

TIMEOUT_S = 0.5  # the loader's timeout in the "slow" cases; the item sleeps 3 times as long
HUGE = 4_000_000  # float32 elements: 16 MB


class KeyErrorOdd(KeyError):
    """Raised as ``KeyError(("a", 1), None)``: two arguments, a tuple among them."""


class NeedsTwo(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


class CannotPickle(Exception):
    def __reduce__(self):
        raise TypeError("this exception cannot be pickled")


UNSENT = ["lambda", "lock", "file", "unrebuildable"]  # items that cannot cross a process
RAISES = ["ValueError", "KeyError", "NeedsTwo", "CannotPickle", "IndexError"]
DEATHS = ["exit", "sigkill", "segfault"]
UNPICKLABLE = ["lambda", "lock", "file"]


def _refuse_rebuild():
    raise ValueError("this item pickles but cannot be rebuilt")


class Unrebuildable:
    """An item that pickles in the worker and raises ``ValueError`` where it is unpickled (the
    training process: torch's workers raise it there, as it is; torch in one process hands
    the object over)."""

    def __reduce__(self):
        return (_refuse_rebuild, ())


def _raise(how: str, where: str) -> None:
    if how == "ValueError":
        raise ValueError(where)
    if how == "KeyError":
        raise KeyError((where, 1), None)
    if how == "NeedsTwo":
        raise NeedsTwo(7, where)
    if how == "CannotPickle":
        raise CannotPickle(where)
    raise IndexError(where)


def _misbehave(how: str, where: str, reference: bool):
    """Do ``how`` (raise, die, sleep); ``reference``: in torch's single process, where a death
    or a sleep past the timeout is a ``RuntimeError``, as torch's workers report them."""
    if how in RAISES:
        _raise(how, where)
    if reference and how in DEATHS:
        raise RuntimeError(f"{how} at {where}")
    if reference and how == "slow":
        return None  # ours raise timeouts (which play() skips), then give the item
    if how == "exit":
        os._exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "slow":
        time.sleep(3 * TIMEOUT_S)
        return None
    if how == "lambda":
        return lambda: None
    if how == "lock":
        return threading.Lock()
    if how == "file":
        return open(os.devnull)  # noqa: SIM115 - the point: an open file as an item
    if how == "unrebuildable":
        return Unrebuildable()
    raise AssertionError(how)


@dataclass
class Point:
    x: int
    y: float


def make_item(i: int, kind: str):
    if kind == "tensor":
        return torch.tensor([i, -i])
    if kind == "empty":
        return torch.zeros((0, 2))
    if kind == "numpy":
        return np.arange(i, i + 3, dtype=np.int64)
    if kind == "string":
        return f"item-{i}"
    if kind == "dataclass":
        return Point(i, i / 2)  # default_collate refuses it: a TypeError per batch
    if kind == "nested":
        return {"a": (torch.tensor(i), [np.float32(i), {"s": f"{i}"}]), "b": i}
    if kind == "complex":
        return torch.ones(2, dtype=torch.complex64) * i
    if kind == "bfloat16":
        return torch.ones(2, dtype=torch.bfloat16) * i
    if kind == "view":  # a strided view of a larger tensor
        return torch.arange(12.0).reshape(3, 4).t()[i % 4]
    if kind == "bigint":
        return 2**70 + i  # default_collate: ValueError (no int64 holds it)
    if kind == "none":
        return None  # default_collate: TypeError
    if kind == "huge":
        return torch.full((HUGE,), float(i))
    if kind == "record":  # a row of a binary file read with a structured dtype
        return np.array([(i, (i, -i), i)], dtype=[("label", "<i4"), ("dense", "<f4", (2,)),
                                                   ("id", ">i8")])  # fmt: skip
    if kind == "jagged":  # torch.nested: rows of several lengths
        return torch.nested.nested_tensor([torch.arange(float(i % 3 + 1)), torch.ones(2)])
    raise AssertionError(kind)


@dataclass(frozen=True)
class Fault:
    where: str = "none"  # none, item, collate, worker_init, sampler, len
    how: str = "ValueError"  # RAISES, DEATHS, "slow", UNPICKLABLE, "odd" (collate)
    at: int = -1


class MapItems(tud.Dataset):
    def __init__(self, n: int, kind: str, fault: Fault, reference: bool) -> None:
        self.n, self.kind, self.fault, self.reference = n, kind, fault, reference

    def __len__(self) -> int:
        return self.n + (3 if self.fault.where == "len" else 0)  # "len": it lies

    def __getitem__(self, i):
        if not isinstance(i, int) or not 0 <= i < self.n:
            raise IndexError(f"index {i!r} out of range of {self.n} items")
        if self.fault.where == "item" and i == self.fault.at:
            odd = _misbehave(self.fault.how, f"item {i}", self.reference)
            if odd is not None:
                return odd
        return make_item(i, self.kind)


class StreamItems(tud.IterableDataset):
    """Worker ``w`` of ``k`` reads ``i`` with ``i % k == w``; ``uneven``: worker ``w`` reads
    only its first ``w * 2`` of them (worker 0 none)."""

    def __init__(self, n: int, kind: str, fault: Fault, reference: bool, uneven: bool) -> None:
        self.n, self.kind, self.fault, self.reference = n, kind, fault, reference
        self.uneven = uneven

    def __iter__(self):
        info = tud.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self._items(worker, workers)

    def _items(self, worker: int, workers: int):
        mine = list(range(worker, self.n, workers))
        if self.uneven:
            mine = mine[: worker * 2]
        for i in mine:
            if self.fault.where == "item" and i == self.fault.at:
                odd = _misbehave(self.fault.how, f"item {i}", self.reference)
                if odd is not None:
                    yield odd
                    continue
            yield make_item(i, self.kind)


@dataclass(frozen=True)
class Collate:
    """A custom ``collate_fn``: the samples as a list, or (``fault``) misbehaving on the batch
    holding item ``at``: raising, dying, or returning an odd result (``odd``)."""

    fault: Fault
    odd: str = "generator"  # generator (cannot be pickled), none, set
    reference: bool = False

    def __call__(self, batch):
        samples = batch if isinstance(batch, list) else [batch]
        if self.fault.where == "collate" and any(_index(s) == self.fault.at for s in samples):
            if self.fault.how == "odd":
                if self.odd == "generator":
                    return (s for s in samples)
                return None if self.odd == "none" else {len(samples), "odd"}
            _misbehave(self.fault.how, f"collate of item {self.fault.at}", self.reference)
        return list(samples)


def _index(sample) -> int | None:
    if isinstance(sample, torch.Tensor) and sample.numel():
        return int(sample.flatten()[0])
    return None


@dataclass(frozen=True)
class InitWorker:
    how: str

    def __call__(self, worker_id: int) -> None:
        _misbehave(self.how, f"worker {worker_id}'s init", False)


class Indices(tud.Sampler):
    """The indices 0 .. n-1, with ``n + 5`` (out of range) in place of the one at ``at``."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at

    def __iter__(self):
        return iter([self.n + 5 if k == self.at else k for k in range(self.n)])

    def __len__(self) -> int:
        return self.n


@dataclass
class Case:
    kind: str  # map, iterable
    n: int
    item: str
    fault: Fault
    options: dict
    custom_collate: bool = False
    odd: str = "generator"
    uneven: bool = False
    # The training loop: "skip" (catch each error, go on), "break" after ``at`` outcomes,
    # "interrupt" (KeyboardInterrupt raised in the loop's body after ``at``), "drop" (the
    # loader and its iterator dropped mid-epoch after ``at``); then a second epoch, whole.
    loop: str = "skip"
    at: int = 0

    @property
    def first_error_only(self) -> bool:
        """A failing ``worker_init_fn`` with workers: torch's workers die, and what its
        iterator does after the first error is no defined behaviour; ours raise the error in
        place of every batch (checked on its own, not against torch)."""
        return self.fault.where == "worker_init" and self.options["num_workers"] > 0

    def dataset(self, reference: bool):
        if self.kind == "map":
            return MapItems(self.n, self.item, self.fault, reference)
        return StreamItems(self.n, self.item, self.fault, reference, self.uneven)

    def kwargs(self, reference: bool) -> dict:
        kwargs = dict(self.options)
        if self.custom_collate:
            kwargs["collate_fn"] = Collate(self.fault, self.odd, reference)
        if self.fault.where == "worker_init":
            kwargs["worker_init_fn"] = InitWorker(self.fault.how)
        if self.fault.where == "sampler":
            kwargs["sampler"] = Indices(self.n, self.fault.at)
        if self.fault.how == "slow":
            kwargs["timeout"] = TIMEOUT_S if not reference else 0
        if reference:
            kwargs["num_workers"] = 0
            for option in ("persistent_workers", "prefetch_factor", "multiprocessing_context",
                           "fuse"):  # fmt: skip
                kwargs.pop(option, None)
            kwargs["timeout"] = 0
        return kwargs


@st.composite
def cases(draw, max_items: int = 24) -> Case:
    """Random hostile user code and training loops."""
    kind = draw(st.sampled_from(["map", "iterable"]))
    item = draw(st.sampled_from(["tensor", "tensor", "empty", "numpy", "string", "nested",
                                 "dataclass", "huge", "complex", "bfloat16", "view", "bigint",
                                 "none", "record", "jagged"]))  # fmt: skip
    n = draw(st.integers(0, 3 if item == "huge" else max_items))
    workers = draw(st.integers(0, 3))
    batch_size = draw(st.sampled_from([None, 1, 2, 3, 5]))
    options: dict = {
        "batch_size": batch_size,
        "drop_last": draw(st.booleans()) if batch_size else False,
        "num_workers": workers,
        "pin_memory": draw(st.booleans()),
    }
    if workers > 0:
        options["persistent_workers"] = draw(st.booleans())
        options["prefetch_factor"] = draw(st.sampled_from([None, 1, 3]))
        options["multiprocessing_context"] = draw(
            st.sampled_from([None, "fork", "spawn", "forkserver"])
        )
        options["timeout"] = draw(st.sampled_from([0, 20]))
    # Ours only: every step a stage of its own (samples cross a process between them).
    options["fuse"] = draw(st.sampled_from(["auto", None]))
    custom_collate = draw(st.booleans())
    wheres = ["none", "item", "item", "worker_init"] + (["collate"] if custom_collate else [])
    if kind == "map":
        wheres += ["sampler", "len"]
    where = draw(st.sampled_from(wheres))
    hows = {
        "none": ["ValueError"],
        "item": RAISES + DEATHS + ["slow"] + (UNSENT if custom_collate else []),
        "collate": RAISES + DEATHS + ["slow", "odd"],
        "worker_init": RAISES + ["exit"],
        "sampler": ["IndexError"],
        "len": ["IndexError"],
    }[where]
    how = draw(st.sampled_from(hows))
    fault = Fault(where, how, draw(st.integers(0, max(n - 1, 0))))
    loop = draw(st.sampled_from(["skip", "skip", "break", "interrupt", "drop"]))
    return Case(kind, n, item, fault, options, custom_collate,
                odd=draw(st.sampled_from(["generator", "none", "set"])),
                uneven=kind == "iterable" and draw(st.booleans()),
                loop=loop, at=draw(st.integers(0, 6)))  # fmt: skip


# ----------------------------------------------------------------------------- running


class Interrupted(KeyboardInterrupt):
    """The Ctrl-C a case's loop body raises."""


def _next(case: Case, iterator, ours: bool):
    try:
        return ("batch", bounded(case, "next()", next, iterator) if ours else next(iterator))
    except StopIteration:
        return None
    except Exception as exc:  # noqa: BLE001 - compared with torch's
        return ("error", exc)


def play(case: Case, loader, ours: bool, prefixes: list[str]) -> list[list[tuple]]:
    """The case's training loop: the first epoch as the case says, a second one whole."""
    epochs: list[list[tuple]] = []
    limit = case.n * max(1, case.options["num_workers"]) + 20
    for epoch in range(2):
        outcomes: list[tuple] = []
        epochs.append(outcomes)
        try:
            iterator = bounded(case, "iter()", iter, loader) if ours else iter(loader)
        except Exception as exc:  # noqa: BLE001 - torch's single-process iter() may raise
            outcomes.append(("error", exc))
            continue
        if ours:
            prefixes.append(loader.pipeline._prefix)
        stop_at = case.at if epoch == 0 and case.loop != "skip" else None
        try:
            while stop_at is None or len(outcomes) < stop_at:
                outcome = _next(case, iterator, ours)
                if outcome is None:
                    break
                if outcome[0] == "error" and _is_timeout(outcome[1]) and ours:
                    continue  # a slow batch: raised one or more timeouts, then comes
                outcomes.append(outcome)
                assert len(outcomes) <= limit, f"more than {limit} outcomes; case: {case}"
            if epoch == 0 and case.loop == "interrupt" and stop_at is not None:
                raise Interrupted
        except Interrupted:
            pass
        if epoch == 0 and case.loop == "drop" and ours:
            return epochs  # the caller drops the loader
        del iterator
    return epochs


def _is_timeout(exc: BaseException) -> bool:
    return type(exc) is RuntimeError and "timed out after" in str(exc)


def _expected_type(case: Case, theirs: BaseException) -> tuple[type, ...]:
    if type(theirs) is RuntimeError and str(theirs).startswith(tuple(DEATHS) + ("slow",)):
        return (RuntimeError,)  # a death (or a timeout, which play() skips) in a worker
    return (type(theirs),)


def compare(case: Case, ours: list[list[tuple]], theirs: list[list[tuple]]) -> None:
    for e, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if case.first_error_only:
            # No batch comes from a worker whose worker_init_fn failed (torch's dies): every
            # outcome is its error, in every epoch (of an iterable, once per reader).
            assert all(o[0] == "error" and isinstance(o[1], _raised(case.fault.how)) for o in a), (
                f"epoch {e}: ours {_summary(a)}, worker_init_fn {case.fault.how}"
            )
            if case.kind == "iterable":
                assert len(a) <= max(1, case.options["num_workers"]), f"epoch {e}: {_summary(a)}"
            continue
        if case.kind == "iterable" and case.options["num_workers"] >= 2:
            _same_multiset(e, case, a, b)
            continue
        assert len(a) == len(b), f"epoch {e}: ours {_summary(a)} != torch's {_summary(b)}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_outcome(case, x, y, f"epoch {e} outcome {k}")


def _raised(how: str) -> type:
    if how not in RAISES:
        return RuntimeError  # a death: torch's RuntimeError (ours: StageFailed, one)
    try:
        _raise(how, "")
    except Exception as exc:  # noqa: BLE001 - its type
        return type(exc)
    raise AssertionError(how)


def _same_outcome(case: Case, ours: tuple, theirs: tuple, where: str) -> None:
    if theirs[0] == "batch" and case.fault.how == "unrebuildable" and ours[0] == "error":
        # torch's workers raise the unpickling's ValueError; in one process there is none.
        assert isinstance(ours[1], ValueError), f"{where}: ours raised {_show(ours)}"
        return
    if theirs[0] == "batch" and _unsendable(case):
        # torch in one process hands the lambda (lock, file, generator) over; its workers hang
        # for ever trying to send it; ours raise.
        if ours[0] == "error":
            return
    assert ours[0] == theirs[0], f"{where}: ours {_show(ours)}, torch's {_show(theirs)}"
    if ours[0] == "batch":
        assert_same(_comparable(ours[1]), _comparable(theirs[1]), where)
        return
    expected = _expected_type(case, theirs[1])
    assert isinstance(ours[1], expected), (
        f"{where}: ours raised {_show(ours)}, torch {_show(theirs)}"
    )


def _unsendable(case: Case) -> bool:
    return case.fault.how in UNPICKLABLE or (case.fault.how == "odd" and case.odd == "generator")


def _comparable(batch):
    """numpy arrays and dataclasses compared by value (assert_same compares tensors)."""
    if isinstance(batch, np.ndarray) and batch.dtype.names:
        return ("record", str(batch.dtype), batch.shape, batch.tobytes())
    if isinstance(batch, torch.Tensor) and batch.is_nested:
        return ("nested", [_comparable(t) for t in batch.unbind()])
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(batch))
    if isinstance(batch, np.generic):
        return batch.item()
    if isinstance(batch, dict):
        return {k: _comparable(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple) and type(batch) in (list, tuple):
        return type(batch)(_comparable(v) for v in batch)
    return batch


def _same_multiset(e: int, case: Case, ours: list[tuple], theirs: list[tuple]) -> None:
    """Several readers: torch's ``num_workers=0`` reads the stream once, as one reader; ours
    read it as ``num_workers`` readers, each its share. Every batch of ours must hold items
    of the stream, none twice; errors must be of torch's types; a whole epoch without a
    fault holds every item."""
    seen: Counter = Counter()
    for o in ours:
        if o[0] == "batch":
            for sample in o[1] if isinstance(o[1], list) else [o[1]]:
                seen[repr(_comparable(sample))] += 1
    dupes = [k for k, c in seen.items() if c > 1 and case.item in ("tensor", "numpy")]
    assert not dupes, f"epoch {e}: items read twice: {dupes[:3]}"
    want_types = {type(o[1]) for o in theirs if o[0] == "error"}
    for o in ours:
        if o[0] == "error":
            assert isinstance(o[1], (RuntimeError, *want_types)), (
                f"epoch {e}: ours raised {_show(o)}, torch's types {want_types}"
            )


def _show(outcome: tuple) -> str:
    if outcome[0] == "error":
        return f"{type(outcome[1]).__name__}({str(outcome[1])[:200]})"
    return f"batch {type(outcome[1]).__name__}"


def _summary(outcomes: list[tuple]) -> list[str]:
    return [_show(o) for o in outcomes]


def run_case(case: Case) -> None:
    """Run ``case`` on torch (``num_workers=0``) and on ours; compare; then nothing of ours
    may be left: no process, thread, or shared-memory file."""
    try:
        reference = tud.DataLoader(case.dataset(True), **case.kwargs(reference=True))
    except Exception as refused:  # noqa: BLE001 - torch refuses it: so must ours
        try:
            DataLoader(case.dataset(False), **case.kwargs(reference=False)).close()
        except type(refused):
            return
        raise AssertionError(f"torch refuses ({refused!r}), ours not; case: {case}") from None
    theirs = play(case, reference, ours=False, prefixes=[])
    children_before = children()
    threads_before = set(threading.enumerate())
    prefixes: list[str] = []
    loader = bounded(
        case, "DataLoader()", lambda: DataLoader(case.dataset(False), **case.kwargs(False))
    )
    try:
        ours = play(case, loader, ours=True, prefixes=prefixes)
    except BaseException:
        bounded(case, "close()", loader.close)
        raise
    if case.loop == "drop":
        theirs = theirs[:1]  # the loader went mid-epoch: no second epoch
    else:
        bounded(case, "close()", loader.close)
    try:
        compare(case, ours, theirs)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ncase: {case}") from None
    held = [loader, ours]
    del loader, ours
    bounded(case, "the loader's garbage collection", lambda: (held.clear(), gc.collect()))
    assert_nothing_left(case, "", threads_before, children_before, prefixes)
