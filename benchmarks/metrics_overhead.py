"""What the Prometheus instruments cost on the ingestion hot path, in CPU per request.

    python -m benchmarks.metrics_overhead --rounds 30 --requests 40

In one process, on a fresh SQLite file (or DATABASE_URL's database), with prometheus-client in
multiprocess mode as under gunicorn (``--single-process`` for the in-memory values): posts
batches of 5 samples x 8 stages through Django's full request path (middleware, DRF, the agent
token lookup, validation, storing) and measures the process's CPU time per request, alternating
rounds with the instruments (``HostMetricsView.dispatch`` as shipped) and without them (DRF's
own ``dispatch``), so that both see the same machine load. Also times the instruments' calls
alone (CPU time too). Prints a JSON object.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

from benchmarks.ingestion_host import batch_maker, register_agent_host, setup_django


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.metrics_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=30, help="rounds of each (default 30)")
    parser.add_argument("--requests", type=int, default=40, help="requests a round (default 40)")
    parser.add_argument(
        "--single-process", action="store_true", help="without PROMETHEUS_MULTIPROC_DIR"
    )
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="intune-metrics-bench-"))
    if not args.single_process:
        (workdir / "prometheus").mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "prometheus")
    setup_django(workdir)
    from rest_framework.views import APIView

    from webapp.ingestion.api.views import HostMetricsView
    from webapp.metrics.instruments import held_long_poll, observe_batch

    agent = register_agent_host()
    client, url = agent.client, agent.url
    batch = batch_maker()

    instrumented = HostMetricsView.dispatch
    variants = {"with": instrumented, "without": APIView.dispatch}

    def run_round(variant: str) -> float:
        HostMetricsView.dispatch = variants[variant]
        bodies = [batch() for _ in range(args.requests)]
        started = time.process_time()
        for body in bodies:
            response = client.post(url, body, format="json")
            assert response.status_code == 200, response.content
        return (time.process_time() - started) / args.requests

    for variant in variants:  # warm both paths
        run_round(variant)
    per_request = {variant: [] for variant in variants}
    for i in range(args.rounds):
        order = ["with", "without"] if i % 2 == 0 else ["without", "with"]
        for variant in order:
            per_request[variant].append(run_round(variant))
    HostMetricsView.dispatch = instrumented

    calls = 100_000

    def hold() -> None:
        with held_long_poll():
            pass

    # CPU time, not wall time: on a shared machine the wall clock counts other processes' turns.
    observe_us = min(
        timeit.repeat(
            lambda: observe_batch(200, 5, 0.004), number=calls, repeat=3, timer=time.process_time
        )
    )
    hold_us = min(timeit.repeat(hold, number=calls, repeat=3, timer=time.process_time))
    with_ms = statistics.median(per_request["with"]) * 1000
    without_ms = statistics.median(per_request["without"]) * 1000
    result = {
        "mode": "single process" if args.single_process else "multiprocess (as under gunicorn)",
        "requests": args.rounds * args.requests,
        "cpu_ms_per_request_with": round(with_ms, 3),
        "cpu_ms_per_request_without": round(without_ms, 3),
        "difference_ms": round(with_ms - without_ms, 3),
        "ratio": round(with_ms / without_ms, 4),
        "observe_batch_us_per_call": round(observe_us / calls * 1e6, 2),
        "held_long_poll_us_per_enter_exit": round(hold_us / calls * 1e6, 2),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
