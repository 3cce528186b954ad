"""The layout decision on the DLRM twin: each fixed layout's best allocation against the
decision's choice, from 1 to 64 CPUs, as a table for docs/benchmarks.md.

    python -m benchmarks.layout_twin [--noise 0.03] [--seeds 5] [--json OUT]

For each CPU count: the best allocation of ``staged``, ``halves`` and ``fused`` (the model's
climb, :func:`tuner.layout.best_allocation`), and the decision run online from the staged
layout (:func:`tuner.layout.run_decision`, costs fitted from noisy measurements), as the
median over seeds of its throughput over the best fixed layout and over staged.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tuner.layout import best_allocation, dlrm_scenario, fixed_layouts, layout_groups, run_decision

CPUS = (1, 2, 4, 8, 16, 32, 64)


def measure(noise: float, seeds: int) -> list[dict]:
    """One row per CPU count (see the module's docs)."""
    rows = []
    for cpus in CPUS:
        scenario, costs = dlrm_scenario(cpus, noise=noise)
        host = scenario.host_at(0)
        ideal = cpus * 1e6 / sum(s.us_per_sample for s in scenario.stages)
        fixed = {
            name: best_allocation(scenario, host, spans, costs)
            for name, spans in fixed_layouts(len(scenario.stages)).items()
        }
        runs = [run_decision(scenario, costs, seed=seed) for seed in range(seeds)]
        best_fixed = max(value for _, value in fixed.values())
        chosen = runs[0]
        rows.append(
            {
                "cpus": cpus,
                "of_ideal": {name: value / ideal for name, (_, value) in fixed.items()},
                "decision_layout": layout_groups(scenario.stage_names, chosen.spans),
                "decision_allocation": list(chosen.allocation),
                "decision_of_ideal": statistics.median(r.throughput for r in runs) / ideal,
                "decision_over_best_fixed": statistics.median(
                    r.throughput / best_fixed for r in runs
                ),
                "decision_over_staged": statistics.median(
                    r.throughput / fixed["staged"][1] for r in runs
                ),
                "changes": max(r.changes for r in runs),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| CPUs | staged | halves | fused | decision: layout, allocation | of ideal "
        "| / best fixed | / staged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        o = row["of_ideal"]
        lines.append(
            f"| {row['cpus']} | {o['staged']:.2f} | {o['halves']:.2f} | {o['fused']:.2f} "
            f"| {', '.join(row['decision_layout'])}: {row['decision_allocation']} "
            f"| {row['decision_of_ideal']:.2f} | **{row['decision_over_best_fixed']:.3f}** "
            f"| {row['decision_over_staged']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = measure(args.noise, args.seeds)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
