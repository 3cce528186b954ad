"""CPU a request of the HTTP server alone, before the application: what a lean protocol of our
own for the agents' endpoints could save at most, measured before building it.

    python -m benchmarks.http_server_cpu --connections 200 --rounds 4

The same requests (an agent's batch: ``POST /api/v1/hosts/1/metrics/`` with its headers and a
body of ``--body-kb`` KiB) answered with the same bytes (a batch's 200: its body and the lean
path's 9 headers) by two servers, each in a process of its own on uvloop, with an application
that does nothing else:

- ``uvicorn``: the web worker's protocol (``BoundedHttpTools``, uvicorn's httptools protocol with
  this server's bounds) and an ASGI application that reads the body and sends the answer in two
  messages, as ``AgentFront`` does (the Django side, the database and the pool left out);
- ``raw``: an ``asyncio.Protocol`` on httptools that gathers the head and body and writes the
  answer in one write, keep-alive, nothing else: the floor of any server in Python here.

``--connections`` aiohttp connections each send a request, all at once, as a fleet in step does,
``--bursts`` times a round; the servers alternate round by round. The server process's CPU
(psutil, user and system) a request; medians of the rounds. Bounded: each burst waits at most
30 s.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time

import psutil

ANSWER_BODY = b'{"stored":5,"duplicates":0,"latest_allocation_version":1}'
# The lean batch's answer headers (webapp/ingestion/api/lean.py: the view's, the middleware's).
ANSWER_HEADERS = [
    (b"content-type", b"application/json"),
    (b"allow", b"GET, POST, HEAD, OPTIONS"),
    (b"content-length", str(len(ANSWER_BODY)).encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_uvicorn(port: int) -> None:
    import uvicorn

    from webapp.stack.web_worker import BoundedHttpTools

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": ANSWER_HEADERS})
        await send({"type": "http.response.body", "body": ANSWER_BODY})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=BoundedHttpTools, loop="uvloop",
        lifespan="off", access_log=False, log_level="warning",
    )  # fmt: skip
    uvicorn.Server(config).run()


def serve_raw(port: int) -> None:
    import httptools
    import uvloop

    answer = b"".join(
        [b"HTTP/1.1 200 OK\r\n", b"server: raw\r\n"]
        + [name + b": " + value + b"\r\n" for name, value in ANSWER_HEADERS]
        + [b"\r\n", ANSWER_BODY]
    )

    class Raw(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.headers: list = []
            self.body: list = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_begin(self) -> None:
            self.headers, self.body = [], []

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name.lower(), value))

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            self.transport.write(answer)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Raw, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


SERVERS = {"uvicorn": serve_uvicorn, "raw": serve_raw}


async def bursts(session, port: int, connections: int, count: int, body: bytes) -> int:
    headers = {
        "Authorization": "Agent " + "t" * 43, "Content-Type": "application/json",
        "Accept": "*/*", "User-Agent": "intune-agent",
    }  # fmt: skip
    url = f"http://127.0.0.1:{port}/api/v1/hosts/1/metrics/"

    async def one() -> None:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            assert response.status == 200, response.status

    for _ in range(count):
        async with asyncio.timeout(30):
            await asyncio.gather(*(one() for _ in range(connections)))
    return connections * count


async def alternate(servers: dict, args, body: bytes) -> dict[str, list[float]]:
    """Each server's CPU a request, round by round; each keeps its connections (keep-alive)."""
    import aiohttp

    sessions = {
        name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.connections))
        for name in servers
    }
    results: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for name, (port, _) in servers.items():  # warm: connections opened, code paths run
            await bursts(sessions[name], port, args.connections, 2, body)
        for round_ in range(args.rounds):
            order = list(servers) if round_ % 2 == 0 else list(reversed(list(servers)))
            for name in order:
                port, process = servers[name]
                watched = psutil.Process(process.pid)
                before = cpu_s(watched)
                sent = await bursts(sessions[name], port, args.connections, args.bursts, body)
                results[name].append((cpu_s(watched) - before) / sent * 1000)
    finally:
        for session in sessions.values():
            await session.close()
    return results


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.http_server_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=10, help="bursts a round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each server")
    parser.add_argument("--body-kb", type=float, default=8.6, help="a batch of 5 x 8: 8.6 KiB")
    args = parser.parse_args(argv)
    body = json.dumps({"samples": "x" * int(args.body_kb * 1024 - 16)}).encode()

    servers = {}
    for name, serve in SERVERS.items():
        port = free_port()
        process = mp.get_context("spawn").Process(target=serve, args=(port,), daemon=True)
        process.start()
        servers[name] = (port, process)
    for port, _ in servers.values():
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no server on port {port} after 20 s") from None
                time.sleep(0.1)
    try:
        results = asyncio.run(alternate(servers, args, body))
    finally:
        for _, process in servers.values():
            process.terminate()
            process.join(timeout=10)
    figures = {
        "connections": args.connections,
        "bursts_per_round": args.bursts,
        "rounds": args.rounds,
        "body_bytes": len(body),
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
        "server_cpu_ms_per_request": {
            name: round(statistics.median(values), 3) for name, values in results.items()
        },
        "rounds_ms": {name: [round(v, 3) for v in values] for name, values in results.items()},
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
