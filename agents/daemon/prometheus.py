"""Optional Prometheus exposition of what the agent samples (``--prometheus-port``).

Each agent has its own registry, so two agents in one process (as in tests) never clash.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server


class AgentMetrics:
    """Gauges mirroring the latest sample, plus the agent's own health."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        self.host_cpu_percent = gauge(
            "intune_host_cpu_percent", "Host CPU use (mean over its CPUs)"
        )
        self.host_memory_used_mb = gauge("intune_host_memory_used_mb", "Host memory used")
        self.host_memory_limit_mb = gauge(
            "intune_host_memory_limit_mb", "Host memory limit (cgroup-aware)"
        )
        self.worker_budget = gauge("intune_worker_budget", "Most workers all stages may run")
        stage = ("stage",)
        self.stage_workers = gauge("intune_stage_workers", "Workers of a stage", stage)
        self.stage_items = gauge(
            "intune_stage_items_per_second", "Items a stage emits per second", stage
        )
        self.stage_busy = gauge(
            "intune_stage_busy_fraction", "Busy fraction of a stage's workers", stage
        )
        self.stage_in_queue = gauge(
            "intune_stage_in_queue", "Items waiting in a stage's input queue", stage
        )
        self.stage_cpu = gauge(
            "intune_stage_cpu_percent", "CPU of a stage's processes (100 = one core)", stage
        )
        self.stage_runqueue = gauge(
            "intune_stage_runqueue_percent",
            "Time a stage's workers were runnable but waiting for a CPU (100 = one worker)",
            stage,
        )
        self.stage_rss = gauge(
            "intune_stage_rss_mb", "Resident memory of a stage's processes", stage
        )
        self.trainer_throughput = gauge(
            "intune_trainer_throughput", "Items per second the trainer consumed"
        )
        self.trainer_idle = gauge(
            "intune_trainer_idle_fraction", "Fraction of time the trainer waited for input"
        )
        self.allocation_version = gauge("intune_allocation_version", "Allocation version in force")
        self.allocations_refused = gauge("intune_allocations_refused", "Allocations refused so far")
        self.buffered = gauge(
            "intune_agent_buffered_samples", "Samples waiting for the control plane"
        )
        self.dropped = gauge(
            "intune_agent_dropped_samples", "Samples dropped by buffer overflow so far"
        )
        self.shipped = gauge(
            "intune_agent_shipped_samples", "Samples the control plane acknowledged"
        )
        self._server = None

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Start the /metrics HTTP endpoint on ``port`` (0 picks a free one, see ``port``)."""
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)

    @property
    def port(self) -> int | None:
        """The port the endpoint listens on, once serving."""
        return self._server.server_port if self._server else None

    def close(self) -> None:
        """Stop the endpoint."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe(self, sample: dict) -> None:
        """Copy one sample's values into the gauges."""
        host = sample["host"]
        self.host_cpu_percent.set(host["cpu_percent"])
        self.host_memory_used_mb.set(host["memory_used_mb"])
        self.host_memory_limit_mb.set(host["memory_limit_mb"])
        self.worker_budget.set(host["worker_budget"])
        for s in sample["stages"]:
            name = s["name"]
            self.stage_workers.labels(name).set(s["workers"])
            self.stage_items.labels(name).set(s["items_per_s"])
            self.stage_busy.labels(name).set(s["busy_fraction"])
            self.stage_in_queue.labels(name).set(s["in_queue"])
            self.stage_cpu.labels(name).set(s["cpu_percent"])
            self.stage_runqueue.labels(name).set(s.get("runqueue_percent", 0.0))
            self.stage_rss.labels(name).set(s["rss_mb"])
        trainer = sample.get("trainer")
        if trainer:
            self.trainer_throughput.set(trainer["throughput"])
            self.trainer_idle.set(trainer["idle_fraction"])
        if sample.get("allocation_version") is not None:
            self.allocation_version.set(sample["allocation_version"])
