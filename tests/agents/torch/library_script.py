"""A training script over a real data library, for the library hunter
(``tests/agents/torch/library_hunt.py``): run with torch's DataLoader, under ``intune-run``
(the library's loaders then subclass ours) and with ``agents.torch.DataLoader`` directly.

``EXIT_CASE`` (JSON) says which: ``lib`` (``webdataset``, ``wds_loader``, ``hf_map``,
``hf_batched``, ``hf_iter``, ``mosaic``, ``litdata``), ``num_workers``, ``persistent``, ``shuffle``,
``epochs``, ``bad`` (a row whose transform raises ``ValueError``), ``brk`` (``[epoch, batch]``
to leave that epoch at), ``end`` (``return``, ``raise``, ``sigint``, ``sigint_group``, ``sigterm``,
``sys_exit``)
at ``at`` (``[epoch, batch]``), ``data`` (the folder of the library's files, written by
:func:`prepare`). Each batch's row ids, each error's type and message and each warning go to
``<records>-<EXIT_LOADER>.jsonl``; the time of the ending to ``EXIT_MARK`` (exit_hunt's).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings

ROWS = 48
BATCH = 4


def row(i: int) -> dict:
    """Row ``i`` as every library stores it: an id, a dense feature, a label (DLRM's shape)."""
    return {"id": i, "dense": [float(i), float(-i)], "label": i % 2}


def prepare(lib: str, folder: str) -> None:
    """Write the library's files of :data:`ROWS` rows into ``folder`` (once, before the runs)."""
    os.makedirs(folder, exist_ok=True)
    if lib in ("webdataset", "wds_loader"):
        import webdataset as wds

        for shard in range(4):  # 4 shards of 12: 2 or 3 workers split them unevenly
            with wds.TarWriter(f"{folder}/shard-{shard}.tar") as sink:
                for i in range(shard * 12, shard * 12 + 12):
                    sink.write({"__key__": f"{i:06d}", "json": row(i)})
    elif lib == "mosaic":
        from streaming import MDSWriter

        columns = {"id": "int", "dense": "json", "label": "int"}
        with MDSWriter(out=folder, columns=columns, size_limit=1 << 9) as out:
            for i in range(ROWS):
                out.write(row(i))
    elif lib == "litdata":
        import litdata

        litdata.optimize(
            fn=row, inputs=list(range(ROWS)), output_dir=folder, chunk_size=12, num_workers=1,
            mode="overwrite",
        )  # fmt: skip


def transform(sample: dict) -> dict:
    """The user's transform: a failure at row ``bad``, and a little work per row."""
    i = int(sample["id"])
    time.sleep(CASE.get("item_s", 0.002))
    if i == CASE.get("bad", -1):
        raise ValueError(f"row {i} is bad")
    return sample


def make_loader():
    """The loader the script trains from, built as the library's users build it."""
    lib, workers = CASE["lib"], CASE["num_workers"]
    kwargs = {"num_workers": workers}
    if workers:
        kwargs["persistent_workers"] = CASE["persistent"]
    if lib in ("webdataset", "wds_loader"):
        import webdataset as wds

        urls = f"{CASE['data']}/shard-{{0..3}}.tar"
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()
        ds = ds.map(lambda s: transform(s["json"]))
        if CASE["shuffle"]:
            ds = ds.shuffle(8, seed=CASE.get("seed", 1))
        if lib == "wds_loader":  # webdataset's own loader, batching in the workers
            loader = wds.WebLoader(ds.batched(BATCH, partial=True), batch_size=None, **kwargs)
            return loader
        return DataLoader(ds, batch_size=BATCH, **kwargs)
    if lib == "hf_map":
        import datasets

        ds = datasets.Dataset.from_dict({k: [row(i)[k] for i in range(ROWS)] for k in row(0)})
        ds = ds.with_format("torch")

        class Transformed(tud.Dataset):
            def __len__(self):
                return len(ds)

            def __getitem__(self, i):
                return transform(ds[i])

        return DataLoader(Transformed(), batch_size=BATCH, shuffle=CASE["shuffle"], **kwargs)
    if lib == "hf_batched":  # the Arrow dataset itself: torch fetches a batch at once
        import datasets
        import torch

        ds = datasets.Dataset.from_dict({k: [row(i)[k] for i in range(ROWS)] for k in row(0)})

        def batch_transform(batch: dict) -> dict:
            for i in batch["id"]:
                transform({"id": i})
            return {k: torch.tensor(v) for k, v in batch.items()}

        ds = ds.with_transform(batch_transform)
        return DataLoader(ds, batch_size=BATCH, shuffle=CASE["shuffle"], **kwargs)
    if lib == "hf_iter":
        import datasets

        ds = datasets.Dataset.from_dict({k: [row(i)[k] for i in range(ROWS)] for k in row(0)})
        it = ds.to_iterable_dataset(num_shards=4).map(transform)
        if CASE["shuffle"]:
            it = it.shuffle(seed=CASE.get("seed", 1), buffer_size=8)
        return DataLoader(it.with_format("torch"), batch_size=BATCH, **kwargs)
    if lib == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset

        class Transformed(StreamingDataset):
            def __getitem__(self, i):
                return transform(super().__getitem__(i))

        ds = Transformed(
            local=CASE["data"], shuffle=CASE["shuffle"], shuffle_seed=CASE.get("seed", 1),
            batch_size=BATCH,
        )  # fmt: skip
        return StreamingDataLoader(ds, batch_size=BATCH, **kwargs)
    if lib == "litdata":
        import litdata

        class Transformed(litdata.StreamingDataset):
            def __getitem__(self, i):
                return transform(super().__getitem__(i))

        ds = Transformed(CASE["data"], shuffle=CASE["shuffle"], seed=CASE.get("seed", 1))
        return litdata.StreamingDataLoader(ds, batch_size=BATCH, **kwargs)
    raise AssertionError(lib)


def ids(batch) -> list[int]:
    got = batch["id"]
    return got.tolist() if hasattr(got, "tolist") else list(got)


def record(*what) -> None:
    # Opened for each record: a file left open at exit is a ResourceWarning of its own name.
    with open(f"{CASE['records']}-{os.environ['EXIT_LOADER']}.jsonl", "a") as records:
        records.write(json.dumps(what, default=str) + "\n")


def end_here() -> None:
    with open(os.environ["EXIT_MARK"], "w") as f:
        f.write(repr(time.time()))
    how = CASE["end"]
    if how == "raise":
        raise RuntimeError("the script fails")
    if how == "sys_exit":
        sys.exit(3)
    if how == "sigint_group":  # Ctrl-C at the terminal: the workers get it too
        os.killpg(0, signal.SIGINT)
        time.sleep(5)
    if how in ("sigint", "sigterm"):
        os.kill(os.getpid(), signal.SIGINT if how == "sigint" else signal.SIGTERM)
        time.sleep(5)  # the signal comes first


def train() -> None:
    """Epochs of the loop a user writes to skip failed batches, recording everything."""
    loader = make_loader()
    for epoch in range(CASE["epochs"]):
        # datasets' reshuffle per epoch (webdataset's WebLoader wraps its DataLoader: none)
        if hasattr(getattr(loader, "dataset", None), "set_epoch"):
            loader.dataset.set_epoch(epoch)
        iterator = iter(loader)
        b = 0
        while True:
            if [epoch, b] == CASE.get("at"):
                end_here()
                return
            if [epoch, b] == CASE.get("brk"):
                record("break", epoch, b)
                break
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    batch = next(iterator)
                for w in caught:
                    record("warning", epoch, w.category.__name__, str(w.message)[:200])
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - the user's loop skips a failed batch
                # The message's last line, its type's name taken off: torch's workers wrap it
                # in their traceback ("Caught ValueError in DataLoader worker process 0"), and
                # so does ours with num_workers=0 (its pipeline's StageFailed, documented).
                said = str(exc).splitlines()[-1] if str(exc) else ""
                said = said.removeprefix(f"{type(exc).__name__}: ")
                record("error", epoch, type(exc).__name__, said[:200])
                b += 1
                if b > 100:
                    raise
                continue
            record("batch", epoch, ids(batch))
            b += 1
            time.sleep(CASE.get("step_s", 0.005))
    with open(os.environ["EXIT_MARK"], "w") as f:
        f.write(repr(time.time()))


if __name__ == "__main__":
    CASE = json.loads(os.environ["EXIT_CASE"])
    if CASE.get("site"):
        sys.path.insert(0, CASE["site"])  # mosaicml-streaming's pinned deps, kept apart
    import torch
    import torch.utils.data as tud

    torch.manual_seed(CASE.get("seed", 1))
    if os.environ.get("EXIT_LOADER") == "ours" and os.environ.get("INTUNE_AUTO") != "1":
        from agents.torch import DataLoader
    else:
        from torch.utils.data import DataLoader  # under intune-run: ours, in torch's place
    open(f"{CASE['records']}-{os.environ['EXIT_LOADER']}.jsonl", "w").close()
    train()
else:
    CASE: dict = {}
