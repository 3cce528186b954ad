"""``python -m benchmarks.dataloader``: ``agents.torch.DataLoader`` against torch's DataLoader.

The workload is what a DLRM team's own input code often looks like: a map-style ``Dataset``
that parses one Criteo line per ``__getitem__`` in Python, ``default_collate``, and a batch
transform (log of the dense features, multi-hot hashing of the categorical ones) that torch
users put in ``collate_fn``; with ``agents.torch.DataLoader`` it is ``batch_transforms=[...]``,
a stage (a lever) of its own.

Every candidate runs on the same cores (``sched_setaffinity``; workers inherit it), in one
run, one after the other in rounds (torch, ours, torch, ours, ...) so that drift on a shared
host falls on both; the figure of each is its median over the rounds.

1. Untuned: at each worker count W, torch ``num_workers=W`` against ours ``num_workers=W``
   (every stage starts with W workers).
2. Tuned: ours is resized live (``apply()``) through allocations of its two stages and
   through the layout with every step fused; the best is then measured again against torch
   at its best W, alternately.

    python -m benchmarks.dataloader --workers 1,2 --seconds 3 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
from tqdm import tqdm

from agents.dlrm.schema import DEFAULT_TABLE_SIZES, NUM_DENSE
from agents.dlrm.workload import ensure_dataset
from agents.torch import DataLoader
from benchmarks.pipeline.measure import consume_rate

# ----------------------------------------------------------------------------- the workload


class CriteoLines(torch.utils.data.Dataset):
    """Criteo TSV lines, each parsed in Python when asked for: (dense, sparse, label)."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fields = self.lines[i].split(b"\t")
        dense = [int(x) if x else 0 for x in fields[1 : 1 + NUM_DENSE]]
        sparse = [int(x, 16) if x else 0 for x in fields[1 + NUM_DENSE :]]
        return (
            torch.tensor(dense, dtype=torch.float32),
            torch.tensor(sparse, dtype=torch.int64),
            torch.tensor(float(fields[0])),
        )


