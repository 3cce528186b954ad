"""``prior`` decides what intune's model-based part decides, and differs from intune only where
the network's learnt value and residual act."""

import numpy as np
from helpers import make_scenario

from tuner.control import TUNER_NAMES, make_tuner
from tuner.prior import zero_residual
from tuner.twin import PipelineTwin

SCENARIO = make_scenario(
    [
        {"name": "read", "us_per_sample": 2.0, "memory_mb_per_worker": 100},
        {"name": "parse", "us_per_sample": 9.0, "memory_mb_per_worker": 300},
        {"name": "collate", "us_per_sample": 3.0, "memory_mb_per_worker": 50},
    ],
    cpus=12,
    noise=0.03,
)


def test_prior_is_a_tuner_name_and_climbs_from_one_worker_each():
    assert "prior" in TUNER_NAMES
    tuner = make_tuner("prior", SCENARIO.stage_names)
    twin = PipelineTwin(SCENARIO, seed=1)
    observation = twin.reset()
    first = twin.step({n: 1 for n in SCENARIO.stage_names}).throughput
    for _ in range(30):
        result = twin.step(tuner.decide(observation).allocation)
        observation = result.observation
    assert result.throughput > 3 * first


def test_prior_scores_each_action_by_the_model_gain_alone():
    tuner = make_tuner("prior", SCENARIO.stage_names)
    twin = PipelineTwin(SCENARIO, seed=3)
    observation = twin.reset()
    decision = tuner.decide(observation)
    assert decision.q_values["hold"] == 0.0
    moves = [q for label, q in decision.q_values.items() if label != "hold"]
    # scale * gain - change cost: the cost shows wherever the model predicts no change.
    assert min(moves) < 0 < max(moves)
    assert decision.action == max(decision.q_values, key=decision.q_values.get)


def test_prior_never_learns():
    tuner = make_tuner("prior", SCENARIO.stage_names)
    before = {k: v.clone() for k, v in tuner.q_network.state_dict().items()}
    twin = PipelineTwin(SCENARIO, seed=4)
    observation = twin.reset()
    for _ in range(60):
        observation = twin.step(tuner.decide(observation).allocation).observation
    assert tuner.learn_steps == 0
    for key, value in tuner.q_network.state_dict().items():
        assert np.array_equal(value.numpy(), before[key].numpy())


def test_intune_with_its_learning_zeroed_decides_exactly_as_prior():
    prior = make_tuner("prior", SCENARIO.stage_names, seed=5)
    # The shipped policy, its learnt part zeroed, online learning kept from starting, and the
    # online capacity fit and the measured-best rules (learning too) off.
    ablated = make_tuner(
        "intune",
        SCENARIO.stage_names,
        seed=5,
        online_learning_starts=10**9,
        capacity_fit=False,
        hold_measured_best=False,
    )
    zero_residual(ablated.q_network)
    shipped = make_tuner("intune", SCENARIO.stage_names, seed=5)
    twin = PipelineTwin(SCENARIO, seed=6)
    observation = twin.reset()
    differs = 0
    for _ in range(40):
        a, b, c = (
            prior.decide(observation),
            ablated.decide(observation),
            shipped.decide(observation),
        )
        assert a.allocation == b.allocation and a.action == b.action
        assert a.q_values == b.q_values
        # The shipped network's learnt part changes the scores (whether or not the choice).
        differs += a.q_values != c.q_values
        observation = twin.step(a.allocation).observation
    assert differs == 40
