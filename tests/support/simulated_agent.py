"""A simulated agent: a real HTTP client that speaks the agent protocol, for tests about the
control plane rather than the pipeline."""

import threading
import time

import httpx


class SimulatedAgent(threading.Thread):
    """A stand-in for the agent where the test is about the control plane, not the pipeline: a
    real HTTP client that speaks the agent protocol (metrics at ``hz``, allocation long-poll,
    applied versions), reporting throughput that grows with the workers it was given."""

    def __init__(self, url: str, host_id: int, token: str, stages: list[str], hz: float = 4.0):
        super().__init__(daemon=True)
        self.url, self.host_id, self.stages, self.hz = url, host_id, stages, hz
        self.headers = {"Authorization": f"Agent {token}"}
        self.stop_event = threading.Event()
        self.workers = {s: 1 for s in stages}
        self.version = 0
        self.seq = int(time.time() * 1000)
        self.sent = 0
        self.errors: list[str] = []
        self.retried = 0  # batches sent again after a 429 or 503 (see _post)
        self._poller = threading.Thread(target=self._long_poll, daemon=True)

    def _long_poll(self):
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=40) as client:
            while not self.stop_event.is_set():
                try:
                    r = client.get(
                        f"/api/v1/hosts/{self.host_id}/allocation/",
                        params={"after": self.version, "wait": 5},
                    )
                    if r.status_code == 200:
                        self.workers, self.version = r.json()["workers"], r.json()["version"]
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                    time.sleep(0.5)

    def run(self):
        self._poller.start()
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as client:
            while not self.stop_event.is_set():
                self.seq += 1
                rate = 1000.0 * min(self.workers.values())
                sample = {
                    "seq": self.seq,
                    "ts": time.time(),
                    "allocation_version": self.version,
                    "host": {
                        "cpus": 8.0,
                        "cpu_percent": 50.0,
                        "memory_used_mb": 1000.0,
                        "memory_limit_mb": 16384.0,
                    },
                    "trainer": {"throughput": rate, "idle_fraction": 0.3},
                    "stages": [
                        {
                            "name": s,
                            "workers": self.workers[s],
                            "items_per_s": rate,
                            "busy_fraction": 0.9,
                            "out_queue": 1,
                            "queue_capacity": 8,
                            "rss_mb": 50.0 * self.workers[s],
                        }
                        for s in self.stages
                    ],
                }
                body = {"samples": [sample], "allocation_status": {"applied_version": self.version}}
                self._post(client, body)
                self.stop_event.wait(1 / self.hz)

    def _post(self, client: httpx.Client, body: dict) -> None:
        """Send a batch; a 429 or 503 (the protocol's "retry after Retry-After": a row locked
        past the lock timeout by a tuning step whose worker was killed, the database away) is
        sent again after that wait, up to 5 times, and counted in ``retried``; any other
        answer but 200 is an error."""
        for _ in range(6):
            try:
                r = client.post(f"/api/v1/hosts/{self.host_id}/metrics/", json=body)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
                return
            if r.status_code == 200:
                self.sent += 1
                return
            if r.status_code not in (429, 503) or "Retry-After" not in r.headers:
                break
            self.retried += 1
            if self.stop_event.wait(min(5.0, float(r.headers["Retry-After"]))):
                return
        self.errors.append(f"{r.status_code} {r.text[:200]}")

    def stop(self):
        self.stop_event.set()
        self.join(timeout=10)
