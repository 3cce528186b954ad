"""Checking an allocation before it touches the pipeline.

An agent never applies an allocation blindly (docs/agent-protocol.md, "Checking and
applying"): it refuses one that leaves out or invents a stage, asks for a count that is not a
whole number of at least one or is above a stage's bound, takes more CPU slots than the host's
budget, or would need more memory than the budget. The rules are :mod:`agents.budget`'s, the
same the control plane and the tuner use; this module adds what the agent tells a person to do.
The reason is a sentence a person can act on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agents.budget import AGENT_WAITING_TOLERANCE, HostBudget, StageBudget, allocation_problems

if TYPE_CHECKING:
    from agents.transport import Cancel

log = logging.getLogger("agents")

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


def reported_stage_names(pipeline: object) -> list[str]:
    """The stage names an agent reports for ``pipeline``, the ones its host's job must have:
    the stages as written for a pipeline that can change its layout (its fused groups are
    reported stage by stage), else its ``stage_names`` (an ``agents.torch.DataLoader``'s
    fused ``fetch+collate`` included)."""
    relayout = callable(getattr(pipeline, "relayout", None))
    units = getattr(pipeline, "unit_names", None)
    return list(units if relayout and units else pipeline.stage_names)  # type: ignore[attr-defined]


def job_stages_problem(
    url: str,
    host_id: int,
    token: str,
    stage_names: Sequence[str],
    cancel: Cancel | None = None,
) -> str | None:
    """Say why the host's job cannot tune a pipeline of ``stage_names`` (``None``: it can, or
    the control plane cannot be asked now).

    When the job names other stages, every sample and every allocation would be refused for
    as long as the agent ran (an error a second in the log, and no tuning). The job's stages
    are those of the host's current allocation, read once without waiting. A control plane
    that cannot be reached, or refuses the token (an operator may fix it while training goes
    on, ``ControlPlaneError.retryable``), is not a problem here; one that refuses the request
    outright is (its :class:`agents.client.ControlPlaneError` said).

    ``cancel`` (:class:`agents.transport.Cancel`), set from another thread, cuts the read at
    once: it then raises :class:`agents.transport.Cancelled`.
    """
    from agents.client import ControlPlaneClient, ControlPlaneError
    from agents.transport import Cancelled

    client = ControlPlaneClient(url, host_id, token, timeout_s=5.0, cancel=cancel)
    try:
        allocation = client.poll_allocation(after=0, wait_s=0)
    except ControlPlaneError as exc:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the job's stages were not read: cancelled") from exc
        if exc.retryable:
            log.warning("could not read the job's stages now (%s); starting anyway", str(exc))
            return None
        return f"the control plane refused this agent: {exc}"
    finally:
        client.close()
    allocation = allocation or {}
    layout = allocation.get("layout")
    if layout:
        job_stages = [stage for group in layout for stage in group]
    else:
        job_stages = list(allocation.get("workers") or {})
    ours = list(stage_names)
    if not job_stages or set(job_stages) == set(ours):
        return None
    return (
        f"host {host_id}'s job has the stages {', '.join(job_stages)}, and this pipeline has "
        f"{', '.join(ours)}: every sample would be refused. Register the host under a job with "
        "this pipeline's stages, as the pipeline names them (print(pipeline.stage_names); for "
        "agents.torch.DataLoader, loader.stage_names), or PATCH the job's stages."
    )
