"""Fine-tune an InTune tuner on a (fitted) twin before it tunes the real pipeline."""

from __future__ import annotations

import numpy as np

from tuner.intune import IntuneTuner, linear_schedule
from tuner.scenario import scenario_from_dict
from tuner.twin import PipelineTwin


def finetune(
    tuner: IntuneTuner,
    scenario: dict,
    steps: int,
    seed: int = 0,
    episode_steps: int = 60,
    start_e: float = 0.3,
    end_e: float = 0.02,
) -> IntuneTuner:
    """Train ``tuner`` for ``steps`` decisions on the twin of ``scenario`` (a version-1 dict).

    Episodes of ``episode_steps`` start from one worker per stage; exploration falls linearly
    from ``start_e`` to ``end_e``. The tuner keeps what it learnt (weights, optimiser, buffer)
    and forgets the twin's episode, so its next decision is about the real pipeline.
    """
    if getattr(tuner, "name", None) != "intune":
        raise ValueError("only an intune tuner can be fine-tuned; baselines do not learn")
    spec = scenario_from_dict(scenario)
    if tuner.stage_names is not None and spec.stage_names != tuner.stage_names:
        raise ValueError(
            f"the twin's stages {spec.stage_names} differ from the tuner's {tuner.stage_names}"
        )
    rng = np.random.default_rng(seed)
    online_epsilon = tuner.config.online_epsilon
    done = 0
    try:
        while done < steps:
            twin = PipelineTwin(spec, seed=int(rng.integers(2**31)))
            tuner.reset_episode()
            observation = twin.reset()
            for _ in range(min(episode_steps, steps - done)):
                tuner.config.online_epsilon = linear_schedule(start_e, end_e, steps, done)
                decision = tuner.decide(observation)
                observation = twin.step(decision.allocation).observation
                done += 1
    finally:
        tuner.config.online_epsilon = online_epsilon
        tuner.reset_episode()
    return tuner