@dataclass(frozen=True)
class DlrmBatch:
    """The batch transform: log of the dense features, ``hot`` hashed ids per categorical."""

    hot: int = 8

    def __call__(self, batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Turn a collated (dense, sparse, label) batch into model inputs."""
        dense, sparse, labels = batch
        salt = torch.arange(self.hot, dtype=torch.int64) * 0x9E3779B1
        sizes = torch.tensor(DEFAULT_TABLE_SIZES, dtype=torch.int64)
        ids = ((sparse[..., None] ^ salt) * 2654435761 % (1 << 32)) % sizes[None, :, None]
        return {"dense": torch.log1p(dense.clamp(min=0)), "ids": ids, "labels": labels}


@dataclass(frozen=True)
class CollateThen:
    """torch's way to the same batches: ``default_collate`` then the batch transform."""

    transform: Callable[[Any], Any]

    def __call__(self, samples: list[Any]) -> Any:
        """Collate the samples and transform the batch."""
        return self.transform(torch.utils.data.default_collate(samples))


def load_lines(rows: int, batch_size: int) -> list[bytes]:
    """The lines of a plain-TSV Criteo-format dataset (generated once in the cache)."""
    folder = ensure_dataset(rows, batch_size, seed=0, compress=False)
    return b"".join(p.read_bytes() for p in sorted(Path(folder).glob("*.tsv"))).splitlines()


# ----------------------------------------------------------------------------- measuring


def endless(loader: Any) -> Iterator[Any]:
    """Batches of epoch after epoch."""
    while True:
        yield from loader


def torch_loader(lines: list[bytes], batch_size: int, workers: int) -> Any:
    """torch's DataLoader over the workload."""
    return torch.utils.data.DataLoader(
        CriteoLines(lines),
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=CollateThen(DlrmBatch()),
        persistent_workers=workers > 0,
    )


def our_loader(lines: list[bytes], batch_size: int, workers: int, fuse: Any = "auto") -> Any:
    """``agents.torch.DataLoader`` over the same workload, the batch transform a stage."""
    return DataLoader(
        CriteoLines(lines),
        batch_size=batch_size,
        num_workers=workers,
        batch_transforms={"transform": DlrmBatch()},
        persistent_workers=workers > 0,
        fuse=fuse,
    )


def measure(make: Callable[[], Any], seconds: float, warmup: float) -> float:
    """Start a loader, measure its batches/s, shut it down."""
    loader = make()
    try:
        return consume_rate(endless(loader), seconds, warmup)
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
        del loader


def sweep(
    loader: Any, allocations: list[dict[str, int]], seconds: float, warmup: float, bar: Any
) -> list[tuple[dict[str, int], float]]:
    """Batches/s of one loader at each allocation, resized live between them."""
    results = []
    batches = endless(loader)
    for allocation in allocations:
        loader.apply(allocation)
        results.append((dict(loader.allocation), consume_rate(batches, seconds, warmup)))
        bar.update()
    return results


# ----------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark; returns its figures."""
    cores = sorted(os.sched_getaffinity(0))[: args.cores] if args.cores else None
    if cores:
        os.sched_setaffinity(0, cores)  # workers inherit it: every candidate, the same cores
    cores = sorted(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    lines = load_lines(args.rows, args.batch_size)
    workers = [int(w) for w in args.workers.split(",")]
    unit = _unit_costs(lines, args.batch_size)
    ceiling = len(cores) + 1
    grid = [
        {"fetch+collate": a, "transform": b}
        for a in range(1, ceiling + 1)
        for b in range(1, ceiling + 1)
        if a + b <= len(cores) + 2
    ]
    fused_counts = list(range(1, ceiling + 1))
    steps = 2 * len(workers) * args.rounds + len(grid) + len(fused_counts) + 2 * args.rounds
    bar = tqdm(total=steps, desc="dataloader benchmark", unit="run", file=sys.stderr)
    untuned: dict[int, dict[str, list[float]]] = {w: {"torch": [], "intune": []} for w in workers}
    for _ in range(args.rounds):
        for w in workers:
            untuned[w]["torch"].append(
                measure(
                    lambda w=w: torch_loader(lines, args.batch_size, w), args.seconds, args.warmup
                )
            )
            bar.update()
            untuned[w]["intune"].append(
                measure(
                    lambda w=w: our_loader(lines, args.batch_size, w), args.seconds, args.warmup
                )
            )
            bar.update()
    search_s, search_warm = max(1.0, args.seconds / 2), min(args.warmup, 0.5)
    staged = our_loader(lines, args.batch_size, 1)
    tried = [("staged", a, r) for a, r in sweep(staged, grid, search_s, search_warm, bar)]
    staged.close()
    fused = our_loader(lines, args.batch_size, 1, fuse="fetch+collate+transform")
    name = "fetch+collate+transform"
    counts = [{name: n} for n in fused_counts]
    tried += [("fused", a, r) for a, r in sweep(fused, counts, search_s, search_warm, bar)]
    fused.close()
    layout, best, _ = max(tried, key=lambda t: t[2])
    torch_best_w = max(workers, key=lambda w: statistics.median(untuned[w]["torch"]))
    final: dict[str, list[float]] = {"torch": [], "intune": []}

    def tuned_loader() -> Any:
        loader = our_loader(lines, args.batch_size, 1, fuse="auto" if layout == "staged" else name)
        loader.apply(best)
        return loader

    for _ in range(args.rounds):
        final["torch"].append(
            measure(
                lambda: torch_loader(lines, args.batch_size, torch_best_w),
                args.seconds,
                args.warmup,
            )
        )
        bar.update()
        final["intune"].append(measure(tuned_loader, args.seconds, args.warmup))
        bar.update()
    bar.close()
    per_s = args.batch_size  # samples per batch
    rows = []
    for w in workers:
        t, o = (statistics.median(untuned[w][k]) for k in ("torch", "intune"))
        rows.append(
            {
                "workers": w,
                "torch_samples_per_s": t * per_s,
                "intune_samples_per_s": o * per_s,
                "ratio": o / t,
                "rounds": {k: [v * per_s for v in untuned[w][k]] for k in untuned[w]},
            }
        )
    t_best, o_best = (statistics.median(final[k]) for k in ("torch", "intune"))
    untuned_at_cores = max(rows, key=lambda r: r["workers"])
    return {
        "cores": cores,
        "batch_size": args.batch_size,
        "rows": len(lines),
        "seconds": args.seconds,
        "rounds": args.rounds,
        "unit_costs_ms": unit,
        "untuned": rows,
        "search": [
            {"layout": lay, "allocation": a, "samples_per_s": r * per_s} for lay, a, r in tried
        ],
        "tuned": {
            "layout": layout,
            "allocation": best,
            "intune_samples_per_s": o_best * per_s,
            "torch_best_workers": torch_best_w,
            "torch_samples_per_s": t_best * per_s,
            "ratio_to_torch_best": o_best / t_best,
            "gain_over_untuned": o_best * per_s / untuned_at_cores["intune_samples_per_s"],
            "untuned_workers": untuned_at_cores["workers"],
        },
    }


def _unit_costs(lines: list[bytes], batch_size: int) -> dict[str, float]:
    """Milliseconds per batch of each step, in this process (for reading the results)."""
    dataset, transform = CriteoLines(lines), DlrmBatch()
    began = time.perf_counter()
    samples = [dataset[i] for i in range(batch_size)]
    fetch = time.perf_counter() - began
    began = time.perf_counter()
    batch = torch.utils.data.default_collate(samples)
    collate = time.perf_counter() - began
    began = time.perf_counter()
    transform(batch)
    return {
        "fetch": 1000 * fetch,
        "collate": 1000 * collate,
        "transform": 1000 * (time.perf_counter() - began),
    }


def report(result: dict[str, Any]) -> str:
    """The figures as a few lines of text."""
    lines = [
        f"cores {result['cores']}, batch {result['batch_size']}, "
        f"{result['rounds']} rounds of {result['seconds']:.0f} s; ms per batch: "
        + ", ".join(f"{k} {v:.1f}" for k, v in result["unit_costs_ms"].items())
    ]
    for row in result["untuned"]:
        lines.append(
            f"untuned, {row['workers']} workers: torch {row['torch_samples_per_s']:,.0f} "
            f"samples/s, intune {row['intune_samples_per_s']:,.0f} ({row['ratio']:.2f}x)"
        )
    tuned = result["tuned"]
    lines.append(
        f"tuned: {tuned['layout']} {tuned['allocation']} {tuned['intune_samples_per_s']:,.0f} "
        f"samples/s = {tuned['ratio_to_torch_best']:.2f}x torch at its best "
        f"({tuned['torch_best_workers']} workers, {tuned['torch_samples_per_s']:,.0f}); "
        f"{tuned['gain_over_untuned']:.2f}x ours untuned at {tuned['untuned_workers']} workers"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.dataloader``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dataloader",
        description="agents.torch.DataLoader against torch.utils.data.DataLoader, same cores.",
    )
    parser.add_argument("--workers", default="1,2", help="worker counts to compare (1,2)")
    parser.add_argument("--cores", type=int, default=None, help="use the first N cores only")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--rounds", type=int, default=3, help="alternating repetitions")
    parser.add_argument("--rows", type=int, default=65536, help="dataset lines")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--json", dest="json_out", help="also write the figures here")
    args = parser.parse_args(argv)
    result = run(args)
    print(report(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
