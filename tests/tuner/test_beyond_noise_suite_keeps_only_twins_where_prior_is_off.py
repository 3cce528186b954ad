"""tuner/suites/model_wrong_beyond_noise.json is what ``python -m tuner.beyond_noise`` draws and
keeps: every twin is the generator's candidate of its draw index, unchanged, and ``prior`` ends
at least 5% under the exact optimum on both selection seeds (issue 15, part 4)."""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tuner.beyond_noise import candidates, keeps, prior_ceilings
from tuner.scenario import load_suite

SUITE = Path(__file__).resolve().parents[2] / "tuner" / "suites" / "model_wrong_beyond_noise.json"


def test_every_twin_is_its_drawn_candidate_and_passes_the_rule():
    suite = load_suite(SUITE)
    assert len(suite) == 12
    indices = [int(re.match(r"mw-beyond-noise-(\d+)-", s.name).group(1)) for s in suite]
    assert indices == sorted(indices)
    drawn = list(islice(candidates(2031, indices[-1] + 1), indices[-1] + 1))
    for index, scenario in zip(indices, suite, strict=True):
        assert scenario == drawn[index]
        ceilings = prior_ceilings(scenario)
        assert keeps(ceilings), (scenario.name, ceilings)


@given(st.lists(st.one_of(st.floats(0.5, 5.0), st.just(float("inf"))), min_size=1, max_size=4))
def test_the_rule_wants_every_seed_finite_and_at_least_the_threshold(ceilings):
    assert keeps(ceilings) == all(1.05 <= c < float("inf") for c in ceilings)
    assert not keeps([*ceilings, 1.04])
