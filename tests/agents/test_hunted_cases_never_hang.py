"""The hang hunters' cases (``tests/agents/pipeline/hunt.py``, ``tests/agents/torch/hunt.py``)
drawn by hypothesis: each case runs in a forked child under a hard bound, and a case that
hangs, loses or repeats an item, or leaves a process, fails with its stacks.

A few cases in ``make test``; ``make soak`` runs many (``INTUNE_HUNT_CASES``, default 200).
The scripts run the same cases by seed, beside busy loops (docs/reliability.md, "Hunting
hangs").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.agents.pipeline import hunt as pipeline_hunt
from tests.agents.torch import hunt as loader_hunt

# Each case starts real processes: no deadline, and no shrinking (minutes of processes).
RUNS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
MANY = int(os.environ.get("INTUNE_HUNT_CASES", "200"))


def _run(hunter, case: dict, bound_s: float, tmp_path: Path) -> None:
    outcome, took, report = pipeline_hunt.run_forked(
        hunter.run_case, case, bound_s, tmp_path / "case.log"
    )
    assert outcome == "ok", f"{outcome} after {took:.1f} s: {case}\n{report[-6000:]}"


@settings(RUNS, max_examples=2)
@given(case=st.randoms(use_true_random=False).map(pipeline_hunt.generate))
def test_hunted_pipelines_never_hang(tmp_path, case):
    _run(pipeline_hunt, case, pipeline_hunt.CASE_BOUND_S, tmp_path)


@settings(RUNS, max_examples=2)
@given(case=st.randoms(use_true_random=False).map(loader_hunt.generate))
def test_hunted_loaders_never_hang(tmp_path, case):
    _run(loader_hunt, case, loader_hunt.CASE_BOUND_S, tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(RUNS, max_examples=MANY)
@given(case=st.randoms(use_true_random=False).map(pipeline_hunt.generate))
def test_many_hunted_pipelines_never_hang(tmp_path, case):
    _run(pipeline_hunt, case, pipeline_hunt.CASE_BOUND_S, tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(RUNS, max_examples=MANY)
@given(case=st.randoms(use_true_random=False).map(loader_hunt.generate))
def test_many_hunted_loaders_never_hang(tmp_path, case):
    _run(loader_hunt, case, loader_hunt.CASE_BOUND_S, tmp_path)
