"""The parity hunter's cases (``parity_hunt``): a training loop run on torch's ``DataLoader``
and on ours with the same arguments gives, operation by operation, the same batches, errors
of torch's types and the same warnings; ours never hangs and leaves no process after
``close()``. Each case runs in a forked child under a hard bound.

``make test`` replays the seed the hunter found a hang with (seed 7: ``next()`` from three
threads; 6 s); ``make soak`` the others it found and ``INTUNE_PARITY_CASES`` (default 100)
generated ones. The script runs them by seed beside busy loops (docs/reliability.md,
"Hunting parity").
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.agents.pipeline.hunt import run_forked
from tests.agents.torch import parity_hunt
from tests.agents.torch.parity_cases import generate

MANY = int(os.environ.get("INTUNE_PARITY_CASES", "100"))
FOUND = [1, 4]  # the warnings' seeds (fixed; test_torchs_warnings_... covers them in seconds)


def _run(case: dict, tmp_path: Path) -> None:
    outcome, took, report = run_forked(
        parity_hunt.run_case, case, parity_hunt.CASE_BOUND_S, tmp_path / "case.log"
    )
    assert outcome == "ok", f"{outcome} after {took:.1f} s: {case}\n{report[-6000:]}"


def test_the_hunted_loop_with_next_from_three_threads_ends_as_torchs(tmp_path):
    _run(generate(random.Random(7)), tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("seed", FOUND)
def test_the_hunted_loops_give_torchs_warnings(tmp_path, seed):
    _run(generate(random.Random(seed)), tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(
    deadline=None,
    max_examples=MANY,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(case=st.randoms(use_true_random=False).map(generate))
def test_many_generated_loops_give_torchs_batches_errors_and_warnings(tmp_path, case):
    _run(case, tmp_path)
