"""``agents.torch.StatefulDataLoader``: torchdata's ``StatefulDataLoader`` API on our loader.

torchdata's ``StatefulDataLoader`` (0.11) checkpoints an epoch's place: ``state_dict()`` after
some batches, ``load_state_dict()`` on a fresh loader, and the rest of the epoch comes as it
would have. Ours (``agents.torch.DataLoader.state_dict``) does that for a map-style dataset;
this class adds what makes its batches torchdata's rather than torch's: torchdata's samplers
(its ``RandomSampler`` seeds itself once, at construction, where the loader has no
``generator``; torch's seeds itself each epoch) and its order of draws (the sampler's iterator
before the base seed). So a script written for ``StatefulDataLoader`` gets the same batches,
epoch after epoch and after a resume, on a tuned loader (``intune-run`` builds this one in its
place for a map-style dataset: ``agents/torch/auto.py``).

Not torchdata's: the state dict's format (``agents.torch.DataLoader/1``; a checkpoint written
by torchdata's class loads only there, and the other way round: ``load_state_dict`` says so),
``snapshot_every_n_steps`` (accepted, not needed: our batches come in order, so the count of
batches delivered is the place), and an ``IterableDataset`` (its place is the dataset's own
``state_dict``: refused here, kept on torchdata's class by ``intune-run``).
"""

from __future__ import annotations

from typing import Any

import torch.utils.data

from agents.torch.loader import DataLoader, _T_co


class StatefulDataLoader(DataLoader[_T_co]):
    """torchdata's ``StatefulDataLoader(dataset, ..., snapshot_every_n_steps=1)`` for a
    map-style dataset, on ``agents.torch.DataLoader`` (whose extra arguments it takes)."""

    _sampler_first = True

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        *args: Any,
        snapshot_every_n_steps: int | None = 1,
        **kwargs: Any,
    ) -> None:
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(
                "agents.torch.StatefulDataLoader takes a map-style dataset: an "
                "IterableDataset's place is its own state_dict (use torchdata's class)"
            )
        from torchdata.stateful_dataloader.sampler import BatchSampler, RandomSampler

        # torch's positional arguments after num_workers, as keywords.
        named = ("collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
                 "multiprocessing_context", "generator")  # fmt: skip
        if len(args) > len(named):
            raise TypeError(f"StatefulDataLoader takes {len(named)} more positional arguments")
        for name, value in zip(named, args, strict=False):
            if name in kwargs:
                raise TypeError(f"StatefulDataLoader got multiple values for argument {name!r}")
            kwargs[name] = value
        drop_last = kwargs.pop("drop_last", False)
        generator = kwargs.get("generator")
        chosen = {}
        if sampler is None and batch_sampler is None:
            # As torchdata's: its RandomSampler, and its BatchSampler over any sampler.
            if shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = torch.utils.data.SequentialSampler(dataset)
            shuffle = None
        elif batch_sampler is None and sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is None and batch_size is not None:
            chosen = {"batch_size": batch_size, "drop_last": drop_last, "sampler": sampler}
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
            batch_size, sampler, drop_last = 1, None, False
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
            drop_last=drop_last, **kwargs,
        )  # fmt: skip
        if chosen:
            # What torchdata's loader shows (torch's sets them to None for a batch_sampler).
            initialized = self._DataLoader__initialized
            self._DataLoader__initialized = False
            self.batch_size, self.drop_last, self.sampler = (
                chosen["batch_size"], chosen["drop_last"], chosen["sampler"])  # fmt: skip
            self._DataLoader__initialized = initialized
        self.snapshot_every_n_steps = snapshot_every_n_steps
