"""Pretrain InTune's default policy across many random twins.

``python -m tuner.pretrain --out tuner/policies/intune-default.pt`` makes the shipped policy.
Twins have 2 to 16 stages, 2 to 128 CPUs and every kind of :mod:`tuner.generate`, stages whose
workers wait (``io_bound``) included; episodes start from one worker per stage or from a random
allocation, so the policy also learns to recover from bad starts and events. The shipped file was
made before the ``io_bound`` kind existed (the features did not change: a stage's first feature,
its CPU slots per worker, was 1 for every stage then); rerunning the command with the same seed
and steps now draws other twins and makes a policy that has also seen waiting stages.

``--suite tuner/suites/model_wrong.json`` mixes a suite's scenarios into the draws (a share
``--suite-fraction`` of the episodes, 0.3 by default): the model-is-wrong twins of issue 15.
Their held-out twins (``model_wrong_holdout.json``) must never be given here.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tuner.generate import random_scenario
from tuner.intune import IntuneConfig, IntuneTuner
from tuner.model import stage_budgets
from tuner.optimum import optimum
from tuner.scenario import Scenario, load_suite
from tuner.twin import PipelineTwin

log = logging.getLogger("tuner.pretrain")
POLICY_FORMAT = "intune-policy"
POLICY_VERSION = 1


def _random_start(rng: np.random.Generator, twin: PipelineTwin) -> list[int]:
    scenario = twin.scenario
    host = scenario.host_at(0)
    n = len(scenario.stages)
    total = int(rng.integers(n, host.worker_budget + 1))
    extra = rng.multinomial(total - n, rng.dirichlet(np.ones(n)))
    return [
        min(1 + int(e), s.most_workers or 1 + int(e))
        for e, s in zip(extra, stage_budgets(scenario), strict=False)
    ]


def pretrain(
    steps: int,
    seed: int = 0,
    episode_steps: int = 80,
    max_minutes: float | None = None,
    progress: bool = True,
    suite: list[Scenario] | None = None,
    suite_fraction: float = 0.3,
) -> tuple[IntuneTuner, dict]:
    """Train a fresh InTune tuner for ``steps`` decisions; return it and a summary. With
    ``suite``, a share ``suite_fraction`` of the episodes runs one of its scenarios instead of
    a random twin."""
    rng = np.random.default_rng(seed)
    config = IntuneConfig(exploration_steps=int(0.4 * steps))
    tuner = IntuneTuner(None, config, seed=seed, mode="pretrain")
    started = time.monotonic()
    episodes, ratios = 0, []
    bar = tqdm(total=steps, disable=not progress, unit="step", desc="pretraining")
    stopped_early = False
    while tuner.global_step < steps:
        if max_minutes is not None and time.monotonic() - started > 60 * max_minutes:
            stopped_early = True
            log.warning(
                "stopping at %d steps: the %.1f-minute limit", tuner.global_step, max_minutes
            )
            break
        if suite and rng.random() < suite_fraction:
            scenario = suite[int(rng.integers(len(suite)))]
        else:
            scenario = random_scenario(rng, f"train-{episodes}", steps=episode_steps)
        twin = PipelineTwin(scenario, seed=int(rng.integers(2**31)))
        if rng.random() < 0.5:
            twin = PipelineTwin(scenario, twin.rng.integers(2**31), _random_start(rng, twin))
        tuner.reset_episode()
        observation = twin.reset()
        tail = []
        for step in range(episode_steps):
            decision = tuner.decide(observation)
            result = twin.step(decision.allocation)
            observation = result.observation
            if step >= episode_steps - 10:
                best = optimum(scenario, scenario.host_at(step)).throughput
                tail.append(result.throughput / best if best > 0 else 1.0)
        episodes += 1
        ratios.append(float(np.mean(tail)))
        bar.update(episode_steps)
        if episodes % 20 == 0:
            recent = float(np.mean(ratios[-20:]))
            bar.set_postfix(eps=f"{tuner.epsilon:.2f}", final_vs_optimum=f"{recent:.3f}")
            log.info(
                "episode %d, step %d: epsilon %.2f, final throughput / optimum %.3f (last 20)",
                episodes, tuner.global_step, tuner.epsilon, recent,
            )  # fmt: skip
    bar.close()
    summary = {
        "steps": tuner.global_step,
        "seed": seed,
        "episodes": episodes,
        "episode_steps": episode_steps,
        "wall_s": round(time.monotonic() - started, 1),
        "stopped_early": stopped_early,
        "final_vs_optimum_last_50_episodes": round(float(np.mean(ratios[-50:])), 4),
        "torch": str(torch.__version__),
        "suite_scenarios": [s.name for s in suite] if suite else [],
        "suite_fraction": suite_fraction if suite else 0.0,
    }
    return tuner, summary


def save_policy(tuner: IntuneTuner, summary: dict, path: str | Path) -> None:
    """Write the policy file ``make_tuner('intune', ...)`` loads: weights, config, provenance."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": POLICY_FORMAT,
            "version": POLICY_VERSION,
            **tuner.policy_dict(),
            "pretrain": summary,
        },
        path,
    )


def main(argv: list[str] | None = None) -> None:
    """Command line: see ``python -m tuner.pretrain --help``."""
    parser = argparse.ArgumentParser(
        prog="python -m tuner.pretrain",
        description="Pretrain InTune's DQN across random pipeline twins and write the policy file.",
    )
    parser.add_argument("--out", required=True, help="policy file to write (.pt)")
    parser.add_argument("--steps", type=int, default=30_000, help="decisions to train (30000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of twins and weights (0)")
    parser.add_argument("--episode-steps", type=int, default=80, help="decisions per twin (80)")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=9.5,
        help="stop early after this long, whatever --steps says (9.5; 0 = no limit)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--suite", help="also train on this suite's scenarios (e.g. tuner/suites/model_wrong.json)"
    )
    parser.add_argument(
        "--suite-fraction", type=float, default=0.3, help="share of episodes from --suite (0.3)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    suite = load_suite(args.suite) if args.suite else None
    if args.suite and "holdout" in Path(args.suite).name:
        parser.error(f"{args.suite} is a held-out suite: pretraining must never see it")
    tuner, summary = pretrain(
        args.steps, args.seed, args.episode_steps, args.max_minutes or None, not args.quiet,
        suite, args.suite_fraction,
    )  # fmt: skip
    save_policy(tuner, summary, args.out)
    size = Path(args.out).stat().st_size
    log.info("wrote %s (%.0f kB): %s", args.out, size / 1024, summary)


if __name__ == "__main__":
    main()
