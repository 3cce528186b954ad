"""How far one tuner is above another on a bench run, and how far any tuner could be.

``python -m tuner.headroom OUT.json --tuner intune --baseline prior --target 1.05`` reads the JSON
of :mod:`tuner.bench` and prints, per scenario and over the suite, the per-run ratio
``tuner / baseline`` of final throughput and its ceiling ``optimum / baseline``.

Why the ceiling bounds every tuner: ``final_vs_optimum`` is at most 1, because the optimum of
:mod:`tuner.optimum` is exact at every step. So on each run ``tuner / baseline <= 1 / baseline``,
and since a median (or a mean) of numbers each below their own bound is below the median (or
mean) of the bounds, no tuner's median ratio can pass the median of the ceilings. A target above
that median cannot be met on the suite, whatever the tuner learns; the report says so.

Runs where the baseline scored 0 (out of memory at the end) have no finite ratio; they are counted
and left out of the medians, as the tables in docs/benchmarks.md do.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPair:
    """One scenario and seed: the two tuners' final throughput over the optimum."""

    scenario: str
    seed: int
    tuner: float
    baseline: float

    @property
    def ratio(self) -> float:
        """Tuner over baseline (the baseline above 0)."""
        return self.tuner / self.baseline

    @property
    def ceiling(self) -> float:
        """The most any tuner can score over this baseline here: the optimum over it."""
        return 1.0 / self.baseline


@dataclass(frozen=True)
class Headroom:
    """The pairs of a bench run and what they add up to."""

    pairs: list[RunPair]
    baseline_zero: int

    @property
    def ratio_median(self) -> float:
        """Median over runs of tuner / baseline."""
        return statistics.median(p.ratio for p in self.pairs)

    @property
    def ratio_mean(self) -> float:
        """Mean over runs of tuner / baseline."""
        return statistics.mean(p.ratio for p in self.pairs)

    @property
    def ceiling_median(self) -> float:
        """Median over runs of optimum / baseline: no tuner's median ratio can pass it."""
        return statistics.median(p.ceiling for p in self.pairs)

    @property
    def ceiling_mean(self) -> float:
        """Mean over runs of optimum / baseline: no tuner's mean ratio can pass it."""
        return statistics.mean(p.ceiling for p in self.pairs)

    def runs_that_can_reach(self, target: float) -> int:
        """Runs whose ceiling is at least ``target``."""
        return sum(p.ceiling >= target for p in self.pairs)


def headroom(bench: dict, tuner: str = "intune", baseline: str = "prior") -> Headroom:
    """Pair every (scenario, seed) that both tuners ran in a :mod:`tuner.bench` JSON body."""
    finals = {
        (m["scenario"], m["tuner"], m["seed"]): m["final_vs_optimum"] for m in bench["metrics"]
    }
    missing = [t for t in (tuner, baseline) if not any(k[1] == t for k in finals)]
    if missing:
        ran = sorted({k[1] for k in finals})
        raise ValueError(f"the bench run has no runs of {missing}; it ran {ran}")
    pairs, zero = [], 0
    for (scenario, name, seed), value in sorted(finals.items()):
        if name != tuner or (scenario, baseline, seed) not in finals:
            continue
        base = finals[(scenario, baseline, seed)]
        if base <= 0:
            zero += 1
            continue
        pairs.append(RunPair(scenario, seed, value, base))
    if not pairs:
        raise ValueError(f"no scenario and seed where both {tuner} and {baseline} ran")
    return Headroom(pairs, zero)


def _cells(values) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def markdown(result: Headroom, tuner: str, baseline: str, target: float) -> str:
    """The per-scenario table and the summary lines, as Markdown."""
    lines = [
        f"| scenario | {tuner} (per seed) | {baseline} (per seed) | {tuner} / {baseline} | "
        f"ceiling: optimum / {baseline} |",
        "|---|---|---|---|---|",
    ]
    scenarios: dict[str, list[RunPair]] = {}
    for pair in result.pairs:
        scenarios.setdefault(pair.scenario, []).append(pair)
    for name, pairs in scenarios.items():
        lines.append(
            f"| `{name}` | {_cells(p.tuner for p in pairs)} | {_cells(p.baseline for p in pairs)} "
            f"| {_cells(p.ratio for p in pairs)} | {_cells(p.ceiling for p in pairs)} |"
        )
    reach = result.runs_that_can_reach(target)
    verdict = (
        f"a median of {target:.2f} is out of reach on this suite for any tuner"
        if result.ceiling_median < target
        else f"a median of {target:.2f} is within reach"
    )
    lines += [
        "",
        f"- {tuner} / {baseline} per run: median {result.ratio_median:.3f}, "
        f"mean {result.ratio_mean:.3f} ({len(result.pairs)} runs"
        + (
            f"; {result.baseline_zero} with {baseline} at 0 left out"
            if result.baseline_zero
            else ""
        )
        + ").",
        f"- ceiling, optimum / {baseline} per run: median {result.ceiling_median:.3f}, "
        f"mean {result.ceiling_mean:.3f}.",
        f"- runs whose ceiling reaches {target:.2f}: {reach} of {len(result.pairs)}; {verdict}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line: see ``python -m tuner.headroom --help``."""
    parser = argparse.ArgumentParser(
        prog="python -m tuner.headroom",
        description="Per-run ratio of two tuners in a tuner.bench JSON, and its ceiling.",
    )
    parser.add_argument("bench_json", help="the --json file of python -m tuner.bench")
    parser.add_argument("--tuner", default="intune")
    parser.add_argument("--baseline", default="prior")
    parser.add_argument("--target", type=float, default=1.05, help="ratio to check (1.05)")
    args = parser.parse_args(argv)
    bench = json.loads(Path(args.bench_json).read_text())
    print(
        markdown(headroom(bench, args.tuner, args.baseline), args.tuner, args.baseline, args.target)
    )


if __name__ == "__main__":
    main()
