"""The web tiers side by side: uvicorn workers (shipped) against gthread workers (the former).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/intune_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m benchmarks.web_tiers --agents 200 --seconds 60 --runs spread,in-step
    python -m benchmarks.web_tiers --memory 500                 # memory per held long-poll

Each run starts a live stack of its own (2 web processes, a Celery worker; a fresh database of
DATABASE_URL's server, or SQLite) with one tier, runs benchmarks.loadgen against it, and stops
it; the tiers alternate within each run kind. Runs: ``spread`` and ``in-step`` (batches every 5
s), ``per-sample`` (in step, a request per sample). ``--memory N`` instead holds N long-polls on a
one-process stack of each tier and reports the web process's memory (USS) and threads added per
held poll. Prints a JSON object.
"""

import argparse
import asyncio
import json
import os
import sys
import time

import httpx
import psutil

from benchmarks import loadgen
from webapp.stack.supervisor import wait_until

RUNS = {
    "spread": {"shape": "spread", "batch_seconds": 5},
    "in-step": {"shape": "in-step", "batch_seconds": 5},
    "per-sample": {"shape": "in-step", "batch_seconds": 1},
}


def load_runs(kinds: list[str], tiers: list[str], agents: int, seconds: float, wait: float):
    results = []
    for kind in kinds:
        for tier in tiers:
            stack = loadgen.live_stack(tier, agents)
            stack.start()
            try:
                token = stack.create_user("load-operator", role="operator")["token"]
                web, before = web_processes(stack), {}

                def on_start(web=web, before=before):  # the hosts registered, the load starts
                    before["load"], before["cpu"] = os.getloadavg()[0], cpu_seconds(web)

                figures = loadgen.run(
                    stack.url, token, agents=agents, stages=8, seconds=seconds, processes=2,
                    long_poll_wait=wait, on_start=on_start, **RUNS[kind],
                )  # fmt: skip
                cpu = cpu_seconds(web) - before["cpu"]
                load_before = before["load"]
                figures["samples_stored"] = stack.stored_samples(figures["job_id"])
                # The web processes' CPU (all of it: batches, long-polls, registration) over
                # the batches posted; the load average (1 min) before and after the run.
                batches = figures["samples_sent"] / RUNS[kind]["batch_seconds"]
                figures["web_cpu_ms_per_batch"] = round(cpu / max(1, batches) * 1000, 2)
                figures["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
            finally:
                stack.stop()
            figures.pop("host_ids")
            results.append({"run": kind, "tier": tier} | figures)
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def web_processes(stack) -> list:
    """The web service's worker processes (gunicorn's master does no request's work)."""
    master = psutil.Process(stack.group.children["web"].pid)
    return wait_until(lambda: master.children(), 30, what="the web workers")


def cpu_seconds(processes: list) -> float:
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def memory_run(tier: str, held: int) -> dict:
    stack = loadgen.live_stack(tier, held, processes=1)
    stack.start()
    try:
        operator = stack.create_user("mem-operator", role="operator")["token"]
        _, hosts = loadgen.register(stack.url, operator, 1, ["read", "parse"])
        host = hosts[0]
        master = psutil.Process(stack.group.children["web"].pid)
        worker = wait_until(lambda: master.children(), 30, what="the web worker")[0]

        async def hold() -> tuple[dict, dict]:
            limits = httpx.Limits(max_connections=held + 10, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=stack.url, timeout=120, limits=limits) as c:
                headers = {"Authorization": f"Agent {host['agent_token']}"}
                url = f"/api/v1/hosts/{host['id']}/allocation/"
                # Warm: the thread pool and the database pool at their working size.
                for _ in range(3):
                    await asyncio.gather(*(c.get(url, headers=headers) for _ in range(64)))
                await asyncio.sleep(3)
                before = {"uss": worker.memory_full_info().uss, "threads": worker.num_threads()}
                tasks = [
                    asyncio.create_task(c.get(url, params={"after": 99, "wait": 40},
                                              headers=headers))
                    for _ in range(held)
                ]  # fmt: skip
                await asyncio.sleep(15)  # all held (no version 99 comes)
                during = {"uss": worker.memory_full_info().uss, "threads": worker.num_threads()}
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return before, during

        before, during = asyncio.run(hold())
    finally:
        stack.stop()
    return {
        "tier": tier,
        "held_long_polls": held,
        "kb_per_held_long_poll": round((during["uss"] - before["uss"]) / held / 1024, 1),
        "threads_added": during["threads"] - before["threads"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.web_tiers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--runs", default="spread,in-step", help=f"of {', '.join(RUNS)}")
    parser.add_argument(
        "--tiers", default="uvicorn,gthread", help=f"of {', '.join(loadgen.WEB_TIERS)}"
    )
    parser.add_argument("--long-poll-wait", type=float, default=30)
    parser.add_argument("--memory", type=int, help="hold this many long-polls instead")
    args = parser.parse_args(argv)
    tiers = args.tiers.split(",")
    if args.memory:
        results = [memory_run(tier, args.memory) for tier in tiers]
    else:
        kinds = args.runs.split(",")
        unknown = set(kinds) - set(RUNS) | set(tiers) - set(loadgen.WEB_TIERS)
        if unknown:
            parser.error(f"unknown runs or tiers: {sorted(unknown)}")
        results = load_runs(kinds, tiers, args.agents, args.seconds, args.long_poll_wait)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
