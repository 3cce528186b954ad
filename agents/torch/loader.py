"""``agents.torch.DataLoader``: torch's DataLoader, run as a live-resizable pipeline.

It is a ``torch.utils.data.DataLoader`` (a subclass: torch's constructor checks the arguments
and builds the sampler, the batch sampler and the default collate function, so the order and
the batches are torch's), whose iteration runs on ``agents.pipeline``:

    source: the batch sampler's index lists (in the loader's process)
    fetch:  [dataset[i] for i in indices]            one process stage
    ...     each of ``transforms`` on every sample   one stage each
    collate: collate_fn(samples)                     one process stage
    ...     each of ``batch_transforms`` on a batch  one stage each

Each stage has its own workers, resized live by ``apply()`` (the agent's allocations) without
losing or repeating a batch; batches reach the consumer in the sampler's order. An
``IterableDataset`` is read by ``num_workers`` readers, ``read``, each worker ``i`` of
``num_workers`` as torch's are (see ``agents.torch.steps.Read``).
The loader answers ``agents.attach`` as a ``Pipeline`` does; its allocation outlives epochs.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import inspect
import itertools
import multiprocessing
import os
import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.utils.data

from agents.pipeline import Pipeline, PipelineStopped, Stage, StageFailed, fuse_groups
from agents.pipeline.errors import AllocationError, as_raised_type, own_message
from agents.pipeline.pipeline import exiting, in_thread_joined_at_exit, joined_at_exit
from agents.pipeline.signals import deferred
from agents.pipeline.stage import HARD_MAX_WORKERS
from agents.pipeline.worker import POLL_S, error_type_name
from agents.process_lock import SharedCount
from agents.torch.steps import (
    BatchFailed,
    CollateHere,
    EpochEnd,
    Fetch,
    FetchHere,
    InitWatch,
    Item,
    Read,
    SamplerFailed,
    Skipped,
    StartWorker,
    Step,
    WorkerSetup,
    fold,
    own_collate,
    stage_names,
    take,
)

# Generic as torch's: ``class StatefulDataLoader(DataLoader[_T_co])`` (torchdata), imported
# under intune-run, subscripts ours; a loader that is not generic raised TypeError there.
_T_co = TypeVar("_T_co", covariant=True)

Transforms = Sequence[Callable[[Any], Any]] | Mapping[str, Callable[[Any], Any]] | None


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose workers InTune resizes live.

    Takes torch's arguments, with their meaning, and these differences:

    - ``num_workers`` is the starting allocation: every stage starts with that many workers
      (at least one; ``0`` runs one worker per stage, not the loading in this process).
    - ``transforms``: functions applied to each sample after ``fetch`` (a list, named after
      the functions, or a mapping of name to function); ``batch_transforms``: functions
      applied to each batch after ``collate``, each a stage of its own, so that a chain of
      transforms gives the tuner one lever per step.
    - ``fuse``: which neighbouring stages run in one worker (``agents.pipeline.fusion``).
      ``"auto"`` (the default) fuses the per-sample steps, ``fetch``, ``transforms`` and
      ``collate``, as torch's workers run them: a list of samples is costly to hand from one
      process to the next (every tensor in it travels on its own), a batch is not. So each
      batch transform is a lever of its own. ``None`` makes every step a stage (worth it for
      samples of a few large arrays); or name groups, e.g. ``"fetch+decode,augment+collate"``.
    - ``max_workers``: the most workers a stage may get (default 128).
    - ``multiprocessing_context`` is checked as torch checks it, and otherwise not used:
      workers fork from a launcher process that runs no thread (``agents.pipeline.zygote``),
      also for ``"spawn"`` and ``"forkserver"``; the dataset need not pickle.
    - Batches always come in the sampler's order (``in_order=False`` is accepted, and
      ignored: torch's order is then any). ``num_workers`` above a stage's most (128) starts
      each stage at 128, with a warning. Each ``iter()`` without persistent workers starts its own pipeline, as torch
      starts workers per iterator, so two iterations can run at once (``zip(loader,
      loader)``); ``apply()`` resizes every running one, and the agent's handle
      (``pipeline``, ``metrics()``) is the newest's. With persistent workers, as torch's,
      every ``iter()`` hands out the one iterator, reset to a new epoch.
    - ``persistent_workers``: one pipeline serves every epoch; otherwise each epoch starts
      its own, as torch starts workers per epoch. Workers are seeded and call
      ``worker_init_fn`` as torch's do (see ``agents.torch.steps.WorkerSetup``):
      ``worker_init_fn``, ``get_worker_info().seed`` and ``torch.initial_seed()`` in it see
      torch's ``base_seed + worker_id``, ``base_seed`` drawn from ``generator`` (or torch's
      global generator) as torch draws it.
    - ``repeatable`` (default ``True``): randomness drawn in the dataset, ``transforms``,
      ``collate_fn`` or ``batch_transforms`` from torch's, ``random``'s or numpy's global
      generators repeats under one seed: before each batch, each step sets them from the
      epoch's base seed, the batch's place in the epoch and the step's place in the loader
      (``agents.torch.steps``, "Repeatable randomness"). ``torch.manual_seed(s)`` before the
      loop gives the same epochs, tensor for tensor, whatever ``num_workers``, the live
      resizes and ``fuse``. torch's draws repeat only at one ``num_workers`` and are not ours
      (its worker ``k % num_workers`` draws batch ``k`` from one stream); with
      ``num_workers=0`` torch draws from the training process's generators, ours from the
      batch's seed, and the training process's generators are left alone. An
      ``IterableDataset``'s reader ``i`` reseeds before each of its batches too. Not made
      repeatable: a generator the user keeps across batches (``np.random.default_rng()``
      made in ``worker_init_fn`` or ``__init__``), since which worker takes a batch is not;
      seed it from the global generators where it draws (``np.random.default_rng(
      torch.randint(2**62, ()).item())`` in ``__getitem__``), or draw from them. ``False``: each
      worker's generators run on from torch's per-worker seed (about 12 us less per step and
      batch; measured in docs/reliability.md).
    - An ``IterableDataset`` is read as torch's workers read it: the ``read`` stage has
      ``num_workers`` readers (at least one), reader ``i`` iterating its own copy as worker
      ``i`` of ``num_workers`` (``get_worker_info()``), so a dataset that splits its shards
      by worker reads them in parallel, each once, and one that does not is read by every
      reader, as with torch. The readers take turns as torch's workers do (reader 0's first
      batch, reader 1's first, ..., a reader whose share ended dropping out), so the epoch
      holds torch's batches in torch's order (``_ReaderTurns``; a reader that falls far
      behind lets the others' batches go out of turn rather than pile up); with
      ``num_workers`` 0 or 1 they are torch's with ``num_workers=0``. The readers are not resized (a reader's
      place in its share cannot move to another process): ``apply()`` keeps ``read`` at
      ``num_workers``. Put per-sample work in ``transforms`` to give it a lever.
    - A failing stage raises ``agents.pipeline.StageFailed`` (a ``RuntimeError`` naming the
      stage, with the worker's traceback); ``timeout`` raises torch's ``RuntimeError``.
    - Workers are not daemonic: a ``multiprocessing.Pool`` or a ``subprocess`` in
      ``__getitem__`` works (torch's workers refuse a pool). What it starts lives no longer
      than the worker that started it: it is killed with that worker, and with the loader's
      workers at ``close()`` (``agents.pipeline.zygote``); start a process that must outlive
      them from the training script.

    - ``state_dict()`` / ``load_state_dict()`` (a map-style dataset): checkpoint an epoch's
      place and resume it in a fresh loader with the same batches, as torchdata's
      ``StatefulDataLoader`` does (in our own format; ``agents.torch.StatefulDataLoader``
      also gives torchdata's batches). See docs/reliability.md, "Checkpointing a loader".

    For ``agents.attach`` it offers a ``Pipeline``'s ``stage_names``, ``stages``,
    ``allocation``, ``apply()``, ``metrics()`` and ``consumer_stats()``; ``pipeline`` is the
    current epoch's ``Pipeline``.
    """

    # Whether the sampler's iterator is made before the base seed is drawn (torchdata's
    # StatefulDataLoader's order; torch's draws the base seed first).
    _sampler_first = False

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        transforms: Transforms = None,
        batch_transforms: Transforms = None,
        fuse: str | Sequence[str] | None = "auto",
        max_workers: int | None = None,
        repeatable: bool = True,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self._iterable = self._dataset_kind == torch.utils.data.dataloader._DatasetKind.Iterable
        self._transforms = stage_names(transforms, ["fetch", "read", "collate"])
        taken = ["fetch", "read", "collate"] + [name for name, _ in self._transforms]
        self._batch_transforms = stage_names(batch_transforms, taken)
        self._fuse = fuse
        self._max_workers = max_workers
        self._repeatable = bool(repeatable)
        # Accepted as torch accepts it, whatever it names: the workers fork from the pipeline's
        # launcher, a process forked when the epoch starts that runs no thread and never
        # touches CUDA, which is what "spawn" and "forkserver" are chosen for. Refused (a
        # ValueError here), a training script written for them could not change one import.
        self._start_method = _start_method(multiprocessing_context)
        # In flight per queue: as many batches as torch keeps outstanding over all workers.
        self._queue_size = max(2, (prefetch_factor or 2) * max(1, num_workers))
        # The source's reads of the sampler that drew from the loader's generator (a
        # RandomSampler's at its end): for _unread_sampler_end.
        self._sampler_draws: _SamplerDraws | None = None
        self._pin = pin_memory and _accelerator_available()
        # An iterable dataset's readers: torch's worker ids 0 .. readers-1 (the other stages'
        # workers count on from there).
        self._readers = self._start_workers if self._iterable else 1
        if num_workers > HARD_MAX_WORKERS:
            # torch starts them all (after its warning above); a stage of ours has at most
            # HARD_MAX_WORKERS. Before, the constructor raised ValueError.
            warnings.warn(
                f"agents.torch.DataLoader: num_workers={num_workers} is more than a stage may "
                f"have; each stage starts with {HARD_MAX_WORKERS} workers",
                stacklevel=2,
            )
        self._allocation: dict[str, int] = {}
        self._init_runtime()

    def _init_runtime(self) -> None:
        """What the loader runs on, made anew for a copy (``__setstate__``): shared counters,
        locks, the epoch's state and the next epoch's pipeline (at the allocation in force)."""
        # Three locks, so that the agent's calls (metrics() every sample, apply() for an
        # allocation) never wait on an epoch switch: stopping the last epoch's workers and
        # starting the next's took the agent's sampling thread seconds on a loaded host.
        # _switch_lock: one epoch switch or close() at a time, held across their stops and
        #   starts (the epoch count, the base seed and the plans are theirs);
        # _apply_lock: one apply() at a time, and the making current of a started pipeline,
        #   with its catch-up to an allocation applied while it started;
        # _lock: the references (pipeline, receiver, iterator, allocation), swapped or read
        #   under it, never held across a stop, a start or a resize.
        self._switch_lock = threading.RLock()
        self._apply_lock = threading.Lock()
        self._lock = threading.RLock()
        # _sampler_lock: a feeder's read of its epoch's sampler, against an epoch switch's
        #   undo of the last epoch's end-draw and the next epoch's draws (_SamplerFeed).
        self._sampler_lock = threading.Lock()
        self._last_feed: _SamplerFeed | None = None  # the newest epoch's reads of its sampler
        self._owner_pid = os.getpid()
        self._epoch = 0
        self._base_seed: int | None = None
        self._base_seed_epoch = 0  # the epoch that drew it (a persistent pipeline's first)
        self._plans: _Plans | None = None
        # The live iterations' iterators, oldest first (several at once without persistent
        # workers: zip(loader, loader), as torch's). Held weakly, as torch's loader holds its
        # iterator: a loop left by an exception drops its iterator, whose __del__ stops the
        # epoch's workers; a strong reference here kept them running (and their memory) until
        # the next epoch or close().
        self._iterator_refs: list[weakref.ref[_EpochIterator]] = []
        # With persistent workers, the one iterator that every iter() hands out while someone
        # holds it, reset to a new epoch, as torch's loader keeps its ``_iterator``. Held
        # weakly, unlike torch's: ours refers back to its loader (torch's copies what it needs
        # and does not), so a strong reference here made a cycle, and a dropped persistent
        # loader kept its workers, threads and pipeline until the next garbage collection
        # (torch's leave at ``del loader``). An iterator nobody holds has nothing to keep:
        # the next iter() makes another on the same pipeline (the epoch's state is reset
        # there anyway), and one the script holds keeps its loader alive, as torch's keeps
        # its workers (``it = iter(DataLoader(...))`` reads to its end).
        self._persistent_iterator_ref: weakref.ref[_EpochIterator] | None = None
        # The started pipelines' receivers not yet stopped, oldest first; the newest is current.
        self._receivers: list[_Receiver] = []
        self._receiver: _Receiver | None = None
        self._stats = _ConsumerStats()
        # state_dict(): the newest epoch's place (_Place); load_state_dict(): the place the
        # next iter() resumes at.
        self._place: _Place | None = None
        self._resume: _Place | None = None
        # The current epoch's pipeline (unstarted between epochs): the agent's handle.
        self._pipeline = self._build_pipeline(base_seed=0)
        self._allocation = self._pipeline.allocation

    # What _init_runtime makes: not copied by pickle or copy.deepcopy (locks, shared counters,
    # a running pipeline cannot be), made anew by __setstate__.
    _RUNTIME = (
        "_switch_lock", "_apply_lock", "_lock", "_sampler_lock", "_last_feed",
        "_owner_pid", "_epoch", "_base_seed", "_base_seed_epoch", "_plans",
        "_iterator_refs", "_persistent_iterator_ref", "_receivers", "_receiver", "_stats",
        "_pipeline", "_place", "_resume",
    )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        """The loader's arguments and allocation, as torch's loader pickles (``copy.deepcopy``,
        a loader handed to ``torch.multiprocessing.spawn``): its workers and epoch are not
        copied; the copy starts its own. Before, both raised (a lock, a shared counter)."""
        with self._lock:
            state = {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}
            state["_allocation"] = dict(self._allocation)
        state["_iterator"] = None  # torch's persistent iterator: never ours, never copied
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # past torch's __setattr__, which refuses some once built
        self._init_runtime()

    # ----------------------------------------------------------------- the pipeline

    def _build_pipeline(self, base_seed: int) -> Pipeline:
        """A pipeline of this loader's stages, seeded with ``base_seed``, not started.

        Its workers number from 0 (after the readers), as each of torch's iterators' workers
        do: a count shared by the loader's pipelines gave a per-epoch loader's second epoch
        workers 2 and 3 (of 2), and ``worker_init_fn`` ids and seeds torch never gives."""
        workers = self._start_workers
        watch = None
        if self.worker_init_fn is not None and self.num_workers > 0:
            watch = InitWatch(self._readers if self._iterable else 0)
        counter = SharedCount(
            "the loader's count of workers", start=self._readers if self._iterable else 0
        )
        setup = WorkerSetup(
            self.dataset,
            base_seed,
            num_workers=workers,
            worker_init_fn=self.worker_init_fn,
            counter=counter,
            as_workers=self.num_workers > 0,
            repeatable=self._repeatable,
            watch=watch,
        )
        start = StartWorker(setup)  # every worker is set up as it starts, as torch's
        batched = self._auto_collation
        if self._iterable:
            readers = self._readers
            reader_setup = WorkerSetup(
                self.dataset,
                base_seed,
                readers,
                self.worker_init_fn,
                as_workers=self.num_workers > 0,
                repeatable=self._repeatable,
                watch=watch,
            )
            read = Read(
                self.dataset,
                self.batch_size,
                self.drop_last,
                reader_setup,
                readers=readers,
                # The last epoch each reader began (Read says why).
                begun=multiprocessing.get_context("fork").RawArray("q", readers),
                # The consumer's count of each reader's batches handed out (Read says why).
                handed=(
                    multiprocessing.get_context("fork").RawArray("q", 1 + readers)
                    if readers > 1
                    else None
                ),
                ahead=self._reader_ahead,
            )
            stages = [
                Stage(
                    "read",
                    read,
                    workers=readers,
                    max_workers=readers,
                    shm_min_bytes=1,
                    init=StartWorker(reader_setup, read),
                )
            ]
        else:
            fetch = Step(Fetch(self.dataset, batched), setup, fetches_here=self.num_workers == 0)
            stages = [self._stage("fetch", fetch, workers, init=start)]
        # Each step's place (read or fetch 0) is folded into the batch's seed: see steps.py.
        # An IterableDataset's steps hand an error on as the batch (BatchFailed), raised at
        # its reader's turn; a map-style one's is raised in the sampler's order as it is.
        named = self._iterable
        for name, fn in self._transforms:
            step = Step(fn, setup, per_sample=True, batched=batched, position=len(stages),
                        name=name if named else "")  # fmt: skip
            stages.append(self._stage(name, step, init=start))
        for name, fn in self._batch_functions():
            collate = name == "collate"
            step = Step(own_collate(fn) if collate else fn, setup, position=len(stages),
                        name=name if named else "",
                        collates_here=collate and self.num_workers == 0)  # fmt: skip
            stages.append(self._stage(name, step, workers, init=start))
        stages = fuse_groups(stages, self._fusion([s.name for s in stages]))
        source = _PlanSource(self._plans if self.persistent_workers else None)
        source.init_watch = watch
        if self._iterable:
            source.handed = read.handed
        pipeline = Pipeline(
            source,
            stages,
            queue_size=self._queue_size,
            name="dataloader",
            samples_per_item=self.batch_size or 1,
            start_method="fork",
        )
        pipeline.source.stopping = pipeline._stop
        pipeline.apply(self._allocation)  # an unstarted pipeline only records it
        return pipeline

    def _batch_functions(self) -> list[tuple[str, Callable[[Any], Any]]]:
        """``collate_fn`` then each of ``batch_transforms``, with their stages' names: what
        makes a batch's samples the batch the loop gets, in the workers' stages or, for a
        batch that cannot leave a worker (``CollateHere``), in the training process."""
        return [("collate", self.collate_fn), *self._batch_transforms]

    def _collated_here(self, samples: Any) -> Any:
        """A ``CollateHere`` batch's samples collated and transformed in the training
        process, as torch's single-process loader collates every batch."""
        batch = samples
        for _, fn in self._batch_functions():
            batch = fn(batch)
        return batch

    def _fetched_here(self, indices: Any) -> Any:
        """A ``FetchHere`` batch fetched, transformed and collated in the training process,
        as torch's single-process loader does every batch: its tensors keep their graph."""
        batched = self._auto_collation
        samples = Fetch(self.dataset, batched)(indices)
        for _, fn in self._transforms:
            samples = [fn(sample) for sample in samples] if batched else fn(samples)
        return self._collated_here(samples)

    def _fusion(self, names: list[str]) -> str | Sequence[str] | None:
        """The fusion groups: ``fuse`` as given, or for ``"auto"`` every per-sample step,
        ``fetch`` or an iterable dataset's ``read`` included, with ``collate``, as torch's
        workers run them. For the readers too: a batch of samples handed from the readers to
        a collate stage cost 0.3 to 0.6 of torch's rate on the sharded-CSV benchmark, fused
        0.9 to 1.3 (docs/benchmarks.md, "An IterableDataset read in shards")."""
        if self._fuse != "auto":
            return self._fuse
        first = "read" if self._iterable else "fetch"
        return "+".join([first] + [name for name, _ in self._transforms] + ["collate"])

    def _stage(
        self, name: str, fn: Callable, workers: int | None = None, init: Callable | None = None
    ) -> Stage:
        ceiling = self._max_workers
        count = self._start_workers if workers is None else workers
        # shm_min_bytes=1: every tensor through the runtime's shared memory (see steps.py).
        return Stage(
            name, fn, workers=min(count, ceiling or count), max_workers=ceiling,
            shm_min_bytes=1, init=init,
        )  # fmt: skip

    @property
    def _reader_ahead(self) -> int:
        """How many batches a reader of an IterableDataset reads ahead of the consumer at
        most (``Read``): torch's worker gets ``prefetch_factor`` indices ahead at most; ours
        twice that, within the consumer's bound of 4 x the queue as before (at
        ``prefetch_factor`` a loop of 2 ms a batch cost 3 ticks skipped per batch, 0.95 to
        1.03 CPU s per epoch against 0.74 to 0.80: benchmarks/reader_turns.py)."""
        return max(2, 2 * (self.prefetch_factor or 2))

    @property
    def _start_workers(self) -> int:
        """The workers each stage starts with: ``num_workers``, at least 1 and at most a
        stage's most."""
        return min(max(1, self.num_workers), HARD_MAX_WORKERS)

    @property
    def pipeline(self) -> Pipeline:
        """The current epoch's pipeline (the next epoch's, not yet started, between epochs)."""
        with self._lock:
            return self._pipeline

    # ----------------------------------------------------------------- epochs

    def __iter__(self) -> _EpochIterator:
        """Start an epoch and return its iterator. Without persistent workers an iteration
        still running goes on beside it with its own pipeline, as torch's iterators each have
        their own workers (``zip(loader, loader)``); the agent's handle is the newest's. With
        persistent workers (one pipeline) every ``iter()`` hands out the same iterator, reset
        to the new epoch, as torch's ``DataLoader.__iter__`` does: ``zip(loader, loader)``
        takes one epoch's batches by turns. Before, the older iterator raised
        ``RuntimeError`` at its next ``next()``.

        The switch runs outside the loader's ``_lock``: meanwhile ``metrics()`` reads the
        pipeline current then (idle rows at the next epoch's allocation, between epochs), and
        an ``apply()`` is recorded for the next epoch's pipeline, which starts at it."""
        self._own_runtime()
        _warn_as_torchs_iterator(self)
        with self._switch_lock:
            if self.persistent_workers:
                reused = self._persistent_iterator
                for current in self._live_iterators():
                    if current is not reused:
                        current.close()  # not handed out by iter(): a copy's, a fork's
                if reused is not None and self._plans is not None:
                    self._plans.finish(reused.epoch)  # the epoch it was on: fed no more
                if reused is not None:
                    reused._feed.left = True
            # Taken once the epoch left is marked so (its iterator's _feed, set as the loop
            # dropped it or above): a read of its sampler under way ends before the undo and
            # the next epoch's draws, and none starts after (_SamplerFeed).
            with _held(self._sampler_lock, SAMPLER_READ_WAIT_S) as locked:
                if locked:
                    self._unread_sampler_end()
                else:
                    self._sampler_draws = None  # a read held the lock past its bound: as is
                self._epoch += 1
                epoch = self._epoch
                resume, self._resume = self._resume, None
                mid = resume is not None and resume.in_epoch  # resumed mid-epoch (load_state_dict)
                if resume is not None and not mid:
                    resume.restore_generators(self)  # a finished epoch's: the next starts there
                skip = resume.num_yielded if mid else 0
                # As torch: a new base seed per iterator (once only with persistent workers),
                # drawn from ``generator`` before the sampler draws from it.
                draw = self._base_seed is None or not self.persistent_workers
                before = drawn = None
                # torchdata's StatefulDataLoader's order (_sampler_first): its sampler's iterator
                # draws as it is made, before the base seed; a new iterator with workers makes it
                # again after the base seed (torch's ``_reset``), and uses that one.
                fresh = draw  # a new iterator's epoch (torchdata's: a resumed one's, as it was)
                if resume is not None and (mid or resume.base_seed is not None):
                    fresh = not self.persistent_workers or resume.epoch_offset == 0
                again = self._sampler_first and self.num_workers > 0 and fresh
                if self._sampler_first and not again:
                    before = _Place.snapshot(self)
                    with _sampler_rng(self, resume if mid else None):
                        drawn = self._sampler_iter(skip)
                elif again and not mid:
                    iter(self._index_sampler)
                saved = resume is not None and resume.base_seed is not None and draw
                if saved and mid and self._sampler_first and self.num_workers == 0:
                    # Drawn after the sampler there too: from the loader's generator, drawn again
                    # (the same, and the generator goes on as it did); torch's global generator
                    # is the script's, whose checkpoint holds it past that draw.
                    saved = self.generator is None
                if saved:
                    # The checkpointed epoch's base seed, not drawn again.
                    self._base_seed = resume.base_seed
                    self._base_seed_epoch = epoch - resume.epoch_offset
                elif draw:
                    self._base_seed = int(
                        torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()
                    )
                    self._base_seed_epoch = epoch
                first_pipeline = self._plans is None
                # The seed of this epoch's batches (steps.py): a persistent pipeline's epochs share
                # one base seed, and each must draw its own numbers, as torch's workers go on
                # drawing from their streams.
                offset = epoch - self._base_seed_epoch
                epoch_seed = resume.epoch_seed if mid else fold(self._base_seed, offset)
                if mid:
                    place = resume.resumed(offset)
                    if drawn is None:
                        with _sampler_rng(self, resume):
                            drawn = self._sampler_iter(skip, first=True)
                else:
                    place = before if before is not None else _Place.snapshot(self)
                    place.base_seed, place.epoch_offset, place.epoch_seed = (
                        self._base_seed, offset, epoch_seed)  # fmt: skip
                    if drawn is None:
                        drawn = self._sampler_iter(0, first=True)
                feed = _SamplerFeed()
                items = self._epoch_items(epoch, epoch_seed, drawn, feed)
                self._last_feed = feed
            self._place = place
            if self.persistent_workers:
                if first_pipeline:
                    self._plans = _Plans()
                    self._start(self._build_pipeline(self._base_seed))
                self._plans.begin(epoch, items)
            else:
                pipeline = self._build_pipeline(self._base_seed)
                pipeline.source.items = items
                self._start(pipeline)
            with self._lock:
                iterator = self._persistent_iterator if self.persistent_workers else None
                if iterator is not None and iterator.receiver is self._receiver:
                    iterator._begin_epoch(epoch, epoch_seed)
                else:
                    iterator = _EpochIterator(self, self._receiver, epoch, epoch_seed)
                    if self.persistent_workers:
                        self._persistent_iterator_ref = weakref.ref(iterator)
                if not any(ref() is iterator for ref in self._iterator_refs):
                    self._iterator_refs.append(weakref.ref(iterator))
                iterator._place = place
                iterator._feed = feed
                iterator._num_yielded = skip
            return iterator

    # ----------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The newest epoch's place, for :meth:`load_state_dict` (torchdata's
        ``StatefulDataLoader`` API, map-style datasets): the batches delivered, the generator
        state the sampler drew from when the epoch started and the epoch's seeds. A loader
        that has not iterated gives ``{}`` (as ``StatefulDataLoader``, a fresh start)."""
        if self._iterable:
            raise NotImplementedError(
                "agents.torch.DataLoader.state_dict() covers map-style datasets: an "
                "IterableDataset's place is its own state (use torchdata's StatefulDataLoader)"
            )
        place = self._place
        return {} if place is None else place.as_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The next ``iter()`` resumes where :meth:`state_dict` was taken: after the batches
        delivered then, the same batches, seeds and sampler order on (a finished epoch:
        the next one, as it would have come). ``{}`` starts afresh."""
        if self._iterable:
            self.state_dict()  # raises
        self._resume = None if not state_dict else _Place.from_dict(state_dict)

    @property
    def _persistent_iterator(self) -> _EpochIterator | None:
        """The iterator every ``iter()`` of a persistent loader hands out, while someone
        holds it (``None``: none made on this pipeline, or none held)."""
        ref = self._persistent_iterator_ref
        return None if ref is None else ref()

    def _live_iterators(self) -> list[_EpochIterator]:
        """The running iterations' iterators that someone still holds, oldest first."""
        with self._lock:
            live = [ref() for ref in self._iterator_refs]
        return [iterator for iterator in live if iterator is not None]

    def _own_runtime(self) -> None:
        """In a child forked from the process that made the loader (``os.fork()``, a
        ``multiprocessing`` fork) start afresh, as a copy does (``__setstate__``): the epoch
        and pipeline it holds are its parent's. Ending them from the child stopped the
        parent's pipeline (its workers killed through inherited pidfds, its shared memory
        removed: the parent's epoch failed), and a persistent pipeline, whose threads are not
        in the child, left the child's loop waiting for ever."""
        if os.getpid() != self._owner_pid:
            self._init_runtime()

    def _start(self, pipeline: Pipeline) -> None:
        """Start ``pipeline`` (worker launches: seconds on a loaded host) without the loader's
        ``_lock``, then make it the current one at the allocation in force: one that an
        ``apply()`` recorded while it started is applied to it here, once."""
        receiver = _Receiver(pipeline)
        # Ctrl-C held: between its start and its taking over, nothing would stop it.
        with deferred():
            try:
                pipeline.start()
            except BaseException:
                receiver.stop()
                raise
            with self._apply_lock:
                target = self._allocation
                if target != pipeline.allocation:
                    pipeline.apply(target)
                with self._lock:
                    self._pipeline = pipeline
                    self._receiver = receiver
                    self._receivers.append(receiver)

    def _sampler_iter(self, skip: int, first: bool = False) -> tuple[Any, int, list] | None:
        """The epoch's sampler iterator (map-style datasets), with ``skip`` batches drawn
        (delivered before a checkpoint) and, with ``first``, the next drawn here, in the
        caller's thread, as torch's iterator does when it starts: a sampler seeded from the
        global RNG takes its seed now, not in our feeder."""
        if self._iterable:
            return None
        indices = iter(self._index_sampler)
        skipped = len(take(indices, skip))
        return indices, skipped, (take(indices, 1) if first else None)

    def _epoch_items(
        self,
        epoch: int,
        epoch_seed: int,
        drawn: tuple[Any, int, list] | None = None,
        feed: _SamplerFeed | None = None,
    ) -> Iterator[Item]:
        """What the source feeds for one epoch: index lists then ``EpochEnd``, or (iterable
        datasets) endless ticks that the readers answer, numbered (see ``Read``). Batch ``k``
        carries the seed ``fold(epoch_seed, k)``; a tick carries ``epoch_seed``."""
        if self._iterable:
            return zip(
                itertools.repeat(epoch),
                itertools.repeat(0),
                itertools.count(),
                itertools.repeat(epoch_seed),
            )
        # A resumed epoch (load_state_dict): the batches delivered before are drawn, not fed.
        indices, skipped, first = drawn if drawn is not None else self._sampler_iter(0, True)
        if first is None:
            first = take(indices, 1)
        batched = self._auto_collation
        generator = self.generator
        feed = feed if feed is not None else _SamplerFeed()
        # every batch of the sampler's, a failed one included, is a read: batch k read k
        feed.epoch, feed.indices, feed.next_read = epoch, indices, skipped + len(first)
        feed.ended = not first
        # The loader, weakly: these items run on the pipeline's source thread, and a persistent
        # pipeline's source held a left epoch's items while it waited for the next epoch, so
        # a loader dropped by the script (with its iterator, a cycle) was reachable from that
        # thread and never collected, and its workers ran on for good (the generated loader
        # cases: a persistent loader whose worker_init_fn raises, dropped; 5 runs of 6).
        sampler_lock, loader = self._sampler_lock, weakref.ref(self)

        def items() -> Iterator[Item]:
            for idx in first:
                yield epoch, (len(idx) if batched else 1), idx, fold(epoch_seed, skipped)
            while not feed.ended:
                with feed.reading(sampler_lock) as allowed:
                    if not allowed:
                        return  # left: the next epoch may have drawn from the generator
                    # The generator before and after each read (2.7 us each, measured on the
                    # loaded 2-core host; only with a loader's generator): a read that drew
                    # is noted for _unread_sampler_end.
                    before = None if generator is None else generator.get_state()
                    read, idx, failed = feed.read()
                    if before is not None:
                        _note_draw(loader, epoch, read, before, generator.get_state())
                if failed is not None:
                    yield epoch, 0, failed, fold(epoch_seed, read)
                elif not feed.ended:
                    yield epoch, (len(idx) if batched else 1), idx, fold(epoch_seed, read)
            yield epoch, 0, EpochEnd(epoch), 0

        return items()

    def _note_sampler_draw(
        self, epoch: int, read: int, before: torch.Tensor, after: torch.Tensor
    ) -> None:
        """The source's read ``read`` of the sampler (batch ``k`` is read ``k``, its end the
        one after the last batch) took the loader's generator from ``before`` to ``after``:
        noted where it drew. A ``RandomSampler`` draws at its end, in the ``StopIteration``'s
        read, or in the last batch's (torch's ``BatchSampler`` reads the sampler's end while
        it makes a short last batch). Noted as it happens, not at the read after: a source
        that stops reading once the loop has left the epoch (``_SamplerFeed``) may never
        make that one, and the draw went unseen (a short last batch, the loop left before it:
        the next epoch's order differed from torch's)."""
        if torch.equal(before, after):
            return
        draws = self._sampler_draws
        if draws is None or draws.epoch != epoch:
            draws = self._sampler_draws = _SamplerDraws(epoch)
        draws.reads.append((read, before))
        draws.after = after

    def _unread_sampler_end(self) -> None:
        """Before a new epoch draws from the loader's ``generator``: undo the draw of the last
        epoch's sampler at its end where torch's iterator never made it.

        A ``RandomSampler`` draws once more from the generator when it is exhausted (torch's
        sampler.py). torch reads the sampler ``prefetch_factor * num_workers`` batches ahead of
        the loop (none with ``num_workers=0``); our source reads as far as its queues allow,
        and for a short epoch that is its end (48 rows in batches of 4, 2 workers: ours had
        read all 12 batches when the loop left at its second, torch 6). An epoch left early
        then drew that extra number in ours and not in torch's, and every later epoch's
        shuffle differed from torch's (HuggingFace ``datasets``' ``with_format("torch")``,
        compared by hand, now ``tests/agents/torch/test_intune_run_gives_torchs_batches_
        through_huggingface_datasets.py``). Undone only where the generator has not been
        drawn from since (the script's own draws stay as they are).

        The other way round, where the loop left the epoch before our source had read as far
        as torch's iterator (a slow sampler, a loaded host), the sampler is read on to there
        (``_SamplerFeed.catch_up``), so that its end-draw comes before the next epoch's, as in
        torch's. Called with the loader's ``_sampler_lock`` held: no read of the source's is
        under way, and none of the epoch left comes after."""
        draws, self._sampler_draws = self._sampler_draws, None
        feed, self._last_feed = self._last_feed, None
        place, generator = self._place, self.generator
        if place is None or not place.in_epoch:
            return  # none read, or the epoch ran to its end: torch read it too
        # torch reads the sampler's batches 0 .. asked - 1: as it starts, prefetch_factor per
        # worker, and one more for each batch the loop takes (or that raises).
        asked = (self.prefetch_factor or 2) * self.num_workers + place.num_yielded
        if feed is not None and feed.left and feed.epoch == self._epoch:
            feed.catch_up(asked)
        if draws is None or generator is None or draws.epoch != self._epoch:
            return
        if len(draws.reads) == draws.MOST and draws.reads[0][0] >= asked:
            return  # an earlier one may have been dropped: undone in part, it would be wrong
        unasked = [before for read, before in draws.reads if read >= asked]
        if unasked and torch.equal(generator.get_state(), draws.after):
            generator.set_state(unasked[0])  # as before the first read torch never made

    def _epoch_finished(self, iterator: _EpochIterator, collected: bool = False) -> None:
        """The consumer reached the end of an epoch (or left it): free its workers. The
        pipeline is swapped for the next epoch's under the lock, and stopped after it
        (``collected``: the iterator is being garbage-collected; see ``_stop_soon``; the next
        epoch's pipeline is then built on the stopping thread, not in the collection)."""
        rebuild = False
        with self._lock:
            # A reference that answers None is one being collected (this one, or another).
            self._iterator_refs = [
                ref for ref in self._iterator_refs if ref() not in (None, iterator)
            ]
            iterator._feed.left = True
            if self.persistent_workers:
                if self._plans is not None:
                    self._plans.finish(iterator.epoch)
                return
            receiver = iterator.receiver
            if receiver not in self._receivers:
                return  # close() stopped it already
            self._receivers.remove(receiver)
            if self._receiver is receiver:
                if self._receivers:
                    # An older iteration still runs (zip(loader, loader)): the agent's handle.
                    self._receiver = self._receivers[-1]
                    self._pipeline = self._receiver.pipeline
                else:
                    # The next epoch's pipeline, unstarted: the agent keeps a handle meanwhile.
                    self._receiver = None
                    if collected:
                        # Not here: a collection runs wherever an allocation triggered it, and
                        # building allocates shared memory from multiprocessing's heap, whose
                        # lock that allocation may hold (RawArray inside the next epoch's
                        # start): the build waited on it for ever (the loader hunter, seed
                        # 95064). The old pipeline stays the agent's handle until then.
                        rebuild = True
                    else:
                        self._pipeline = self._build_pipeline(self._base_seed or 0)
        if collected:
            finished = receiver.pipeline
            _stop_soon(receiver, then=(lambda: self._follow(finished)) if rebuild else None)
        else:
            receiver.stop()

    def _follow(self, finished: Pipeline) -> None:
        """The next epoch's pipeline, unstarted, in place of ``finished`` where that is still
        the current one (no epoch started since)."""
        with self._lock:
            if self._receiver is None and self._pipeline is finished:
                self._pipeline = self._build_pipeline(self._base_seed or 0)

    def close(self) -> None:
        """Stop the workers now (persistent ones included); the loader can iterate again.

        A Ctrl-C that lands inside is raised once the workers are stopped."""
        self._own_runtime()
        # Ctrl-C held: raised between taking the pipelines from the loader and stopping them,
        # it left them running, reachable by nothing but the collector (the launcher and its
        # workers still there 5 s after the hunter's close(): seed 97018).
        with deferred(), self._switch_lock:
            for current in self._live_iterators():
                current.close()
            with self._lock:
                self._iterator_refs = []
                self._persistent_iterator_ref = None
                receivers, self._receivers = self._receivers, []
                self._receiver = None
                plans, self._plans = self._plans, None
                self._base_seed = None
                self._pipeline = self._build_pipeline(0)
            if plans is not None:
                plans.close()
            for receiver in receivers:
                receiver.stop()

    def __del__(self, _getpid: Callable[[], int] = os.getpid) -> None:
        # As torch's iterators do: workers do not outlive the loader. (``os.getpid`` bound
        # now: one collected at the interpreter's teardown finds this module's ``os`` None.)
        if _getpid() != getattr(self, "_owner_pid", None):
            return  # a forked copy (see _EpochIterator.__del__)
        try:
            if self._plans is not None:
                self._plans.close()
            for receiver in self._receivers:
                _stop_soon(receiver)
        except Exception:
            pass

    # ----------------------------------------------------------------- the agent's handle

    @property
    def stage_names(self) -> list[str]:
        """The names of the loader's stages, in order."""
        return list(self._pipeline.stage_names)

    @property
    def stages(self) -> list[Stage]:
        """The loader's stages (their ceilings and kinds, for the agent's checks)."""
        return list(self._pipeline.stages)

    @property
    def allocation(self) -> dict[str, int]:
        """The worker count of each stage; it carries over from one epoch to the next."""
        with self._lock:
            return dict(self._allocation)

    def apply(self, allocation: dict[str, int]) -> None:
        """Resize stages live (``Pipeline.apply``); the next epochs start at this allocation.
        An iterable dataset's ``read`` stage (or the fused stage holding it) keeps its
        ``num_workers`` readers whatever is asked (see the class's docstring)."""
        allocation = self._pinned(allocation)
        # Without the loader's _lock: a live resize launches workers, and metrics() must not
        # wait on it. During an epoch switch the current pipeline is the next epoch's
        # unstarted one, which only records it; the switch then starts its pipeline at it.
        with self._apply_lock:
            with self._lock:
                pipeline = self._pipeline
            try:
                pipeline.apply(allocation)
            except PipelineStopped:
                # Stopped under the loader (its stop() from another thread, or an epoch's
                # end): the next epoch's pipeline starts at this allocation.
                problems = pipeline.check(allocation)
                if problems:
                    raise AllocationError("; ".join(problems)) from None
            with self._lock:
                self._allocation = {**self._allocation, **allocation}
                current = self._pipeline
                # Older iterations still running (zip(loader, loader)) run at it too.
                older = [
                    receiver.pipeline
                    for receiver in self._receivers
                    if receiver.pipeline not in (pipeline, current)
                ]
            for other in older:
                with contextlib.suppress(PipelineStopped):
                    other.apply(allocation)
            if current is not pipeline:
                # Swapped meanwhile for the next epoch's, unstarted (only a start, under
                # _apply_lock, makes a started one current): it records the allocation.
                with contextlib.suppress(PipelineStopped):
                    current.apply(allocation)

    def check(self, allocation: dict[str, int]) -> list[str]:
        """Say what is wrong with an allocation (empty: nothing) without applying it."""
        return self._pipeline.check(self._pinned(allocation))

    def _pinned(self, allocation: dict[str, int]) -> dict[str, int]:
        """``allocation`` with the readers of an iterable dataset kept at their number."""
        if not self._iterable:
            return allocation
        return {
            name: self._readers if "read" in name.split("+") else count
            for name, count in allocation.items()
        }

    def metrics(self) -> list[dict[str, Any]]:
        """The current pipeline's per-stage measurements since the previous call."""
        with self._lock:
            pipeline = self._pipeline
        return pipeline.metrics()

    def consumer_stats(self) -> dict[str, Any]:
        """How the training loop fared since the previous call, across epochs: samples/s and
        the share of time it waited for a batch."""
        return self._stats.read()


