"""Every worker runs ``worker_init_fn`` as it starts, as torch's workers do, not before its
first batch: a worker that never got a batch never ran it (a file, a connection, a thread
count set up there was missing in it), nor did a worker added by a live resize until it got
one. ``get_worker_info()`` in it answers as torch's.

A ``worker_init_fn`` that exits (``os._exit``, ``sys.exit``) kills the worker as torch's;
the runtime starts another, which ran it again and died again, for ever: now after two
deaths in it the replacements do not run it and fail each batch with an error naming the
dead worker ("exited unexpectedly", as torch's text), and the epoch ends. One that hangs
holds its worker's batches, as torch's: the loader's ``timeout`` bounds each wait, as
torch's.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from agents.torch import DataLoader

BOUND_S = 60.0


class Rows(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        for row in range(info.id, self.n, info.num_workers):
            yield torch.tensor([row])


class Record:
    """A worker_init_fn writing what ``get_worker_info()`` says, one file per worker."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        # Written under another name and renamed: a test polling the folder while a worker
        # writes read an empty file (CI at load 9: "expected 5, got 0").
        final = Path(self.folder, f"{worker_id}.{os.getpid()}")
        partial = final.with_name(f"{final.name}.partial")
        partial.write_text(
            f"{info.id} {info.num_workers} {info.seed} {type(info.dataset).__name__} "
            f"{len(info.dataset) if hasattr(info.dataset, '__len__') else -1}"
        )
        os.replace(partial, final)


def _records(folder: Path) -> dict[int, tuple]:
    out = {}
    for path in folder.iterdir():
        if path.name.endswith(".partial"):
            continue
        wid, num, seed, kind, size = path.read_text().split()
        out[int(path.name.split(".")[0])] = (int(wid), int(num), int(seed), kind, int(size))
    return out


def _wait_for(folder: Path, count: int, bound_s: float = 20.0) -> dict[int, tuple]:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        records = _records(folder)
        if len(records) >= count:
            return records
        time.sleep(0.05)
    return _records(folder)


def _epoch(loader) -> list:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("iterable", [False, True])
def test_a_worker_that_gets_no_batch_runs_worker_init_fn_as_torchs(tmp_path, iterable, persistent):
    # One batch for three workers: two of them never get one.
    results = {}
    for name, cls in (("torch", torch.utils.data.DataLoader), ("ours", DataLoader)):
        folder = tmp_path / name
        folder.mkdir()
        dataset = Rows(1) if iterable else list(range(4))
        loader = cls(dataset, batch_size=4, num_workers=3, worker_init_fn=Record(folder),
                     persistent_workers=persistent, generator=torch.Generator().manual_seed(7))  # fmt: skip
        try:
            batches = _epoch(loader)
            records = _wait_for(folder, 3) if persistent else _records(folder)
        finally:
            if isinstance(loader, DataLoader):
                loader.close()
        results[name] = (batches, records)
    (theirs, their_records), (ours, our_records) = results["torch"], results["ours"]
    assert ours == theirs
    assert sorted(their_records) == [0, 1, 2]
    # Every worker ran it, with torch's worker info: ids, count, seeds, the dataset.
    assert our_records == their_records, f"ours {our_records} != torch's {their_records}"


def test_workers_added_by_a_live_resize_run_worker_init_fn_as_they_start(tmp_path):
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1,
                        worker_init_fn=Record(tmp_path), persistent_workers=True)  # fmt: skip
    try:
        iterator = iter(loader)
        first = next(iterator)
        assert sorted(_wait_for(tmp_path, 1)) == [0]
        (stage,) = loader.stage_names
        loader.apply({stage: 3})
        # No batch taken since: the new workers run it all the same.
        records = _wait_for(tmp_path, 3)
        assert sorted(records) == [0, 1, 2], records
        assert {r[1] for r in records.values()} == {1}  # num_workers as given
        seeds = {wid - r[2] for wid, r in records.items()}
        assert len(seeds) == 1, f"seeds are not base_seed + id: {records}"
        assert [first.tolist()] + [b.tolist() for b in iterator] == [
            [2 * k, 2 * k + 1] for k in range(4)
        ]
    finally:
        loader.close()


def exits(worker_id: int) -> None:
    os._exit(3)


def sys_exits(worker_id: int) -> None:
    sys.exit(4)


def _outcomes(loader, bound_s: float = BOUND_S, torchs: bool = False) -> tuple[list, float]:
    began, outcomes = time.monotonic(), []
    try:
        iterator = iter(loader)
    except RuntimeError as exc:  # torch's SIGCHLD handler may raise in iter() already
        return [exc], time.monotonic() - began
    except KeyError as exc:
        # torch's handler raised inside the Thread.start() of its index queue's feeder, and
        # threading's clean-up then raised a KeyError over it (CI, 2026-11-29): the handler's
        # RuntimeError is torch's outcome. Ours runs no such handler: its KeyError would fail.
        if not (torchs and isinstance(exc.__context__, RuntimeError)):
            raise
        return [exc.__context__], time.monotonic() - began
    while True:
        assert time.monotonic() - began < bound_s, f"no end after {bound_s} s: {outcomes[:3]}"
        try:
            outcomes.append(next(iterator).tolist())
        except StopIteration:
            return outcomes, time.monotonic() - began
        except RuntimeError as exc:
            outcomes.append(exc)


