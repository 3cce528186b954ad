"""Time the job page's first load and live refresh on a host with a day of 1 Hz samples.

Fills a throwaway job (8 stages by default) with ``--hours`` of samples every second, then
requests the page and every API call its JavaScript makes, as the browser would, through
Django's test client in this process (no network, so the figures are the server's own time).
The job is deleted at the end unless ``--keep``. Uses the configured database (DATABASE_URL).
Django must be set up before this module is imported (``python -m benchmarks.dashboard`` does).
"""

import argparse
import statistics
import time
import uuid

from django.contrib.auth.models import User
from django.test import Client
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from webapp.jobs.services import register_host, register_job

from .synthetic import BENCH_STAGES, fill_host


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.dashboard``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dashboard", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--hours", type=float, default=24.0, help="hours of samples to fill (default 24)"
    )
    parser.add_argument(
        "--stages", type=int, default=8, help="pipeline stages, at most 8 (default 8)"
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (default 1)"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="times each request is timed; the median is shown"
    )
    parser.add_argument(
        "--rolled-up",
        action="store_true",
        help="roll up samples older than INTUNE_RAW_RETENTION_S first, as celery beat does",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the job and its data (to look at the page)"
    )
    parser.add_argument(
        "--job-id",
        type=int,
        default=None,
        help="time an existing job's page instead of filling a new one",
    )

    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with these command-line arguments."""
    run(vars(build_parser().parse_args(argv)))
    return 0


def run(options: dict) -> None:
    """Fill (or pick) a job, time every request of its page, print the table."""
    if not 1 <= options["stages"] <= len(BENCH_STAGES):
        raise SystemExit(
            f"--stages must be between 1 and {len(BENCH_STAGES)}, got {options['stages']}"
        )
    console = Console()
    user = User.objects.create_superuser(f"bench-{uuid.uuid4().hex[:8]}", password=uuid.uuid4().hex)
    try:
        if options["job_id"] is not None:
            from webapp.jobs.models import Job

            job = Job.objects.get(pk=options["job_id"])
            host = job.hosts.first()
            if host is None:
                raise SystemExit(f"job {job.pk} has no host to time")
        else:
            job, host = fill(options, user)
        rows = time_requests(job, host, user, options["hours"] * 3600, options["repeat"])
    finally:
        if options["job_id"] is None and not options["keep"] and "job" in locals():
            job.delete()
        user.delete()
    table = Table(
        title=f"Job page, {options['hours']:g} h at {options['interval']:g} s, "
        f"{options['stages']} stages: server time per request "
        f"(median of {options['repeat']})"
    )
    table.add_column("request")
    table.add_column("ms", justify="right")
    table.add_column("bytes", justify="right")
    for name, ms, size in rows:
        table.add_row(name, f"{ms:.1f}", f"{size:,}")
    first = [r for r in rows if not r[0].startswith("refresh")]
    table.add_row(
        "[b]first load, all requests one after another[/b]",
        f"[b]{sum(r[1] for r in first):.1f}[/b]",
        "",
    )
    console.print(table)
    if options["keep"] and options["job_id"] is None:
        console.print(f"kept job {job.pk} ({job.name}); open /jobs/{job.pk}/")


def fill(options: dict, user) -> tuple:
    """A new job with one host filled with ``options["hours"]`` of synthetic history."""
    stages = BENCH_STAGES[: options["stages"]]
    job = register_job(
        user=user,
        name=f"bench-{uuid.uuid4().hex[:6]}",
        description="dashboard benchmark",
        stages=[{"name": s} for s in stages],
    )
    host, _ = register_host(
        job=job, user=user, name="bench-host", cpus=16, memory_mb=65536, worker_budget=None
    )
    seconds = options["hours"] * 3600
    bar = tqdm(total=int(seconds / options["interval"]), unit="sample", desc="filling")

    def progress(done, total):
        bar.update(done - bar.n)

    started = time.perf_counter()
    counts = fill_host(
        host,
        seconds=seconds,
        end=time.time(),
        interval_s=options["interval"],
        progress=progress,
    )
    bar.close()
    if options["rolled_up"]:
        from django.conf import settings

        from webapp.ingestion.rollup import roll_up_host

        knobs = settings.INTUNE
        now = time.time()
        rolled = roll_up_host(
            host,
            raw_before=now - knobs["RAW_RETENTION_S"],
            step=knobs["ROLLUP_STEP_S"],
            delete_before=now - knobs["ROLLUP_RETENTION_S"],
        )
        print(f"rolled up: {rolled}")
    print(f"filled {counts} in {time.perf_counter() - started:.0f} s")
    return job, host


def time_requests(job, host, user, range_s: float, repeat: int) -> list[tuple[str, float, int]]:
    """Each request of the job page with its median server time (ms) and size (bytes)."""
    client = Client()
    client.force_login(user)
    now = time.time()
    since = now - range_s
    step = max(1, -(-int(range_s) // 1000))
    metrics = f"/api/v1/hosts/{host.pk}/metrics/"
    whole = f"?since={since}&until={now + 60}&step={step}"
    newest = f"?since={(now // step) * step - step}&until={now + 60}&step={step}"
    requests = [
        ("page HTML", f"/jobs/{job.pk}/"),
        ("metrics, whole range", metrics + whole),
        ("overview", f"/dashboard/api/hosts/{host.pk}/overview/"),
        ("allocation history", f"/dashboard/api/hosts/{host.pk}/allocations/?since={since}"),
        ("job's hosts", f"/dashboard/api/jobs/{job.pk}/hosts/"),
        ("alerts", f"/dashboard/api/jobs/{job.pk}/alerts/"),
        ("decisions (500)", f"/api/v1/hosts/{host.pk}/decisions/?limit=500"),
        ("tuning sessions", f"/api/v1/jobs/{job.pk}/tuning/"),
        ("audit trail", f"/api/v1/audit/?job={job.pk}&limit=50"),
        ("refresh: metrics, newest bucket", metrics + newest),
    ]
    rows = []
    for name, url in requests:
        times, size = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(
                    f"{url} answered {response.status_code}: {response.content[:300]!r}"
                )
            size = len(response.content)
        rows.append((name, statistics.median(times), size))
    return rows
