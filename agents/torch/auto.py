"""torch's ``DataLoader`` replaced by ours in a process that ``intune-run`` started.

:func:`patch` puts :class:`AutoDataLoader` where ``torch.utils.data.DataLoader`` was (and in
``torch.utils.data.dataloader``), before the training script imports it. It is
``agents.torch.DataLoader`` when the script asks for ``num_workers`` above 0; with
``num_workers=0`` it builds torch's own loader, which loads in the training process as the
script expects. ``isinstance(x, torch.utils.data.DataLoader)`` and ``issubclass`` still mean
torch's class, so libraries that check for a loader see one either way.

In each process one loader is attached to the control plane (``agents.attach``, from a thread
of its own: the training loop never waits for the control plane): by default, when the first
iteration of any loader starts, the one with the most batches among those built so far (an
``IterableDataset`` without ``len()`` counts as the most); with ``patch(loader="N")`` the N-th
built (``intune-run --loader N``). Whatever goes wrong there is logged, and that loader runs with the workers it
asked for.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch.utils.data
import torch.utils.data.dataloader

from agents.torch import observed
from agents.torch.loader import DataLoader, _T_co
from agents.torch.observed import ObservedDataLoader
from agents.torch.stateful import StatefulDataLoader
from agents.transport import Cancel, Cancelled

log = logging.getLogger("agents.autorun")

_TORCH: type = torch.utils.data.DataLoader  # torch's own, kept before the patch
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, ...)
_NUM_WORKERS_AT = 5
# The attach asks the control plane for the job's stages (5 s at most) before it starts. At
# exit that read, or its connect, is cut (_Tuned.cancel) and the attach ends at once; the bound
# is for what a cut cannot reach (the lookup of the control plane's host name, in libc).
ATTACH_WAIT_AT_EXIT_S = 6.0


def _num_workers(args: tuple, kwargs: dict) -> int:
    if "num_workers" in kwargs:
        return kwargs["num_workers"]
    return args[_NUM_WORKERS_AT] if len(args) > _NUM_WORKERS_AT else 0


# torch's own iteration: its iterator classes (``_get_iterator``) and the iterator a loader
# keeps (``_iterator``: persistent workers, and the place in an epoch that a checkpoint
# saves). A subclass that defines ``_get_iterator``, or an ``__iter__``, ``state_dict`` or
# ``load_state_dict`` that reaches either, extends torch's iteration (torchdata's
# StatefulDataLoader does), which our loader replaces: it is kept torch's own, untuned. One
# that wraps ``super().__iter__()`` or saves its sampler's state is served as any other.
TORCH_ITERATION = frozenset({"_get_iterator", "_iterator"})
_MAY_REACH_IT = ("__iter__", "state_dict", "load_state_dict")


class _AutoMeta(type):
    """Builds torch's loader for ``num_workers=0``; answers ``isinstance`` and ``issubclass``
    for torch's class, since it stands in its place; keeps a subclass that extends torch's
    own iteration (:data:`TORCH_ITERATION`) torch's (:func:`_torch_subclass`)."""

    def __new__(mcls, name: str, bases: tuple, namespace: dict, **kwargs: Any) -> type:
        auto = globals().get("AutoDataLoader")
        reached = _reaches_torch_iteration(namespace) if auto is not None else []
        if reached and auto in bases:
            return _torch_subclass(name, bases, namespace, reached, **kwargs)
        if "__del__" in namespace and not reached:
            namespace = {**namespace, "__del__": _also_ours(namespace["__del__"])}
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if reached:
            # Below a subclass of ours (class B(A), A(DataLoader)): its loaders run ours
            # where it calls super(), and are not tuned (its iteration may be torch's).
            cls._intune_unserved = True
            _unserved(cls, f"{', '.join(reached)} use torch's own iteration")
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is AutoDataLoader:
            workers = _num_workers(args, kwargs)
            dataset = args[0] if args else kwargs.get("dataset")
            if workers == 0:
                return _TORCH(*args, **kwargs)
            if workers > 1 and isinstance(dataset, torch.utils.data.IterableDataset):
                _readers_said(workers)
                observed = ObservedDataLoader(*args, **kwargs)
                _tuned.built(observed)
                return observed
        loader = super().__call__(*args, **kwargs)
        if "_pipeline" not in vars(loader):
            _unserved(cls, "its __init__ does not call DataLoader.__init__")
        elif loader._iterable and loader.num_workers > 1:
            loader._intune_as_torch = True  # a subclass: its __iter__ reaches ours, then torch's
            _readers_said(loader.num_workers)
        elif not getattr(cls, "_intune_unserved", False):
            _tuned.built(loader)
        return loader

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is AutoDataLoader:
            return isinstance(obj, _TORCH)
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is AutoDataLoader:
            return issubclass(sub, _TORCH)
        return super().__subclasscheck__(sub)


