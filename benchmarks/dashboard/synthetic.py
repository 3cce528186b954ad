"""Synthetic history for a host: samples, allocations, a tuning session and its decisions.

For the dashboard's benchmark (``python -m benchmarks.dashboard``) and for looking at the pages
with a day of data without waiting a day (its ``--keep``). Written straight to the database in bulk; nothing here is
used by the control plane itself.
"""

import math
import random
from datetime import UTC, datetime

from django.db import transaction

from webapp.ingestion.models import HostSample, StageSample
from webapp.jobs.models import Allocation, Host
from webapp.tuning.models import Decision, TuningSession

BENCH_STAGES = ["read", "decode", "parse", "transform", "augment", "shuffle", "collate", "prefetch"]


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _allocation_plan(
    stages: list[str], budget: int, start: float, end: float, every_s: float, rng
) -> list[tuple[float, dict, str]]:
    """Allocation changes from ``start`` to ``end``: a policy move every ``every_s`` seconds and
    one override in the middle."""
    workers = {s: 1 for s in stages}
    plan = [(start, dict(workers), Allocation.Source.DEFAULT)]
    t = start + every_s
    middle = start + (end - start) / 2
    override_done = False
    while t < end:
        source = Allocation.Source.POLICY
        if not override_done and t >= middle:
            source, override_done = Allocation.Source.OVERRIDE, True
        donor = rng.choice([s for s in stages if workers[s] > 1] or stages)
        taker = rng.choice(stages)
        if sum(workers.values()) < budget:
            workers[taker] += 1
        elif donor != taker and workers[donor] > 1:
            workers[donor] -= 1
            workers[taker] += 1
        plan.append((t, dict(workers), source))
        t += every_s
    return plan


@transaction.atomic
def fill_host(
    host: Host,
    *,
    seconds: float,
    end: float,
    interval_s: float = 1.0,
    policy_every_s: float = 600.0,
    seed: int = 0,
    progress=None,
) -> dict:
    """Write ``seconds`` of samples every ``interval_s`` up to ``end``, the allocations behind
    them, and a tuning session with one decision per allocation change. Returns counts."""
    rng = random.Random(seed)
    stages = host.job.stage_names
    start = end - seconds
    plan = _allocation_plan(stages, host.worker_budget, start, end, policy_every_s, rng)
    session = TuningSession.objects.create(
        job=host.job,
        host=host,
        tuner="intune",
        status=TuningSession.Status.RUNNING,
        decision_interval_s=policy_every_s,
        steps=len(plan) - 1,
    )
    TuningSession.objects.filter(pk=session.pk).update(started_at=_dt(start))
    allocations = []
    host.allocations.all().delete()
    for version, (t, workers, source) in enumerate(plan, start=1):
        allocation = Allocation.objects.create(
            host=host,
            version=version,
            workers=workers,
            source=source,
            status=Allocation.Status.APPLIED,
        )
        Allocation.objects.filter(pk=allocation.pk).update(created_at=_dt(t), applied_at=_dt(t + 1))
        allocations.append((t, allocation))
        if version > 1:
            q = {
                f"move {a}->{b}": rng.gauss(0, 1) for a, b in zip(stages, stages[1:], strict=False)
            } | {"hold": rng.gauss(0.2, 0.5)}
            decision = Decision.objects.create(
                session=session,
                host=host,
                step=version - 2,
                observation={},
                action=max(q, key=q.get),
                q_values=q,
                reward=rng.gauss(0.1, 0.3),
                epsilon=max(0.05, 1 - version / 50),
                allocation=allocation,
            )
            Decision.objects.filter(pk=decision.pk).update(created_at=_dt(t))
    Host.objects.filter(pk=host.pk).update(
        allocation_version=len(plan),
        applied_version=len(plan),
        last_seen=_dt(end),
        status=Host.Status.ONLINE,
        last_seq=int(seconds / interval_s),
    )
    count = int(seconds / interval_s)
    plan_index = 0
    batch_hosts, written = [], 0
    for i in range(count):
        ts = start + i * interval_s
        while plan_index + 1 < len(allocations) and allocations[plan_index + 1][0] <= ts:
            plan_index += 1
        workers = allocations[plan_index][1].workers
        bottleneck = min(workers.values())
        throughput = 800.0 * bottleneck * (1 + 0.05 * math.sin(ts / 300)) + rng.gauss(0, 20)
        batch_hosts.append(
            (
                HostSample(
                    host=host,
                    seq=i + 1,
                    ts=ts,
                    allocation_version=plan_index + 1,
                    cpus=host.cpus,
                    cpu_percent=min(100.0, 40 + 5 * sum(workers.values()) + rng.gauss(0, 3)),
                    memory_used_mb=0.3 * host.memory_mb + rng.gauss(0, 50),
                    memory_limit_mb=host.memory_mb,
                    worker_budget=host.worker_budget,
                    throughput=max(0.0, throughput),
                    idle_fraction=min(1.0, max(0.0, 0.6 / bottleneck + rng.gauss(0, 0.02))),
                    step_ms=8.0,
                    wait_ms=3.0,
                ),
                workers,
            )
        )
        if len(batch_hosts) >= 2000 or i == count - 1:
            rows = HostSample.objects.bulk_create([h for h, _ in batch_hosts])
            StageSample.objects.bulk_create(
                [
                    StageSample(
                        sample=row,
                        host_id=row.host_id,
                        ts=row.ts,
                        stage=name,
                        workers=w[name],
                        items_per_s=row.throughput * (1 + 0.02 * k),
                        busy_fraction=min(1.0, 1.0 / w[name]),
                        in_queue=1,
                        out_queue=2,
                        queue_capacity=8,
                        cpu_percent=90.0,
                        rss_mb=50.0 * w[name],
                    )
                    for row, (_, w) in zip(rows, batch_hosts, strict=True)
                    for k, name in enumerate(stages)
                ],
                batch_size=5000,
            )
            written += len(batch_hosts)
            batch_hosts = []
            if progress is not None:
                progress(written, count)
    return {
        "samples": written,
        "stage_samples": written * len(stages),
        "allocations": len(plan),
        "decisions": len(plan) - 1,
    }
