"""Generated pipelines under generated resizes, worker kills and stops, with the CPUs busy:
every operation finishes within its bound, and the consumer gets every item exactly once (in
order when every stage is ordered), or the stage's error with its traceback.

The short form runs in ``make test``; ``make soak`` runs the long form. Each writes its tally
after every case (``var/stress-pipeline-short.json``, ``var/stress-pipeline.json``; figures
in docs/reliability.md).
"""

import multiprocessing
import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.agents.pipeline.stress import Tally, run_scenario, scenarios, write_tally


def _burn() -> None:
    while True:
        pass


@pytest.fixture(scope="module")
def busy_cpus():
    """Keep every core busy while the pipelines run, as a training host's are."""
    burners = [
        multiprocessing.get_context("fork").Process(target=_burn, daemon=True)
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    for burner in burners:
        burner.start()
    yield
    for burner in burners:
        burner.kill()
        burner.join(5)


# Both forms: each case starts real processes, so no deadline; a failing case is reported as
# found (with its blob to reproduce it), since shrinking one costs minutes of real processes.
RUNS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)

SHORT = Tally()


# A handful in make test (25 took 11.7 s of the suite); the soak form below runs 400.
@settings(RUNS, max_examples=10)
@given(scenario=scenarios(max_items=80, max_operations=6))
def test_generated_pipelines_finish_every_operation_in_bounds(busy_cpus, scenario):
    run_scenario(scenario, SHORT, seed=len(scenario.operations))
    assert SHORT.hangs == 0
    write_tally(SHORT, "stress-pipeline-short.json")


LONG = Tally()


# pytest-timeout's 300 s (pyproject) is for one test of the suite; this one is 400 runs.
@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(RUNS, max_examples=400)
@given(scenario=scenarios(max_items=200, max_operations=12))
def test_many_generated_pipelines_never_hang(busy_cpus, scenario):
    run_scenario(scenario, LONG, seed=len(scenario.operations))
    write_tally(LONG, "stress-pipeline.json")
