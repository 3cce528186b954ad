"""``python -m benchmarks.collate_memory``: torch's ``default_collate`` in the loader's workers,
stacked in the worker's own memory (``agents.torch.steps.PrivateCollate``, the loader's way)
against stacked into a new shared-memory segment of torch's per batch (what it does in any
worker where ``get_worker_info()`` answers, which the runtime's own transfer makes redundant).

Both run alternately, one epoch each per round, on the same loader settings; the figure of
each is its median epoch time over the rounds.

    python -m benchmarks.collate_memory --batches 300 --batch-size 64 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.utils.data
from tqdm import tqdm

import agents.torch.loader as loader_module
from agents.torch import DataLoader


class Images(torch.utils.data.Dataset):
    """``n`` samples of ``shape`` floats (and their index)."""

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full(self.shape, float(i)), i


def epoch_seconds(dataset: Images, batch_size: int, workers: int) -> float:
    """One epoch's wall time, the loader's start included."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    started = time.perf_counter()
    for _ in loader:
        pass
    seconds = time.perf_counter() - started
    loader.close()
    return seconds


def main(argv: list[str] | None = None) -> None:
    """Measure both ways alternately and print their medians and ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shape", default="3,64,64", help="a sample's shape (floats)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split(","))
    dataset = Images(args.batches * args.batch_size, shape)
    private = loader_module.own_collate
    ways = {"private (the loader's)": private, "torch's shared segments": lambda fn: fn}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in tqdm(range(args.rounds), desc="rounds", unit="round"):
        for name, wrap in ways.items():
            loader_module.own_collate = wrap
            try:
                times[name].append(epoch_seconds(dataset, args.batch_size, args.workers))
            finally:
                loader_module.own_collate = private
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:26s} median {medians[name]:.3f} s  rounds {[round(x, 3) for x in t]}")
    first, second = medians.values()
    print(f"torch's shared segments / private: {second / first:.2f}x the epoch time")


if __name__ == "__main__":
    main()
