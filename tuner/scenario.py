"""Scenario files, version 1: the description of a pipeline twin (a host, its stages, events).

The format is a contract other tools read; see ``docs/benchmarks.md`` and issue 4. Unknown keys
are ignored on load so that newer writers stay readable. Optional extensions:
``host.worker_budget``, the host's CPU slots (default :func:`agents.budget.cpu_slots`, as the
agent's), and a stage's ``wait_us_per_sample``, the time a worker waits per sample without using
a CPU (default 0: the stage computes).

Keys where the tuners' capacity model is wrong (issue 15; every one defaults to off, so files
without them behave as before):

- a stage's ``serial_fraction`` and ``coherency``: the Universal Scalability Law's contention and
  coherency terms, ``w / (1 + serial_fraction (w - 1) + coherency w (w - 1))``: capacity grows
  sublinearly and, with coherency, falls past a peak (workers that spend more time agreeing with
  each other than working);
- the host's ``memory_bandwidth`` (in workers that run at full speed) with a stage's
  ``memory_bound`` (the fraction of its CPU time that streams memory): once the workers of all
  stages ask for more bandwidth than there is, every memory-bound stage slows, so one stage's
  workers cost the others capacity;
- a stage's ``wait_growth``: its wait per sample grows by this fraction per extra worker (a remote
  service that queues under concurrency), so workers of a waiting stage add less and less;
- an event's ``consumer_samples_per_s``: the trainer's rate changes mid-run;
- the host's ``oversubscription``: once the workers ask for more CPU than there is, the CPUs
  lose this fraction of their time per CPU's worth of demand beyond them (context switches, caches
  refilled after each), so a stage's throughput falls past the host's cores where the tuners'
  model (CPUs time-sliced at no cost) says a worker more still takes a larger share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.budget import cpu_slots

FORMAT_VERSION = 1


class ScenarioError(ValueError):
    """A scenario file or dict does not follow format version 1."""


@dataclass(frozen=True)
class StageSpec:
    """One stage of a twin pipeline: its cost per sample and how it scales.

    ``us_per_sample`` is the CPU time one sample costs a worker; ``wait_us_per_sample`` the time
    the worker then waits without using a CPU (a GET from an object store). A stage whose wait
    dwarfs its CPU time is latency-bound: it grows by adding workers, at little CPU each.
    """

    name: str
    us_per_sample: float
    max_workers: int | None = None
    scaling: float = 1.0
    memory_mb_per_worker: float = 0.0
    wait_us_per_sample: float = 0.0
    serial_fraction: float = 0.0
    coherency: float = 0.0
    memory_bound: float = 0.0
    wait_growth: float = 0.0

    @property
    def model_wrong(self) -> bool:
        """Whether the stage has a trait the tuners' capacity model does not describe."""
        return bool(self.serial_fraction or self.coherency or self.memory_bound or self.wait_growth)


@dataclass(frozen=True)
class Event:
    """A change of the host from ``at_step`` on; fields left ``None`` keep their value."""

    at_step: int
    cpus: float | None = None
    background_cpus: float | None = None
    memory_gb: float | None = None
    consumer_samples_per_s: float | None = None


@dataclass(frozen=True)
class HostState:
    """The host as it is at one step, after every event with ``at_step <= step``."""

    cpus: float
    background_cpus: float
    memory_gb: float
    worker_budget: int  # CPU slots (agents.budget)
    consumer_samples_per_s: float | None = None  # the trainer's rate now (None: unbounded)

    @property
    def effective_cpus(self) -> float:
        """CPUs left to the pipeline once co-located work took its share."""
        return max(0.0, self.cpus - self.background_cpus)

    @property
    def memory_limit_mb(self) -> float:
        """The memory limit in MB, above which the pipeline runs out of memory."""
        return self.memory_gb * 1024.0


