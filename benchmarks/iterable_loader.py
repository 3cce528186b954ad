"""``python -m benchmarks.iterable_loader``: a sharded ``IterableDataset`` through both loaders.

The workload is how teams read their own data as it lies on disk: a folder of CSV shards,
an ``IterableDataset`` that gives worker ``i`` of ``num_workers`` every ``num_workers``-th
shard (``get_worker_info()``, as torch's documentation shows) and parses each line in
Python. torch's ``DataLoader(num_workers=W)`` reads W shards at once; so must
``agents.torch.DataLoader`` for a team to move over by changing the import.

Each candidate reads whole epochs, alternately (torch, ours, torch, ours, ...); the figure
of each is its median samples/s over the rounds.

    python -m benchmarks.iterable_loader --workers 2 --shards 8 --rows 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.data
from torch.utils.data import IterableDataset, get_worker_info

from agents.torch import DataLoader


class CsvShards(IterableDataset):
    """Rows of 1 label, 13 dense and 26 categorical fields from every ``*.csv`` of a folder,
    each shard read by one worker."""

    def __init__(self, folder: str) -> None:
        self.files = sorted(str(p) for p in Path(folder).glob("*.csv"))

    def __iter__(self):
        info = get_worker_info()
        files = self.files if info is None else self.files[info.id :: info.num_workers]
        for path in files:
            with open(path, newline="") as handle:
                for row in csv.reader(handle):
                    dense = torch.tensor([float(x) for x in row[1:14]])
                    sparse = torch.tensor([int(x, 16) % 100_003 for x in row[14:]])
                    yield dense, sparse, int(row[0])


def write_shards(folder: Path, shards: int, rows: int) -> None:
    """``shards`` CSV files of ``rows`` rows each, as a team's export would lie on disk."""
    for s in range(shards):
        with open(folder / f"part-{s:05d}.csv", "w", newline="") as handle:
            out = csv.writer(handle)
            for i in range(rows):
                n = s * rows + i
                dense = [n % 97 + 0.5 * k for k in range(13)]
                sparse = [format((n * 2654435761 + k) % (1 << 32), "08x") for k in range(26)]
                out.writerow([n % 2, *dense, *sparse])


def epoch_rate(make, epochs: int = 1) -> float:
    """Samples/s of whole epochs of a freshly made loader (its start included, as a job's)."""
    loader = make()
    try:
        start, samples = time.perf_counter(), 0
        for _ in range(epochs):
            for dense, _sparse, _label in loader:
                samples += dense.shape[0]
        return samples / (time.perf_counter() - start)
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()


def main(argv: list[str] | None = None) -> int:
    """Write the shards, then time both loaders alternately and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="num_workers of both loaders")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20000, help="rows per shard")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="alternating repetitions")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="intune-shards-") as folder:
        write_shards(Path(folder), args.shards, args.rows)
        dataset = CsvShards(folder)
        loaders = {
            "torch": lambda: torch.utils.data.DataLoader(
                dataset, batch_size=args.batch_size, num_workers=args.workers
            ),
            "ours": lambda: DataLoader(
                dataset, batch_size=args.batch_size, num_workers=args.workers
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        for round_ in range(args.rounds):
            for name, make in loaders.items():
                rates[name].append(epoch_rate(make))
                print(f"round {round_ + 1}: {name} {rates[name][-1]:,.0f} samples/s", flush=True)
    ratios = [o / t for o, t in zip(rates["ours"], rates["torch"], strict=True)]
    print(
        f"median samples/s: torch {statistics.median(rates['torch']):,.0f}, ours "
        f"{statistics.median(rates['ours']):,.0f}; ours / torch per round "
        + ", ".join(f"{r:.2f}" for r in ratios)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
