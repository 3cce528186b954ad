"""webdataset 1.0 under ``intune-run``'s patch and without it: the same training script, its
batches, errors and early exits compared item for item.

``wds.WebDataset`` is an ``IterableDataset`` over tar shards that splits them by worker
(``split_by_worker``); the script reads it through torch's ``DataLoader`` (``num_workers`` 0
to 3, persistent or not, with webdataset's seeded shuffle buffer or without; an epoch left at
its fourth batch; a row whose decoding the user's ``map`` refuses, skipped by the loop) and
through webdataset's own ``WebLoader`` (a pipeline around a ``DataLoader`` of its batches,
unbatched, reshuffled, rebatched, ``with_epoch``). Under the patch a loader of it with 1
worker is ours (in torch's order), with more torch's own (said once); with 0, torch's.

The library hunter (``tests/agents/torch/library_hunt.py``) runs generated cases of it (and of
HuggingFace ``datasets``, mosaicml-streaming and litdata) with signals, exits and a control
plane publishing resizes; docs/reliability.md, "Libraries under intune-run".
"""

import textwrap

import pytest

from tests.agents.torch.test_intune_run_gives_torchs_batches_through_torchdata_and_lightning import (  # noqa: E501
    _run,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent(
    """
    import json, os
    import torch
    from torch.utils.data import DataLoader
    import webdataset as wds

    if not os.path.exists("shard-3.tar"):
        for shard in range(4):  # 4 shards of 12 rows: 2 or 3 workers split them unevenly
            with wds.TarWriter(f"shard-{shard}.tar") as sink:
                for i in range(shard * 12, shard * 12 + 12):
                    sink.write({"__key__": f"{i:06d}", "json": {"id": i, "dense": [i, -i]}})

    def checked(sample):
        row = sample["json"]
        if row["id"] == 21:
            raise ValueError("row 21 is bad")
        return {"id": row["id"], "dense": torch.tensor(row["dense"], dtype=torch.float32)}

    def epochs(loader, n=2, leave_at=None):
        out = []
        for epoch in range(n):
            got, it, b = [], iter(loader), 0
            while (epoch, b) != leave_at:
                b += 1
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except ValueError as exc:  # the user's loop skips a failed batch
                    got.append(str(exc).splitlines()[-1].removeprefix("ValueError: "))
                    continue
                got.append([batch["id"].tolist(), batch["dense"].sum().item()])
            out.append(got)
        return out

    urls = "shard-{0..3}.tar"
    results = {}
    # (workers, persistent, shuffle): one worker (tuned under intune-run) both ways of each
    # option, and two (torch's loader under intune-run: an IterableDataset's readers shard by
    # worker id); the suite's time: 42 s with 0, 2 and 3 workers each way (library_hunt has them)
    for workers, persistent, shuffle in [(0, False, True), (1, False, False), (1, True, True),
                                         (2, True, False)]:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().map(checked)
        if shuffle:
            ds = ds.shuffle(8, seed=5)
        loader = DataLoader(ds, batch_size=4, num_workers=workers, persistent_workers=persistent)
        key = f"DataLoader workers={workers} persistent={persistent} shuffle={shuffle}"
        results[key] = epochs(loader, leave_at=(0, 3))
    for workers in (1,):
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().map(checked)
        loader = wds.WebLoader(ds.batched(5), batch_size=None, num_workers=workers)
        loader = loader.unbatched().shuffle(6, seed=2).batched(4).with_epoch(9)
        results[f"WebLoader workers={workers}"] = epochs(loader)
    print(json.dumps(results))
    """
)


def test_webdatasets_batches_errors_and_early_exits_are_torchs_under_intune_run(tmp_path):
    pytest.importorskip("webdataset")
    torchs, _ = _run(SCRIPT, tmp_path, patch=False)
    ours, log = _run(SCRIPT, tmp_path, patch=True)
    assert len(torchs) == 5
    for key in torchs:
        assert ours[key] == torchs[key], key
    first = torchs["DataLoader workers=1 persistent=False shuffle=False"]
    assert first[0] == [[[0, 1, 2, 3], 0.0], [[4, 5, 6, 7], 0.0], [[8, 9, 10, 11], 0.0]]
    assert "row 21 is bad" in first[1]  # the failed row's batch, then the epoch goes on
    assert "stages read+collate" in log  # a loader with 1 worker: ours
    assert "IterableDataset with num_workers=2 loads as torch's" in log