def _reaches_torch_iteration(namespace: dict) -> list[str]:
    """The methods of a class body that define or use torch's own iteration."""
    reached = ["_get_iterator"] if "_get_iterator" in namespace else []
    for name in _MAY_REACH_IT:
        code = getattr(namespace.get(name), "__code__", None)
        if code is not None and TORCH_ITERATION.intersection(_names(code)):
            reached.append(name)
    return reached


def _names(code: types.CodeType) -> set[str]:
    """The attribute and global names a function's code uses, its nested functions' too."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _torch_subclass(name: str, bases: tuple, namespace: dict, reached: list, **kwargs: Any):
    """The class ``class name(*bases)`` with torch's DataLoader where ``AutoDataLoader`` was.

    A library imported after torch subclasses the name ``torch.utils.data.DataLoader``, ours
    under ``intune-run``. torchdata's ``StatefulDataLoader`` (0.11) builds itself without
    ``DataLoader.__init__`` and iterates with torch's iterators, extended to checkpoint an
    epoch's place: left on ours, the first iteration of any other loader raised in the
    training loop (``AttributeError: ... no attribute '_pipeline'``), since ours was chosen to
    be tuned and had never been built."""
    auto = AutoDataLoader
    bases = tuple(_TORCH if base is auto else base for base in bases)
    if "__orig_bases__" in namespace:  # class X(DataLoader[T]): typing's record of it
        namespace = dict(namespace)
        namespace["__orig_bases__"] = tuple(
            _TORCH[base.__args__] if getattr(base, "__origin__", None) is auto else base
            for base in namespace["__orig_bases__"]
        )
    if (name, namespace.get("__module__")) == _TORCHDATA_STATEFUL:
        # torchdata's own: built as ours (agents.torch.StatefulDataLoader) where it can be.
        cls = _StatefulSwap(name, bases, {**namespace, "_intune_swap": True}, **kwargs)
        return cls
    cls = type(name, bases, namespace, **kwargs)
    _unserved(cls, f"{', '.join(reached)} use torch's own iteration")
    return cls


_TORCHDATA_STATEFUL = ("StatefulDataLoader", "torchdata.stateful_dataloader.stateful_dataloader")
# "1": torchdata's StatefulDataLoader over a map-style dataset is built as ours (set by
# intune-run --tune-stateful): tuned, but its checkpoints are in our format, not torchdata's.
STATEFUL_ENV = "INTUNE_AUTO_STATEFUL"


class _StatefulSwap(type):
    """torchdata's ``StatefulDataLoader`` (0.11) under ``intune-run --tune-stateful``
    (``STATEFUL_ENV``; without it torchdata's own, untuned, whose checkpoints a run without
    intune-run reads): over a map-style dataset
    with workers, ``agents.torch.StatefulDataLoader`` is built in its place (tuned: its
    batches, order and resumes are torchdata's, its ``state_dict`` format is ours, see
    docs/reliability.md), and ``isinstance(loader, StatefulDataLoader)`` holds for it. An
    ``IterableDataset`` (whose place is the dataset's own ``state_dict``), ``num_workers=0``
    and a script's subclass of it keep torchdata's own class. Said once each, in the log."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__dict__.get("_intune_swap"):
            dataset = args[0] if args else kwargs.get("dataset")
            if os.environ.get(STATEFUL_ENV) != "1":
                # Its checkpoints stay torchdata's: a script resumed with and without
                # intune-run must read the other's (the formats differ).
                _stateful_said(
                    False,
                    "its checkpoints stay torchdata's; intune-run --tune-stateful tunes it, "
                    "its state_dict() then in agents.torch's own format",
                )
            elif isinstance(dataset, torch.utils.data.IterableDataset):
                _stateful_said(False, "an IterableDataset: its place is the dataset's state")
            elif _num_workers(args, kwargs) == 0:
                _stateful_said(False, "num_workers=0: it loads in the training process")
            else:
                _stateful_said(True, "a map-style dataset")
                return TunedStatefulDataLoader(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls.__dict__.get("_intune_swap") and isinstance(obj, TunedStatefulDataLoader):
            return True
        return super().__instancecheck__(obj)


def _stateful_said(tuned: bool, why: str) -> None:
    """Say once per kind whether a torchdata StatefulDataLoader is tuned, and why."""
    key = f"stateful {tuned} {why}"
    if key in _said:
        return
    _said.add(key)
    if tuned:
        log.info(
            "intune-run: torchdata's StatefulDataLoader over %s is tuned: "
            "agents.torch.StatefulDataLoader is built in its place (torchdata's batches and "
            "resumes; its state_dict() format is agents.torch.DataLoader/1, not torchdata's)",
            why,
        )
    else:
        log.info("intune-run: torchdata's StatefulDataLoader is kept, not tuned (%s)", why)


def _also_ours(theirs: Callable[[Any], None]) -> Callable[[Any], None]:
    """A subclass's ``__del__`` that also runs ours, which stops the loader's pipelines (a
    persistent one's workers lived on after the loader): mosaicml-streaming's
    ``StreamingDataLoader.__del__`` shuts torch's iterator down and never calls super().

    Ours is taken now, not looked up as the loader is collected: one collected at the
    interpreter's teardown, once this module's globals were cleared, printed "Exception
    ignored in ... AttributeError: 'NoneType' object has no attribute '__del__'" at the end of
    a training script (the clean run of tests/agents/torch, 2026-11-29 14:22)."""
    ours = DataLoader.__del__

    def __del__(self: Any) -> None:
        try:
            theirs(self)
        finally:
            ours(self)

    return __del__


_said: set[str] = set()


def _readers_said(workers: int) -> None:
    """Say once why a loader of an ``IterableDataset`` with several workers is torch's."""
    if "readers" in _said:
        return
    _said.add("readers")
    log.info(
        "intune-run: a DataLoader of an IterableDataset with num_workers=%d loads as torch's, "
        "observed, not resized: its workers split the dataset by their number (stage "
        "read+collate, its samples/s, the trainer's waiting and the workers' CPU reported)",
        workers,
    )


def _unserved(cls: type, why: str) -> None:
    """Say once per class that its loaders are not tuned, and why."""
    if cls.__dict__.get("_intune_unserved_said"):
        return
    type.__setattr__(cls, "_intune_unserved_said", True)
    log.info(
        "intune-run: %s.%s is not tuned (%s): its loaders load as torch's",
        cls.__module__, cls.__qualname__, why,
    )  # fmt: skip


class AutoDataLoader(DataLoader[_T_co], metaclass=_AutoMeta):
    """``agents.torch.DataLoader``, standing in for torch's under ``intune-run``."""

    def __iter__(self) -> Any:
        if "_pipeline" not in vars(self) or vars(self).get("_intune_as_torch"):
            # A subclass whose __init__ is torch's, not ours, or one reading an iterable
            # dataset with several workers (said once: _unserved, _readers_said).
            return _TORCH.__iter__(self)
        try:
            _tuned.iterating(self)
        except Exception:  # noqa: BLE001 - tuning never stops training
            log.exception("intune-run: choosing the loader to tune failed; training goes on")
        return super().__iter__()


AutoDataLoader.__name__ = AutoDataLoader.__qualname__ = "DataLoader"
AutoDataLoader.__module__ = "torch.utils.data.dataloader"


class TunedStatefulDataLoader(StatefulDataLoader[_T_co], AutoDataLoader[_T_co]):
    """``agents.torch.StatefulDataLoader``, standing in for torchdata's under ``intune-run``
    (over a map-style dataset with workers: :class:`_StatefulSwap`)."""


class _Tuned:
    """This process's loaders, and the one attached.

    With ``--loader largest`` the choice is made when the first iteration of any loader
    starts: the one with the most batches among those built (alive). It moves, stopping the
    agent and attaching another, when a loader starts an iteration and either has more
    batches than the one tuned (Lightning builds the training loader from its
    ``train_dataloader()`` hook after the sanity check has iterated the validation loader:
    that one was tuned for the whole run), or the one tuned has not started an iteration
    while another loader started two (a loader rebuilt by a library, accelerate's
    ``prepare()`` or Lightning's distributed sampler, that the script still holds: it is
    never iterated). Then it goes to the largest loader that has started an iteration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaders: list[weakref.ref] = []
        self.started: list[weakref.ref] = []  # those that have started an iteration
        self.decided = False
        self.tuned: weakref.ref | None = None
        self.starts_since_choice = 0
        self.ours: weakref.WeakSet = weakref.WeakSet()  # the loaders this attached
        self.agent: Any = None
        self.generation = 0  # of the attaches started: the latest is the one in force
        self.attaching: list[threading.Thread] = []
        self.pid = os.getpid()
        self.index: int | None = None  # None: the largest; else the index-th built
        # Set at exit: cuts an attach's requests under way (a control plane that accepts and
        # never answers held the exit up to ATTACH_WAIT_AT_EXIT_S: 7.55 s against torch's 1.44).
        self.cancel = Cancel()

    def built(self, loader: DataLoader) -> None:
        with self.lock:
            if self.pid != os.getpid():
                return  # a fork of the training process: its parent's agent is the host's
            self.loaders.append(weakref.ref(loader))
            if self.decided or self.index is None or len(self.loaders) != self.index + 1:
                return
            self.decided = True
            self.tuned = weakref.ref(loader)
            self.generation += 1
            generation = self.generation
        self._attach(loader, self.index, generation)

    def iterating(self, loader: DataLoader) -> None:
        with self.lock:
            if self.index is not None or self.pid != os.getpid():
                return
            if not any(ref() is loader for ref in self.loaders):
                return  # not one of those tuned (a class said to be untuned, below ours)
            # (Pruned: Lightning's reload_dataloaders_every_n_epochs builds one per epoch.)
            self.started = [ref for ref in self.started if ref() is not None]
            if not any(ref() is loader for ref in self.started):
                self.started.append(weakref.ref(loader))
            choice = self._choice(loader)
            if choice is None:
                return
            self.tuned = weakref.ref(choice)
            # Counted with the choice: two threads' choices attach in the order they were made.
            self.generation += 1
            generation = self.generation
            index = next(i for i, ref in enumerate(self.loaders) if ref() is choice)
        self._attach(choice, index, generation)

    def _choice(self, loader: DataLoader) -> DataLoader | None:
        """The loader to tune from now on, if it changes (under the lock)."""
        if not self.decided:
            self.decided = True
            alive = [(i, ref()) for i, ref in enumerate(self.loaders)]
            alive = [(i, each) for i, each in alive if each is not None]
            if not alive:
                return None
            return max(alive, key=lambda pair: (_batches(pair[1]), -pair[0]))[1]
        self.starts_since_choice += 1
        tuned = self.tuned() if self.tuned is not None else None
        tuned_started = tuned is not None and any(ref() is tuned for ref in self.started)
        if tuned is loader:
            return None
        if tuned_started:
            return loader if _batches(loader) > _batches(tuned) else None
        if tuned is not None and self.starts_since_choice < 2:
            return None  # the one tuned may be about to start
        started = [ref() for ref in self.started]
        started = [each for each in started if each is not None]
        best = max(started, key=_batches)  # the first of the largest
        return None if best is tuned else best

    def _attach(self, loader: DataLoader, index: int, generation: int) -> None:
        try:
            batches = _batches(loader)
            size = "unsized" if math.isinf(batches) else f"{batches:.0f} batches"
            what = f"DataLoader #{index} ({size}, stages {', '.join(loader.stage_names)})"
        except Exception as exc:  # noqa: BLE001 - tuning never stops training
            log.warning("intune-run: DataLoader #%d is not tuned: %s", index, repr(exc))
            return
        with self.lock:
            self.ours.add(loader)  # before attach() notes it: not taken for the script's own
            self.attaching = [thread for thread in self.attaching if thread.is_alive()]
            thread = threading.Thread(
                target=self._run_attach, args=(loader, what, generation),
                name="intune-run attach", daemon=True,
            )  # fmt: skip
            self.attaching.append(thread)
        thread.start()

    def _run_attach(self, loader: DataLoader, what: str, generation: int) -> None:
        """Stop the agent of the loader tuned before (if any), attach ``loader``. An attach
        overtaken by a later one (a move while it waited on the control plane) stops the
        agent it started."""
        import agents

        with self.lock:
            if generation != self.generation:
                return
            theirs = [p for p in agents.attached if p not in self.ours]
            moving_from, self.agent = self.agent, None
        if theirs:
            log.info("intune-run: the script attaches its own pipeline; %s is left to it", what)
            return
        if moving_from is not None:
            moving_from.stop()
        if generation > 1:
            log.info("intune-run: moving the tuning to %s", what)
        try:
            agent = agents.attach(loader, cancel=self.cancel)
        except Cancelled:
            return  # the process exits: nothing to tune, nothing to say
        except Exception as exc:  # noqa: BLE001 - tuning never stops training
            log.warning("intune-run: %s is not tuned: %s", what, str(exc))
            return
        with self.lock:
            current = generation == self.generation
            if current:
                self.agent = agent
        if not current:
            agent.stop()
            return
        doing = "observing" if isinstance(loader, ObservedDataLoader) else "tuning"
        log.info("intune-run: %s %s as host %s", doing, what, os.environ.get("INTUNE_HOST_ID"))

    def stop(self) -> None:
        """At exit: let the attaches under way end (a daemon thread still logging while the
        interpreter finalizes can abort it), then stop the agent; bounded."""
        if self.pid != os.getpid():
            return
        self.cancel.set()  # the attaches' reads end now, rather than at their 5 s bound
        deadline = time.monotonic() + ATTACH_WAIT_AT_EXIT_S
        with self.lock:
            attaching = list(self.attaching)
        for thread in attaching:  # they run side by side: one deadline for all
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            agent, self.agent = self.agent, None
        if agent is not None:
            agent.stop()


def _batches(loader: DataLoader) -> float:
    """The loader's batches, asked without a trace: torch's ``len()`` of a loader of an
    ``IterableDataset`` records the length it gave, and warns at every batch past it from then
    on (its NOTE [ IterableDataset and __len__ ]). Asked by intune-run's choice of the loader
    to tune, it made a script that never asked warn (torch's own test of that warning failed
    on the loader intune-run observes); the record is put back as it was."""
    before = vars(loader).get("_IterableDataset_len_called", _UNSET)
    try:
        return float(len(loader))
    # An IterableDataset without __len__ (a stream: the training set), or a batch sampler whose
    # __len__ raises (NotImplementedError: it raised into the training loop): the largest.
    except Exception:  # noqa: BLE001
        return math.inf
    finally:
        if before is _UNSET:
            vars(loader).pop("_IterableDataset_len_called", None)
        else:
            vars(loader)["_IterableDataset_len_called"] = before  # past torch's __setattr__


_UNSET = object()


_tuned = _Tuned()
observed.on_iteration = _tuned.iterating
atexit.register(_tuned.stop)


def patch(loader: str = "largest", log_level: str = "INFO") -> None:
    """Put :class:`AutoDataLoader` in torch's place (once; the training script imports it
    afterwards), and send the agent's log lines to stderr at ``log_level`` unless the script
    logs them. ``loader``: which loader to attach, ``"largest"`` or the index of one built."""
    _tuned.index = int(loader) if loader.isdigit() else None
    if torch.utils.data.DataLoader is AutoDataLoader:
        return
    torch.utils.data.DataLoader = AutoDataLoader
    torch.utils.data.dataloader.DataLoader = AutoDataLoader
    agents_log = logging.getLogger("agents")
    if not agents_log.handlers:
        from agents.logs import log_handler

        agents_log.addHandler(log_handler())
        agents_log.setLevel(log_level)
        agents_log.propagate = False
