"""A stand-in control plane: protocol v1 (docs/agent-protocol.md) in memory, without Django.

It is not the control plane (that is ``webapp/``). It exists to test agents and measure their
overhead where running Django, a database and Redis would be the bigger part of the work
(the agent's tests, the agent-only install check of tests/packaging,
``benchmarks.agent_overhead``), and as an executable reading of the protocol for agent
authors. It keeps what it stores across :meth:`StandinControlPlane.stop` / :meth:`start` on the
same port, as a real control plane keeps its database across an outage, so "nothing lost,
nothing duplicated" can be checked.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from agents.protocol import MAX_BODY_BYTES, MAX_SAMPLES_PER_BATCH
from tests.support.ports import free_port

HOST_KEYS = {"cpus", "cpu_percent", "per_cpu_percent", "memory_used_mb", "memory_limit_mb"}
STAGE_KEYS = {"name", "workers", "items_per_s", "busy_fraction", "in_queue", "out_queue"}


@dataclass
class StoredHost:
    """One registered host and everything it sent."""

    id: int
    token: str
    stage_names: list[str]
    allocations: list[dict] = field(default_factory=list)
    samples: dict[int, dict] = field(default_factory=dict)  # seq -> sample
    duplicates: int = 0
    batches: int = 0
    batch_bytes: list[int] = field(default_factory=list)
    statuses: list[dict] = field(default_factory=list)
    dropped_reported: int = 0
    # The sequence numbers of each batch stored and then hung up on (hang_up_after_storing).
    unanswered: list[list[int]] = field(default_factory=list)


def validate_sample(sample: dict, stage_names: list[str], where: str) -> str | None:
    """Return what is wrong with one sample, as the control plane would say it, or ``None``."""
    if not isinstance(sample.get("seq"), int) or isinstance(sample.get("seq"), bool):
        return f"{where}.seq: must be an integer"
    if not isinstance(sample.get("ts"), (int, float)):
        return f"{where}.ts: must be a number"
    missing = HOST_KEYS - set(sample.get("host") or {})
    if missing:
        return f"{where}.host: missing {sorted(missing)}"
    for i, stage in enumerate(sample.get("stages", [])):
        missing = STAGE_KEYS - set(stage)
        if missing:
            return f"{where}.stages[{i}]: missing {sorted(missing)}"
        if stage_names and stage["name"] not in stage_names:
            return f"{where}.stages[{i}].name: unknown stage {stage['name']!r}"
        if not 0.0 <= float(stage["busy_fraction"]) <= 1.0:
            return f"{where}.stages[{i}].busy_fraction: must be between 0 and 1"
    listed = [s["name"] for s in sample.get("stages", [])]
    if stage_names and sorted(listed) != sorted(stage_names):
        return f"{where}.stages: must list every stage once ({stage_names}), got {listed}"
    trainer = sample.get("trainer")
    if not isinstance(trainer, dict):
        return f"{where}.trainer: must be an object"
    if not 0.0 <= float(trainer.get("idle_fraction", -1.0)) <= 1.0:
        return f"{where}.trainer.idle_fraction: must be between 0 and 1"
    return None


class StandinControlPlane:
    """An in-memory control plane on ``127.0.0.1:port`` that can go away and come back."""

    def __init__(self, port: int | None = None, api_token: str = "standin-api-token") -> None:
        self.api_token = api_token
        self.hosts: dict[int, StoredHost] = {}
        self.changed = threading.Condition()
        self.fail_next: list[int] = []  # statuses to answer any request with, for retry tests
        # The same for metrics batches only; an entry may be (status, detail).
        self.fail_next_metrics: list[int | tuple[int, str]] = []
        # The next this many metrics batches that carry samples are stored, and then the
        # connection is cut without an answer: the agent cannot tell that from a batch that was
        # lost, so it must send the same samples again (at-least-once; the control plane
        # stores a sequence number once). What was stored so is in ``StoredHost.unanswered``.
        self.hang_up_after_storing = 0
        self.max_wait_s = 60.0  # longest long-poll hold; a longer ``wait`` is refused (400)
        self.hold_polls = True  # False: answer every poll at once, as a proxy that holds none
        self.polls = 0  # allocation polls answered, whatever the answer
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = port if port is not None else free_port()
        self._fork_hook = False

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        """Whether it answers now."""
        return self._server is not None

    def add_host(self, stage_names: list[str], workers: dict[str, int] | None = None) -> StoredHost:
        """Register a host directly, with a default allocation (version 1) of one worker each."""
        with self.changed:
            host = StoredHost(len(self.hosts) + 1, "ia_" + secrets.token_hex(16), list(stage_names))
            self.hosts[host.id] = host
            self._publish_locked(host, workers or dict.fromkeys(stage_names, 1), "default")
            return host

    def publish(
        self, host_id: int, workers: dict, source: str = "override", layout: object = None
    ) -> int:
        """Publish a new allocation for a host (any content: the agent must check it), with a
        ``layout`` when one is given."""
        with self.changed:
            return self._publish_locked(self.hosts[host_id], workers, source, layout)

    def _publish_locked(
        self, host: StoredHost, workers: dict, source: str, layout: object = None
    ) -> int:
        version = len(host.allocations) + 1
        allocation = {
            "version": version,
            "workers": workers,
            "source": source,
            "created_at": time.time(),
        }
        if layout is not None:
            allocation["layout"] = layout
        host.allocations.append(allocation)
        self.changed.notify_all()
        return version

    def start(self) -> StandinControlPlane:
        """Listen (again) on the same port."""
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.daemon_threads = True
        server.standin = self  # type: ignore[attr-defined]
        server.open_sockets = set()  # type: ignore[attr-defined]
        server.gone = False  # type: ignore[attr-defined]
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="standin", daemon=True)
        self._thread.start()
        if not self._fork_hook:
            # A pipeline forks its workers while this server runs in the same (test) process;
            # a child keeping the listening socket would hold the port through an "outage".
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _close_in_child(ref))
            self._fork_hook = True
        return self

    def stop(self) -> None:
        """Go away: refuse connections and cut the ones open, held long-polls included."""
        server, self._server = self._server, None
        if server is None:
            return
        server.gone = True  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        for sock in list(server.open_sockets):  # type: ignore[attr-defined]
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.changed:
            self.changed.notify_all()

    def __enter__(self) -> StandinControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # An agent that hangs up on a held long-poll (it is stopping) is not an error here.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _close_in_child(ref: weakref.ref) -> None:
    plane = ref()
    server = plane._server if plane is not None else None
    if server is not None:
        for sock in [server.socket, *server.open_sockets]:  # type: ignore[attr-defined]
            try:
                sock.close()
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def setup(self) -> None:
        super().setup()
        self.server.open_sockets.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self.server.open_sockets.discard(self.connection)  # type: ignore[attr-defined]
        super().finish()

    @property
    def plane(self) -> StandinControlPlane:
        return self.server.standin  # type: ignore[attr-defined]

    def _answer(self, status: int, body: dict | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _host(self, host_id: int) -> StoredHost | None:
        auth = self.headers.get("Authorization", "")
        host = self.plane.hosts.get(host_id)
        if not auth.startswith("Agent "):
            self._answer(401, {"detail": "missing agent token"})
            return None
        token = auth.removeprefix("Agent ")
        if host is None or host.token != token:
            known = any(h.token == token for h in self.plane.hosts.values())
            self._answer(403 if known else 401, {"detail": "token does not match this host"})
            return None
        return host

    def _failing(self) -> bool:
        with self.plane.changed:
            status = self.plane.fail_next.pop(0) if self.plane.fail_next else None
        if status is not None:
            self._answer(status, {"detail": f"stand-in told to answer {status}"})
        return status is not None

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        parts = urlparse(self.path).path.strip("/").split("/")
        if self._failing():
            return
        if len(raw) > MAX_BODY_BYTES:
            return self._answer(413, {"detail": f"body over {MAX_BODY_BYTES} bytes"})
        body = json.loads(raw or b"{}")
        if parts[:3] == ["api", "v1", "jobs"] and parts[4:] == ["hosts"]:
            if self.headers.get("Authorization") != f"Token {self.plane.api_token}":
                return self._answer(401, {"detail": "bad API token"})
            stages = body.get("stage_names") or ["read", "parse"]
            host = self.plane.add_host(stages)
            return self._answer(
                201,
                {
                    "id": host.id,
                    "name": body.get("name"),
                    "agent_token": host.token,
                    "allocation": host.allocations[-1],
                },
            )
        if parts[:3] == ["api", "v1", "hosts"] and parts[4:] == ["metrics"]:
            host = self._host(int(parts[3]))
            if host is None:
                return
            with self.plane.changed:
                fail = self.plane.fail_next_metrics.pop(0) if self.plane.fail_next_metrics else 0
            if fail:
                status, detail = fail if isinstance(fail, tuple) else (fail, f"told to fail {fail}")
                return self._answer(status, {"detail": detail})
            samples = body.get("samples", [])
            if not samples and body.get("allocation_status") is None:
                return self._answer(400, {"detail": "samples: must not be empty without status"})
            if len(samples) > MAX_SAMPLES_PER_BATCH:
                return self._answer(
                    400, {"detail": f"samples: at most {MAX_SAMPLES_PER_BATCH} per batch"}
                )
            for i, sample in enumerate(samples):
                problem = validate_sample(sample, host.stage_names, f"samples[{i}]")
                if problem:
                    return self._answer(400, {"detail": problem})
            with self.plane.changed:
                stored = duplicates = 0
                for sample in samples:
                    if sample["seq"] in host.samples:
                        duplicates += 1
                    else:
                        host.samples[sample["seq"]] = sample
                        stored += 1
                host.duplicates += duplicates
                host.batches += 1
                host.batch_bytes.append(len(raw))
                host.statuses.append(body.get("allocation_status") or {})
                host.dropped_reported += int(body.get("dropped_samples", 0))
                latest = host.allocations[-1]["version"] if host.allocations else 0
                hang_up = bool(samples) and self.plane.hang_up_after_storing > 0
                if hang_up:
                    self.plane.hang_up_after_storing -= 1
                    host.unanswered.append([s["seq"] for s in samples])
                self.plane.changed.notify_all()
            if hang_up:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return None
            return self._answer(
                200,
                {"stored": stored, "duplicates": duplicates, "latest_allocation_version": latest},
            )
        self._answer(404, {"detail": f"no such endpoint {self.path}"})

    def do_GET(self) -> None:
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if self._failing():
            return
        if parts[:3] != ["api", "v1", "hosts"] or parts[4:] != ["allocation"]:
            return self._answer(404, {"detail": f"no such endpoint {self.path}"})
        host = self._host(int(parts[3]))
        if host is None:
            return
        query = parse_qs(url.query)
        after = int(query.get("after", ["0"])[0])
        wait = float(query.get("wait", ["0"])[0])
        if not 0 <= wait <= self.plane.max_wait_s:
            return self._answer(
                400, {"wait": [f"must be between 0 and {self.plane.max_wait_s:g} seconds"]}
            )
        deadline = time.monotonic() + (wait if self.plane.hold_polls else 0.0)
        with self.plane.changed:
            self.plane.polls += 1
            while True:
                if self.server.gone:  # type: ignore[attr-defined]
                    self.close_connection = True
                    return  # the connection is cut: the agent sees a network error
                if host.allocations and host.allocations[-1]["version"] > after:
                    allocation = host.allocations[-1]
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    allocation = None
                    break
                self.plane.changed.wait(left)
        if allocation is None:
            self._answer(204)
        else:
            self._answer(200, allocation)