_STATE_FORMAT = "agents.torch.DataLoader/1"


class _Place:
    """Where an epoch is, for ``state_dict()``: enough to draw its sampler's batches again.

    ``generator_state``: the loader's ``generator`` before the sampler drew from it (after
    the base seed, which torch draws first; before it in torchdata's order);
    ``sampler_generator_state``: the sampler's own ``generator`` then, where it has one of its
    own (torchdata's ``RandomSampler`` without a loader's generator, or one the script made);
    ``global_rng_state``: torch's global generator's then, where the loader has no
    ``generator`` (torch's ``RandomSampler`` seeds itself from it each epoch). Between epochs
    (``in_epoch`` false) the generator states are those the next epoch starts from."""

    def __init__(self, **fields: Any) -> None:
        self.in_epoch = True
        self.num_yielded = 0
        self.base_seed: int | None = None
        self.epoch_offset = 0
        self.epoch_seed = 0
        self.generator_state: torch.Tensor | None = None
        self.sampler_generator_state: torch.Tensor | None = None
        self.global_rng_state: torch.Tensor | None = None
        vars(self).update(fields)

    @classmethod
    def snapshot(cls, loader: DataLoader) -> _Place:
        generator, own = loader.generator, _sampler_generator(loader)
        return cls(
            generator_state=None if generator is None else generator.get_state(),
            sampler_generator_state=None if own is None else own.get_state(),
            global_rng_state=torch.get_rng_state() if generator is None else None,
        )

    def resumed(self, epoch_offset: int) -> _Place:
        return _Place(**{**vars(self), "epoch_offset": epoch_offset})

    def restore_generators(self, loader: DataLoader) -> None:
        """Set the loader's and its sampler's generators to the states recorded."""
        own = _sampler_generator(loader)
        if loader.generator is not None and self.generator_state is not None:
            loader.generator.set_state(self.generator_state)
        if own is not None and self.sampler_generator_state is not None:
            own.set_state(self.sampler_generator_state)

    def finished(self, loader: DataLoader) -> None:
        """The epoch ended: the next starts from the generators' states now."""
        now = _Place.snapshot(loader)
        self.in_epoch = False
        self.generator_state = now.generator_state
        self.sampler_generator_state = now.sampler_generator_state
        self.global_rng_state = None  # the script's own, between epochs
        if loader.persistent_workers:
            self.epoch_offset += 1  # the next epoch keeps the base seed
        else:
            self.base_seed = None  # drawn anew

    def as_dict(self) -> dict[str, Any]:
        return {"format": _STATE_FORMAT, **vars(self)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> _Place:
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(
                "agents.torch.DataLoader.load_state_dict() takes what its state_dict() gave "
                f"(format {_STATE_FORMAT!r}); this one is another's (torchdata's "
                "StatefulDataLoader's?), whose resume it cannot repeat: see docs/reliability.md"
            )
        fields = {key: value for key, value in state.items() if key != "format"}
        return cls(**fields)


def _sampler_generator(loader: DataLoader) -> torch.Generator | None:
    """The sampler's own generator, where it is not the loader's."""
    own = getattr(loader.sampler, "generator", None)
    if isinstance(own, torch.Generator) and own is not loader.generator:
        return own
    return None


@contextlib.contextmanager
def _sampler_rng(loader: DataLoader, place: _Place | None) -> Iterator[None]:
    """The sampler's generators set back to where the checkpointed epoch's sampler began
    (``place``; ``None``: left as they are); torch's global generator, where the loader has
    none, is left after as it was."""
    if place is None:
        yield
        return
    place.restore_generators(loader)
    if loader.generator is not None or place.global_rng_state is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(place.global_rng_state)
        yield


class _EpochIterator:
    """The iterator of one epoch: batches in order, ``timeout`` on each wait, pinning."""

    def __init__(
        self, loader: DataLoader, receiver: _Receiver, epoch: int, epoch_seed: int = 0
    ) -> None:
        self.loader = loader
        self.receiver = receiver
        self._timeout = loader.timeout
        self._pin = loader._pin
        self._stats = loader._stats
        self._readers = loader._readers
        self._owner_pid = os.getpid()
        self._iterable = loader._iterable
        self._num_workers = loader.num_workers
        # One next() at a time (see __next__); reentrant only for _is_owned().
        self._next_lock = threading.RLock()
        # Its epoch's reads of the sampler (DataLoader.__iter__ sets the epoch's).
        self._feed = _SamplerFeed()
        self._begin_epoch(epoch, epoch_seed)

    def _begin_epoch(self, epoch: int, epoch_seed: int) -> None:
        """Read ``epoch`` from its start (a persistent loader's iterator, handed out again
        by ``iter()``, as torch's ``_reset``; what is left of the epoch before is dropped)."""
        self.epoch = epoch
        self._done = False
        self._closed_early = False
        self._readers_ended: set[int] = set()
        # torch's NOTE [ IterableDataset and __len__ ]: once len(loader) was asked, each batch
        # past the dataset's len() warns (torch compares the batches with the samples).
        self._len_called = self.loader._IterableDataset_len_called
        self._num_yielded = 0
        self._place: _Place | None = None  # set by DataLoader.__iter__
        # Several readers of an IterableDataset take turns, as torch's workers do (with
        # in_order=False too, where torch yields whichever batch is ready first).
        self._turns: _ReaderTurns | None = None
        if self._iterable and self._readers > 1:
            # Held at most: each reader's batches ahead of its turn (Read skips past them),
            # and 4 x the queue as before for what a skipping reader may still read (Read's
            # SKIP_LIMIT_S).
            most_held = max(4 * self.loader._queue_size,
                            self._readers * (self.loader._reader_ahead + 1))  # fmt: skip
            self._turns = _ReaderTurns(self._readers, epoch_seed, most_held,
                                       self.receiver.pipeline.source.handed, epoch)  # fmt: skip

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self) -> Any:
        """The next batch. Threads that call it at once take their turns: each waits for the
        one before it, so that the epoch's end reaches every one of them as
        ``StopIteration``, as torch's single-process iterator gives it. (Without the turns,
        the one that met the end stopped the pipeline under the others, which raised
        ``PipelineStopped``; with persistent workers they waited on the next epoch, for ever
        with ``timeout=0``, and took its first batches.)"""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        try:
            while not self._next_lock.acquire(timeout=POLL_S * 5):
                if deadline is not None and time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} seconds (waiting for "
                        "another thread's next() on this iterator)"
                    )
            return self._next()
        finally:
            # Owned or not whatever a Ctrl-C cut: released where this thread holds it.
            if self._next_lock._is_owned():  # type: ignore[attr-defined]
                self._next_lock.release()

    def _next(self) -> Any:
        if self._done:
            if self._closed_early:
                # As for a newer iter(): an epoch cut short must not look like a whole one.
                raise PipelineStopped(
                    "this DataLoader iterator was ended by the loader's close() before the "
                    "end of its epoch: the rest of the epoch was not loaded"
                )
            raise StopIteration
        self._stats.waiting()
        lost = False
        turns = self._turns
        try:
            while True:
                if turns is not None:
                    ready = turns.next_batch()
                    if ready is not None:
                        samples, payload = ready
                        break
                    if turns.ended():
                        payload = EpochEnd(self.epoch)
                        break
                epoch, samples, payload, seed = self.receiver.next(self._timeout)
                if epoch != self.epoch or isinstance(payload, Skipped):
                    continue  # what is left of an abandoned epoch is dropped; see Skipped
                if isinstance(payload, EpochEnd):
                    # Several readers: the epoch ends with the last one's share.
                    first = payload.reader not in self._readers_ended
                    self._readers_ended.add(payload.reader)
                    if turns is not None:
                        turns.reader_ended(payload.reader)
                    if payload.error and first:
                        lost = True  # a share cut short by a reader's death: raised once
                        break
                    if len(self._readers_ended) < self._readers or turns is not None:
                        continue
                elif turns is not None:
                    turns.add(seed, samples, payload)
                    continue
                break
        except StageFailed as exc:
            if self.receiver.pipeline.source.epoch_of(exc.source_seq) not in (None, self.epoch):
                # A failure of an abandoned epoch (a persistent pipeline goes on feeding it
                # until told): dropped as its batches are. Raised, it failed the next epoch
                # with the last one's error, which torch never does.
                self._stats.taken(0, batch=False)
                return self._next()
            # As torch's iterator: the failed batch raises, and the next call goes on with
            # the batches after it (the pipeline keeps running).
            self._stats.taken(0)
            self._placed()  # a checkpoint after it resumes past it
            if self._num_workers == 0 and exc.error_type in _RAISED_AS_ITSELF:
                # torch's single-process loader raises it to the loop, which a script's
                # ``except Exception`` does not catch (its workers die of it: RuntimeError).
                raise _as_itself(exc) from exc
            raise as_raised_type(exc, in_worker=self._num_workers > 0) from exc.__cause__
        except PipelineStopped:
            self._stats.taken(0)
            if exiting():
                _await_teardown()
            raise
        except RuntimeError as exc:
            self._stats.taken(0)
            if "timed out after" not in str(exc):
                raise
            raise RuntimeError(
                f"{exc}{self._inside_init() or self._waiting_on()}"
            ) from exc.__cause__
        except BaseException:
            self._stats.taken(0)
            raise
        if lost:
            self._stats.taken(0)
            raise StageFailed(self._stage_of("read"), -1, payload.error,
                              "(the reader's replacement found it)\n")  # fmt: skip
        if isinstance(payload, EpochEnd):
            self._stats.taken(0, batch=False)
            if self._place is not None:
                self._place.finished(self.loader)
            self._finish()
            raise StopIteration
        if isinstance(payload, SamplerFailed):
            self._stats.taken(0)
            self._placed()
            failure = StageFailed("sampler", -1, payload.error, payload.traceback_text,
                                  payload.error_type)  # fmt: skip
            raise as_raised_type(failure)
        if isinstance(payload, BatchFailed):
            # A reader's failed batch, at its reader's turn (see BatchFailed).
            self._stats.taken(0)
            self._placed()
            reader = turns.last_reader if turns is not None else 0  # one reader: worker 0
            failure = StageFailed(self._stage_of(payload.step), self._num_yielded, payload.error,
                                  payload.traceback_text, payload.error_type,
                                  worker=reader)  # fmt: skip
            if self._num_workers == 0 and failure.error_type in _RAISED_AS_ITSELF:
                raise _as_itself(failure) from failure
            raise as_raised_type(failure, in_worker=self._num_workers > 0)
        if isinstance(payload, CollateHere | FetchHere):
            # A batch that could not leave the worker (num_workers=0): collated here, or
            # (in autograd) fetched and collated here. What that raises is the batch's
            # error, raised as it is, as torch's single-process loader raises it.
            try:
                if isinstance(payload, CollateHere):
                    payload = self.loader._collated_here(payload.samples)
                else:
                    payload = self.loader._fetched_here(payload.indices)
            except BaseException:
                self._stats.taken(0)
                self._placed()
                raise
        if self._pin:
            from torch.utils.data._utils.pin_memory import pin_memory

            payload = pin_memory(payload)
        self._stats.taken(samples)
        self._num_yielded += 1
        self._placed()
        if self._iterable and self._len_called is not None:
            if self._num_yielded > self._len_called:
                _warn_past_len(self.loader.dataset, self._len_called, self._num_yielded,
                               self._num_workers)  # fmt: skip
        return payload

    def _stage_of(self, step: str) -> str:
        """The name of the pipeline's stage that runs ``step`` (a fused one's ``read+collate``
        for ``read``; the step's own name where no stage runs it)."""
        names = self.receiver.pipeline.stage_names
        return next((name for name in names if step in name.split("+")), step)

    def _placed(self) -> None:
        """One more of the sampler's batches handed out (or raised) for ``state_dict()``."""
        if self._place is not None:
            self._place.num_yielded += 1

    def _inside_init(self) -> str:
        """What a timeout's error adds: the workers still inside ``worker_init_fn``."""
        watch = getattr(self.receiver.pipeline.source, "init_watch", None)
        if watch is None:
            return ""
        inside = watch.inside()
        if not inside:
            return ""
        named = ", ".join(f"worker {worker} (pid {pid})" for worker, pid in sorted(inside))
        return f"; still inside worker_init_fn: {named}, whose batches wait on it"

    def _waiting_on(self) -> str:
        """What a timeout's error adds: where the oldest batch in flight is (a
        ``__getitem__`` that never returns is named: its stage, worker and indices)."""
        held = []
        try:
            for pool in list(self.receiver.pipeline._pools):
                for worker in list(pool.active) + list(pool.retiring):
                    outstanding = list(worker.outstanding)
                    if outstanding:
                        seq, item = outstanding[0]
                        held.append((seq, pool.stage.name, worker.pid, item))
        except Exception:  # noqa: BLE001 - only for the message; the pipeline may be stopping
            return ""
        if not held:
            return ""
        seq, stage, pid, item = min(held, key=lambda h: h[0])
        payload = item[2] if isinstance(item, tuple) and len(item) == 4 else None
        indices = ""
        # A map-style fetch's payload is its indices (a reader's is its turn: not named).
        if not self._iterable and (
            isinstance(payload, int)
            or (isinstance(payload, list) and all(isinstance(i, int) for i in payload[:64]))
        ):
            indices = f", dataset indices {payload if isinstance(payload, int) else payload[:64]}"
        return (
            f"; the oldest batch in flight is in stage '{stage}', worker pid {pid}{indices}: "
            "a dataset or collate_fn call there has not returned"
        )

    def _finish(self, collected: bool = False) -> None:
        # Ctrl-C held: cut between the two, the epoch read as ended and its workers ran on.
        with deferred():
            if not self._done:
                self._done = True
                self.loader._epoch_finished(self, collected)

    def close(self) -> None:
        """End this epoch early (its remaining batches are dropped), which a later
        ``next()`` on this one then reports."""
        self._closed_early = self._closed_early or not self._done
        self._finish()

    def __del__(self, _getpid: Callable[[], int] = os.getpid) -> None:
        # (``os.getpid`` bound now: at the interpreter's teardown this module's ``os`` is None.)
        if _getpid() != getattr(self, "_owner_pid", None):
            # A copy in a forked process: the pipeline's launcher is forked from the training
            # process, and a loader left there in a reference cycle (a loop ended by an
            # exception) is copied into it and every worker, whose garbage collection ran
            # this and stopped, in the worker, its copy of the old pipeline (taking locks
            # copied mid-use, killing through inherited pidfds, sweeping shared memory): the
            # new loader's epoch never came, 2 runs in 3 of the regression test.
            return
        try:
            self._finish(collected=True)
        except Exception:
            pass


