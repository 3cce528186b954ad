"""A step back from an oversubscribed stage that measured worse is kept as long as a far loser
(``FAR_LOSER_STALE``, :mod:`tuner.incumbent`), not re-measured every ``STALE`` decisions, and a
checkpoint keeps which measurements were step backs."""

from pathlib import Path

from tuner.control import make_tuner
from tuner.incumbent import FAR_LOSER_STALE, MeasuredAllocations
from tuner.scenario import load_suite
from tuner.twin import PipelineTwin

LOADER = Path(__file__).parents[2] / "tuner" / "suites" / "loader.json"


def test_each_losing_step_back_is_measured_once_in_150_decisions():
    # 17 computing workers on 16 CPUs, the twin's time slicing free: every step back loses.
    scenario = next(s for s in load_suite(LOADER) if s.name == "loader-01-16c-2st")
    for seed in range(2):
        tuner = make_tuner("intune", scenario.stage_names, seed=seed)
        twin = PipelineTwin(scenario, seed=seed)
        observation = twin.reset()
        step_backs = []
        for _ in range(150):
            decision = tuner.decide(observation)
            if decision.info["measured_best"] == "step back":
                step_backs.append(tuple(decision.allocation.values()))
            observation = twin.step(decision.allocation).observation
        assert 150 < FAR_LOSER_STALE
        # Removed, or moved to the other stage: each measured once.
        assert len(step_backs) == len(set(step_backs)) <= 2, step_backs


def test_a_checkpoint_keeps_the_step_backs():
    table = MeasuredAllocations()
    key = ((), (16, 2))
    table.probed(key)
    restored = MeasuredAllocations()
    restored.load_state_dict(table.state_dict())
    assert restored.step_backs == {key}
    table.forget()
    assert table.step_backs == set()
