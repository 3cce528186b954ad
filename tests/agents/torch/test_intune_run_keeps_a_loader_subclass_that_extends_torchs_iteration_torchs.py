"""Under ``intune-run`` a library imported after torch subclasses the name
``torch.utils.data.DataLoader``, which is then ours (``agents.torch.auto``). Each pattern
below is one that a library training scripts use has (named beside it), reproduced without
the library; the same script runs with torch's class and with ours in its place, and its
batches, resumed epochs and types must agree item for item.

- ``DataLoader[T]``: torchdata's ``class StatefulDataLoader(DataLoader[_T_co])`` raised
  ``TypeError: ... is not a generic class`` at import (our class was not generic).
- A subclass that extends torch's iteration (``_get_iterator``, an ``__iter__`` or
  ``state_dict`` that reaches torch's iterator: torchdata 0.11's ``StatefulDataLoader``,
  which checkpoints an epoch's place) is kept on torch's class, untuned, with one log line;
  before, the first iteration of any other loader raised ``AttributeError: ... no attribute
  '_pipeline'`` in the training loop.
- A subclass whose ``__iter__`` wraps ``super().__iter__()`` and whose ``state_dict`` saves
  its sampler is served, as any loader.
- A subclass whose ``__init__`` is torch's own, not ours, loads as torch's; so does one below a
  served subclass whose ``__iter__`` is torch's.
- A loader of an ``IterableDataset`` with several workers loads as torch's, in torch's
  round-robin order (ours takes readers' batches as they are ready), plain or subclassed; a
  served subclass's own ``__del__`` (mosaicml-streaming's) still stops our workers.
- A batch sampler whose ``len()`` raises: the choice of the loader to tune raised it into the
  training loop.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import gc, itertools, json, logging, os, sys, time
    import torch
    if os.environ.get("PATCH") == "1":
        from agents.torch import auto
        auto.patch()
    from typing import TypeVar
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    T = TypeVar("T")

    class Squares(Dataset):
        def __len__(self):
            return 48

        def __getitem__(self, i):
            return {"x": torch.tensor([i * i]), "i": i}

    def ids(batches):
        return [b["i"].tolist() for b in batches]

    def mro(loader):
        return [c.__module__ for c in type(loader).__mro__]

    class Typed(DataLoader[T]):                       # a typed wrapper, served
        pass

    class _CountingIter(_MultiProcessingDataLoaderIter):
        def __init__(self, loader, skip):
            super().__init__(loader)
            self.taken = 0
            for _ in range(skip):
                self._next_data()
                self.taken += 1

        def __next__(self):
            batch = super().__next__()
            self.taken += 1
            return batch

    class Resumable(DataLoader[T]):                   # as torchdata's StatefulDataLoader
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.resume_at = 0

        def _get_iterator(self):
            it, self.resume_at = _CountingIter(self, self.resume_at), 0
            return it

        def __iter__(self):
            self._iterator = self._get_iterator()
            return self._iterator

        def state_dict(self):
            return {"taken": self._iterator.taken}

        def load_state_dict(self, state):
            self.resume_at = state["taken"]

    class Wrapping(DataLoader):                       # served: wraps super().__iter__()
        def __iter__(self):
            for batch in super().__iter__():
                batch["wrapped"] = True
                yield batch

        def state_dict(self):
            return {"sampler": type(self.sampler).__name__}

    TORCHS = [c for c in DataLoader.__mro__ if c.__name__ == "DataLoader"][-1]

    class TorchInit(DataLoader):                      # its __init__ is torch's own
        def __init__(self, *args, **kwargs):
            TORCHS.__init__(self, *args, **kwargs)

    class Shards(IterableDataset):                    # split by worker, as streaming's
        def __iter__(self):
            info = get_worker_info()
            start, step = (info.id, info.num_workers) if info else (0, 1)
            for i in range(start, 40, step):
                if i % 7 == start:
                    time.sleep(0.01)  # readers that are not ready in turn
                yield {"x": torch.tensor([i * i]), "i": i}

    class Counting(DataLoader):                       # as StreamingDataLoader: served
        def __iter__(self):
            self.yielded = 0
            for batch in super().__iter__():
                self.yielded += len(batch["i"])
                yield batch

        def __del__(self):                            # never calls super()
            pass

    class Below(Wrapping):                            # below a served one: not tuned
        def __iter__(self):
            return self._get_iterator()

    class Unsized:                                    # a batch sampler whose len() raises
        def __iter__(self):
            return iter([[0, 1], [2, 3, 4], [5]])

        def __len__(self):
            raise NotImplementedError("no length")

    out = {"subscript": str(DataLoader[int])}
    make = lambda cls: cls(Squares(), batch_size=4, shuffle=True, num_workers=2,
                           generator=torch.Generator().manual_seed(3))
    typed = make(Typed)
    out["typed"] = ids(typed)
    resumable = make(Resumable)
    it = iter(resumable)
    first = ids(itertools.islice(it, 5))
    state = resumable.state_dict()
    rest = ids(it)
    again = make(Resumable)
    again.load_state_dict(state)
    out["resumable"] = [first, rest, ids(again), mro(resumable)]
    plain = DataLoader(Squares(), batch_size=6, num_workers=1)
    out["plain"] = ids(plain)                         # raised AttributeError, before
    wrapping = make(Wrapping)
    out["wrapping"] = [[b.get("wrapped") for b in wrapping], wrapping.state_dict()]
    out["wrapping_ids"] = ids(wrapping)
    torch_init = make(TorchInit)
    out["torch_init"] = ids(torch_init)
    out["isinstance"] = [isinstance(x, DataLoader) for x in (typed, resumable, wrapping, torch_init)]
    out["below"] = ids(make(Below))
    out["unsized"] = ids(DataLoader(Squares(), batch_sampler=Unsized(), num_workers=1))
    shards = DataLoader(Shards(), batch_size=3, num_workers=3)
    counting = Counting(Shards(), batch_size=3, num_workers=2)
    out["shards"] = [ids(shards), ids(counting), counting.yielded]   # torch's round-robin order
    owned = Counting(Squares(), batch_size=4, num_workers=1, persistent_workers=True)
    out["owned"] = ids(owned)
    receivers = getattr(owned, "_receivers", [])
    del owned
    gc.collect()
    deadline = time.monotonic() + 20
    while receivers and not receivers[0].pipeline._stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps(out))
    ours = {name: "agents.torch.loader" in mro(x) for name, x in
            [("typed", typed), ("resumable", resumable), ("wrapping", wrapping),
             ("shards", shards), ("counting", counting)]}
    ours["owned_stopped"] = [r.pipeline._stopped for r in receivers]
    print(json.dumps(ours))
    """
)


