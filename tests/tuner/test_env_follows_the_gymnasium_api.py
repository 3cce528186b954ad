"""TuningEnv passes gymnasium's checker and exposes only measurements."""

import warnings

import numpy as np
from gymnasium.utils.env_checker import check_env

from tuner.env import TuningEnv
from tuner.scenario import load_suite

# Unbounded Box spaces are intended: rates have no cap. Every other warning is a finding.
INTENDED = "A Box observation space maximum value is infinity"


def test_gymnasium_env_checker_accepts_the_env():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(TuningEnv(episode_steps=10), skip_render_check=True)
    unexpected = [str(w.message) for w in caught if INTENDED not in str(w.message)]
    assert unexpected == []


def test_a_masked_action_holds_the_allocation():
    env = TuningEnv(load_suite("tuner/suites/default.json")[:1], episode_steps=5)
    observation, info = env.reset(seed=0)
    masked = int(np.flatnonzero(~info["action_mask"])[0])
    before = observation["stages"][:, 0].copy()
    observation, _, _, _, info = env.step(masked)
    assert info["invalid_action"]
    assert np.array_equal(observation["stages"][:, 0], before)


def test_episodes_end_by_truncation_after_the_set_steps():
    env = TuningEnv(load_suite("tuner/suites/default.json")[:1], episode_steps=3)
    env.reset(seed=1)
    flags = [env.step(0)[3] for _ in range(3)]
    assert flags == [False, False, True]
