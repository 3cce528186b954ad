"""The layout as part of a tuning step: which neighbouring stages run fused (issue 15, part 3).

On when the job's ``tuning_options`` say ``"layout": "auto"`` (default ``"off"``: every step is
the tuner's allocation alone, as before). Each step, from the observation's per-stage CPU (the
agent reports one row per registered stage whatever the layout runs), :func:`choose` fits the
stages' costs and asks :func:`tuner.layout.choose_layout` for the layout predicted best at its
best allocation. The ingestion protocol does not carry a stage's CPU inside its function, so the
hand-off is modelled with tuner/layout.py's calibrated constants (3.5% of the work per queue
crossing, 5% for the crossing to the trainer, 0.03 time-slicing): a stage's measured CPU per
sample is split into its function's and its share of the hand-offs of the layout running now.

Hysteresis: a layout changes only when predicted at least ``MARGIN`` better, and at most once
every ``HOLD_STEPS`` steps of a session (a change costs a drain; noise must not flip it).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.layout import group_names, group_workers
from tuner import Observation
from tuner.layout import LayoutCosts, choose_layout, spans_of
from tuner.scenario import Scenario, StageSpec

LAYOUT_OPTION = "layout"
LAYOUT_MODES = ("off", "auto")
MARGIN = 0.03
HOLD_STEPS = 3
# tuner/layout.py's calibration on the real DLRM pipeline (dlrm_scenario), as fractions of the
# work per sample: one queue crossing, and the crossing to the trainer.
HANDOFF_FRACTION = 0.035
CONSUMER_FRACTION = 0.05
SWITCH_PENALTY = 0.03


def layout_mode(options: dict | None) -> str:
    """The job's layout mode, ``"off"`` unless its tuning options say otherwise."""
    return str((options or {}).get(LAYOUT_OPTION, "off"))


def option_problem(options: dict | None) -> str | None:
    """Why the job's ``layout`` tuning option is invalid, or ``None``."""
    if not options or LAYOUT_OPTION not in options:
        return None
    value = options[LAYOUT_OPTION]
    if value not in LAYOUT_MODES:
        return f"layout must be one of {', '.join(map(repr, LAYOUT_MODES))}, got {value!r:.100}"
    return None


@dataclass(frozen=True)
class LayoutStep:
    """A layout decision of one step: the layout (None: each stage alone), the allocation of
    its groups, and what the model predicts for it and for the layout running now."""

    layout: list[list[str]] | None
    workers: dict[str, int]
    predicted: float
    predicted_current: float
    changed: bool


def staged(stage_names: list[str]) -> list[list[str]]:
    """The layout of every stage alone."""
    return [[name] for name in stage_names]


def fitted_scenario(
    observation: Observation, stage_names: list[str], current: list[list[str]]
) -> tuple[Scenario, LayoutCosts] | None:
    """The stages' costs per sample as measured, less the hand-offs of the layout running now,
    and the modelled hand-off costs; None when the window has no throughput or CPU to fit."""
    by_name = {s.name: s for s in observation.stages}
    if observation.throughput <= 0 or any(name not in by_name for name in stage_names):
        return None
    cpu_us = [
        max(0.0, float(by_name[n].cpu_percent or 0.0)) / 100.0 / observation.throughput * 1e6
        for n in stage_names
    ]
    total = sum(cpu_us)
    if total <= 0:
        return None
    # Measured = work * (1 + groups * handoff + consumer): the functions' work alone.
    work = total / (1.0 + len(current) * HANDOFF_FRACTION + CONSUMER_FRACTION)
    stages = tuple(
        StageSpec(
            name,
            max(us * work / total, 1e-6),
            max_workers=by_name[name].max_workers,
            memory_mb_per_worker=float(by_name[name].memory_mb_per_worker or 0.0),
        )
        for name, us in zip(stage_names, cpu_us, strict=True)
    )
    host = observation.host
    scenario = Scenario(
        name="observed",
        cpus=host.cpus,
        memory_gb=max(host.memory_limit_mb, 1.0) / 1024.0,
        stages=stages,
    )
    costs = LayoutCosts(
        handoff_us=HANDOFF_FRACTION * work,
        consumer_us=CONSUMER_FRACTION * work,
        switch_penalty=SWITCH_PENALTY,
    )
    return scenario, costs


def choose(
    observation: Observation, stage_names: list[str], current: list[list[str]] | None
) -> LayoutStep | None:
    """The layout predicted best for what ``observation`` measured (see the module's docs),
    with its allocation; the current layout unless another is ``MARGIN`` better."""
    current = current or staged(stage_names)
    fitted = fitted_scenario(observation, stage_names, current)
    if fitted is None:
        return None
    scenario, costs = fitted
    choice = choose_layout(
        scenario,
        scenario.host_at(0),
        costs,
        spans_of(stage_names, group_names(current)),
        margin=MARGIN,
    )
    layout = [list(stage_names[i:j]) for i, j in choice.spans]
    return LayoutStep(
        layout=None if len(layout) == len(stage_names) else layout,
        workers=dict(zip(group_names(layout), map(int, choice.allocation), strict=True)),
        predicted=choice.predicted,
        predicted_current=choice.predicted_current,
        changed=choice.changed,
    )


def to_groups(
    decided: dict[str, int], observed: dict[str, int], layout: list[list[str]]
) -> dict[str, int]:
    """The tuner's per-stage decision as the groups of ``layout`` run it
    (:func:`agents.layout.group_workers`: a fused group's stages each report the group's
    workers, so the tuner's moves are deltas from those)."""
    return group_workers(decided, observed, layout)