class _ReaderTurns:
    """The batches of an IterableDataset's readers, handed out in torch's order: reader 0's
    first batch, reader 1's first, ..., reader 0's second, ...; a reader whose share ended
    drops out of the turns (torch's workers do the same with ``in_order=True``).

    The pipeline hands each reader's batches in that reader's order, the readers' interleaved
    as they come. Which reader read a batch is told by its seed: reader ``r``'s ``j``-th batch
    of the epoch carries ``fold(epoch_seed, r, j)`` (``agents.torch.steps.Read``). A batch
    that is not its reader's turn waits here; at most ``most_held`` wait (the pipeline goes
    on reading meanwhile, where torch's other workers stop after ``prefetch_factor``
    batches): past that, a reader has fallen far behind, and the batch held longest is handed
    out of turn rather than holding an unbounded share of the epoch in memory.
    A batch that failed in a step of the loader's (its reader's rows, ``collate_fn``) comes as
    a ``BatchFailed`` with its seed, and takes its turn as a batch; one the runtime failed (a
    reader that died, a result that cannot be sent) carries no seed and is raised as it
    comes."""

    # How many batches past the expected one a reader's seed is looked for: a batch that
    # failed was counted by its reader (the next one's seed is one further on).
    LOOK_AHEAD = 8

    def __init__(
        self, readers: int, epoch_seed: int, most_held: int, handed: Any = None, epoch: int = 0
    ) -> None:
        # Each reader's batches handed out this epoch, told to the readers (Read): zeroed
        # before the epoch is named, so that a reader never reads another epoch's counts.
        self._handed = handed
        if handed is not None:
            for reader in range(readers):
                handed[1 + reader] = 0
            handed[0] = epoch
        self._epoch_seed = epoch_seed
        self._most_held = max(1, most_held)
        self._held: list[collections.deque] = [collections.deque() for _ in range(readers)]
        self._counted = [0] * readers  # batches of each reader seen so far
        self._expected = {fold(epoch_seed, r, 0): r for r in range(readers)}
        self._ended = [False] * readers
        self._turn = 0
        self._arrivals = itertools.count()
        self._unknown: collections.deque = collections.deque()
        self.last_reader = -1  # whose batch was handed out last (-1: not known)

    def add(self, seed: int, samples: int, payload: Any) -> None:
        """A batch from the pipeline."""
        reader = self._reader_of(seed)
        if reader is None:
            self._unknown.append((samples, payload))  # not ours to order: handed out at once
        else:
            self._held[reader].append((next(self._arrivals), samples, payload))

    def reader_ended(self, reader: int) -> None:
        """``reader``'s share ended (its batches all came before its end)."""
        if 0 <= reader < len(self._ended):
            self._ended[reader] = True

    def next_batch(self) -> tuple[int, Any] | None:
        """``(samples, batch)`` to hand out now, or ``None``: the reader whose turn it is has
        not delivered it yet."""
        if self._unknown:
            self.last_reader = -1
            return self._unknown.popleft()
        if sum(len(held) for held in self._held) > self._most_held:
            oldest = min((held[0][0], r) for r, held in enumerate(self._held) if held)[1]
            return self._hand(oldest)
        for _ in range(len(self._held)):
            reader = self._turn
            if self._held[reader]:
                self._turn = (reader + 1) % len(self._held)
                return self._hand(reader)
            if not self._ended[reader]:
                return None
            self._turn = (reader + 1) % len(self._held)  # ended: out of the turns
        return None

    def _hand(self, reader: int) -> tuple[int, Any]:
        """Hand out ``reader``'s oldest held batch, and tell the reader."""
        if self._handed is not None:
            self._handed[1 + reader] += 1
        self.last_reader = reader
        return self._held[reader].popleft()[1:]

    def ended(self) -> bool:
        """Every reader's share ended and was handed out."""
        return all(self._ended) and not self._unknown and not any(self._held)

    def _reader_of(self, seed: int) -> int | None:
        reader = self._expected.pop(seed, None)
        if reader is not None:
            self._count(reader, 1)
            return reader
        for reader, counted in enumerate(self._counted):
            for ahead in range(1, self.LOOK_AHEAD):
                if fold(self._epoch_seed, reader, counted + ahead) == seed:
                    del self._expected[fold(self._epoch_seed, reader, counted)]
                    self._count(reader, ahead + 1)
                    return reader
        return None

    def _count(self, reader: int, batches: int) -> None:
        self._counted[reader] += batches
        self._expected[fold(self._epoch_seed, reader, self._counted[reader])] = reader


