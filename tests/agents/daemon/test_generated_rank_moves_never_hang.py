"""Generated multi-rank hosts (2 to 4 ranks joining in any order, allocations within and beyond
the bounds, rebalances, ranks leaving, cut, silent or refusing, the hosting rank or the hub
stopping), with the CPUs busy: every operation returns within its bound, the host never runs
more workers of a stage than the old or the new allocation gives it, every connected rank ends
on its share, and nothing is left after stop.

The short form runs in ``make test``; ``make soak`` (or ``INTUNE_RANK_STRESS_EXAMPLES=N``)
runs the long form. Each writes its tally after every case (``var/stress-ranks-short.json``,
``var/stress-ranks.json``).
"""

import os

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings

from tests.agents.daemon.rank_stress import Scenario, Tally, run_scenario, scenarios
from tests.agents.pipeline.stress import write_tally
from tests.agents.pipeline.test_generated_pipelines_never_hang import busy_cpus  # noqa: F401

RUNS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)

SHORT = Tally()

ALIKE = {"read": 2, "parse": 2, "collate": 2}
# Found by this test: rank 1 goes quiet while its share shrinks (the ranks' needs swapped);
# the hub dropped it and grew rank 0 into the slots rank 1 still held (6 workers on 4 slots).
SILENT_WHILE_SHRINKING = Scenario(
    ranks=2,
    busy=[0.1, 0.95],
    rebalance_s=None,
    operations=[
        ("join", 0), ("join", 1), ("wait", 0.3), ("apply", ALIKE), ("busy", 0, 0.95),
        ("busy", 1, 0.1), ("wait", 0.3), ("mute", 1), ("apply", ALIKE),
    ],
)  # fmt: skip


# The soak's one failure in 288 runs: rank 1's stand-in apply, muted, held its link's thread
# past its stop(2.0) (a stop cannot cut a pipeline's apply); with every rank gone the case
# ended at once, and the thread, let go a moment before, was read still alive (3 of 60 runs at
# load 12 before RankLink.stop said whether its thread ended).
MUTED_RANK_LEAVES_LAST_BUT_ONE = Scenario(
    ranks=2,
    busy=[0.5, 0.5],
    rebalance_s=None,
    operations=[
        ("join", 0), ("join", 1), ("wait", 0.3), ("apply", ALIKE), ("mute", 1),
        ("apply", {"read": 3, "parse": 3, "collate": 3}), ("leave", 1), ("leave", 0),
    ],
)  # fmt: skip


@settings(RUNS, max_examples=int(os.environ.get("INTUNE_RANK_STRESS_SHORT", "12")))
@example(scenario=SILENT_WHILE_SHRINKING)
@example(scenario=MUTED_RANK_LEAVES_LAST_BUT_ONE)
@given(scenario=scenarios(max_operations=8))
def test_generated_rank_moves_finish_in_bounds_and_never_overrun_the_host(busy_cpus, scenario):  # noqa: F811
    run_scenario(scenario, SHORT)
    write_tally(SHORT, "stress-ranks-short.json")


LONG = Tally()


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
@settings(RUNS, max_examples=int(os.environ.get("INTUNE_RANK_STRESS_EXAMPLES", "300")))
@given(scenario=scenarios(max_operations=16))
def test_many_generated_rank_moves_never_hang(busy_cpus, scenario):  # noqa: F811
    run_scenario(scenario, LONG)
    write_tally(LONG, "stress-ranks.json")
