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
import weakref
from typing import Any, TypeVar

import torch.utils.data
import torch.utils.data.dataloader

from agents.torch.loader import DataLoader

log = logging.getLogger("agents.autorun")

_TORCH: type = torch.utils.data.DataLoader  # torch's own, kept before the patch
_T_co = TypeVar("_T_co", covariant=True)  # what the loader yields: DataLoader[Batch]
_NUM_WORKERS_AT = 5
# The attach asks the control plane for the job's stages (5 s at most) before it starts.
ATTACH_WAIT_AT_EXIT_S = (
    6.0  # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers)
)


def _num_workers(args: tuple, kwargs: dict) -> int:
    if "num_workers" in kwargs:
        return kwargs["num_workers"]
    return args[_NUM_WORKERS_AT] if len(args) > _NUM_WORKERS_AT else 0


class _AutoMeta(type):
    """Builds torch's loader for ``num_workers=0``; answers ``isinstance`` and ``issubclass``
    for torch's class, since it stands in its place."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is AutoDataLoader and _num_workers(args, kwargs) == 0:
            return _TORCH(*args, **kwargs)
        loader = super().__call__(*args, **kwargs)
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


class AutoDataLoader(DataLoader[_T_co], metaclass=_AutoMeta):
    """``agents.torch.DataLoader``, standing in for torch's under ``intune-run``."""

    def __iter__(self) -> Any:
        _tuned.iterating()
        return super().__iter__()


AutoDataLoader.__name__ = AutoDataLoader.__qualname__ = "DataLoader"
AutoDataLoader.__module__ = "torch.utils.data.dataloader"


class _Tuned:
    """This process's loaders, and the one attached."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaders: list[weakref.ref] = []
        self.decided = False
        self.agent: Any = None
        self.attaching: threading.Thread | None = None
        self.pid = os.getpid()
        self.index: int | None = None  # None: the largest; else the index-th built

    def built(self, loader: DataLoader) -> None:
        with self.lock:
            if self.pid != os.getpid():
                return  # a fork of the training process: its parent's agent is the host's
            self.loaders.append(weakref.ref(loader))
            if self.decided or self.index is None or len(self.loaders) != self.index + 1:
                return
            self.decided = True
        self._attach(loader, self.index)

    def iterating(self) -> None:
        with self.lock:
            if self.decided or self.index is not None or self.pid != os.getpid():
                return
            self.decided = True
            alive = [(i, ref()) for i, ref in enumerate(self.loaders)]
            alive = [(i, loader) for i, loader in alive if loader is not None]
        if alive:
            index, loader = max(alive, key=lambda pair: (_batches(pair[1]), -pair[0]))
            self._attach(loader, index)

    def _attach(self, loader: DataLoader, index: int) -> None:
        batches = _batches(loader)
        size = "unsized" if math.isinf(batches) else f"{batches:.0f} batches"
        what = f"DataLoader #{index} ({size}, stages {', '.join(loader.stage_names)})"
        self.attaching = threading.Thread(
            target=self._run_attach, args=(loader, what), name="intune-run attach", daemon=True
        )
        self.attaching.start()

    def _run_attach(self, loader: DataLoader, what: str) -> None:
        import agents

        if len(agents.attached):
            log.info("intune-run: the script attaches its own pipeline; %s is left to it", what)
            return
        try:
            agent = agents.attach(loader)
        except Exception as exc:  # noqa: BLE001 - tuning never stops training
            log.warning("intune-run: %s is not tuned: %s", what, exc)
            return
        with self.lock:
            self.agent = agent
        log.info("intune-run: tuning %s as host %s", what, os.environ.get("INTUNE_HOST_ID"))

    def stop(self) -> None:
        """At exit: let an attach under way end (a daemon thread still logging while the
        interpreter finalizes can abort it), then stop the agent; each bounded."""
        if self.pid != os.getpid():
            return
        if self.attaching is not None:
            self.attaching.join(ATTACH_WAIT_AT_EXIT_S)
        with self.lock:
            agent, self.agent = self.agent, None
        if agent is not None:
            agent.stop()


def _batches(loader: DataLoader) -> float:
    try:
        return float(len(loader))
    except TypeError:  # an IterableDataset without __len__: a stream, the training set
        return math.inf


_tuned = _Tuned()
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
