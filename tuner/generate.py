"""Random twins for pretraining and for held-out suites: every kind of scenario of issue 4.

Kinds: ``plain``, ``memory_bound`` (the memory limit binds before the CPUs do), ``io_capped``
(a stage with a small ``max_workers``), ``sublinear`` (``scaling < 1``), ``consumer_bound`` (the
trainer is the bottleneck), ``colocated`` (a co-located job takes CPUs mid-run), ``cpu_loss`` (the
host loses half its CPUs mid-run), ``memory_loss`` (the memory limit shrinks mid-run), ``io_bound``
(one or two stages whose workers mostly wait, such as a GET from an object store: latency-bound,
little CPU each, so they want more workers than the host has CPUs). Any kind may also carry traits
of the others at random, as real pipelines do.

Kinds where the tuners' capacity model is wrong (issue 15, :func:`model_wrong_scenario`):
``usl`` (stages that follow the Universal Scalability Law, some past a peak), ``bandwidth``
(stages that share the host's memory bandwidth), ``wait_growth`` (a waiting stage whose wait grows
with its workers) and ``consumer_change`` (the trainer's rate changes mid-run, on top of one of the
others). ``tuner/suites/model_wrong.json`` (seed 2027) may be used in pretraining;
``tuner/suites/model_wrong_holdout.json`` (seed 2028, other shapes) is kept out of it.
``tuner/suites/model_wrong_beyond_noise.json`` (seed 2031, held-out shapes) keeps only the twins
where the model is wrong by more than the noise, picked by ``prior`` alone: :mod:`tuner.beyond_noise`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np

from tuner.model import memory_mb
from tuner.optimum import optimum
from tuner.scenario import Event, Scenario, StageSpec, save_suite

KINDS = (
    "plain",
    "memory_bound",
    "io_capped",
    "sublinear",
    "consumer_bound",
    "colocated",
    "cpu_loss",
    "memory_loss",
    "io_bound",
)
# The held-out suite's kinds: those of its committed file (tuner/suites/holdout.json), so that
# the generator still writes that very file; waiting stages have their own suite (io_bound.json).
HOLDOUT_KINDS = KINDS[:8]
STAGE_NAMES = (
    "read", "decompress", "parse", "decode", "filter", "join", "hash", "embed_lookup",
    "transform", "augment", "normalize", "tokenize", "bucketize", "shuffle", "batch", "collate",
)  # fmt: skip


def _log_uniform(rng: np.random.Generator, low: float, high: float, size=None):
    return np.exp(rng.uniform(math.log(low), math.log(high), size))


def random_scenario(
    rng: np.random.Generator,
    name: str,
    kind: str | None = None,
    stages: tuple[int, int] = (2, 16),
    cpus: tuple[int, int] = (2, 128),
    us_per_sample: tuple[float, float] = (0.5, 40.0),
    steps: int = 150,
    kinds: tuple[str, ...] = KINDS,
) -> Scenario:
    """One random scenario of ``kind`` (random among ``kinds`` when None) with shapes in the
    given ranges. Stages that wait appear in the ``io_bound`` kind, and as a trait of the others
    only when ``io_bound`` is among ``kinds``."""
    kind = kind or str(rng.choice(kinds))
    n = int(rng.integers(stages[0], stages[1] + 1))
    host_cpus = int(round(float(_log_uniform(rng, cpus[0], cpus[1]))))
    names = STAGE_NAMES[:n] if n <= len(STAGE_NAMES) else [f"stage{i}" for i in range(n)]
    us = _log_uniform(rng, *us_per_sample, size=n)
    scaling = np.ones(n)
    if kind == "sublinear" or rng.random() < 0.2:
        scaling = np.where(rng.random(n) < 0.6, rng.uniform(0.55, 0.95, n), 1.0)
    caps: list[int | None] = [None] * n
    if kind == "io_capped" or rng.random() < 0.15:
        for i in rng.choice(n, size=min(n, int(rng.integers(1, 3))), replace=False):
            caps[int(i)] = int(rng.integers(1, 5))
            us[int(i)] *= float(rng.uniform(1.0, 4.0))
    memory = _log_uniform(rng, 32, 1024, size=n)
    wait = np.zeros(n)
    if kind == "io_bound" or ("io_bound" in kinds and rng.random() < 0.15):
        # A latency-bound stage: 10 to 200 times its CPU time spent waiting, mostly the first
        # (reading from an object store), sometimes one further on (a remote lookup).
        for i in sorted({0, int(rng.integers(0, n))} if rng.random() < 0.3 else {0}):
            caps[i] = None if rng.random() < 0.8 else int(rng.integers(8, 65))
            wait[i] = us[i] * float(_log_uniform(rng, 10, 200))
            memory[i] = 0.0  # thread workers share the process's memory
    specs = tuple(
        StageSpec(names[i], round(float(us[i]), 3), caps[i], round(float(scaling[i]), 3),
                  round(float(memory[i]), 1), round(float(wait[i]), 3))
        for i in range(n)
    )  # fmt: skip
    base = Scenario(name=name, cpus=float(host_cpus), memory_gb=1e6, stages=specs)
    best = optimum(base, base.host_at(0))
    best_memory = memory_mb(base, best.allocation)
    floor_memory = memory_mb(base, [1] * n)
    if kind == "memory_bound":
        limit = max(best_memory * rng.uniform(0.35, 0.8), floor_memory * 1.5)
    else:
        limit = max(best_memory * rng.uniform(1.3, 4.0), floor_memory * 3)
    consumer = None
    if kind == "consumer_bound":
        consumer = best.throughput * rng.uniform(0.3, 0.85)
    elif rng.random() < 0.25:
        consumer = best.throughput * rng.uniform(1.2, 3.0)
    events: list[Event] = []
    at = int(rng.integers(steps // 4, max(steps // 4 + 1, steps - 40)))
    if kind == "colocated":
        events.append(Event(at, background_cpus=round(host_cpus * rng.uniform(0.25, 0.5), 1)))
        if rng.random() < 0.5:
            events.append(Event(min(steps - 20, at + int(rng.integers(20, 40))), background_cpus=0))
    elif kind == "cpu_loss":
        events.append(Event(at, cpus=float(max(1, host_cpus // 2))))
    elif kind == "memory_loss":
        events.append(Event(at, memory_gb=round(max(limit * rng.uniform(0.35, 0.7),
                                                    floor_memory * 1.5) / 1024, 4)))  # fmt: skip
    return replace(
        base,
        memory_gb=round(limit / 1024, 4),
        consumer_samples_per_s=None if consumer is None else round(float(consumer), 1),
        noise=round(float(rng.uniform(0.0, 0.04)), 3),
        events=tuple(events),
    )


MODEL_WRONG_KINDS = ("usl", "bandwidth", "wait_growth", "consumer_change")
#: Held out from every suite above: every stage memory-bound (0.5 to 0.95 of its CPU time) and
#: a host bandwidth of 5 to 15% of its CPUs' worth, so that the stages contend from a few
#: workers on and every worker added anywhere slows all of them.
CONTENTION_KIND = "contention"


def _model_wrong_stages(
    rng: np.random.Generator, kind: str, stages: tuple[StageSpec, ...], cpus: float
) -> tuple[tuple[StageSpec, ...], float | None]:
    n = len(stages)
    new = list(stages)
    bandwidth = None
    slowest = int(np.argmax([s.us_per_sample for s in stages]))
    if kind == "usl":
        picked = set(rng.choice(n, size=int(rng.integers(1, min(3, n) + 1)), replace=False))
        if rng.random() < 0.7:
            picked.add(slowest)  # the law matters most where the bottleneck would be
        for i in sorted(int(i) for i in picked):
            new[i] = replace(
                new[i],
                scaling=1.0,
                serial_fraction=round(float(rng.uniform(0.02, 0.15)), 3),
                coherency=round(float(_log_uniform(rng, 0.003, 0.03)), 4),
            )
    elif kind == "bandwidth":
        bound = np.where(rng.random(n) < 0.7, rng.uniform(0.3, 0.9, n), 0.0)
        bound[slowest] = max(bound[slowest], float(rng.uniform(0.3, 0.9)))
        new = [replace(s, memory_bound=round(float(b), 3)) for s, b in zip(new, bound, strict=True)]
        bandwidth = round(max(1.0, cpus * float(rng.uniform(0.2, 0.5))), 1)
    elif kind == CONTENTION_KIND:
        bound = rng.uniform(0.5, 0.95, n)
        new = [replace(s, memory_bound=round(float(b), 3)) for s, b in zip(new, bound, strict=True)]
        bandwidth = round(max(1.0, cpus * float(rng.uniform(0.05, 0.15))), 1)
    elif kind == "wait_growth":
        for i in sorted({0, slowest} if rng.random() < 0.5 else {0}):
            us = new[i].us_per_sample
            new[i] = replace(
                new[i],
                max_workers=None,
                wait_us_per_sample=round(us * float(_log_uniform(rng, 5, 50)), 3),
                wait_growth=round(float(rng.uniform(0.05, 0.4)), 3),
            )
    return tuple(new), bandwidth


def model_wrong_scenario(
    rng: np.random.Generator,
    name: str,
    kind: str | None = None,
    stages: tuple[int, int] = (2, 10),
    cpus: tuple[int, int] = (4, 64),
    us_per_sample: tuple[float, float] = (1.0, 60.0),
    steps: int = 150,
) -> Scenario:
    """One random scenario of a kind where the capacity model is wrong (random when None)."""
    kind = kind or str(rng.choice(MODEL_WRONG_KINDS))
    base = random_scenario(rng, name, "plain", stages, cpus, us_per_sample, steps, kinds=("plain",))
    trait = str(rng.choice(MODEL_WRONG_KINDS[:3])) if kind == "consumer_change" else kind
    specs, bandwidth = _model_wrong_stages(rng, trait, base.stages, base.cpus)
    wide = replace(base, stages=specs, memory_bandwidth=bandwidth, memory_gb=1e6, events=(),
                   consumer_samples_per_s=None)  # fmt: skip
    best = optimum(wide, wide.host_at(0))
    limit = max(
        memory_mb(wide, best.allocation) * rng.uniform(1.3, 4.0),
        memory_mb(wide, [1] * len(specs)) * 3,
    )
    consumer, events = None, []
    if kind == "consumer_change":
        # The trainer binds first, then speeds up past what the pipeline can give (or the
        # other way round): the pipeline must grow, or may shrink, mid-run.
        low = best.throughput * float(rng.uniform(0.3, 0.6))
        high = best.throughput * float(rng.uniform(1.5, 3.0))
        first, then = (low, high) if rng.random() < 0.7 else (high, low)
        consumer = round(first, 1)
        at = int(rng.integers(steps // 4, steps // 2))
        events.append(Event(at, consumer_samples_per_s=round(then, 1)))
    return replace(
        wide,
        memory_gb=round(limit / 1024, 4),
        consumer_samples_per_s=consumer,
        noise=round(float(rng.uniform(0.005, 0.03)), 3),
        events=tuple(events),
    )


def model_wrong_suite(seed: int = 2027, count: int = 12, holdout: bool = False) -> list[Scenario]:
    """Model-is-wrong scenarios, every kind in turn: the pretraining suite (seed 2027, 2..10
    stages, 4..64 CPUs) or, with ``holdout``, the held-out one's shapes (3..12 stages, 8..96
    CPUs, costlier stages; seed 2028 in the committed file)."""
    rng = np.random.default_rng(seed)
    shapes = (
        {"stages": (3, 12), "cpus": (8, 96), "us_per_sample": (2.0, 80.0)}
        if holdout
        else {"stages": (2, 10), "cpus": (4, 64), "us_per_sample": (1.0, 60.0)}
    )
    prefix = "mw-holdout" if holdout else "mw"
    return [
        model_wrong_scenario(
            rng, f"{prefix}-{i:02d}-{MODEL_WRONG_KINDS[i % 4]}", MODEL_WRONG_KINDS[i % 4], **shapes
        )
        for i in range(count)
    ]


def contention_suite(seed: int = 2029, count: int = 8) -> list[Scenario]:
    """The held-out contention suite (:data:`CONTENTION_KIND`), with the held-out shapes of
    :func:`model_wrong_suite` (3..12 stages, 8..96 CPUs); seed 2029 in the committed file."""
    rng = np.random.default_rng(seed)
    shapes = {"stages": (3, 12), "cpus": (8, 96), "us_per_sample": (2.0, 80.0)}
    return [
        model_wrong_scenario(rng, f"contention-holdout-{i:02d}", CONTENTION_KIND, **shapes)
        for i in range(count)
    ]


def holdout_suite(seed: int = 2026, count: int = 10) -> list[Scenario]:
    """Scenarios unlike pretraining's draws: another seed, 3..12 stages, 4..96 CPUs, costlier
    stages; every kind appears."""
    rng = np.random.default_rng(seed)
    suite = []
    for index in range(count):
        kind = HOLDOUT_KINDS[index % len(HOLDOUT_KINDS)]
        suite.append(
            random_scenario(
                rng, f"holdout-{index:02d}-{kind}", kind, stages=(3, 12), cpus=(4, 96),
                us_per_sample=(1.0, 80.0), kinds=HOLDOUT_KINDS,
            )
        )  # fmt: skip
    return suite


def loader_suite(seed: int = 2030, count: int = 8) -> list[Scenario]:
    """Pipelines of the shape ``agents.torch.DataLoader`` gives a torch training script (and
    ``intune-run`` one it did not change): one ``fetch+collate`` stage, where the dataset's
    ``__getitem__`` and ``collate_fn`` run, and, every other scenario, one batch transform; the
    fetch may wait (a read from a store) as well as compute; 4 to 64 CPUs. Seed 2030 in the
    committed file (``tuner/suites/loader.json``)."""
    rng = np.random.default_rng(seed)
    suite = []
    for index in range(count):
        cpus = float(rng.choice([4, 8, 16, 32, 64]))
        stages = [
            StageSpec(
                "fetch+collate",
                us_per_sample=float(rng.uniform(20.0, 200.0)),
                scaling=float(rng.choice([1.0, 0.95, 0.85])),
                memory_mb_per_worker=float(rng.choice([200.0, 800.0, 2000.0])),
                wait_us_per_sample=float(rng.choice([0.0, 0.0, 50.0, 400.0])),
            )
        ]
        if index % 2:
            stages.append(
                StageSpec(
                    "batch_transform",
                    us_per_sample=float(rng.uniform(2.0, 30.0)),
                    memory_mb_per_worker=300.0,
                )
            )
        suite.append(
            Scenario(
                name=f"loader-{index:02d}-{int(cpus)}c{'-2st' if index % 2 else ''}",
                cpus=cpus,
                memory_gb=float(rng.choice([16.0, 64.0, 256.0])),
                consumer_samples_per_s=float(rng.choice([1e5, 3e5, 1e6])),
                stages=tuple(stages),
                noise=0.02,
            )
        )
    return suite


def main(argv: list[str] | None = None) -> None:
    """Write a held-out suite: ``python -m tuner.generate --out tuner/suites/holdout.json``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", required=True, help="where to write the version-1 suite")
    parser.add_argument("--seed", type=int, default=2026, help="generator seed (default 2026)")
    parser.add_argument("--count", type=int, default=10, help="number of scenarios")
    parser.add_argument(
        "--model-wrong",
        choices=("train", "holdout", "contention"),
        help="write a model-is-wrong suite instead (tuner/suites/model_wrong.json: train, seed "
        "2027, count 12; model_wrong_holdout.json: holdout, seed 2028, count 12; "
        "contention_holdout.json: contention, seed 2029, count 8)",
    )
    parser.add_argument(
        "--loader",
        action="store_true",
        help="write the DataLoader-shaped suite instead (tuner/suites/loader.json: seed 2030, "
        "count 8)",
    )
    args = parser.parse_args(argv)
    if args.loader:
        suite = loader_suite(args.seed, args.count)
    elif args.model_wrong == "contention":
        suite = contention_suite(args.seed, args.count)
    elif args.model_wrong:
        suite = model_wrong_suite(args.seed, args.count, holdout=args.model_wrong == "holdout")
    else:
        suite = holdout_suite(args.seed, args.count)
    save_suite(suite, args.out)
    print(f"wrote {args.count} scenarios to {args.out}")


if __name__ == "__main__":
    main()