@functools.cache
def _at_torchs_line(function: Callable, needle: str) -> Callable[..., None]:
    """A function ``call(fn, *args)`` that calls ``fn(*args)`` from the very line, file and
    module of torch's ``function`` that holds ``needle``: a warning ``fn`` gives with
    ``stacklevel=2`` then names torch's place, as torch's own does, and Python shows it once
    per place as it does torch's (the module's registry). Under ``intune-run`` ours named
    ``agents/torch/auto.py``, without it the script's line (the exit hunter, seed 1000)."""
    lines, first = inspect.getsourcelines(function)
    at = first + next(i for i, line in enumerate(lines) if needle in line)
    module = sys.modules[function.__module__]
    source = "\n" * (at - 2) + "def call(fn, *args):\n    fn(*args)\n"
    space = {
        "__name__": module.__name__,
        "__warningregistry__": module.__dict__.setdefault("__warningregistry__", {}),
    }
    exec(compile(source, inspect.getsourcefile(function) or "", "exec"), space)  # noqa: S102
    return space["call"]


def _warn_as_torchs_iterator(loader: DataLoader) -> None:
    """The warnings torch gives as it makes an iterator, from the places it gives them: at
    each ``iter()``, or a persistent loader's first (its later ones reset that one, and warn no
    more; the parity hunter, seeds 1 and 4)."""
    from torch.utils.data import dataloader

    if loader.persistent_workers and loader._persistent_iterator_ref is not None:
        return  # its first iterator warned (dropped since or not: torch's loader keeps it)
    if loader.num_workers > 0:
        # Torch's _get_iterator checks the workers against the CPUs (its constructor too, at
        # another line): a script saw the warning twice under torch and once with ours (the
        # exit hunter, seed 102).
        _at_torchs_line(torch.utils.data.DataLoader._get_iterator, "check_worker_number")(
            torch.utils.data.DataLoader.check_worker_number_rationality, loader
        )
    if loader.pin_memory:
        made = (
            dataloader._MultiProcessingDataLoaderIter
            if loader.num_workers > 0
            else dataloader._SingleProcessDataLoaderIter
        )
        _at_torchs_line(made.__init__, "super().__init__(loader)")(
            _warn_pin_memory, loader.pin_memory, loader.pin_memory_device
        )


