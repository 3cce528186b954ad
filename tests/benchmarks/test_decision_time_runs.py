"""``python -m benchmarks.decision_time`` measures the CPU time of InTune's decisions on a
16-stage twin and writes every figure: a tiny run. The 5 ms target is a benchmark's (the brief:
speed targets are benchmarks, not timed tests; the figures, machine and date are in
docs/benchmarks.md, "Tuner"): a timed test of it failed on the same code from one day to the
next on this shared machine (6.5 to 8.1 ms, against under 5 ms the day before). What is checked
here is that what it times is the whole decision: online learning and the capacity fit ran."""

import json

from benchmarks.decision_time import main


def test_a_tiny_run_times_decisions_that_learn_and_fit_and_writes_every_figure(tmp_path):
    out = tmp_path / "decision_time.json"
    result = main(["--blocks", "2", "--block", "5", "--warmup", "60", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["stages"] == 16 and result["decisions"] == 70
    assert len(result["block_median_cpu_ms"]) == 2
    assert 0 < result["best_block_median_cpu_ms"] == min(result["block_median_cpu_ms"])
    assert result["learn_steps"] > 0, "online learning must be inside the timed decisions"
    assert result["uses_capacity_fit"]
