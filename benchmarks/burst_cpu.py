"""CPU of an in-step burst on the agents' web path: every agent posts its batch and re-arms its
allocation long-poll in the same instant, as a fleet in step does every 30 s.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/intune_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python -m benchmarks.burst_cpu --agents 100 --rounds 6

In one process, through the web server's ASGI application (webapp/agent_asgi.py, the HTTP parsing
aside) on its thread pool, on DATABASE_URL's PostgreSQL: each burst is ``--agents`` batches of 5
samples x 8 stages and as many long-poll re-arms (``after`` the host's version, held 0.05 s, then
204), all at once. Measured per burst: this process's CPU (its pool's threads included) and the
CPU of the PostgreSQL backends of this database (psutil; the server must run on this machine), per
request. Variants, alternated round by round (ABC CBA): ``before``, re-arms through Django's view
(as before webapp/jobs/api/lean.py) and batches stored in a transaction (``store_batch``);
``rearm-lean``, re-arms by the lean path; ``shipped``, that and the usual batch stored by one
statement that is its own transaction (``store_usual_batch``). CPU time, not wall time: it
holds on a loaded machine. Prints a JSON object; medians of rounds.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.ingestion_host import (
    batch_maker,
    postgres_database,
    register_hosts,
    setup_django,
)
from benchmarks.loadgen import cpu_of


def backends_cpu(database: str) -> float:
    """CPU seconds so far of the PostgreSQL backends serving ``database`` (live ones)."""
    return cpu_of(
        [
            process
            for process in psutil.process_iter(["name", "cmdline"])
            if (process.info["name"] or "").startswith("postgres")
            and f" {database} " in " ".join(process.info["cmdline"] or ())
        ]
    )


async def request(front, method: str, url: str, token: str, query: bytes, body: bytes) -> int:
    headers = [
        (b"host", b"127.0.0.1:8000"), (b"accept", b"*/*"),
        (b"authorization", f"Agent {token}".encode()),
    ]  # fmt: skip
    if body:
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
    scope = {
        "type": "http", "method": method, "path": url, "raw_path": url.encode(),
        "query_string": query, "headers": headers, "http_version": "1.1", "scheme": "http",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(60)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(front(scope, receive, send), timeout=120)
    return sent[0]["status"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.burst_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each variant")
    parser.add_argument("--threads", type=int, default=8, help="the web process's pool")
    parser.add_argument(
        "--samples", type=int, default=5, help="samples a batch (1: a request per sample)"
    )
    parser.add_argument("--no-rearm", action="store_true", help="batches only, no re-arms")
    parser.add_argument(
        "--variants", default="before,rearm-lean,shipped", help="comma-separated, in this order"
    )
    args = parser.parse_args(argv)

    setup_django(Path(tempfile.mkdtemp(prefix="intune-burst-bench-")))
    from webapp.agent_asgi import AgentFront
    from webapp.ingestion import services
    from webapp.jobs.api import lean as lean_allocation

    database = postgres_database(parser.error)
    hosts = [
        (host.pk, token, batch_maker(samples=args.samples))
        for host, token in register_hosts(args.agents, prefix="burst")
    ]

    async def django(scope, receive, send):
        raise AssertionError(f"not an agent's request: {scope['path']}")

    front = AgentFront(django, threads=args.threads)
    lean_poll = lean_allocation.LeanAllocationPoll()
    one_statement = services.store_usual_batch
    # (the re-arm's lean path, the batch's one-statement store) of each variant
    variants = {
        "before": (None, None),
        "rearm-lean": (lean_poll, None),
        "shipped": (lean_poll, one_statement),
    }
    chosen = args.variants.split(",")
    unknown = [name for name in chosen if name not in variants]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(variants)}")
    variants = {name: variants[name] for name in chosen}
    loop = asyncio.new_event_loop()

    async def burst() -> list[int]:
        front.waker.start()
        deadline = time.monotonic() + 10
        while not front.waker.connected:
            if time.monotonic() > deadline:
                raise RuntimeError("no Redis subscription: set REDIS_URL")
            await asyncio.sleep(0.02)
        calls = []
        for host_id, token, batch in hosts:
            body = json.dumps(batch()).encode()
            calls.append(
                request(front, "POST", f"/api/v1/hosts/{host_id}/metrics/", token, b"", body)
            )
            if args.no_rearm:
                continue
            calls.append(
                request(front, "GET", f"/api/v1/hosts/{host_id}/allocation/", token,
                        b"after=1&wait=0.05", b"")
            )  # fmt: skip
        return await asyncio.gather(*calls)

    loop.run_until_complete(burst())  # warm: connections, prepared statements, caches
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        order = list(variants) if round_ % 2 == 0 else list(reversed(list(variants)))
        for name in order:
            front.lean_poll, store = variants[name]
            services.store_usual_batch = store or (lambda host, batch: None)
            loop.run_until_complete(burst())  # each variant warms its own code path first
            pg0, cpu0, wall0 = backends_cpu(database), time.process_time(), time.perf_counter()
            statuses = loop.run_until_complete(burst())
            wall = time.perf_counter() - wall0
            cpu, pg = time.process_time() - cpu0, backends_cpu(database) - pg0
            assert sorted(set(statuses)) == ([200] if args.no_rearm else [200, 204]), statuses
            requests = len(statuses)
            results[name].append(
                {"web_ms": cpu / requests * 1000, "pg_ms": pg / requests * 1000, "wall_s": wall}
            )
    loop.run_until_complete(front.waker.stop())
    figures = {
        "agents": args.agents,
        "samples_per_batch": args.samples,
        "requests_per_burst": len(hosts) * (1 if args.no_rearm else 2),
        "rounds": args.rounds,
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
    }
    for name, rounds in results.items():
        figures[name] = {
            key: round(statistics.median(r[key] for r in rounds), 3)
            for key in ("web_ms", "pg_ms", "wall_s")
        }
    print(json.dumps(figures, indent=2))
    front.pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