# What a dataset may raise that is no Exception: with num_workers=0 torch raises it as is.
_RAISED_AS_ITSELF: dict[str, type[BaseException]] = {
    "builtins:KeyboardInterrupt": KeyboardInterrupt,
    "builtins:SystemExit": SystemExit,
}


def _as_itself(failure: StageFailed) -> BaseException:
    """A ``KeyboardInterrupt`` or ``SystemExit`` the dataset raised, rebuilt: a
    ``sys.exit(3)``'s code is 3, as the script's exit status under torch."""
    kind = _RAISED_AS_ITSELF[failure.error_type]
    said = own_message(failure)
    if kind is SystemExit:
        with contextlib.suppress(ValueError):
            return SystemExit(int(said))
        return SystemExit(said or None)
    return kind(str(failure))


def _warn_pin_memory(pin_memory: bool, pin_memory_device: str) -> None:
    """torch's warnings, as each iterator of its gives them, for a ``pin_memory`` that
    cannot be honoured as asked (called through ``_at_torchs_line``)."""
    if pin_memory and pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=2,
        )
    if pin_memory and not _accelerator_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=2,
        )


def _warn_past_len(dataset: Any, length: int, yielded: int, num_workers: int) -> None:
    """torch's warning for an IterableDataset that yields more than its ``len()`` said
    (its words, so that a filter on them treats ours alike)."""
    message = (
        f"Length of IterableDataset {dataset} was reported to be {length}"
        f"(when accessing len(dataloader)), but {yielded} samples have been fetched. "
    )
    if num_workers > 0:
        message += (
            "For multiprocessing data-loading, this could be caused by not properly configuring "
            "the IterableDataset replica at each worker. Please see "
            "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for "
            "examples."
        )
    warnings.warn(message, stacklevel=3)


