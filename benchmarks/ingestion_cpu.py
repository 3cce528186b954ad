"""CPU per metrics batch on the ingestion path: the one-statement PostgreSQL insert against the
multi-row INSERTs every database runs, side by side.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/intune_bench \\
        python -m benchmarks.ingestion_cpu --rounds 20 --batches 40

In one process, on DATABASE_URL's database (migrated here; default a fresh SQLite file, where
only the generic path exists): batches of 5 samples x 8 stages. Each round times, in this
thread's CPU time, what the issue's target names (the agent's token lookup, the batch's
validation, storing it and the host's update) for ``lean`` (webapp.permissions.host_by_token_hash
and webapp.ingestion.services.store_batch as shipped) and ``generic`` (the ORM's token lookup and
``store_batch(generic=True)``, as before the lean path), alternating which goes first. Also the whole
request through Django and DRF (``request``, Django's test client), for scale, and the whole request
as the web server runs it, through the ASGI application (webapp/agent_asgi.py, the HTTP parsing
aside) in this process's CPU time (its thread pool included): ``asgi-lean`` by the lean path
(webapp/ingestion/api/lean.py, shipped), ``asgi-django`` by Django's view (``INTUNE_LEAN_INGESTION``
off). Prints a JSON object; medians of rounds.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.ingestion_host import batch_maker, register_agent_host, setup_django


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ingestion_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each (default 20)")
    parser.add_argument("--batches", type=int, default=40, help="batches a round (default 40)")
    args = parser.parse_args(argv)

    setup_django(Path(tempfile.mkdtemp(prefix="intune-ingestion-bench-")))
    from django.conf import settings
    from django.db import connection

    from webapp.ingestion import services
    from webapp.ingestion.validation import validate_batch
    from webapp.jobs.models import Host, hash_agent_token
    from webapp.permissions import host_by_token_hash

    agent = register_agent_host()
    client, token, url = agent.client, agent.token, agent.url
    batch = batch_maker()
    max_samples = settings.INTUNE["MAX_SAMPLES_PER_BATCH"]

    def store(generic: bool) -> None:
        # What HostMetricsView.post does, without DRF's request handling around it.
        if generic:  # the ORM lookup the agent's token had before
            found = Host.objects.select_related("job").filter(token_hash=hash_agent_token(token))
            found = found.first()
        else:
            found = host_by_token_hash(hash_agent_token(token))
        valid = validate_batch(batch(), services.stage_names_of(found.job), max_samples)
        result = services.store_batch(found, valid, generic=generic)
        assert result["stored"] == 5, result

    def request() -> None:
        response = client.post(url, batch(), format="json")
        assert response.status_code == 200, response.content

    variants = {
        "lean": lambda: store(False),
        "generic": lambda: store(True),
        "request": request,
    }
    fronts = asgi_fronts()
    loop = asyncio.new_event_loop()

    def run_round(name: str) -> float:
        if name in fronts:  # the bodies are encoded first, as a client's are
            bodies = [json.dumps(batch()).encode() for _ in range(args.batches)]
            started = time.process_time()
            loop.run_until_complete(post_all(fronts[name], url, token, bodies))
            return (time.process_time() - started) / args.batches * 1000
        started = time.thread_time()
        for _ in range(args.batches):
            variants[name]()
        return (time.thread_time() - started) / args.batches * 1000

    variants |= dict.fromkeys(fronts)

    for name in variants:
        run_round(name)  # warm up
    profiled = os.getenv("INTUNE_PROFILE")
    if profiled:  # where a variant's CPU goes: INTUNE_PROFILE=lean, asgi-lean, asgi-django...
        import cProfile
        import pstats

        profile = cProfile.Profile(timer=time.process_time)
        if profiled in fronts:
            bodies = [json.dumps(batch()).encode() for _ in range(args.batches)]
            front = fronts[profiled]
            front.pool = SameThread()  # cProfile sees one thread only
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"  # Django's work on the loop's thread
            profile.runcall(lambda: loop.run_until_complete(post_all(front, url, token, bodies)))
        else:
            profile.runcall(lambda: [variants[profiled]() for _ in range(args.batches)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(45)
        for front in fronts.values():
            loop.run_until_complete(front.waker.stop())
        return 0
    per_batch = {name: [] for name in variants}
    for i in range(args.rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            per_batch[name].append(run_round(name))
    medians = {name: round(statistics.median(v), 3) for name, v in per_batch.items()}
    result = {
        "database": connection.vendor,
        "batch": "5 samples x 8 stages",
        "batches": args.rounds * args.batches,
        "cpu_ms_per_batch": medians,
        "lean_over_generic": round(medians["lean"] / medians["generic"], 3),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=2))
    for front in fronts.values():
        loop.run_until_complete(front.waker.stop())
    loop.close()
    return 0


def asgi_fronts() -> dict:
    """The ASGI application of the web server with the lean path and without it."""
    from webapp.agent_asgi import AgentFront
    from webapp.ingestion.api import lean

    async def django(scope, receive, send):
        raise AssertionError(f"not an agent's request: {scope['path']}")

    with_lean, without = AgentFront(django, threads=8), AgentFront(django, threads=8)
    with_lean.lean_post, without.lean_post = lean.LeanBatchPost(), None
    return {"asgi-lean": with_lean, "asgi-django": without}


async def post_all(front, url: str, token: str, bodies: list[bytes]) -> None:
    """POST each body in turn to ``front`` as uvicorn hands a request to it."""
    for body in bodies:
        headers = [
            (b"host", b"127.0.0.1:8000"), (b"accept", b"*/*"), (b"content-type", b"application/json"),
            (b"authorization", f"Agent {token}".encode()), (b"content-length", str(len(body)).encode()),
        ]  # fmt: skip
        scope = {
            "type": "http", "method": "POST", "path": url, "raw_path": url.encode(), "query_string": b"",
            "headers": headers, "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
        }  # fmt: skip
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent = []

        async def receive(messages=messages):
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message, sent=sent):
            sent.append(message)

        await front(scope, receive, send)
        assert sent[0]["status"] == 200, sent


class SameThread:
    """An executor that runs its calls at once in the caller's thread (for the profile)."""

    def submit(self, fn, *args):
        import concurrent.futures

        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)
        return future


if __name__ == "__main__":
    sys.exit(main())
