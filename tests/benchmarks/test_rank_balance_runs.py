"""``python -m benchmarks.rank_balance`` measures the even and the measured split of two ranks
that differ, and writes every figure: a tiny run (the figures are in docs/benchmarks.md; no
speed is asserted here). What it checks is the split it applies: the heavy rank gets more fetch
threads, the host's total stays, and the stage alike on both ranks stays even."""

import json

from benchmarks.rank_balance import main


def test_a_tiny_run_splits_towards_the_heavy_rank_and_writes_every_figure(tmp_path):
    out = tmp_path / "rank_balance.json"
    result = main(["--seconds", "0.6", "--rounds", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    (row,) = result["rounds"]
    assert row["even_samples_per_s"] > 0 and row["measured_samples_per_s"] > 0
    split = row["split"]
    assert split[1]["fetch"] > split[0]["fetch"] >= 1
    assert split[0]["fetch"] + split[1]["fetch"] == 2 * result["workers_per_rank"]
    assert split[0]["decode"] == split[1]["decode"] == 1