# How long a daemon thread reading an epoch that the interpreter's exit stopped waits for
# the teardown to end it (_await_teardown): past it, it is told (PipelineStopped).
TEARDOWN_WAIT_S = 10.0


def _await_teardown() -> None:
    """In a daemon thread reading an epoch that the interpreter's exit stopped (``atexit``):
    wait for the teardown to end the thread, as a thread reading torch's loader is ended,
    rather than raise ``PipelineStopped`` into it: the script printed that thread's traceback
    as it exited (twice: the exception and its cause), and torch's printed nothing (the exit
    hunter, seed 2002). Another thread (the main thread in a late ``atexit`` handler) is
    told at once; the wait is bounded."""
    thread = threading.current_thread()
    if not thread.daemon or thread is threading.main_thread():
        return
    deadline = time.monotonic() + TEARDOWN_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(POLL_S)


def _stop_soon(receiver: _Receiver, then: Callable[[], None] | None = None) -> None:
    """Stop a pipeline from a garbage collection, in a thread of its own.

    A collection runs wherever an allocation triggers it: a loader left in a reference cycle
    (a loop ended by an exception) was collected inside the next loader's ``Pipeline.start()``
    and stopped its pipeline there, 1 to 2 s of waits in the middle of the other's start (its
    lock held), whose workers were then SIGKILLed under it: its epoch waited for ever (with
    ``timeout=20``, "timed out" after 20 s; 1 in 3 runs of 8 loaders of which every other
    one raised).

    A pipeline stopped already, or being stopped by another thread, is left to that stop: the
    loader's finalizer and its iterator's both come here, one after the other in the same
    collection, and the second found the first's stop under way; its ``stop()`` waited for
    that one (``Pipeline.stop`` holds its lock throughout), 2.05 s inside the next loader's
    start in 11 runs of 12 (the epoch 2.7 s instead of 0.8 s; 6.4 s in CI at load 15).

    At the interpreter's exit (the traceback of a Ctrl-C holds the iterator until then) it
    stops in place: no thread runs once the interpreter finalizes, and ``start()`` waited
    for one for ever. The pipelines were stopped by then (``atexit``): it returns at once.

    The thread is one the exit waits for (``joined_at_exit``): it holds the stopped pipeline
    and (``then``) the loader until it ends, and a script that returned from its loop mid-epoch
    was aborted at exit ("terminate called without an active exception", status 134) in 2
    runs of 99 when that thread dropped them, freeing tensors inside torch's C++ code, after
    the teardown had begun (``python -m tests.agents.torch.exit_hunt``). Once the exit has
    begun, it stops in place.

    ``then`` runs on that thread after the stop (never in the collection, nor at exit)."""
    stop = receiver.stop
    if receiver.pipeline._stopped:
        receiver._stopped.set()  # the receiving end only: its thread leaves, never waited on
        stop = None
    if exiting():
        if stop is not None:
            stop()
        return
    if stop is None and then is None:
        return

    def stop_then() -> None:
        if stop is not None:
            stop()
        if then is not None:
            then()

    in_thread_joined_at_exit(stop_then, "intune-loader-stop")


