"""CPU of the agents' token lookup run as the web server runs it now (on its thread pool, through
``run_in_executor``) against psycopg's ``AsyncConnection`` on the event loop, with no thread:
what moving the lean paths' DB work onto the loop would save, before building it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/intune_bench \\
        python -m benchmarks.async_lookup_cpu --agents 100 --rounds 8

In one process, on uvloop (the web server's loop), on DATABASE_URL's PostgreSQL: each burst is
``--agents`` lookups at once (``host_by_token_hash(..., agent_fields=True)``, prepared), as an
in-step fleet's batches and re-arms start. ``thread``: each lookup handed to a pool of
``--threads`` threads, each with its kept connection (webapp/agent_asgi.py); ``async``: the
same prepared statement on ``--threads`` kept ``AsyncConnection``s, each lookup taking a free
one from a queue, the row turned into the host as ``host_by_token_hash`` does. Alternated round
by round; this process's CPU (time.process_time, its threads included) a lookup; medians.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from benchmarks.ingestion_host import postgres_database, register_hosts, setup_django


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.async_lookup_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args(argv)

    setup_django(Path(tempfile.mkdtemp(prefix="intune-async-lookup-")))
    import psycopg
    import uvloop
    from django.db import connection

    from webapp.jobs.models import Host, Job, hash_agent_token
    from webapp.permissions import _token_lookup, host_by_token_hash

    postgres_database(parser.error)
    hashes = [hash_agent_token(t) for _, t in register_hosts(args.agents, prefix="lookup")]
    sql, _, converting, host_fields, job_fields = _token_lookup(True)
    assert not converting  # the agents' fields need no converter
    params = connection.get_connection_params()
    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="agent")
    loop = uvloop.new_event_loop()
    free: asyncio.Queue = asyncio.Queue()

    async def connect() -> None:
        for _ in range(args.threads):
            conn = await psycopg.AsyncConnection.connect(
                **{k: v for k, v in params.items() if k not in ("cursor_factory", "context")},
                autocommit=True,
            )
            free.put_nowait(conn)

    async def async_lookup(token_hash: str):
        conn = await free.get()
        try:
            cursor = await conn.execute(sql, [token_hash], prepare=True)
            row = await cursor.fetchone()
        finally:
            free.put_nowait(conn)
        host = Host.from_db("default", host_fields, row[: len(host_fields)])
        job = Job.from_db("default", job_fields, row[len(host_fields) :])
        Host.job.field.set_cached_value(host, job)
        return host

    def thread_lookup(token_hash: str):
        return host_by_token_hash(token_hash, agent_fields=True)

    async def burst(variant: str) -> list:
        if variant == "thread":
            running = asyncio.get_running_loop()
            calls = [running.run_in_executor(pool, thread_lookup, h) for h in hashes]
        else:
            calls = [async_lookup(h) for h in hashes]
        return await asyncio.gather(*calls)

    loop.run_until_complete(connect())
    results: dict[str, list[float]] = {"thread": [], "async": []}
    for round_ in range(args.rounds):
        order = ["thread", "async"] if round_ % 2 == 0 else ["async", "thread"]
        for variant in order:
            loop.run_until_complete(burst(variant))  # warm: connections, prepared statements
            cpu0 = time.process_time()
            hosts = loop.run_until_complete(burst(variant))
            cpu = time.process_time() - cpu0
            assert [h.token_hash for h in hosts] == hashes
            results[variant].append(cpu / len(hashes) * 1e6)
    figures = {
        "agents": args.agents,
        "threads": args.threads,
        "rounds": args.rounds,
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
        **{f"{k}_us": round(statistics.median(v), 1) for k, v in results.items()},
    }
    print(json.dumps(figures, indent=2))
    pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
