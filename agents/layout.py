"""An allocation's optional ``layout``: which neighbouring stages run fused (one definition,
imported by the agent and the control plane; docs/agent-protocol.md).

A layout is a list of groups, each a list of stage names as the job registered them; every
stage in exactly one group, in pipeline order, each group of neighbours. The allocation's
``workers`` then names each group by its stages joined with ``+``:

    {"layout": [["read", "parse"], ["transform", "collate"]],
     "workers": {"read+parse": 2, "transform+collate": 3}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SEPARATOR = "+"
MAX_GROUPS = 64


def group_names(layout: Sequence[Sequence[str]]) -> list[str]:
    """The names the allocation's ``workers`` use for a layout's groups."""
    return [SEPARATOR.join(group) for group in layout]


def group_workers(
    decided: Mapping[str, int], observed: Mapping[str, int], layout: Sequence[Sequence[str]]
) -> dict[str, int]:
    """A per-stage allocation as the groups of ``layout`` run it. Each stage of a fused group
    reports the group's workers, so a per-stage decision is read as changes from what was
    observed: a group gets its workers as observed plus its stages' changes (at least one)."""
    workers = {}
    for group in layout:
        now = max(observed.get(stage, 1) for stage in group)
        delta = sum(
            decided.get(stage, observed.get(stage, now)) - observed.get(stage, now)
            for stage in group
        )
        workers[SEPARATOR.join(group)] = max(1, now + delta)
    return workers


def layout_problem(layout: object, stage_names: Sequence[str]) -> str | None:
    """Why ``layout`` is not a layout of ``stage_names`` (in pipeline order), or ``None``."""
    if not isinstance(layout, list) or not layout or len(layout) > MAX_GROUPS:
        return (
            f"layout must be a non-empty list of groups of stage names, got {layout!r:.200}; "
            'for example [["read", "parse"], ["transform"]]'
        )
    for group in layout:
        if not isinstance(group, list) or not group or not all(isinstance(n, str) for n in group):
            return f"layout group {group!r:.100} is not a non-empty list of stage names"
    flat = [name for group in layout for name in group]
    if flat != list(stage_names):
        unknown = sorted(set(flat) - set(stage_names))
        if unknown:
            return (
                f"layout names unknown stage(s) {', '.join(unknown)}; the stages are "
                f"{', '.join(stage_names)}"
            )
        return (
            f"layout must take every stage once, in pipeline order ({', '.join(stage_names)}), "
            f"got {' | '.join(SEPARATOR.join(g) for g in layout)}"
        )
    return None


def workers_problem(layout: Sequence[Sequence[str]], workers: object) -> str | None:
    """Why ``workers`` does not name exactly the groups of ``layout``, or ``None``."""
    if not isinstance(workers, dict):
        return "workers must be a mapping of group name to worker count"
    names = group_names(layout)
    if set(workers) != set(names):
        return (
            f"with a layout, workers must name its groups {', '.join(names)}; "
            f"got {', '.join(map(str, workers))}"
        )
    return None
