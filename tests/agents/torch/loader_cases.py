"""Generated ``DataLoader`` cases for the parity-and-never-hang tests (short and soak forms).

A case is a dataset (map-style or iterable, 0 to 200 items of a few bytes to about 1 MB, as
tensors or nested dicts, tuples and named tuples), torch's loader options, a fault (an
exception in ``__getitem__``, ``__iter__``, ``collate_fn`` or ``worker_init_fn``, or an item
that sleeps) and what the training loop does in each of 1 to 3 epochs (a whole epoch, a
``break``, ``del`` of the iterator, a new ``iter()``, ``close()``, live resizes between
batches). ``run_case`` runs it on ``agents.torch.DataLoader`` under a watchdog (every call in
a thread joined with a bound) and on ``torch.utils.data.DataLoader``, and compares what each
call gave: the same batches, or an error of the same type.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import Counter, namedtuple
from dataclasses import dataclass, field

import psutil
import torch
import torch.utils.data as tud
from hypothesis import strategies as st

from agents.torch import DataLoader
from tests.agents.pipeline import stress
from tests.agents.torch.conftest import assert_same

CALL_BOUND_S = 30.0  # the longest one call (next, iter, close, apply) may take on busy CPUs
GONE_BOUND_S = 15.0  # for every worker process and thread to leave after close
SIZES = {"tiny": 1, "small": 64, "large": 262_144}  # float32 elements: 4 B, 256 B, 1 MB
SLEEP_S = 0.2
STALL_S, STALL_TIMEOUT_S = 4.0, 1.5  # an item that outlasts the loader's timeout

Row = namedtuple("Row", ["features", "extra"])


class Refused(Exception):
    """A user's own exception type: torch raises it to the training loop as it is."""