@dataclass(frozen=True)
class Scenario:
    """A pipeline twin: host, consumer, stages, measurement noise and events."""

    name: str
    cpus: float
    memory_gb: float
    stages: tuple[StageSpec, ...]
    consumer_samples_per_s: float | None = None
    noise: float = 0.0
    events: tuple[Event, ...] = field(default_factory=tuple)
    worker_budget: int | None = None
    memory_bandwidth: float | None = None
    oversubscription: float = 0.0

    @property
    def stage_names(self) -> list[str]:
        """Stage names in pipeline order."""
        return [stage.name for stage in self.stages]

    def host_at(self, step: int) -> HostState:
        """The host at ``step``: the initial host with every event up to ``step`` applied."""
        cpus, background, memory_gb = self.cpus, 0.0, self.memory_gb
        consumer = self.consumer_samples_per_s
        budget = self.worker_budget
        for event in sorted(self.events, key=lambda e: e.at_step):
            if event.at_step > step:
                break
            cpus = event.cpus if event.cpus is not None else cpus
            background = event.background_cpus if event.background_cpus is not None else background
            memory_gb = event.memory_gb if event.memory_gb is not None else memory_gb
            if event.consumer_samples_per_s is not None:
                consumer = event.consumer_samples_per_s
        if budget is None:
            budget = cpu_slots(cpus, len(self.stages))
        return HostState(cpus, background, memory_gb, max(budget, len(self.stages)), consumer)

    def event_steps(self) -> list[int]:
        """The distinct steps at which events happen, ascending."""
        return sorted({event.at_step for event in self.events})


def _number(raw: dict, key: str, where: str, *, default: Any = ..., positive: bool = True):
    if key not in raw or raw[key] is None:
        if default is ...:
            raise ScenarioError(f"{where}: '{key}' is required")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: '{key}' must be a number, got {value!r}")
    if positive and value <= 0:
        raise ScenarioError(f"{where}: '{key}' must be above 0, got {value}")
    return value


def _wait(stage: dict, where: str) -> float:
    wait = float(_number(stage, "wait_us_per_sample", where, default=0.0, positive=False))
    if wait < 0:
        raise ScenarioError(f"{where}: 'wait_us_per_sample' must be 0 or more, got {wait}")
    return wait


def _fraction(raw: dict, key: str, where: str, high: float = 1.0) -> float:
    value = float(_number(raw, key, where, default=0.0, positive=False))
    if not 0 <= value <= high:
        raise ScenarioError(f"{where}: '{key}' must be from 0 to {high}, got {value}")
    return value


