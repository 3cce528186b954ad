"""make_tuner says what was wrong and what to do."""

import pytest

from tuner.control import make_tuner


def test_an_unknown_tuner_name_lists_the_choices():
    with pytest.raises(
        ValueError, match="choose one of intune, prior, hillclimb, lp, static, random"
    ):
        make_tuner("autotune", ["read", "parse"])


def test_an_unknown_intune_option_is_refused():
    with pytest.raises(ValueError, match="unknown intune options"):
        make_tuner("intune", ["read", "parse"], learning_rat=0.1)


def test_a_missing_policy_file_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m tuner.pretrain"):
        make_tuner("intune", ["read", "parse"], policy=tmp_path / "missing.pt")


def test_intune_refuses_an_observation_of_another_pipeline():
    from helpers import make_scenario

    from tuner.twin import PipelineTwin

    tuner = make_tuner("intune", ["read", "parse"])
    scenario = make_scenario(
        [{"name": "read", "us_per_sample": 1.0}, {"name": "x", "us_per_sample": 1.0}]
    )
    with pytest.raises(ValueError, match="make a new tuner"):
        tuner.decide(PipelineTwin(scenario).reset())
