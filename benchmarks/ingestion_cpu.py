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
request through Django and DRF (``request``), for scale. Prints a JSON object; medians of rounds.
"""

import argparse
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

    def run_round(name: str) -> float:
        started = time.thread_time()
        for _ in range(args.batches):
            variants[name]()
        return (time.thread_time() - started) / args.batches * 1000

    for name in variants:
        run_round(name)  # warm up
    if os.getenv("INTUNE_PROFILE"):  # where the lean path's CPU goes (thread CPU time)
        import cProfile
        import pstats

        profile = cProfile.Profile(timer=time.thread_time)
        profile.runcall(lambda: [store(False) for _ in range(args.batches)])
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
