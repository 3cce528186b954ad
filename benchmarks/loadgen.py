"""Simulated agents: N real HTTP clients streaming 1 Hz metric batches at a control plane.

    python -m benchmarks.loadgen --agents 200 --stages 8 --seconds 300           # own live stack
    python -m benchmarks.loadgen --url http://127.0.0.1:8000 --api-token T ...   # an existing one

Each simulated agent registers a host, then once a second posts one sample with one row per
stage (as the real agent does at 1 Hz), and keeps an allocation long-poll open. Agents run as
asyncio tasks in a few processes of their own, so the generator does not share the server's
process. Prints (and writes with --json) samples sent, stored (counted in the database's answer),
latency percentiles and errors. Bounded: it stops after --seconds.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

from agents.budget import cpu_slots

SHAPES = ("spread", "in-step")
# uvicorn: the shipped tier; uvicorn-django: the same with agents' batches served by Django's
# view (INTUNE_LEAN_INGESTION=False, as before webapp/ingestion/api/lean.py); gthread: the former.
WEB_TIERS = ("uvicorn", "uvicorn-django", "gthread")


def web_argv(tier: str, python: str, bin_dir: str, threads: int) -> list[str] | None:
    """The web service's argv for ``tier``: None for the shipped one (uvicorn workers,
    webapp/stack/services.py); "gthread" is the former tier (gthread workers, a thread per
    held long-poll, ``threads`` a process), kept here to compare with."""
    if tier in ("uvicorn", "uvicorn-django"):
        return None
    from webapp.stack.services import command

    argv = command("web", python, bin_dir)
    argv[-1] = "webapp.wsgi:application"
    return argv[:-1] + ["-k", "gthread", "--threads", str(threads), argv[-1]]


def _sample(seq: int, stages: list[str], version: int) -> dict:
    throughput = random.uniform(5_000, 50_000)
    return {
        "seq": seq,
        "ts": time.time(),
        "allocation_version": version,
        "host": {
            "cpus": 16.0,
            "cpu_percent": random.uniform(20, 95),
            "memory_used_mb": 20_000.0,
            "memory_limit_mb": 65_536.0,
            "worker_budget": cpu_slots(16.0, len(stages)),
        },
        "trainer": {
            "throughput": throughput,
            "idle_fraction": random.uniform(0, 0.6),
            "step_ms": 8.0,
            "wait_ms": 2.0,
            "device": "cpu",
        },
        "stages": [
            {
                "name": name,
                "workers": 2,
                "items_per_s": throughput * random.uniform(1.0, 1.3),
                "busy_fraction": random.uniform(0.2, 1.0),
                "in_queue": 3,
                "out_queue": 5,
                "queue_capacity": 16,
                "cpu_percent": random.uniform(50, 200),
                "rss_mb": 300.0,
            }
            for name in stages
        ],
    }


async def _agent(
    client: httpx.AsyncClient,
    host: dict,
    stages: list[str],
    deadline: float,
    stats: dict,
    batch_seconds: int,
    in_step: bool = False,
) -> None:
    """One simulated agent: a sample every second, shipped every ``batch_seconds`` seconds;
    the agents start spread over the batch period, or all at once (``in_step``)."""
    headers = {"Authorization": f"Agent {host['agent_token']}"}
    seq = 0
    version = 1
    if not in_step:
        await asyncio.sleep(random.uniform(0, batch_seconds))
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        samples = []
        for back in range(batch_seconds):
            seq += 1
            sample = _sample(seq, stages, version)
            sample["ts"] -= batch_seconds - 1 - back
            samples.append(sample)
        body = {"samples": samples, "allocation_status": {"applied_version": version}}
        started = time.perf_counter()
        try:
            response = await client.post(
                f"/api/v1/hosts/{host['id']}/metrics/", json=body, headers=headers
            )
            stats["latencies"].append(time.perf_counter() - started)
            stats["sent"] += len(samples)
            if response.status_code == 200:
                stats["acknowledged"] += len(samples)
            else:
                stats["errors"].append(f"{response.status_code}: {response.text[:200]}")
        except httpx.HTTPError as exc:
            stats["sent"] += len(samples)
            stats["errors"].append(f"{type(exc).__name__}: {exc}")
        next_at += batch_seconds
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _long_poll(
    client: httpx.AsyncClient, host: dict, deadline: float, spread_s: float, wait_s: float
) -> None:
    """The agent's allocation long-poll, re-armed as soon as it returns; started at a random
    moment within ``spread_s`` (0: all agents at once, in step)."""
    headers = {"Authorization": f"Agent {host['agent_token']}"}
    await asyncio.sleep(random.uniform(0, spread_s))
    while time.monotonic() < deadline:
        try:
            await client.get(
                f"/api/v1/hosts/{host['id']}/allocation/",
                params={"after": 1, "wait": wait_s},
                headers=headers,
                timeout=wait_s + 30,
            )
        except httpx.HTTPError:
            await asyncio.sleep(1)


def _run_agents(
    url: str,
    hosts: list[dict],
    stages: list[str],
    seconds: float,
    long_poll: bool,
    batch_seconds: int,
    queue,
    in_step: bool = False,
    long_poll_wait: float = 20,
) -> None:
    async def main():
        stats = {"sent": 0, "acknowledged": 0, "latencies": [], "errors": []}
        # A client per agent, as a fleet has. With one client shared by 200 agents (and 400
        # connections in its pool) the generator used 1.3 of the 2 cores it shares with the
        # server it measures; with a client each, 0.35 (psutil, per process, during a run).
        clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in hosts]
        try:
            deadline = time.monotonic() + seconds
            tasks = [
                _agent(c, h, stages, deadline, stats, batch_seconds, in_step)
                for c, h in zip(clients, hosts, strict=True)
            ]
            if long_poll:
                spread = 0.0 if in_step else batch_seconds
                tasks += [
                    _long_poll(c, h, deadline, spread, long_poll_wait)
                    for c, h in zip(clients, hosts, strict=True)
                ]
            await asyncio.gather(*tasks)
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        return stats

    queue.put(asyncio.run(main()))


def register(url: str, api_token: str, agents: int, stages: list[str]) -> tuple[int, list[dict]]:
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Token {api_token}"}, timeout=60
    ) as api:
        job = api.post(
            "/api/v1/jobs/",
            json={"name": f"load-{uuid.uuid4().hex[:6]}", "stages": [{"name": s} for s in stages]},
        )
        job.raise_for_status()
        job_id = job.json()["id"]
        hosts = []
        for i in range(agents):
            host = api.post(
                f"/api/v1/jobs/{job_id}/hosts/",
                json={"name": f"sim-{i:04d}", "cpus": 16, "memory_mb": 65536},
            )
            host.raise_for_status()
            hosts.append(host.json())
    return job_id, hosts


def run(
    url: str,
    api_token: str,
    *,
    agents: int,
    stages: int,
    seconds: float,
    processes: int,
    long_poll: bool = True,
    batch_seconds: int = 1,
    shape: str = "spread",
    long_poll_wait: float = 20,
    on_start=None,
) -> dict:
    """Run the load and return its figures (``stored`` is counted from the server's answers).

    Every agent takes a sample a second; ``batch_seconds`` is how often it ships them (the real
    agent's default is 5; 1 is the harshest case, a request per sample). ``shape``: "spread",
    agents start at random moments over the batch period; "in-step", all at the same moment,
    each re-arming its long-poll (``long_poll_wait`` seconds) as soon as it returns.
    ``on_start`` is called once the hosts are registered, as the load starts."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    stage_names = [f"stage{i}" for i in range(stages)]
    job_id, hosts = register(url, api_token, agents, stage_names)
    queue = mp.get_context("spawn").Queue()
    groups = [hosts[i::processes] for i in range(processes)]
    workers = [
        mp.get_context("spawn").Process(
            target=_run_agents,
            args=(
                url,
                g,
                stage_names,
                seconds,
                long_poll,
                batch_seconds,
                queue,
                shape == "in-step",
                long_poll_wait,
            ),
        )  # fmt: skip
        for g in groups
        if g
    ]
    if on_start is not None:
        on_start()
    started = time.monotonic()
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    elapsed = time.monotonic() - started
    latencies = sorted(lat for r in results for lat in r["latencies"])
    errors = [e for r in results for e in r["errors"]]

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    sent = sum(r["sent"] for r in results)
    return {
        "agents": agents,
        "stages": stages,
        "batch_seconds": batch_seconds,
        "shape": shape,
        "long_poll_wait_s": long_poll_wait if long_poll else None,
        "seconds": round(elapsed, 1),
        "job_id": job_id,
        "host_ids": [h["id"] for h in hosts],
        "samples_sent": sent,
        "samples_acknowledged": sum(r["acknowledged"] for r in results),
        "samples_per_s": round(sum(r["acknowledged"] for r in results) / elapsed, 1),
        "offered_samples_per_s": agents,
        "stage_samples_per_s": round(sum(r["acknowledged"] for r in results) * stages / elapsed, 1),
        "latency_ms": {
            "p50": round(pct(0.50), 2),
            "p95": round(pct(0.95), 2),
            "p99": round(pct(0.99), 2),
            "max": round(latencies[-1] * 1000, 2) if latencies else None,
            "mean": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
        },
        "errors": len(errors),
        "first_errors": errors[:5],
    }


def live_stack(tier: str, agents: int, processes: int = 2):
    """A live stack (not started) whose web service runs ``tier``."""
    import tempfile

    from tests.support.live_stack import LiveStack

    stack = LiveStack(
        Path(tempfile.mkdtemp(prefix="intune-load-")),
        extra_env={
            "WEB_CONCURRENCY": str(processes),
            "INTUNE_AGENT_RATE": "100000/min",
            "INTUNE_ACCESS_LOG": "",
            "INTUNE_LEAN_INGESTION": str(tier != "uvicorn-django"),
        },
    )
    stack.web_argv = web_argv(tier, stack.python, stack.bin_dir, max(64, agents + 32))
    return stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url", help="an existing control plane (default: start a live stack of our own)"
    )
    parser.add_argument("--api-token", help="an operator's API token for --url")
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--processes", type=int, default=2, help="generator processes")
    parser.add_argument(
        "--batch-seconds",
        type=int,
        default=1,
        help="seconds of samples per batch (the real agent ships every 5 s; default 1, the harshest)",
    )
    parser.add_argument(
        "--no-long-poll", action="store_true", help="do not hold allocation long-polls"
    )
    parser.add_argument(
        "--shape", choices=SHAPES, default="spread",
        help="spread: agents start at random moments over the batch period; in-step: all at "
        "once, each re-arming its long-poll as soon as it returns (default spread)",
    )  # fmt: skip
    parser.add_argument(
        "--long-poll-wait", type=float, default=20, help="seconds a long-poll asks to be held"
    )
    parser.add_argument(
        "--web-tier", choices=WEB_TIERS, default="uvicorn",
        help="of the stack started here: uvicorn (shipped), uvicorn-django (batches through "
        "Django's view, as before the lean path) or gthread (the former tier)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.agents <= 2000 or not 1 <= args.seconds <= 3600:
        parser.error("--agents must be 1..2000 and --seconds 1..3600")
    stack = None
    url, token = args.url, args.api_token
    if url is None:
        stack = live_stack(args.web_tier, args.agents)
        stack.start()
        url, token = stack.url, stack.create_user("load-operator", role="operator")["token"]
    try:
        figures = run(
            url,
            token,
            agents=args.agents,
            stages=args.stages,
            seconds=args.seconds,
            processes=args.processes,
            long_poll=not args.no_long_poll,
            batch_seconds=args.batch_seconds,
            shape=args.shape,
            long_poll_wait=args.long_poll_wait,
        )
        figures["web_tier"] = args.web_tier if stack is not None else "given by --url"
        if stack is not None:
            figures["samples_stored"] = stack.stored_samples(figures["job_id"])
    finally:
        if stack is not None:
            stack.stop()
    figures.pop("host_ids")
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
