"""A fleet for the dashboard in a browser: one job of ``--hosts`` hosts and ``--stages`` stages,
each host with ``--minutes`` of samples every ``--interval`` seconds, its allocations and a
running tuning session, written in bulk to the configured database (DATABASE_URL). Prints the
job's id for ``python -m benchmarks.dashboard.browser``. Nothing here is used by the control
plane itself.

DATABASE_URL=... .venv/bin/python -m benchmarks.dashboard.fleet --hosts 500 --stages 12
"""

import argparse
import os
import time
import uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard.fleet")
    parser.add_argument("--hosts", type=int, default=500, help="hosts in the job (default 500)")
    parser.add_argument("--stages", type=int, default=12, help="pipeline stages (default 12)")
    parser.add_argument("--minutes", type=float, default=15, help="history per host (default 15)")
    parser.add_argument("--interval", type=float, default=10, help="seconds between samples")
    options = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User

    from webapp.jobs.services import register_host, register_job

    from .synthetic import fill_host

    user = User.objects.filter(is_superuser=True).first() or User.objects.first()
    job = register_job(
        user=user,
        name=f"fleet-{uuid.uuid4().hex[:6]}",
        description="dashboard fleet benchmark",
        stages=[{"name": f"stage{i:02d}"} for i in range(options.stages)],
    )
    now = time.time()
    started = time.perf_counter()
    for i in range(options.hosts):
        host, _ = register_host(
            job=job, user=user, name=f"trainer-{i:03d}", cpus=32, memory_mb=65536,
            worker_budget=None,
        )  # fmt: skip
        fill_host(
            host, seconds=options.minutes * 60, end=now, interval_s=options.interval,
            policy_every_s=300, seed=i,
        )  # fmt: skip
    print(f"job {job.pk}: {options.hosts} hosts filled in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
