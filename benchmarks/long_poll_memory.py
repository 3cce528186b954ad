"""Memory per held allocation long-poll: the web workers' USS with 0, 500, 1,000, 2,000 held.

    python -m benchmarks.long_poll_memory                      # steps 0,500,1000,2000
    python -m benchmarks.long_poll_memory --steps 0,100,200 --json figures.json

Starts a live stack of its own (the shipped web tier, ``--web-processes`` uvicorn workers),
registers as many hosts as the largest step, warms every worker up (each endpoint served, the
thread pool and database connections in use), then holds long-polls (``wait`` longer than the
whole run, re-armed should one return) from one client process, step by step. At each step it
waits until the workers hold that many connections, steady for a few seconds, and sums the
workers' USS (psutil ``memory_full_info``: the memory only they hold, shared pages left out).
Bytes per held long-poll is the slope of a least-squares line through the steps. Kernel socket
buffers are not in a process's USS and not counted here.
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

import aiohttp
import psutil

from benchmarks import loadgen
from webapp.stack.limits import raise_open_file_limit

HOLD_S = 600  # a held long-poll's wait: longer than any run, so none returns while measured
SETTLE_S = 3.0  # connections unchanged this long: every one is held


class Holder:
    """Long-polls held from an event loop on a thread of this process."""

    def __init__(self, url: str, hosts: list[dict]) -> None:
        self.url, self.hosts = url, hosts
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Future] = []
        self.errors: list[str] = []
        self.thread.start()

    def _call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @staticmethod
    def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=HOLD_S + 60),
        )

    async def _poll(self, session, host: dict, wait: float, forever: bool) -> None:
        headers = {"Authorization": f"Agent {host['agent_token']}"}
        url = f"{self.url}/api/v1/hosts/{host['id']}/allocation/"
        while True:
            try:
                async with session.get(
                    url, params={"after": 1, "wait": wait}, headers=headers
                ) as response:
                    await response.read()
                    if response.status not in (200, 204):
                        self.errors.append(f"long-poll {response.status}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.errors.append(f"long-poll {type(exc).__name__}: {exc}")
                await asyncio.sleep(1)
            if not forever:
                return

    def warm_up(self, hosts: list[dict]) -> None:
        """Long-polls that return at once and after a second: every worker serves the view,
        holds and answers, before the baseline is read; their connections are closed after."""

        async def both():
            async with self._session() as session:
                await asyncio.gather(*(self._poll(session, h, 0, False) for h in hosts))
                await asyncio.gather(*(self._poll(session, h, 1, False) for h in hosts))

        self._call(both(), timeout=120)

    def hold(self, hosts: list[dict]) -> None:
        async def start():
            if self.session is None:
                self.session = self._session()
            self.tasks += [
                asyncio.ensure_future(self._poll(self.session, h, HOLD_S, True)) for h in hosts
            ]

        self._call(start())

    def close(self) -> None:
        async def stop():
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            if self.session is not None:
                await self.session.close()

        try:
            self._call(stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


def workers_of(stack) -> list[psutil.Process]:
    """The stack's web workers (gunicorn's master holds no connection)."""
    return psutil.Process(stack.group.children["web"].pid).children()


def established(workers: list[psutil.Process], port: int) -> int:
    """Connections the workers hold open on the server's port."""
    count = 0
    for worker in workers:
        for conn in worker.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_ESTABLISHED and conn.laddr and conn.laddr.port == port:
                count += 1
    return count


def wait_held(workers: list[psutil.Process], port: int, target: int, timeout: float) -> int:
    """Wait until the workers hold ``target`` connections, unchanged for SETTLE_S seconds."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = established(workers, port)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= target and time.monotonic() - since >= SETTLE_S:
            return now
        time.sleep(0.5)
    raise TimeoutError(
        f"the web workers hold {last} connections, not {target}, after {timeout:.0f} s: "
        "see the stack's logs (web.log) and the holder's errors"
    )


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y on x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0


def measure(steps: list[int], web_processes: int = 2) -> dict:
    """Start a stack, hold each step's number of long-polls, and return the figures."""
    most = max(steps)
    raise_open_file_limit(2 * most + 256)
    stack = loadgen.live_stack("uvicorn", most, processes=web_processes)
    stack.extra_env["INTUNE_LONG_POLL_MAX_WAIT_S"] = str(HOLD_S)
    stack.start()
    holder = None
    try:
        token = stack.create_user("memory-operator", role="operator")["token"]
        _, hosts = loadgen.register(stack.url, token, max(most, 1), ["stage0", "stage1"])
        workers = workers_of(stack)
        holder = Holder(stack.url, hosts)
        holder.warm_up(hosts[: min(len(hosts), 64)])
        wait_held(workers, stack.port, 0, timeout=60)
        rows = []
        for held in sorted(set(steps)):
            holder.hold(hosts[len(holder.tasks) : held])
            connections = wait_held(workers, stack.port, held, timeout=120 + held / 10)
            uss = [w.memory_full_info().uss for w in workers]
            rows.append(
                {
                    "held": held,
                    "connections": connections,
                    "uss_bytes": sum(uss),
                    "uss_bytes_per_worker": uss,
                }  # fmt: skip
            )
            print(f"{held:>5} held: USS {sum(uss) / 2**20:.1f} MiB in {len(uss)} workers",
                  file=sys.stderr)  # fmt: skip
        per_poll = slope([(r["held"], r["uss_bytes"]) for r in rows])
        first, last = rows[0], rows[-1]
        return {
            "web_processes": len(workers),
            "steps": rows,
            "bytes_per_held_long_poll": round(per_poll),
            "bytes_per_held_long_poll_end_to_end": round(
                (last["uss_bytes"] - first["uss_bytes"]) / (last["held"] - first["held"])
            )
            if last["held"] != first["held"]
            else None,
            "holder_errors": len(holder.errors),
            "first_holder_errors": holder.errors[:5],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        if holder is not None:
            holder.close()
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.long_poll_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--steps", default="0,500,1000,2000", help="held long-polls at each measurement"
    )
    parser.add_argument("--web-processes", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",") if s.strip()]
    if len(steps) < 2 or min(steps) < 0 or max(steps) > 5000:
        parser.error("--steps needs two or more counts in 0..5000")
    figures = measure(steps, args.web_processes)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
