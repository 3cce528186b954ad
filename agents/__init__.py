"""InTune's trainer-host side: the pipeline runtime, the DLRM workload and the agent.

Attach the agent to your own training script in five lines (or use ``agents.DataLoader``,
a drop-in ``torch.utils.data.DataLoader`` whose stages the agent resizes)::

    from agents import attach
    agent = attach(pipeline, url="http://intune:8000", host_id=3, token="ia_...")
    for batch in pipeline:
        train_step(batch)
    agent.stop()
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.daemon.agent import Agent
    from agents.daemon.ranks import RankAttachment
    from agents.transport import Cancel

__all__ = ["DataLoader", "attach"]

# The pipelines attach() was called for in this process (intune-run leaves a script that
# attaches its own alone: agents.torch.auto).
attached: weakref.WeakSet = weakref.WeakSet()


def __getattr__(name: str) -> Any:
    # ``agents.DataLoader`` imports torch on first use only: ``import agents`` (the agent,
    # the pipeline runtime's workers) stays light.
    if name == "DataLoader":
        from agents.torch import DataLoader

        return DataLoader
    raise AttributeError(f"module 'agents' has no attribute {name!r}")


def attach(
    pipeline: Any,
    url: str | None = None,
    host_id: int | None = None,
    token: str | None = None,
    *,
    trainer_stats: Callable[[], dict] | None = None,
    rank: int | None = None,
    local_world_size: int | None = None,
    rank_socket: str | None = None,
    cancel: Cancel | None = None,
    **options: Any,
) -> Agent | RankAttachment:
    """Start an agent for ``pipeline`` in background threads and return it.

    ``url``, ``host_id`` and ``token`` default to ``INTUNE_URL``, ``INTUNE_HOST_ID`` and
    ``INTUNE_AGENT_TOKEN``. The agent reads ``pipeline.consumer_stats()`` for the trainer's
    throughput and idle time unless ``trainer_stats`` (a callable returning the same keys) is
    given. Other keyword arguments are :class:`agents.daemon.AgentConfig` fields, e.g.
    ``interval_s=1.0``, ``worker_budget=12``, ``prometheus_port=9310``. Call ``agent.stop()``
    when training ends; the pipeline is not stopped for you.

    On a host with several local ranks (``local_world_size``, or torchrun's
    ``LOCAL_WORLD_SIZE``, above one) the host has one agent for all of them: each rank's
    pipeline reports to it over a local socket (``rank_socket``, or ``INTUNE_RANK_SOCKET``: a
    path, or ``@name`` in Linux's abstract namespace; by default an abstract name derived from
    ``url`` and ``host_id``) and applies the allocation it
    sends; the first rank to come up runs it, another takes over if that rank ends
    (``agents.daemon.ranks``, docs/architecture.md "Multi-rank hosts"). It returns a
    :class:`agents.daemon.ranks.RankAttachment`, which also has ``stop()``.

    Raises ``ValueError`` when the host's job names other stages than the pipeline reports
    (register the job with ``pipeline.stage_names``), as ``intune-agent`` exits then; a
    control plane that cannot be reached now is not an error (the agent ships when it can).

    ``cancel`` (:class:`agents.transport.Cancel`): set from another thread (a process that
    exits), it cuts the job's stages' read at once and ``attach()`` raises
    :class:`agents.transport.Cancelled` without starting an agent.
    """
    # Imported here so that ``import agents.pipeline`` in a worker process stays light.
    from agents.daemon.agent import Agent, AgentConfig

    url = url or os.environ.get("INTUNE_URL")
    host_id = host_id if host_id is not None else os.environ.get("INTUNE_HOST_ID")
    token = token or os.environ.get("INTUNE_AGENT_TOKEN")
    missing = [
        name
        for name, value in (("url", url), ("host_id", host_id), ("token", token))
        if value in (None, "")
    ]
    if missing:
        raise ValueError(
            f"attach() needs {', '.join(missing)}: pass them or set INTUNE_URL, "
            "INTUNE_HOST_ID and INTUNE_AGENT_TOKEN (register the host on the control plane first)"
        )
    config = AgentConfig(url=str(url), host_id=int(host_id), token=str(token), **options)
    with contextlib.suppress(TypeError):  # not weakly referable, or unhashable: not noted
        attached.add(pipeline)
    from agents.daemon import ranks as host_ranks
    from agents.daemon.checks import job_stages_problem, reported_stage_names

    # As intune-agent does at start: a job registered with other stage names would refuse
    # every sample for as long as training ran (an error a second, no tuning); say so now.
    names = reported_stage_names(pipeline)
    if problem := job_stages_problem(config.url, config.host_id, config.token, names, cancel):
        raise ValueError(f"attach(): {problem}")
    if cancel is not None and cancel.is_set():
        from agents.transport import Cancelled

        raise Cancelled("attach() was cancelled (the process is exiting): no agent started")

    rank, world = host_ranks.local_rank_and_world(rank, local_world_size)
    if world == 1:
        return Agent(pipeline, config, trainer_stats=trainer_stats).start()
    stats = trainer_stats or getattr(pipeline, "consumer_stats", None)
    if stats is None:
        raise ValueError(
            "attach() needs the trainer's stats: pass trainer_stats=callable, or a pipeline "
            "with consumer_stats()"
        )

    def host_here(listener: Any) -> host_ranks.HostedAgent:
        hub = host_ranks.HostPipelines(
            listener,
            world,
            stages=host_ranks.stage_infos(pipeline),
            interval_s=config.interval_s,
            rebalance_s=config.rebalance_s,
        ).start()
        try:
            agent = Agent(hub, config).start()
        except BaseException:
            hub.stop()
            raise
        return host_ranks.HostedAgent(hub, agent)

    link = host_ranks.RankLink(
        pipeline,
        rank,
        world,
        host_ranks.socket_address(rank_socket)
        if rank_socket
        else host_ranks.default_address(config.url, config.host_id),
        trainer_stats=stats,
        host_here=host_here,
        interval_s=config.interval_s,
    ).start()
    return host_ranks.RankAttachment(link)
