"""Generated ``agents.torch.DataLoader`` cases, with the CPUs busy: every call returns within
its bound, each epoch gives torch's batches (in torch's order where it is defined) or an
error of torch's type, and nothing of the loader is left running after ``close()``.

The cases (datasets, loader options, faults, training loops) are ``loader_cases.cases``; the
short form runs in ``make test``, ``make soak`` (or ``INTUNE_LOADER_CASES=N``) the long one.
"""

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from torch.utils.data import _utils as torch_utils

from tests.agents.pipeline.test_generated_pipelines_never_hang import busy_cpus  # noqa: F401
from tests.agents.torch.loader_cases import cases, run_case

# Each case starts real processes, so no deadline; a failing case is reported as found
# (with its blob to reproduce it): shrinking costs minutes of real processes.
RUNS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
SHORT = int(os.environ.get("INTUNE_LOADER_CASES", "6"))
# How long torch's loader waits for each of its workers to leave when it shuts them down
# (MP_STATUS_CHECK_INTERVAL, 5 s, read there when it shuts down), before it terminates the
# worker. With the CPUs busy, a worker that had not left in time cost 5 s, one after another:
# torch's shutdowns took 37 s of the test's 80 in 3 of its 6 cases (2026-11-29, load 15). What
# the cases compare is torch's batches and errors, all taken before; its workers "leave on their
# own time" (loader_cases). Ours does not read it.
TORCHS_WORKER_JOIN_S = 0.5


@pytest.fixture(autouse=True)
def _torchs_workers_terminated_sooner(monkeypatch):
    monkeypatch.setattr(torch_utils, "MP_STATUS_CHECK_INTERVAL", TORCHS_WORKER_JOIN_S)


# A longer run through INTUNE_LOADER_CASES gets a longer bound than pytest-timeout's 300 s.
@pytest.mark.timeout(max(300, 30 * SHORT))
@settings(RUNS, max_examples=SHORT)
@given(case=cases(max_items=48, max_epochs=3, max_workers=3))
def test_generated_loaders_give_torchs_batches_and_never_hang(busy_cpus, case):  # noqa: F811
    run_case(case)


# pytest-timeout's 300 s (pyproject) is for one test of the suite; this one is 300 cases.
@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(RUNS, max_examples=300)
@given(case=cases(max_items=200, max_epochs=3, max_workers=4))
def test_many_generated_loaders_give_torchs_batches_and_never_hang(busy_cpus, case):  # noqa: F811
    run_case(case)