class _Receiver:
    """Takes a started pipeline's items, and stops it. With a timeout it takes them through
    a thread, so that a wait can be bounded without reaching into the pipeline."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._stopped = threading.Event()
        self._direct: Iterator[Any] | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None

    def stop(self) -> None:
        """Stop the pipeline (and the thread taking its items)."""
        self._stopped.set()
        self.pipeline.stop()

    def next(self, timeout: float) -> Item:
        """The next item, raising ``StageFailed`` where a stage failed; torch's
        ``RuntimeError`` after ``timeout`` seconds (0: wait as long as it takes)."""
        if timeout <= 0 and self._thread is None:
            if self._direct is None:
                self._direct = iter(self.pipeline)
            try:
                return next(self._direct)
            except StopIteration:  # the loader's pipeline never ends by itself
                self._direct = None
                raise self._stopped_error() from None
            except PipelineStopped as exc:
                self._direct = None
                raise self._stopped_error() from exc
            except StageFailed:
                self._direct = None  # the pipeline's iterator ended; a new one goes on
                raise
        if self._thread is None:
            self._queue = queue.Queue(maxsize=1)
            self._thread = threading.Thread(target=self._pull, name="intune-loader", daemon=True)
            # Joined at exit: it holds a batch's tensors while it hands them on.
            joined_at_exit(self._thread)
            self._thread.start()
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            # In slices: a stop() from another thread ends the wait (its thread puts no
            # message once stopped), rather than leaving it to the timeout, or forever.
            left = POLL_S * 5 if deadline is None else deadline - time.monotonic()
            try:
                kind, value = self._queue.get(timeout=max(0.0, min(left, POLL_S * 5)))
                break
            except queue.Empty:
                if self._stopped.is_set():
                    raise self._stopped_error() from None
                if not self._thread.is_alive() and self._queue.empty():
                    # Its every way out puts a message first; gone without one, no item
                    # will ever come: say so rather than wait on.
                    raise RuntimeError(
                        "the loader's thread that takes the pipeline's items ended unexpectedly"
                    ) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
        if kind == "item":
            return value
        if kind == "error":
            raise value
        raise self._stopped_error()

    def _stopped_error(self) -> PipelineStopped:
        # One error for both ways of taking items, naming what the training loop lost.
        return PipelineStopped(
            "the loader's pipeline was stopped (close(), or its pipeline's stop() from another "
            "thread) while this epoch was being read: the rest of the epoch was not loaded"
        )

    def _pull(self) -> None:
        while True:
            try:
                for item in self.pipeline:
                    if not self._put(("item", item)):
                        return
            except StageFailed as exc:
                if not self._put(("error", exc)):
                    return
                continue
            except PipelineStopped:
                pass  # the consumer is told below, by the one message for a stop
            except BaseException as exc:  # noqa: BLE001 - the consumer must hear of it
                self._put(("error", exc))
                return
            self._put(("stopped", None))
            return

    def _put(self, message: tuple[str, Any]) -> bool:
        # Not past the exit's start: the exit waits for this thread (joined_at_exit), and
        # with a full queue nobody would ever take the message.
        while not self._stopped.is_set() and not exiting():
            try:
                self._queue.put(message, timeout=POLL_S * 5)
                return True
            except queue.Full:
                continue
        return False


class _SamplerDraws:
    """One epoch's reads of its sampler that drew from the loader's generator: ``(read, the
    generator's state before it)``, the last ``MOST`` of them, and the state after the last."""

    # A RandomSampler draws at its start and its end (with replacement, once per 32
    # samples): the reads ahead of torch's, which are the ones undone, are fewer than the
    # source's queues hold. 64 states of 5 KB each at most.
    MOST = 64

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.reads: collections.deque[tuple[int, torch.Tensor]] = collections.deque(
            maxlen=self.MOST
        )
        self.after: torch.Tensor | None = None


# The longest an epoch switch waits for a feeder's read of the last epoch's sampler (a
# batch's indices: microseconds, unless the sampler's own code waits). Past it the switch goes
# on without undoing that epoch's end-draw (_unread_sampler_end), rather than hang.
SAMPLER_READ_WAIT_S = 10.0


@contextlib.contextmanager
def _held(lock: threading.Lock, timeout: float) -> Iterator[bool]:
    """``lock`` held for the block if taken within ``timeout`` seconds (the block is told)."""
    locked = lock.acquire(timeout=timeout)
    try:
        yield locked
    finally:
        if locked:
            lock.release()


class _SamplerFeed:
    """One epoch's reads of its sampler by the source's feeder thread, each under the
    loader's ``_sampler_lock``, and whether the loop has left the epoch (``left``: set as
    its iterator finishes, or a persistent loader's next ``iter()`` abandons it).

    A ``RandomSampler`` draws from the loader's ``generator`` at its end, and the feeder reads
    ahead in its own thread: a read under way as the loop left the epoch drew there after the
    next epoch's base seed and shuffle (or between ``_unread_sampler_end``'s check and its
    undo), and every later epoch's order was not torch's. The switch now takes the lock after
    marking the epoch left: a read under way ends first (its end-draw is noted, and undone
    where torch would not have made it), none starts after, as torch's abandoned iterator
    reads no more, and the switch reads on to where torch's had read (``catch_up``).
    Generated loaders with a sampler 2 or 10 ms a read, the loop leaving mid-epoch, under two
    busy CPUs: 5 cases of 50 differed from torch before, 0 of 50 after.

    Every wait for the lock is bounded: the feeder's in slices, leaving once its epoch is
    left; the switch's by ``SAMPLER_READ_WAIT_S``."""

    def __init__(self) -> None:
        self.left = False
        self.epoch = 0
        self.indices: Iterator[Any] | None = None  # the epoch's sampler iterator
        self.next_read = 0  # the number of the next read (batch k is read k)
        self.ended = False  # the sampler's end was read

    def read(self) -> tuple[int, Any, SamplerFailed | None]:
        """The next read of the sampler (the caller holds the lock): its number, its
        indices and what it raised (``ended`` set at its end)."""
        read = self.next_read
        self.next_read += 1
        try:
            return read, next(self.indices), None
        except StopIteration:
            self.ended = True
            return read, None, None
        except Exception as exc:
            # In place of that batch, as torch's iterator raises it; the epoch goes on (a
            # generator that raised ends it). Left to the pipeline's source, it ended the
            # pipeline: every next() after it raised PipelineStopped, and a persistent
            # loader's later epochs too.
            failed = SamplerFailed(
                f"{type(exc).__name__}: {exc}", traceback.format_exc(), error_type_name(exc)
            )
            return read, None, failed

    def catch_up(self, asked: int) -> None:
        """Read on, the epoch left (the caller holds the lock), to read ``asked - 1``, as far
        as torch's iterator read before the loop left: its draws (a ``RandomSampler``'s at
        its end) come before the next epoch's, as torch's. The feeder, slower than torch's
        prefetch (a slow sampler, a loaded host), had not read that far: the end drawn in
        torch and not in ours, the next epochs' orders differed (3 workers, 28 rows in
        batches of 4, left at the sixth)."""
        if self.indices is None:
            return  # an IterableDataset's epoch: no sampler
        while not self.ended and self.next_read < asked:
            if self.read()[2] is not None:
                return  # torch raised it at a next() the loop never made

    @contextlib.contextmanager
    def reading(self, lock: threading.Lock) -> Iterator[bool]:
        """``lock`` held for one read of the sampler; ``False``: the epoch was left, read no
        more."""
        while not lock.acquire(timeout=POLL_S):
            if self.left:
                yield False
                return
        try:
            yield not self.left
        finally:
            lock.release()


class _PlanSource:
    """A pipeline's source: one epoch's items, or (persistent workers) every epoch's in turn."""

    def __init__(self, plans: _Plans | None) -> None:
        self.plans = plans
        self.items: Iterator[Item] | None = None
        # The pipeline's stop: a persistent feeder waiting for the next epoch leaves on it.
        self.stopping: threading.Event | None = None
        # (first source number, epoch) at each change of epoch: which epoch a failed item
        # belonged to (a failure carries no payload, so no epoch tag of its own).
        self._starts: list[tuple[int, int]] = []
        # An IterableDataset's readers' count of their batches the consumer handed out
        # (agents.torch.steps.Read), written by the consumer's _ReaderTurns; None: none.
        self.handed: Any = None
        # The workers inside worker_init_fn (agents.torch.steps.InitWatch; None: no
        # worker_init_fn), named in a timeout's error.
        self.init_watch: Any = None

    def __call__(self) -> Iterator[Item]:
        if self.plans is None:
            items = self.items if self.items is not None else iter(())
        else:
            items = self.plans.feed(self.stopping or threading.Event())
        return self._numbered(items)

    def _numbered(self, items: Iterator[Item]) -> Iterator[Item]:
        for seq, item in enumerate(items):
            if not self._starts or self._starts[-1][1] != item[0]:
                self._starts.append((seq, item[0]))
            yield item

    def epoch_of(self, source_seq: int) -> int | None:
        """The epoch of the source's item ``source_seq`` (``None``: not known)."""
        if source_seq < 0:
            return None
        starts = list(self._starts)
        at = bisect.bisect_right(starts, (source_seq, float("inf"))) - 1
        return starts[at][1] if at >= 0 else None


def _note_draw(loader: weakref.ref, epoch: int, read: int, before: Any, after: Any) -> None:
    """``_note_sampler_draw`` on the loader if it is still alive (a function of its own, so
    that the items' generator holds no strong reference to it between its reads)."""
    alive = loader()
    if alive is not None:
        alive._note_sampler_draw(epoch, read, before, after)


class _Plans:
    """The epochs a persistent pipeline serves, handed from the consumer to its source."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._current = 0
        self._finished = 0
        self._closed = False

    def begin(self, epoch: int, items: Iterator[Item]) -> None:
        """Make ``epoch`` the one to feed (abandoning the one being fed)."""
        self._current = epoch
        self._queue.put((epoch, items))

    def finish(self, epoch: int) -> None:
        """The consumer is done with ``epoch``: feed no more of it."""
        self._finished = max(self._finished, epoch)

    def close(self) -> None:
        """Stop feeding for good (waking the feeder at once: the pipeline's stop waits 0.5 s
        for its source thread, then names it as stuck in user code)."""
        self._closed = True
        self._queue.put(None)

    def feed(self, stopping: threading.Event) -> Iterator[Item]:
        """Every epoch's items, as the consumer begins them; ends when closed, or when
        ``stopping`` (the pipeline's stop) is set. A pipeline stopped without the loader's
        close() (at the interpreter's exit after Ctrl-C; ``loader.pipeline.stop()``) waited
        0.5 s for this thread and then warned of it as "still inside user code"."""
        while not self._closed and not stopping.is_set():
            try:
                plan = self._queue.get(timeout=POLL_S / 5)
            except queue.Empty:
                continue
            if plan is None:
                return
            epoch, items = plan
            items = iter(items)
            # Asked before each read, not after: a feeder held at its yield by a full queue
            # read one more of an abandoned epoch's sampler when it woke, after the next
            # epoch's shuffle had drawn, and the sampler's end drew from the loader's generator
            # there (26 items unbatched, 1 persistent worker, left at item 14: the third
            # epoch's order was not torch's; test_after_a_partial_epoch_a_shuffle_...).
            while not (self._closed or epoch != self._current or epoch <= self._finished):
                try:
                    item = next(items)
                except StopIteration:
                    break
                yield item
            # Not held while the next epoch is awaited: a left epoch's items (a generator
            # suspended mid-epoch) keep what they read from alive (see _epoch_items).
            plan = items = item = None


class _ConsumerStats:
    """The training loop's throughput and waiting time, over every epoch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._wait_s = 0.0
        self._batches = 0
        self._samples = 0
        self._waiting_since: float | None = None

    def waiting(self) -> None:
        """The consumer asks for a batch."""
        with self._lock:
            self._waiting_since = time.monotonic()

    def taken(self, samples: int, batch: bool = True) -> None:
        """The consumer got a batch of ``samples`` (or an end, or an error)."""
        with self._lock:
            if self._waiting_since is not None:
                self._wait_s += time.monotonic() - max(self._waiting_since, self._since)
                self._waiting_since = None
            self._batches += int(batch and samples > 0)
            self._samples += samples

    def read(self) -> dict[str, Any]:
        """The figures since the previous read (``Pipeline.consumer_stats``'s keys)."""
        with self._lock:
            now = time.monotonic()
            wall = max(now - self._since, 1e-9)
            wait = self._wait_s
            if self._waiting_since is not None:
                wait += now - max(self._waiting_since, self._since)
            batches, samples = self._batches, self._samples
            self._since, self._wait_s, self._batches, self._samples = now, 0.0, 0, 0
        return {
            "throughput": samples / wall,
            "idle_fraction": min(1.0, max(0.0, wait / wall)),
            "step_ms": 1000.0 * (wall - wait) / batches if batches else 0.0,
            "wait_ms": 1000.0 * wait / batches if batches else 0.0,
            "device": "cpu",
        }


def _start_method(context: Any) -> str | None:
    """The start method a ``multiprocessing_context`` argument names (``None``: default)."""
    if context is None:
        return None
    if isinstance(context, str):
        return context
    return context.get_start_method()


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()
