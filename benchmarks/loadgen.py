"""Simulated agents: N real HTTP clients streaming metric batches at a control plane.

    python -m benchmarks.loadgen --agents 200 --stages 8 --seconds 300           # own live stack
    python -m benchmarks.loadgen --url http://127.0.0.1:8000 --api-token T ...   # an existing one
    python -m benchmarks.loadgen --agents 2000 --batch-seconds 10 --seconds 60 --long-poll-wait 30

Each simulated agent registers a host (8 at a time), then takes a sample a second with one row
per stage (as the real agent does) and ships them every --batch-seconds, and keeps an allocation
long-poll open. Agents run as asyncio tasks in processes of their own (one per 500 agents, at
least 2), so the generator does not share the server's process, each with an HTTP client of its
own (aiohttp by default: a third of httpx's CPU a request; --client httpx for the real agent's).
A batch's latency runs from just before its request is sent to its whole answer; its body is
serialised before. Prints (and writes with --json) samples sent, stored (counted in the
database's answer), latency percentiles, errors, the generator's own CPU a request and the web
processes' CPU (psutil), and the load average. Bounded: it stops after --seconds.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import ssl
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil

from agents.budget import cpu_slots
from agents.client import KEEPALIVE_S
from webapp.stack.limits import raise_open_file_limit

# spread: every agent starts at a random moment of the batch period, its long-poll too; in-step:
# every agent sends its batches and re-arms its long-poll in the same instant; polls-in-step:
# batches spread, long-polls all opened at once and each re-armed as soon as it returns (the
# client of issue 14 written from docs/agent-protocol.md alone: a fleet's polls stay in step
# after a restart of the control plane, whatever its batches do).
SHAPES = ("spread", "in-step", "polls-in-step")
# The HTTP client of each simulated agent: httpx (the real agent's) or aiohttp (lighter per
# request; same requests, same latency window).
CLIENTS = ("httpx", "aiohttp")
# Agents per generator process when --processes is not given: one event loop per 500 agents
# keeps a loop's own queueing out of what is measured (2,000 agents: 4 processes).
AGENTS_PER_PROCESS = 500
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


class HttpxAgentClient:
    """One agent's httpx client, as the real agent's: its idle connections kept
    ``agents.client.KEEPALIVE_S`` (httpx's default, 5 s, made a batch every 10 s open a
    connection each). The SSL context is shared: httpx builds one per client otherwise (24 ms
    of CPU each, measured: 48 s for 2,000 agents)."""

    error = httpx.HTTPError

    def __init__(
        self, url: str, ssl_context: ssl.SSLContext, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        self.client = httpx.AsyncClient(
            base_url=url,
            timeout=30,
            verify=ssl_context,
            limits=httpx.Limits(keepalive_expiry=keepalive_s),
        )

    async def post(self, path: str, content: bytes, headers: dict) -> tuple[int, str]:
        response = await self.client.post(path, content=content, headers=headers)
        return response.status_code, response.text

    async def get(self, path: str, params: dict, headers: dict, timeout: float) -> int:
        response = await self.client.get(path, params=params, headers=headers, timeout=timeout)
        return response.status_code

    async def aclose(self) -> None:
        await self.client.aclose()


class AiohttpAgentClient:
    """One agent's aiohttp session: the same requests as ``HttpxAgentClient``."""

    def __init__(
        self, url: str, ssl_context: ssl.SSLContext, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        import aiohttp

        self.error = (aiohttp.ClientError, asyncio.TimeoutError)
        self.url = url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context, keepalive_timeout=keepalive_s),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def post(self, path: str, content: bytes, headers: dict) -> tuple[int, str]:
        async with self.session.post(self.url + path, data=content, headers=headers) as response:
            return response.status, (await response.read()).decode(errors="replace")

    async def get(self, path: str, params: dict, headers: dict, timeout: float) -> int:
        import aiohttp

        async with self.session.get(
            self.url + path, params=params, headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:  # fmt: skip
            await response.read()
            return response.status

    async def aclose(self) -> None:
        await self.session.close()


def agent_client(
    kind: str, url: str, ssl_context: ssl.SSLContext, keepalive_s: float = KEEPALIVE_S
):
    if kind not in CLIENTS:
        raise ValueError(f"client must be one of {CLIENTS}, got {kind!r}")
    return (HttpxAgentClient if kind == "httpx" else AiohttpAgentClient)(
        url, ssl_context, keepalive_s
    )


async def _agent(
    client,
    host: dict,
    stages: list[str],
    deadline: float,
    stats: dict,
    batch_seconds: int,
    in_step: bool = False,
) -> None:
    """One simulated agent: a sample every second, shipped every ``batch_seconds`` seconds;
    the agents start spread over the batch period, or all at once (``in_step``). A batch's
    latency runs from just before its request is sent to its whole answer; its body is built
    and serialised before that, as the real agent's is."""
    headers = {"Authorization": f"Agent {host['agent_token']}", "Content-Type": "application/json"}
    path = f"/api/v1/hosts/{host['id']}/metrics/"
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
        content = json.dumps(body, separators=(",", ":")).encode()
        started = time.perf_counter()
        try:
            status, text = await client.post(path, content, headers)
            stats["latencies"].append(time.perf_counter() - started)
            stats["sent"] += len(samples)
            if status == 200:
                stats["acknowledged"] += len(samples)
            else:
                stats["errors"].append(f"{status}: {text[:200]}")
        except client.error as exc:
            stats["sent"] += len(samples)
            stats["errors"].append(f"{type(exc).__name__}: {exc}")
        stats["requests"] += 1
        next_at += batch_seconds
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _long_poll(
    client, host: dict, deadline: float, spread_s: float, wait_s: float, stats: dict
) -> None:
    """The agent's allocation long-poll, re-armed as soon as it returns; started at a random
    moment within ``spread_s`` (0: all agents at once, in step). Answers other than 200 and
    204 and failed requests are counted as long-poll errors."""
    headers = {"Authorization": f"Agent {host['agent_token']}"}
    path = f"/api/v1/hosts/{host['id']}/allocation/"
    params = {"after": 1, "wait": wait_s}
    await asyncio.sleep(random.uniform(0, spread_s))
    while time.monotonic() < deadline:
        try:
            status = await client.get(path, params, headers, wait_s + 30)
            stats["requests"] += 1
            if status not in (200, 204):
                stats["long_poll_errors"].append(f"long-poll {status}")
        except client.error as exc:
            stats["long_poll_errors"].append(f"long-poll {type(exc).__name__}: {exc}")
            await asyncio.sleep(1)


def _run_agents(
    url: str,
    hosts: list[dict],
    stages: list[str],
    seconds: float,
    long_poll: bool,
    batch_seconds: int,
    queue,
    shape: str = "spread",
    long_poll_wait: float = 20,
    client_kind: str = "httpx",
    ready=None,
    keepalive_s: float = KEEPALIVE_S,
) -> None:
    # Two connections an agent (its batches, its long-poll), and room for the rest.
    raise_open_file_limit(2 * len(hosts) + 64)

    async def main():
        stats = {
            "sent": 0, "acknowledged": 0, "requests": 0, "latencies": [], "errors": [],
            "long_poll_errors": [],
        }  # fmt: skip
        # A client per agent, as a fleet has. With one client shared by 200 agents (and 400
        # connections in its pool) the generator used 1.3 of the 2 cores it shares with the
        # server it measures; with a client each, 0.35 (psutil, per process, during a run).
        ssl_context = ssl.create_default_context()
        clients = [agent_client(client_kind, url, ssl_context, keepalive_s) for _ in hosts]
        if ready is not None:  # every process starts its agents at the same moment
            await asyncio.to_thread(ready.wait, 120)
        cpu = psutil.Process().cpu_times()
        try:
            deadline = time.monotonic() + seconds
            tasks = [
                _agent(c, h, stages, deadline, stats, batch_seconds, shape == "in-step")
                for c, h in zip(clients, hosts, strict=True)
            ]
            if long_poll:
                spread = 0.0 if shape in ("in-step", "polls-in-step") else batch_seconds
                tasks += [
                    _long_poll(c, h, deadline, spread, long_poll_wait, stats)
                    for c, h in zip(clients, hosts, strict=True)
                ]
            await asyncio.gather(*tasks)
        finally:
            # The CPU of the load itself: the clients' set-up and tear-down are left out.
            now = psutil.Process().cpu_times()
            stats["cpu_s"] = (now.user - cpu.user) + (now.system - cpu.system)
            await asyncio.gather(*(c.aclose() for c in clients))
        return stats

    queue.put(asyncio.run(main()))


def register(
    url: str, api_token: str, agents: int, stages: list[str], concurrency: int = 8
) -> tuple[int, list[dict]]:
    """A job with ``stages`` and ``agents`` hosts, registered through the REST API,
    ``concurrency`` at a time (2,000 one after another take minutes)."""

    async def hosts_of(job_id: int) -> list[dict]:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Token {api_token}"}, timeout=60,
            limits=httpx.Limits(max_connections=concurrency),
        ) as api:  # fmt: skip

            async def one(i: int) -> dict:
                async with gate:
                    host = await api.post(
                        f"/api/v1/jobs/{job_id}/hosts/",
                        json={"name": f"sim-{i:04d}", "cpus": 16, "memory_mb": 65536},
                    )
                host.raise_for_status()
                return host.json()

            return list(await asyncio.gather(*(one(i) for i in range(agents))))

    with httpx.Client(
        base_url=url, headers={"Authorization": f"Token {api_token}"}, timeout=60
    ) as api:
        job = api.post(
            "/api/v1/jobs/",
            json={"name": f"load-{uuid.uuid4().hex[:6]}", "stages": [{"name": s} for s in stages]},
        )
        job.raise_for_status()
        job_id = job.json()["id"]
    return job_id, asyncio.run(hosts_of(job_id))


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
    client: str = "aiohttp",
    server_processes=None,
    database: str | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> dict:
    """Run the load and return its figures (``stored`` is counted from the server's answers).

    Every agent takes a sample a second; ``batch_seconds`` is how often it ships them (the real
    agent's default is 5; 1 is the harshest case, a request per sample). ``shape``: "spread",
    agents start at random moments over the batch period; "in-step", all at the same moment,
    each re-arming its long-poll (``long_poll_wait`` seconds) as soon as it returns;
    "polls-in-step", batches spread and long-polls in step (SHAPES).
    ``on_start`` is called once the hosts are registered, as the load starts. ``processes``:
    generator processes (0: one per AGENTS_PER_PROCESS agents, at least 2). ``client``: the
    agents' HTTP client (CLIENTS). ``server_processes``: a callable giving the server's
    processes (psutil), whose CPU during the load is reported beside the generator's.
    ``keepalive_s``: how long each agent's client keeps an idle connection (the agent's by
    default; httpx's own default is 5 s, a connection a batch at batches 5 s apart or more)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    processes = processes or max(2, -(-agents // AGENTS_PER_PROCESS))
    raise_open_file_limit(2 * -(-agents // processes) + 64)
    stage_names = [f"stage{i}" for i in range(stages)]
    registering = time.monotonic()
    job_id, hosts = register(url, api_token, agents, stage_names)
    registered_s = time.monotonic() - registering
    context = mp.get_context("spawn")
    queue = context.Queue()
    groups = [g for g in (hosts[i::processes] for i in range(processes)) if g]
    ready = context.Barrier(len(groups))
    workers = [
        context.Process(
            target=_run_agents,
            args=(
                url,
                g,
                stage_names,
                seconds,
                long_poll,
                batch_seconds,
                queue,
                shape,
                long_poll_wait,
                client,
                ready,
                keepalive_s,
            ),
        )  # fmt: skip
        for g in groups
    ]
    if on_start is not None:
        on_start()
    watched = list(server_processes()) if server_processes else []
    if watched:  # for a profiler to attach to (py-spy record -p PID)
        print(
            "web processes: " + ",".join(str(p.pid) for p in watched), file=sys.stderr, flush=True
        )
    server_cpu = cpu_of(watched)
    database_cpu = database_processes_cpu(database) if database else None
    started = time.monotonic()
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 180) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    elapsed = time.monotonic() - started
    server_cpu = cpu_of(watched) - server_cpu
    if database:
        database_cpu = database_processes_cpu(database) - database_cpu
    load_average = [round(x, 2) for x in os.getloadavg()]
    latencies = sorted(lat for r in results for lat in r["latencies"])
    errors = [e for r in results for e in r["errors"]]
    long_poll_errors = [e for r in results for e in r["long_poll_errors"]]
    requests = sum(r["requests"] for r in results)
    generator_cpu = sum(r["cpu_s"] for r in results)

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
        "long_poll_errors": len(long_poll_errors),
        "first_long_poll_errors": long_poll_errors[:5],
        "client": client,
        "keepalive_s": keepalive_s,
        "processes": len(workers),
        "registration_s": round(registered_s, 1),
        "requests": requests,
        # The generator's own CPU while it ran the load (psutil, in each of its processes), and
        # the web processes' when they are given: both share the machine's cores.
        "generator_cpu_s": round(generator_cpu, 2),
        "generator_cores": round(generator_cpu / elapsed, 3),
        "generator_cpu_ms_per_request": round(1000 * generator_cpu / requests, 3)
        if requests
        else None,
        "server_cpu_s": round(server_cpu, 2) if watched else None,
        "server_cores": round(server_cpu / elapsed, 3) if watched else None,
        "server_cpu_ms_per_request": round(1000 * server_cpu / requests, 3)
        if watched and requests
        else None,
        # The PostgreSQL backends of the stack's database (psutil; the server on this machine):
        # the other half of a request's CPU on the server's side.
        "database_cpu_s": round(database_cpu, 2) if database else None,
        "database_cpu_ms_per_request": round(1000 * database_cpu / requests, 3)
        if database and requests
        else None,
        "load_average": load_average,
    }


def database_processes_cpu(database: str) -> float:
    """CPU seconds so far of the live PostgreSQL backends serving ``database`` (this machine's;
    0 where none can be read). A backend that ended during the run takes its CPU with it, so
    read this over a stack whose connections are kept (the web processes' are)."""
    return cpu_of(
        [
            process
            for process in psutil.process_iter(["name", "cmdline"])
            if (process.info["name"] or "").startswith("postgres")
            and f" {database} " in " ".join(process.info["cmdline"] or ())
        ]
    )


def cpu_of(processes: list[psutil.Process]) -> float:
    """User and system CPU seconds of ``processes`` so far (0 for one that has gone)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


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


def web_processes(stack) -> list[psutil.Process]:
    """The stack's web service: gunicorn's master and its workers."""
    master = psutil.Process(stack.group.children["web"].pid)
    return [master, *master.children(recursive=True)]


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
    parser.add_argument(
        "--processes", type=int, default=0,
        help=f"generator processes (default: one per {AGENTS_PER_PROCESS} agents, at least 2)",
    )  # fmt: skip
    parser.add_argument(
        "--client", choices=CLIENTS, default="aiohttp",
        help="the simulated agents' HTTP client: aiohttp (default; a third of httpx's CPU a "
        "request) or httpx (the real agent's)",
    )  # fmt: skip
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
        "once, each re-arming its long-poll as soon as it returns; polls-in-step: batches "
        "spread, long-polls opened at once and re-armed as they return (default spread)",
    )  # fmt: skip
    parser.add_argument(
        "--long-poll-wait", type=float, default=20, help="seconds a long-poll asks to be held"
    )
    parser.add_argument(
        "--web-tier", choices=WEB_TIERS, default="uvicorn",
        help="of the stack started here: uvicorn (shipped), uvicorn-django (batches through "
        "Django's view, as before the lean path) or gthread (the former tier)",
    )  # fmt: skip
    parser.add_argument(
        "--keepalive", type=float, default=KEEPALIVE_S,
        help=f"seconds each agent's client keeps an idle connection (default {KEEPALIVE_S:g}, "
        "the agent's; httpx's own default is 5)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.agents <= 2000 or not 1 <= args.seconds <= 3600:
        parser.error("--agents must be 1..2000 and --seconds 1..3600")
    stack = None
    url, token = args.url, args.api_token
    if url is None:
        # The web workers inherit this limit: every agent's two connections may land on one.
        raise_open_file_limit(2 * args.agents + 256)
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
            client=args.client,
            keepalive_s=args.keepalive,
            server_processes=(lambda: web_processes(stack)) if stack is not None else None,
            database=stack.database.name if stack is not None else None,
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
