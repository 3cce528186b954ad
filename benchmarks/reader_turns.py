"""``python -m benchmarks.reader_turns``: what keeping torch's turns costs an IterableDataset.

A reader of ``agents.torch.DataLoader`` that is ``prefetch_factor`` batches ahead of the
training loop answers its ticks with ``Skipped`` instead of reading on
(``agents.torch.steps.Read``), so that however slow one reader is, the batches come in
torch's turns. This measures whole epochs with it ("turns") and without it ("read on", the
reader's check patched out in the training process, which the workers fork from), alternately,
plus torch's loader, in three cases: readers of equal speed with a fast loop, the same with a
loop that takes 2 ms a batch, and reader 0 slower by ``--slow-us`` a row. Each figure is the
median over the rounds of samples/s (wall) and CPU seconds per epoch (this process and every
process it started and reaped: the launcher, the workers), and whether the epoch held torch's
order.

    python -m benchmarks.reader_turns --rounds 3 --rows 6000 --workers 2
"""

from __future__ import annotations

import argparse
import functools
import resource
import statistics
import time

import torch
import torch.utils.data as tud

from agents.torch import DataLoader
from agents.torch.steps import Read


class Rows(tud.IterableDataset):
    """Worker ``w`` yields ``rows`` samples of 64 floats, each after ``work_us`` of CPU
    (``slow_us`` more for worker 0)."""

    def __init__(self, rows: int, work_us: float, slow_us: float) -> None:
        self.rows, self.work_us, self.slow_us = rows, work_us, slow_us

    def __iter__(self):
        info = tud.get_worker_info()
        w = 0 if info is None else info.id
        spin = (self.work_us + (self.slow_us if w == 0 else 0.0)) / 1e6
        for i in range(self.rows):
            until = time.perf_counter() + spin
            while time.perf_counter() < until:
                pass
            yield torch.full((64,), float(1_000_000 * w + i))


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def epoch(make, step_s: float) -> tuple[float, float, list[float]]:
    """One epoch of a fresh loader (its start and close counted): samples/s, CPU s, rows."""
    began, cpu = time.perf_counter(), cpu_s()
    loader = make()
    order: list[float] = []
    samples = 0
    for batch in loader:
        order.append(float(batch[0, 0]))
        samples += batch.shape[0]
        if step_s:
            time.sleep(step_s)
    if hasattr(loader, "close"):
        loader.close()
    return samples / (time.perf_counter() - began), cpu_s() - cpu, order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=6000, help="rows per worker")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--work-us", type=float, default=20.0)
    parser.add_argument("--slow-us", type=float, default=200.0)
    args = parser.parse_args()
    original = Read._ahead_of_consumer
    cases = {
        "equal readers, fast loop": (0.0, 0.0),
        "equal readers, loop 2 ms a batch": (0.0, 0.002),
        f"reader 0 {args.slow_us:g} us a row slower": (args.slow_us, 0.0),
    }
    for name, (slow_us, step_s) in cases.items():
        dataset = Rows(args.rows, args.work_us, slow_us)
        kwargs = dict(batch_size=args.batch_size, num_workers=args.workers)
        figures: dict[str, list[tuple[float, float, bool]]] = {}
        reference = None
        for _ in range(args.rounds):
            for label in ("torch", "turns", "read on"):
                if label == "torch":
                    make = functools.partial(tud.DataLoader, dataset, **kwargs)
                else:
                    Read._ahead_of_consumer = (
                        original if label == "turns" else (lambda self, epoch, reader: False)
                    )
                    make = functools.partial(DataLoader, dataset, timeout=120, **kwargs)
                rate, cpu, order = epoch(make, step_s)
                Read._ahead_of_consumer = original
                if label == "torch":
                    reference = order
                figures.setdefault(label, []).append((rate, cpu, order == reference))
        print(f"{name}:")
        for label, runs in figures.items():
            rates = [r for r, _, _ in runs]
            cpus = [c for _, c, _ in runs]
            same = sum(s for _, _, s in runs)
            print(
                f"  {label:8s} {statistics.median(rates):10,.0f} samples/s "
                f"(rounds: {', '.join(f'{r:,.0f}' for r in rates)}), "
                f"CPU {statistics.median(cpus):.2f} s/epoch, torch's order {same}/{len(runs)}"
            )


if __name__ == "__main__":
    main()
