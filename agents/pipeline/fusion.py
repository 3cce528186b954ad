"""Fuse neighbouring stages into one: each worker runs their functions back to back.

A stage of its own lets the tuner give a step exactly the workers it needs, but every item
then crosses a queue, and another process, between each pair of stages. When the steps are
short, or the host has few cores, those hand-offs (and the time-slicing of many processes on
few cores) can cost more than the balance gains: tf.data fuses map and batch for the same
reason. A fused stage is an ordinary stage named ``"read+parse"``; its worker count is one
lever where there were several, and it resizes live like any other.

    stages = fuse_groups(stages, ["read+parse+transform+collate"])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agents.pipeline.stage import Stage

SEPARATOR = "+"


@dataclass(frozen=True)
class Chain:
    """Several stage functions applied in turn to one item (picklable if they are)."""

    fns: tuple[Callable[[Any], Any], ...]

    def __call__(self, item: Any) -> Any:
        """Apply every function, in order, each to the previous one's result."""
        for fn in self.fns:
            item = fn(item)
        return item

    def timed(self, item: Any, seconds: Any, base: int) -> Any:
        """``self(item)``, adding each function's time to ``seconds[base + k]``: so that a
        fused group still says what each of its stages costs."""
        for k, fn in enumerate(self.fns):
            began = time.perf_counter()
            item = fn(item)
            seconds[base + k] += time.perf_counter() - began
        return item


@dataclass(frozen=True)
class InitChain:
    """The per-worker setups of several fused stages, run in turn."""

    inits: tuple[Callable[[int], Any], ...]

    def __call__(self, slot: int) -> None:
        """Run every stage's setup for the worker in ``slot``."""
        for init in self.inits:
            init(slot)


def fuse(stages: Sequence[Stage], workers: int | None = None) -> Stage:
    """One stage doing the work of ``stages`` (neighbours, in pipeline order) in each worker.

    Its name joins theirs with ``+``; it is a process stage if any of them is; it keeps its
    items in order if all of them do; its ceiling is the lowest of theirs. ``workers``
    defaults to the most any of them starts with.
    """
    if not stages:
        raise ValueError("fuse() needs at least one stage")
    if len(stages) == 1:
        return stages[0]
    ceilings = [s.max_workers for s in stages if s.max_workers is not None]
    ceiling = min(ceilings) if ceilings else None
    start = workers if workers is not None else max(s.workers for s in stages)
    if ceiling is not None:
        start = min(start, ceiling)
    affinities = {tuple(s.cpu_affinity) for s in stages if s.cpu_affinity}
    last = stages[-1]
    return Stage(
        name=SEPARATOR.join(s.name for s in stages),
        fn=Chain(tuple(s.fn for s in stages)),
        workers=start,
        kind="process" if any(s.kind == "process" for s in stages) else "thread",
        max_workers=ceiling,
        ordered=all(s.ordered for s in stages),
        cpu_affinity=list(affinities.pop()) if len(affinities) == 1 else None,
        shared_memory=last.shared_memory,
        shm_min_bytes=last.shm_min_bytes,
        init=InitChain(inits) if (inits := tuple(s.init for s in stages if s.init)) else None,
    )


def parse_groups(spec: str | Iterable[str | Sequence[str]] | None) -> list[list[str]]:
    """Read fusion groups: ``"read+parse,transform+collate"``, a list of such strings, or a
    list of lists of stage names."""
    if spec is None:
        return []
    if isinstance(spec, str):
        spec = [part for part in spec.split(",") if part.strip()]
    groups = []
    for group in spec:
        names = group.split(SEPARATOR) if isinstance(group, str) else list(group)
        names = [str(n).strip() for n in names]
        if not names or not all(names):
            raise ValueError(f"fusion group {group!r} names an empty stage; write a+b+c")
        groups.append(names)
    return groups


def fuse_groups(
    stages: Sequence[Stage], groups: str | Iterable[str | Sequence[str]] | None
) -> list[Stage]:
    """``stages`` with each group of neighbouring stages replaced by their fusion.

    Raises ``ValueError`` when a group names an unknown stage, stages that are not
    neighbours in pipeline order, or a stage another group already took.
    """
    spans = layout_spans([s.name for s in stages], groups)
    return [fuse(stages[i:j]) for i, j in spans]


Span = tuple[int, int]  # a group of neighbouring stages: indices [start, end) in pipeline order


def layout_spans(
    names: Sequence[str], groups: str | Iterable[str | Sequence[str]] | None
) -> list[Span]:
    """The layout ``groups`` describe over the stages ``names``, as spans covering them all
    in order (a stage no group names stays alone). Raises ``ValueError`` as ``fuse_groups``."""
    starts: dict[int, int] = {}
    taken: set[str] = set()
    for group in parse_groups(groups):
        unknown = [n for n in group if n not in names]
        if unknown:
            raise ValueError(
                f"cannot fuse {SEPARATOR.join(group)}: no stage named "
                f"{', '.join(repr(n) for n in unknown)}; the stages are {', '.join(names)}"
            )
        again = [n for n in group if n in taken or group.count(n) > 1]
        if again:
            raise ValueError(
                f"cannot fuse {SEPARATOR.join(group)}: {', '.join(again)} already in another group"
            )
        first = list(names).index(group[0])
        if list(names[first : first + len(group)]) != group:
            raise ValueError(
                f"cannot fuse {SEPARATOR.join(group)}: only neighbouring stages fuse, in "
                f"pipeline order ({SEPARATOR.join(names)})"
            )
        starts[first] = len(group)
        taken.update(group)
    spans, i = [], 0
    while i < len(names):
        length = starts.get(i, 1)
        spans.append((i, i + length))
        i += length
    return spans


def boundaries(spans: Sequence[Span]) -> set[int]:
    """The places between stages where a layout has a queue (0 and the end included)."""
    return {0} | {end for _, end in spans}