def _run(tmp_path: Path, patch: bool) -> tuple[list[dict], str]:
    script = tmp_path / "subclasses.py"
    script.write_text(SCRIPT)
    env = os.environ | {"PATCH": "1" if patch else "0", "PYTHONPATH": str(ROOT)}
    for name in ("INTUNE_URL", "INTUNE_HOST_ID", "INTUNE_AGENT_TOKEN"):
        env.pop(name, None)  # no control plane: the attach fails, and says so
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines, done.stderr


def test_library_subclasses_of_the_loader_give_torchs_batches_and_resume_as_with_torch(tmp_path):
    (torchs, _), _ = _run(tmp_path, False)
    (ours, served), log = _run(tmp_path, True)
    first, rest, again, mro = ours["resumable"]
    assert again == rest and len(first) == 5 and len(first + rest) == 12  # resumed in place
    assert "agents.torch.loader" not in mro  # kept on torch's class
    torchs["resumable"][3] = mro  # (the rest of the comparison: item for item)
    assert ours == torchs
    assert served == {
        "typed": True, "resumable": False, "wrapping": True, "shards": False, "counting": True,
        "owned_stopped": [True],  # its own __del__ did not keep ours from stopping its workers
    }  # fmt: skip
    assert ours["wrapping"] == [[True] * 12, {"sampler": "RandomSampler"}]
    assert log.count("its loaders load as torch's") == 3, log  # Resumable, Below, TorchInit
    assert "__main__.Below is not tuned (__iter__ use torch's own iteration)" in log
    assert "__main__.Resumable is not tuned (_get_iterator, __iter__, state_dict use torch" in log
    assert "__main__.TorchInit is not tuned (its __init__ does not call" in log
    assert log.count("IterableDataset with num_workers=3 loads as torch's") == 1, log
    assert "Traceback" not in log, log