class NeedsTwoArguments(Exception):
    """An exception that cannot be built from one message (torch's workers raise a
    ``RuntimeError`` for it; ``num_workers=0`` raises it as it is)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


ERRORS = {
    "ValueError": ValueError,
    "KeyError": KeyError,
    "OSError": OSError,
    "Refused": Refused,
    "NeedsTwoArguments": NeedsTwoArguments,
}


def _raise(error: str, where: str) -> None:
    kind = ERRORS[error]
    if kind is NeedsTwoArguments:
        raise kind(7, where)
    raise kind(where)


def make_item(i: int, size: str, shape: str):
    """Item ``i``: a tensor of ``size`` filled with ``i``, alone or nested."""
    tensor = torch.full((SIZES[size],), float(i))
    if shape == "tensor":
        return tensor
    if shape == "dict":
        return {"x": tensor, "meta": {"i": i, "pair": (i, float(i))}}
    if shape == "tuple":
        return (tensor, i)
    return Row(tensor, {"i": i, "name": f"row{i}"})


def index_of(sample) -> int:
    """The ``i`` an item (or a collated batch's first item) was made from."""
    while not isinstance(sample, torch.Tensor):
        sample = sample["x"] if isinstance(sample, dict) else sample[0]
    return int(sample.flatten()[0])


@dataclass(frozen=True)
class Fault:
    """Where the case raises (``at``: the item, for ``getitem``, ``iter_mid``, ``collate``)
    or sleeps (``sleep``)."""

    # none, getitem, iter_start, iter_mid, collate, worker_init, sleep, stall, sampler
    where: str = "none"
    at: int = -1
    error: str = "ValueError"


class MapItems(tud.Dataset):
    def __init__(self, n: int, size: str, shape: str, fault: Fault) -> None:
        self.n, self.size, self.shape, self.fault = n, size, shape, fault

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.fault.where == "getitem" and i == self.fault.at:
            _raise(self.fault.error, f"item {i} is refused")
        if self.fault.where in ("sleep", "stall") and i == self.fault.at:
            time.sleep(SLEEP_S if self.fault.where == "sleep" else STALL_S)
        return make_item(i, self.size, self.shape)


class StreamItems(tud.IterableDataset):
    """0 .. n-1, split between workers by ``get_worker_info()`` or read whole by each."""

    def __init__(self, n: int, size: str, shape: str, split: bool, fault: Fault) -> None:
        self.n, self.size, self.shape, self.split, self.fault = n, size, shape, split, fault

    def __iter__(self):
        if self.fault.where == "iter_start":
            _raise(self.fault.error, "the stream cannot start")
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None or not self.split else (info.id, info.num_workers)
        return self._items(start, step)

    def _items(self, start: int, step: int):
        for i in range(start, self.n, step):
            if self.fault.where == "iter_mid" and i == self.fault.at:
                _raise(self.fault.error, f"the stream broke at {i}")
            if self.fault.where in ("sleep", "stall") and i == self.fault.at:
                time.sleep(SLEEP_S if self.fault.where == "sleep" else STALL_S)
            yield make_item(i, self.size, self.shape)


@dataclass(frozen=True)
class Collate:
    """A custom ``collate_fn``: torch's default, raising on a batch holding item ``fail_at``."""

    fail_at: int = -1
    error: str = "ValueError"

    def __call__(self, batch):
        samples = batch if isinstance(batch, list) else [batch]
        if any(index_of(s) == self.fail_at for s in samples):
            _raise(self.error, f"cannot collate item {self.fail_at}")
        # Without auto-batching a collate_fn gets one sample: torch's default converts it.
        collated = (
            tud.default_collate(batch) if isinstance(batch, list) else tud.default_convert(batch)
        )
        return {"batch": collated, "count": len(samples)}


@dataclass(frozen=True)
class InitWorker:
    """A ``worker_init_fn`` that raises (``fail``) or checks what torch guarantees."""

    fail: bool = False
    error: str = "ValueError"

    def __call__(self, worker_id: int) -> None:
        info = tud.get_worker_info()
        assert info is not None and info.id == worker_id
        if self.fail:
            _raise(self.error, f"worker {worker_id} cannot start")


class ListSampler(tud.Sampler):
    """A custom sampler: these indices (or batches of them), in this order; raising instead
    of giving the one at ``fail_at``."""

    def __init__(self, indices: list, fault: Fault | None = None) -> None:
        self.indices = indices
        self.fault = fault or Fault()

    def __iter__(self):
        for k, index in enumerate(self.indices):
            if self.fault.where == "sampler" and k == self.fault.at:
                _raise(self.fault.error, f"the sampler broke at {k}")
            yield index

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class Case:
    """One generated loader, its fault and the training loop's actions, epoch by epoch."""

    kind: str  # "map" or "iterable"
    n: int
    size: str
    shape: str
    split: bool
    options: dict
    fault: Fault
    sampling: str  # map-style: "sequential", "shuffle", "sampler", "batch_sampler"
    order: list[int] = field(default_factory=list)  # sampler's indices / batch_sampler's
    custom_collate: bool = False
    # Per epoch: ("full",) or (action, at) with action in break, del, new_iter, close;
    # resizes: the batches after which the loader's stages get these worker counts.
    epochs: list[tuple] = field(default_factory=list)
    resizes: list[tuple[int, int]] = field(default_factory=list)
    # How the loader ends: "close" (close()), or "drop" (its last reference dropped and
    # collected, as a script that never calls close() leaves it).
    ending: str = "close"

    def dataset(self):
        if self.kind == "map":
            return MapItems(self.n, self.size, self.shape, self.fault)
        return StreamItems(self.n, self.size, self.shape, self.split, self.fault)

    def kwargs(self, theirs: bool) -> dict:
        """The loader's arguments; ``theirs``: torch's reference run (see ``reference_workers``)."""
        kwargs = dict(self.options)
        if self.sampling == "shuffle":
            kwargs["shuffle"] = True
            kwargs["generator"] = torch.Generator().manual_seed(self.options.get("seed", 0))
        elif self.sampling == "sampler":
            kwargs["sampler"] = ListSampler(self.order, self.fault)
        elif self.sampling == "batch_sampler":
            size = max(1, kwargs.pop("batch_size") or 1)
            kwargs.pop("drop_last", None)
            batches = [self.order[k : k + size] for k in range(0, len(self.order), size)]
            kwargs["batch_sampler"] = ListSampler(batches, self.fault)
        kwargs.pop("seed", None)
        if self.custom_collate:
            fail_at = self.fault.at if self.fault.where == "collate" else -1
            kwargs["collate_fn"] = Collate(fail_at, self.fault.error)
        init = kwargs.pop("init", False)
        if self.fault.where == "worker_init":
            kwargs["worker_init_fn"] = InitWorker(True, self.fault.error)
        elif init:
            kwargs["worker_init_fn"] = InitWorker()
        if theirs:
            workers = self.reference_workers
            kwargs["num_workers"] = workers
            if workers == 0:
                # torch's single-process iterator refuses these (persistent_workers and
                # prefetch_factor need workers; its timeout needs them too).
                kwargs.pop("persistent_workers", None)
                kwargs.pop("prefetch_factor", None)
                kwargs["timeout"] = 0
        return kwargs

    @property
    def reference_workers(self) -> int:
        """torch's ``num_workers`` for the reference run: 0 (its order and errors are those
        of every ``num_workers`` for a map-style dataset, and it starts no process), except
        where its workers make a difference a user sees: an iterable dataset read by several
        workers (each reads its share), persistent workers with a shuffle (torch draws the
        base seed from the generator once, not every epoch, so the orders differ), and a
        failing ``worker_init_fn`` (torch calls it only in workers)."""
        workers = self.options.get("num_workers", 0)
        if self.kind == "iterable" and workers >= 2:
            return workers
        if self.options.get("persistent_workers") and self.sampling == "shuffle":
            return workers
        if self.fault.where in ("worker_init", "stall") and workers > 0:
            return workers  # "stall": torch's timeout needs workers
        return 0

    @property
    def unordered(self) -> bool:
        """Several readers of an iterable dataset: torch takes their batches round-robin,
        ours as they are ready (documented), so an epoch is compared as a multiset."""
        return self.kind == "iterable" and self.options.get("num_workers", 0) >= 2

    @property
    def first_error_only(self) -> bool:
        """Cases where torch's behaviour after the first error is no defined one: a failing
        ``__iter__`` (``num_workers=0``: ``iter()`` raises; workers: every later batch raises
        an ``UnboundLocalError`` for ever) and a failing ``worker_init_fn`` (workers: the
        same). Only the first error's type is compared; then the loader is closed."""
        if self.fault.where in ("iter_start", "stall"):
            return True  # "stall": after a timeout torch's iterator is in no defined state
        return self.fault.where == "worker_init" and self.options.get("num_workers", 0) > 0


@st.composite
def cases(draw, max_items: int = 200, max_epochs: int = 3, max_workers: int = 4) -> Case:
    """Random loaders, faults and training loops."""
    kind = draw(st.sampled_from(["map", "iterable"]))
    size = draw(st.sampled_from(list(SIZES)))
    # Items of 1 MB: few of them, so that a case stays a second or two.
    n = draw(st.integers(0, 12 if size == "large" else max_items))
    shape = draw(st.sampled_from(["tensor", "dict", "tuple", "namedtuple"]))
    workers = draw(st.integers(0, max_workers))
    batch_size = draw(st.sampled_from([None, 1, draw(st.integers(2, 17))]))
    options: dict = {
        "batch_size": batch_size,
        "drop_last": draw(st.booleans()) if batch_size else False,
        "num_workers": workers,
        "pin_memory": False,
        "init": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }
    if workers > 0:
        options["persistent_workers"] = draw(st.booleans())
        options["prefetch_factor"] = draw(st.sampled_from([None, 1, 2, 4]))
        # A timeout far above the sleeping item: it must not fire. (torch's single-process
        # iterator refuses a timeout, so num_workers=0 has none.)
        options["timeout"] = draw(st.sampled_from([0, 20]))
    sampling, order = "sequential", []
    if kind == "map":
        sampling = draw(st.sampled_from(["sequential", "shuffle", "sampler", "batch_sampler"]))
        if sampling in ("sampler", "batch_sampler"):
            order = draw(st.permutations(range(n)))
            order = order[: draw(st.integers(0, n))]
        if sampling == "batch_sampler" and batch_size is None:
            options["batch_size"] = 1  # a batch sampler's batches are lists of indices
    custom_collate = draw(st.booleans())
    wheres = ["none", "sleep", "worker_init"]
    wheres += ["getitem"] if kind == "map" else ["iter_start", "iter_mid"]
    wheres += ["collate"] if custom_collate else []
    wheres += ["sampler"] if sampling in ("sampler", "batch_sampler") else []
    wheres += ["stall"] if workers > 0 else []
    where = draw(st.sampled_from(wheres))
    fault = Fault(
        where=where,
        at=draw(st.integers(0, max(n - 1, 0)))
        if where in ("getitem", "iter_mid", "collate", "sleep", "sampler", "stall")
        else -1,
        error=draw(st.sampled_from(list(ERRORS))),
    )
    epochs = []
    count = draw(st.integers(1, max_epochs))
    for e in range(count):
        action = draw(st.sampled_from(["full", "full", "break", "del", "new_iter", "close"]))
        if sampling == "shuffle" and e < count - 1:
            # Not generated (test_after_a_partial_epoch_a_shuffle_from_the_loaders_generator_
            # is_torchs.py): a RandomSampler draws from the loader's generator once more when
            # exhausted; torch reads the sampler prefetch_factor * num_workers batches ahead,
            # ours further. The draw torch would not have made is undone at the next iter()
            # (DataLoader._unread_sampler_end), and a source still reading then stops at it
            # (_SamplerFeed), but where the old iterator is still held ("new_iter") its source
            # reads on, and its end can come after the next epoch's shuffle.
            action = "full"
        epochs.append((action,) if action == "full" else (action, draw(st.integers(0, 8))))
    if where == "stall":
        options["timeout"] = STALL_TIMEOUT_S
    if where in ("iter_start", "worker_init", "stall"):
        # What torch does after these errors is no defined behaviour (Case.first_error_only):
        # one epoch, up to its first error.
        epochs = [("full",)]
    resizes = []
    if draw(st.booleans()):
        resizes = draw(
            st.lists(
                st.tuples(st.integers(0, 12), st.integers(1, 3)),
                max_size=3,
                unique_by=lambda r: r[0],
            )
        )
    return Case(kind, n, size, shape, bool(draw(st.booleans())), options, fault, sampling,
                list(order), custom_collate, epochs, resizes,
                draw(st.sampled_from(["close", "drop"])))  # fmt: skip


# ----------------------------------------------------------------------------- running


def bounded(case: Case, what: str, fn, *args):
    """``fn(*args)`` in a thread joined with ``CALL_BOUND_S``; a hang fails naming the case."""
    value, _ = stress.bounded(f"{what} (case: {case})", CALL_BOUND_S, fn, *args)
    return value


_END = ("end",)


def _step(case: Case, iterator, ours: bool):
    """One ``next()``: ("batch", b), ("error", exc) or the end."""
    try:
        value = bounded(case, "next()", next, iterator) if ours else next(iterator)
    except StopIteration:
        return _END
    except Exception as exc:  # noqa: BLE001 - compared with torch's
        return ("error", exc)
    return ("batch", value)


def _iter(case: Case, loader, ours: bool):
    try:
        return bounded(case, "iter()", iter, loader) if ours else iter(loader), None
    except Exception as exc:  # noqa: BLE001 - torch's single-process iter() may raise
        return None, ("error", exc)


def play(case: Case, loader, ours: bool) -> list[list[tuple]]:
    """Run the case's training loop on ``loader``: each epoch's outcomes, in order."""
    epochs = []
    # Errors count too; an iterable dataset read whole by each reader gives n per reader.
    readers = max(1, case.options.get("num_workers", 0))
    limit = case.n * (readers if case.kind == "iterable" else 1) + 2 * readers + 4
    for action in case.epochs:
        outcomes: list[tuple] = []
        epochs.append(outcomes)
        iterator, failed = _iter(case, loader, ours)
        if failed:
            outcomes.append(failed)
            if case.first_error_only:
                break
            continue
        stop_at = None if action[0] == "full" else action[1]
        if case.unordered and not ours:
            stop_at = None  # our part of an epoch is checked against torch's whole epoch
        resizes = dict(case.resizes) if ours else {}
        while stop_at is None or len(outcomes) < stop_at:
            if len(outcomes) in resizes and ours:
                _resize(case, loader, resizes.pop(len(outcomes)))
            outcome = _step(case, iterator, ours)
            if outcome is _END:
                break
            outcomes.append(outcome)
            if outcome[0] == "error" and case.first_error_only:
                break
            assert len(outcomes) <= limit, f"more than {limit} batches or errors; case: {case}"
        if case.first_error_only and any(o[0] == "error" for o in outcomes):
            break
        if action[0] == "del":
            del iterator
            gc.collect()
        elif action[0] == "close":
            if ours:
                bounded(case, "close()", loader.close)
            elif case.reference_workers and case.options.get("persistent_workers"):
                loader._iterator = None  # torch's persistent workers, dropped as by a close
        # "new_iter": the next epoch's iter() comes while this iterator is alive.
    return epochs


def _resize(case: Case, loader: DataLoader, workers: int) -> None:
    allocation = {name: workers for name in loader.allocation}
    bounded(case, f"apply({allocation})", loader.apply, allocation)


def compare(case: Case, ours: list[list[tuple]], theirs: list[list[tuple]]) -> None:
    """The same outcomes, epoch by epoch (as multisets where torch's order is not ours)."""
    assert len(ours) == len(theirs), f"{len(ours)} epochs, torch {len(theirs)}"
    for e, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if case.first_error_only:
            _first_errors_match(e, a, b)
        elif case.unordered:
            _same_multiset(e, a, b, whole=case.epochs[e][0] == "full")
        else:
            assert len(a) == len(b), f"epoch {e}: {_summary(a)} != torch's {_summary(b)}"
            for k, (x, y) in enumerate(zip(a, b, strict=True)):
                _same_outcome(x, y, f"epoch {e} outcome {k}")


def _same_outcome(ours: tuple, theirs: tuple, where: str) -> None:
    assert ours[0] == theirs[0], f"{where}: ours {_show(ours)}, torch's {_show(theirs)}"
    if ours[0] == "batch":
        assert_same(ours[1], theirs[1], where)
    else:
        assert isinstance(ours[1], type(theirs[1])), (
            f"{where}: ours raised {type(ours[1]).__name__}, torch {type(theirs[1]).__name__}: "
            f"{ours[1]!r}"
        )


def _first_errors_match(e: int, ours: list[tuple], theirs: list[tuple]) -> None:
    first = [o for o in ours if o[0] == "error"][:1]
    expected = [o for o in theirs if o[0] == "error"][:1]
    assert len(first) == len(expected), f"epoch {e}: {_summary(ours)} != torch's {_summary(theirs)}"
    if first:
        _same_outcome(first[0], expected[0], f"epoch {e}'s first error")


def _key(outcome: tuple):
    if outcome[0] == "error":
        return ("error", type(outcome[1]).__name__)
    return ("batch", repr(outcome[1]))


def _same_multiset(e: int, ours: list[tuple], theirs: list[tuple], whole: bool) -> None:
    """Our errors are instances of torch's types: compare them by torch's type's name."""
    names = {type(o[1]).__name__ for o in theirs if o[0] == "error"}
    got = Counter()
    for o in ours:
        if o[0] == "error":
            match = [n for n in names if any(c.__name__ == n for c in type(o[1]).__mro__)]
            got[("error", match[0] if match else type(o[1]).__name__)] += 1
        else:
            got[_key(o)] += 1
    want = Counter(_key(o) for o in theirs)
    if whole:
        assert got == want, (
            f"epoch {e}: ours {sorted(got.items())} != torch's {sorted(want.items())}"
        )
    else:
        assert not (got - want), f"epoch {e}: batches torch never gives: {got - want}"


def _show(outcome: tuple) -> str:
    if outcome[0] == "error":
        return f"{type(outcome[1]).__name__}({outcome[1]})"[:300]
    return f"batch from item {index_of(outcome[1]) if _indexed(outcome[1]) else '?'}"


def _indexed(batch) -> bool:
    try:
        index_of(batch)
        return True
    except Exception:  # noqa: BLE001 - only for a message
        return False


def _summary(outcomes: list[tuple]) -> list[str]:
    return [_show(o) for o in outcomes]


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def run_case(case: Case) -> None:
    """Run ``case`` on both loaders and compare; then nothing of ours may be left running."""
    began = time.monotonic()
    try:
        _run_case(case)
    finally:
        if os.environ.get("INTUNE_LOADER_CASES_TIMES"):
            _phase("end")
            steps = " ".join(
                f"{b[0]}:{b[1] - a[1]:.1f}" for a, b in zip(_PHASES, _PHASES[1:], strict=False)
            )
            print(f"{time.monotonic() - began:.1f}s [{steps}] {case}", file=sys.stderr)
            _PHASES.clear()


_PHASES: list = []


def _phase(name: str) -> None:
    if os.environ.get("INTUNE_LOADER_CASES_TIMES"):
        _PHASES.append((name, time.monotonic()))


def _run_case(case: Case) -> None:
    children_before = children()
    try:
        theirs_loader = tud.DataLoader(case.dataset(), **case.kwargs(theirs=True))
    except Exception as refused:  # noqa: BLE001 - e.g. a shuffle of no items: so must ours
        try:
            DataLoader(case.dataset(), **case.kwargs(theirs=False)).close()
        except type(refused):
            return
        raise AssertionError(
            f"torch refuses the case ({refused!r}), ours not; case: {case}"
        ) from refused
    _phase("start")
    theirs = play(case, theirs_loader, ours=False)
    _phase("torch")
    del theirs_loader
    gc.collect()
    # torch's workers and queue threads leave by themselves, on their own time.
    children_before |= children()
    threads_before = set(threading.enumerate())
    loader = bounded(
        case, "DataLoader()", lambda: DataLoader(case.dataset(), **case.kwargs(theirs=False))
    )
    try:
        ours = play(case, loader, ours=True)
    except BaseException:
        bounded(case, "close()", loader.close)
        raise
    _phase("ours")
    if case.ending == "close":
        bounded(case, "close()", loader.close)
    try:
        compare(case, ours, theirs)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ncase: {case}") from None
    # The last references: the loader, and the errors' tracebacks (their frames hold it).
    held = [loader, ours]
    del loader, ours
    bounded(case, "the loader's garbage collection", lambda: (held.clear(), gc.collect()))
    _phase("compared, collected")
    assert_nothing_left(case, f"after {case.ending}", threads_before, children_before)


def assert_nothing_left(
    case, when: str, threads_before: set, children_before: set[int], shm_prefixes=()
) -> None:
    """Within ``GONE_BOUND_S``, no thread, child process or shared-memory file (of
    ``shm_prefixes``) is left that was not there before the case's loader."""
    deadline = time.monotonic() + GONE_BOUND_S
    while True:
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        threads = [t for t in threads if not t.name.startswith(("watchdog-", "bounded-"))]
        procs = children() - children_before
        files = [f for f in os.listdir("/dev/shm") if f.startswith(tuple(shm_prefixes))]
        files = files if shm_prefixes else []
        if not (threads or procs or files) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not (threads or procs or files), (
        f"left behind {when}: threads {threads}, processes {procs}, shared memory {files}; "
        f"case: {case}"
    )
