"""Checking an allocation before it touches the pipeline.

An agent never applies an allocation blindly (docs/agent-protocol.md, "Checking and
applying"): it refuses one that leaves out or invents a stage, asks for a count that is not a
whole number of at least one or is above a stage's bound, takes more CPU slots than the host's
budget, or would need more memory than the budget. The rules are :mod:`agents.budget`'s, the
same the control plane and the tuner use; this module adds what the agent tells a person to do.
The reason is a sentence a person can act on.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.budget import AGENT_WAITING_TOLERANCE, HostBudget, StageBudget, allocation_problems

#: What the agent knows about one stage when it checks an allocation.
StageLimits = StageBudget


def check_allocation(
    workers: object,
    stages: Sequence[StageBudget],
    worker_budget: float,
    memory_budget_mb: float | None = None,
    cpus: float | None = None,
    ranks: int = 1,
) -> str | None:
    """Return why ``workers`` (stage name -> worker count) must be refused, or ``None`` if fine.

    ``worker_budget`` is the host's CPU slots, shared by its ``ranks`` pipelines (``workers``
    is per rank; :mod:`agents.budget`). The checks run from the most to the least basic,
    so the reason names the first problem.
    """
    problems = allocation_problems(
        workers,
        stages,
        HostBudget(worker_budget, memory_budget_mb, cpus, ranks),
        waiting_tolerance=AGENT_WAITING_TOLERANCE,
        cpu_hint="set --worker-budget on the agent to allow more",
        memory_hint="set --memory-budget-mb on the agent to allow more",
    )
    return problems[0] if problems else None
