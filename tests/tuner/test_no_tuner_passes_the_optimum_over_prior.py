"""``tuner.headroom``: the optimum over a baseline bounds every tuner's ratio to it, run by run,
at the median and on average; a target above that ceiling is reported out of reach."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.headroom import headroom, markdown

finals = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)


def bench(rows):
    return {
        "metrics": [
            {"scenario": f"s{i}", "tuner": tuner, "seed": seed, "final_vs_optimum": value}
            for i, seed, values in rows
            for tuner, value in values.items()
        ]
    }


@given(st.lists(st.tuples(finals, finals), min_size=1, max_size=30))
def test_no_tuner_passes_the_median_or_mean_of_optimum_over_prior(pairs):
    body = bench([(i, 0, {"intune": a, "prior": b}) for i, (a, b) in enumerate(pairs)])
    result = headroom(body)
    assert all(p.ratio <= p.ceiling + 1e-12 for p in result.pairs)
    assert result.ratio_median <= result.ceiling_median + 1e-12
    assert result.ratio_mean <= result.ceiling_mean + 1e-12
    # A tuner at the optimum on every run scores the ceiling exactly.
    best = headroom(bench([(i, 0, {"intune": 1.0, "prior": b}) for i, (_, b) in enumerate(pairs)]))
    assert best.ratio_median == pytest.approx(result.ceiling_median)


def test_a_target_above_the_median_ceiling_is_reported_out_of_reach():
    # Two runs of three where prior is already at the optimum: the median ceiling is 1.
    body = bench(
        [
            (0, 0, {"intune": 1.0, "prior": 0.5}),
            (1, 0, {"intune": 1.0, "prior": 1.0}),
            (2, 0, {"intune": 0.99, "prior": 1.0}),
        ]
    )
    result = headroom(body)
    assert result.ceiling_median == 1.0
    assert result.runs_that_can_reach(1.05) == 1
    assert "out of reach" in markdown(result, "intune", "prior", 1.05)
    assert "within reach" in markdown(result, "intune", "prior", 1.0)


def test_runs_where_the_baseline_scored_zero_are_counted_and_left_out():
    body = bench([(0, 0, {"intune": 0.9, "prior": 0.0}), (1, 0, {"intune": 0.9, "prior": 0.9})])
    result = headroom(body)
    assert result.baseline_zero == 1
    assert [p.scenario for p in result.pairs] == ["s1"]


def test_a_tuner_the_bench_did_not_run_is_named_in_the_error():
    body = bench([(0, 0, {"intune": 0.9, "lp": 0.8})])
    with pytest.raises(ValueError, match="no runs of \\['prior'\\]"):
        headroom(body)
