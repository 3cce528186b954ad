"""What a tuner sees and what it answers: the dataclasses of the control interface.

These are the measurements an agent really takes (averaged over the window since the last
decision), never the twin's ground truth. ``tuner.control`` re-exports them for the web app.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StageObservation:
    """One stage as measured: workers, output rate, busy fraction, output-queue fill and CPU."""

    name: str
    workers: int
    items_per_s: float
    busy_fraction: float
    queue_fill: float  # 0..1, output queue depth / capacity
    max_workers: int | None = None
    memory_mb_per_worker: float | None = None  # measured RSS / workers when known
    cpu_percent: float | None = None  # the stage's CPU use, all workers (100 = one CPU)
    # Time its workers were runnable but waiting for a CPU, all workers (100 = one worker all
    # the time); counted as CPU they wanted (agents.budget.cpu_per_busy_worker). 0: unmeasured.
    runqueue_percent: float = 0.0
    # CPU slots one worker takes as the control plane counts them (agents.budget); None: the
    # tuner measures it from busy_fraction and cpu_percent itself.
    worker_cpu: float | None = None


@dataclass
class HostObservation:
    """The host as measured: CPUs, CPU use, memory limit and use, and its CPU slots."""

    cpus: float
    cpu_percent: float  # 0..100 of all cpus
    memory_limit_mb: float
    memory_used_mb: float
    worker_budget: int  # CPU slots of all stages together (agents.budget)
    # What the host holds besides the pipeline's workers (the trainer and its model or
    # embedding tables, the system, other tenants): memory used less the workers' own. The
    # workers have the limit less this; 0 where it is not measured (the twins hold nothing else).
    memory_outside_mb: float = 0.0


@dataclass
class Observation:
    """Everything a tuner may use for one decision."""

    stages: list[StageObservation]
    host: HostObservation
    throughput: float
    trainer_idle_fraction: float
    # The layout in force (agents.layout): groups of neighbouring stages run fused. Each stage
    # of a fused group reports the group's workers; None: every stage runs alone.
    layout: list[list[str]] | None = None

    @property
    def allocation(self) -> dict[str, int]:
        """The allocation in force while this observation was measured."""
        return {stage.name: stage.workers for stage in self.stages}

    def to_dict(self) -> dict:
        """A JSON-ready dict of the observation."""
        return asdict(self)


@dataclass
class Decision:
    """A tuner's answer: the allocation to apply and why."""

    allocation: dict[str, int]
    action: str  # human-readable, e.g. "move 1 worker parse -> transform" or "hold"
    q_values: dict[str, float] | None = None  # action label -> Q, for policies that have them
    epsilon: float | None = None
    reward: float | None = None  # reward of the previous decision, computed from this observation
    info: dict = field(default_factory=dict)
