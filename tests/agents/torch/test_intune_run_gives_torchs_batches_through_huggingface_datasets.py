"""HuggingFace ``datasets`` 5.2 under ``intune-run``'s patch and without it: the same training
script, its batches, errors and early exits compared item for item. Skipped where
``datasets`` is not installed: it is not in the test extras (with pandas, huggingface_hub and
hf-xet it adds about 116 MB to the environment; pyarrow is there already), so the suite runs
it only where a developer installed it (``pip install datasets==5.2.0``).

- ``Dataset.with_format("torch")``, a map-style dataset whose ``__getitems__`` fetches a
  batch at once, shuffled from a seeded ``generator``, an epoch left at its fourth batch:
  ours (tuned), torch's order in every epoch after it. Before, with 2 or 3 workers the
  epochs after the one left had another order: our source had read the sampler to its end,
  whose ``RandomSampler`` draws once more from the generator there, where torch's prefetch
  had not (``DataLoader._unread_sampler_end``). A source still reading as the next epoch
  starts no longer draws that end after the next epoch's shuffle (``_SamplerFeed``); left
  open where the old iterator is still held (its source reads on, as with ``zip(loader,
  loader)``). The loop here takes a training step before it leaves.
- ``with_transform`` (a batch transform that fails on one row: the loop skips that batch).
- ``to_iterable_dataset(num_shards=4)``, which shards by ``get_worker_info()``, ``.map``,
  ``.shuffle(seed, buffer_size)`` with ``set_epoch``: ours with 1 worker, torch's with more.
"""

import textwrap

import pytest

from tests.agents.torch.test_intune_run_gives_torchs_batches_through_torchdata_and_lightning import (  # noqa: E501
    _run,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent(
    """
    import json, time
    import torch
    from torch.utils.data import DataLoader
    import datasets

    table = datasets.Dataset.from_dict(
        {"id": list(range(48)), "dense": [[float(i), -float(i)] for i in range(48)]}
    )

    def checked(row):
        if row["id"] == 21:
            raise ValueError("row 21 is bad")
        return row

    def batch_checked(batch):
        if 21 in batch["id"]:
            raise ValueError("row 21 is bad")
        return {k: torch.tensor(v) for k, v in batch.items()}

    def epochs(loader, n=3, leave_at=None, set_epoch=None):
        out = []
        for epoch in range(n):
            if set_epoch is not None:
                set_epoch(epoch)
            got, it, b = [], iter(loader), 0
            while True:
                if (epoch, b) == leave_at:
                    # A training step before the loop leaves: our source has read the
                    # sampler as far as it will (see the module's docstring).
                    time.sleep(0.3)
                    break
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

    results = {}
    for workers, persistent in [(0, False), (1, True), (2, False), (3, True)]:
        name = f"workers={workers} persistent={persistent}"
        kwargs = {"num_workers": workers, "persistent_workers": persistent}
        seeded = torch.Generator().manual_seed(4)
        loader = DataLoader(table.with_format("torch"), batch_size=4, shuffle=True,
                            generator=seeded, **kwargs)
        results[f"with_format {name}"] = epochs(loader, leave_at=(0, 3))
        loader = DataLoader(table.with_transform(batch_checked), batch_size=4, **kwargs)
        results[f"with_transform {name}"] = epochs(loader, n=1)
        stream = table.to_iterable_dataset(num_shards=4).map(checked)
        stream = stream.shuffle(seed=9, buffer_size=8).with_format("torch")
        loader = DataLoader(stream, batch_size=4, **kwargs)
        results[f"iterable {name}"] = epochs(loader, leave_at=(0, 2), set_epoch=stream.set_epoch)
    print(json.dumps(results))
    """
)


def test_datasets_batches_errors_and_early_exits_are_torchs_under_intune_run(tmp_path):
    pytest.importorskip("datasets")
    torchs, _ = _run(SCRIPT, tmp_path, patch=False)
    ours, log = _run(SCRIPT, tmp_path, patch=True)
    assert len(torchs) == 12
    for key in torchs:
        assert ours[key] == torchs[key], key
    assert "row 21 is bad" in torchs["with_transform workers=2 persistent=False"][0]
    assert "stages fetch+collate" in log  # the map-style loaders: ours
    assert "IterableDataset with num_workers=2 loads as torch's" in log
