"""What the in-process ingestion benchmarks share: Django set up on a fresh database, one
registered host of 8 stages with its agent's client, and metrics batches of 5 samples.

Used by ``benchmarks.ingestion_cpu`` and ``benchmarks.metrics_overhead``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = [f"stage{i}" for i in range(8)]


def setup_django(workdir: Path) -> None:
    """Set Django up in this process: DATABASE_URL's database (else a SQLite file in
    ``workdir``), no rate limit for the agent, plain http, quiet logs; then migrate it."""
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    os.environ["INTUNE_VAR_DIR"] = str(workdir)
    os.environ["INTUNE_AGENT_RATE"] = "1000000/s"
    os.environ["INTUNE_SECURE_COOKIES"] = "False"
    os.environ.setdefault("INTUNE_LOG_LEVEL", "ERROR")  # no Redis needed: publishes only warn
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@dataclass
class AgentHost:
    """A registered host, its agent token, a DRF client that sends it, and its metrics URL."""

    host: Any
    token: str
    client: Any
    url: str


def register_hosts(count: int, prefix: str = "bench", stages: list[str] = STAGES) -> list:
    """A job of ``stages`` and ``count`` 8-CPU hosts of its own user (after
    :func:`setup_django`): ``[(host, agent token), ...]``."""
    from django.contrib.auth.models import User

    from webapp.jobs.services import register_host, register_job

    user = User.objects.create_user(f"{prefix}-{time.time_ns()}")
    job = register_job(
        user=user, name=f"{prefix}-{time.time_ns()}", stages=[{"name": s} for s in stages]
    )
    return [
        register_host(
            job=job, user=user, name=f"{prefix}-host-{i}", cpus=8, memory_mb=16384,
            worker_budget=None,
        )
        for i in range(count)
    ]  # fmt: skip


def postgres_database(error: Callable[[str], Any]) -> str:
    """The name of Django's database; ``error`` is called unless it is PostgreSQL (the CPU of
    its backends is what these benchmarks measure)."""
    from django.conf import settings

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        error("DATABASE_URL must name a PostgreSQL database on this machine")
    return settings.DATABASES["default"]["NAME"]


def register_agent_host(stages: list[str] = STAGES) -> AgentHost:
    """Register a job of ``stages`` and an 8-CPU host (after :func:`setup_django`)."""
    from rest_framework.test import APIClient

    [(host, token)] = register_hosts(1, stages=stages)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {token}")
    return AgentHost(host, token, client, f"/api/v1/hosts/{host.pk}/metrics/")


def batch_maker(stages: list[str] = STAGES, samples: int = 5) -> Callable[[], dict]:
    """A function that returns the next batch of ``samples`` samples (sequence numbers go on
    from one batch to the next), each measuring every stage, as docs/agent-protocol.md has it."""
    seq = iter(range(1, 10**9))

    def batch() -> dict:
        now = time.time()
        return {
            "samples": [
                {
                    "seq": next(seq),
                    "ts": now,
                    "allocation_version": 1,
                    "host": {"cpus": 8.0, "cpu_percent": 50.0, "per_cpu_percent": [50.0] * 8,
                             "memory_used_mb": 4096.0, "memory_limit_mb": 16384.0,
                             "worker_budget": 16},
                    "trainer": {"throughput": 1000.0, "idle_fraction": 0.2, "step_ms": 8.0,
                                "wait_ms": 2.0, "device": "cpu"},
                    "stages": [
                        {"name": s, "workers": 1, "items_per_s": 1000.0, "busy_fraction": 0.5,
                         "in_queue": 1, "out_queue": 2, "queue_capacity": 8,
                         "cpu_percent": 50.0, "rss_mb": 100.0}
                        for s in stages
                    ],
                }
                for _ in range(samples)
            ]
        }  # fmt: skip

    return batch