# torch's outcome for each (worker_init_fn, iterable), which ``fuse`` (ours alone) does not
# change: it is run once, not once a fuse.
_TORCHS: dict[tuple, list] = {}
# torch sees its dead workers when a wait for a batch times out, after its status-check
# interval (MP_STATUS_CHECK_INTERVAL, 5 s: the default of _try_get_data's timeout, fixed when
# torch is imported), unless its SIGCHLD handler raises first: three of the four runs took
# 5.05 to 5.10 s, 0.24 to 0.27 s each with the interval at 0.2 s (torch 2.13, 2026-11-29), and
# the same RuntimeError ("DataLoader worker (pid(s) N) exited unexpectedly"). Only the interval
# of torch's waits without a timeout of their own is shortened, and only for these runs.
TORCHS_STATUS_CHECK_S = 0.2


def _torchs_outcomes(how, iterable: bool) -> list:
    if (how, iterable) not in _TORCHS:
        dataset = Rows(16) if iterable else list(range(16))
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2,
                                             worker_init_fn=how)  # fmt: skip
        try_get_data = _MultiProcessingDataLoaderIter._try_get_data
        assert try_get_data.__defaults__ == (MP_STATUS_CHECK_INTERVAL,), "torch's wait changed"
        with mock.patch.object(try_get_data, "__defaults__", (TORCHS_STATUS_CHECK_S,)):
            _TORCHS[how, iterable] = _outcomes(loader, torchs=True)[0]
    return _TORCHS[how, iterable]


@pytest.mark.parametrize("how", [exits, sys_exits])
@pytest.mark.parametrize("fuse", ["auto", None])
@pytest.mark.parametrize("iterable", [False, True])
def test_a_worker_init_fn_that_exits_fails_the_epoch_with_a_clear_error_and_it_ends(
    how, fuse, iterable
):
    # torch: its workers die, and its iterator raises "exited unexpectedly".
    dataset = Rows(16) if iterable else list(range(16))
    theirs = _torchs_outcomes(how, iterable)
    assert theirs and all(isinstance(o, RuntimeError) for o in theirs), theirs
    assert all("exited unexpectedly" in str(o) for o in theirs), theirs
    for persistent in (False, True):
        loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=how,
                            fuse=fuse, persistent_workers=persistent)  # fmt: skip
        try:
            for epoch in range(2):
                ours, took = _outcomes(loader)
                assert ours, f"epoch {epoch}: no outcome"
                assert all(isinstance(o, RuntimeError) for o in ours), ours
                text = str(ours[0])
                assert "exited unexpectedly in its worker_init_fn" in text, text
                assert "DataLoader worker " in text and "died" in text, text
                if not iterable:
                    assert len(ours) == 8, f"{len(ours)} outcomes for 8 batches"
                else:
                    assert len(ours) <= 2, f"more than one error per reader: {ours}"
                pools = loader.pipeline._pools
                died = sum(pool.died for pool in pools)
                # Two deaths in worker_init_fn, and those already starting meanwhile.
                assert died <= 4 * len(pools), f"{died} workers died"
        finally:
            loader.close()


def hangs_in_worker_0(worker_id: int) -> None:
    if worker_id == 0:
        time.sleep(1000)


@pytest.mark.parametrize("iterable", [False, True])
def test_a_worker_init_fn_that_hangs_times_out_as_torchs_and_close_ends_it(iterable):
    dataset = Rows(16) if iterable else list(range(16))
    for cls in (torch.utils.data.DataLoader, DataLoader):
        loader = cls(dataset, batch_size=2, num_workers=2, worker_init_fn=hangs_in_worker_0,
                     timeout=2)  # fmt: skip
        began = time.monotonic()
        iterator = iter(loader)
        with pytest.raises(RuntimeError, match="DataLoader timed out after 2 seconds") as raised:
            for _ in range(8):
                next(iterator)
        if cls is DataLoader:  # ours names the worker that holds its batches
            assert "still inside worker_init_fn: worker 0 (pid " in str(raised.value)
        assert time.monotonic() - began < 30, cls
        began = time.monotonic()
        if cls is not DataLoader:
            # torch's shutdown joins the hung worker for its 5 s status-check interval before
            # it terminates it; what is checked here is ours, so torch's workers are ended
            # first, with torch's SIGCHLD handler (it raises for a killed worker, wherever the
            # main thread is then) set aside meanwhile.
            handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                for worker in iterator._workers:
                    worker.kill()
                    worker.join(10)
            finally:
                signal.signal(signal.SIGCHLD, handler)
        del iterator
        if isinstance(loader, DataLoader):
            pids = [w.pid for pool in loader.pipeline._pools for w in pool.active]
            loader.close()
            assert time.monotonic() - began < 15, "close() waited on the hung worker"
            for pid in pids:
                assert (
                    not os.path.exists(f"/proc/{pid}")
                    or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
                ), f"worker {pid} outlived close()"