def scenario_from_dict(raw: dict) -> Scenario:
    """Build a :class:`Scenario` from one entry of a version-1 file, checking every field."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError("a scenario needs a non-empty 'name'")
    where = f"scenario '{name}'"
    host = raw.get("host")
    if not isinstance(host, dict):
        raise ScenarioError(f"{where}: 'host' must be an object with 'cpus' and 'memory_gb'")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ScenarioError(f"{where}: 'stages' must be a non-empty list")
    stages = []
    for index, stage in enumerate(stages_raw):
        stage_where = f"{where} stage {index}"
        if not isinstance(stage, dict) or not isinstance(stage.get("name"), str):
            raise ScenarioError(f"{stage_where}: each stage needs a 'name'")
        max_workers = stage.get("max_workers")
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
            raise ScenarioError(f"{stage_where}: 'max_workers' must be null or an integer >= 1")
        stages.append(
            StageSpec(
                name=stage["name"],
                us_per_sample=float(_number(stage, "us_per_sample", stage_where)),
                max_workers=max_workers,
                scaling=float(_number(stage, "scaling", stage_where, default=1.0)),
                memory_mb_per_worker=float(
                    _number(stage, "memory_mb_per_worker", stage_where, default=0.0, positive=False)
                ),
                wait_us_per_sample=_wait(stage, stage_where),
                serial_fraction=_fraction(stage, "serial_fraction", stage_where),
                coherency=_fraction(stage, "coherency", stage_where),
                memory_bound=_fraction(stage, "memory_bound", stage_where),
                # Up to 1: above it a waiting stage's CPU demand would fall as workers are added.
                wait_growth=_fraction(stage, "wait_growth", stage_where),
            )
        )
    names = [stage.name for stage in stages]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{where}: stage names must be unique, got {names}")
    events = []
    for index, event in enumerate(raw.get("events") or []):
        event_where = f"{where} event {index}"
        at_step = event.get("at_step")
        if not isinstance(at_step, int) or at_step < 0:
            raise ScenarioError(f"{event_where}: 'at_step' must be an integer >= 0")
        events.append(
            Event(
                at_step=at_step,
                cpus=_number(event, "cpus", event_where, default=None),
                background_cpus=_number(
                    event, "background_cpus", event_where, default=None, positive=False
                ),
                memory_gb=_number(event, "memory_gb", event_where, default=None),
                consumer_samples_per_s=_number(
                    event, "consumer_samples_per_s", event_where, default=None
                ),
            )
        )
    consumer = raw.get("consumer_samples_per_s")
    if consumer is not None:
        consumer = float(_number(raw, "consumer_samples_per_s", where))
    budget = host.get("worker_budget")
    if budget is not None and (not isinstance(budget, int) or budget < len(stages)):
        raise ScenarioError(
            f"{where}: 'host.worker_budget' must be an integer >= the {len(stages)} stages"
        )
    bandwidth = host.get("memory_bandwidth")
    if bandwidth is not None:
        bandwidth = float(_number(host, "memory_bandwidth", where))
    oversubscription = _fraction(host, "oversubscription", f"{where} host")
    return Scenario(
        name=name,
        cpus=float(_number(host, "cpus", where)),
        memory_gb=float(_number(host, "memory_gb", where)),
        stages=tuple(stages),
        consumer_samples_per_s=consumer,
        noise=float(_number(raw, "noise", where, default=0.0, positive=False)),
        events=tuple(events),
        worker_budget=budget,
        memory_bandwidth=bandwidth,
        oversubscription=oversubscription,
    )


def scenario_to_dict(scenario: Scenario) -> dict:
    """The version-1 dict of a scenario (the inverse of :func:`scenario_from_dict`)."""
    host: dict[str, Any] = {"cpus": scenario.cpus, "memory_gb": scenario.memory_gb}
    if scenario.worker_budget is not None:
        host["worker_budget"] = scenario.worker_budget
    if scenario.memory_bandwidth is not None:
        host["memory_bandwidth"] = scenario.memory_bandwidth
    if scenario.oversubscription:  # written only when set, so older files stay as they were
        host["oversubscription"] = scenario.oversubscription
    events = []
    for event in scenario.events:
        entry: dict[str, Any] = {"at_step": event.at_step}
        for key in ("cpus", "background_cpus", "memory_gb", "consumer_samples_per_s"):
            if getattr(event, key) is not None:
                entry[key] = getattr(event, key)
        events.append(entry)
    return {
        "name": scenario.name,
        "host": host,
        "consumer_samples_per_s": scenario.consumer_samples_per_s,
        "stages": [_stage_to_dict(s) for s in scenario.stages],
        "noise": scenario.noise,
        "events": events,
    }


def _stage_to_dict(stage: StageSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": stage.name,
        "us_per_sample": stage.us_per_sample,
        "max_workers": stage.max_workers,
        "scaling": stage.scaling,
        "memory_mb_per_worker": stage.memory_mb_per_worker,
    }
    if stage.wait_us_per_sample:  # written only when set, so compute-only files stay as they were
        entry["wait_us_per_sample"] = stage.wait_us_per_sample
    for key in ("serial_fraction", "coherency", "memory_bound", "wait_growth"):
        if getattr(stage, key):  # likewise: written only when set
            entry[key] = getattr(stage, key)
    return entry


def load_suite(path: str | Path) -> list[Scenario]:
    """Read a version-1 scenario file; raise :class:`ScenarioError` saying what is wrong."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ScenarioError(f"cannot read scenario file {path}: {error}") from error
    if raw.get("version") != FORMAT_VERSION:
        raise ScenarioError(
            f'{path}: version {raw.get("version")!r} is not supported; write "version": 1'
        )
    return [scenario_from_dict(entry) for entry in raw.get("scenarios", [])]


def save_suite(scenarios: list[Scenario], path: str | Path) -> None:
    """Write scenarios as a version-1 file."""
    body = {"version": FORMAT_VERSION, "scenarios": [scenario_to_dict(s) for s in scenarios]}
    Path(path).write_text(json.dumps(body, indent=1) + "\n")
