"""An agent written from docs/agent-protocol.md alone, in another language (Node.js, its standard
library only: tests/http_clients/node_agent/agent.mjs), against a real control plane: the doc is
the contract for third parties, so what it promises must hold for an agent that knows nothing
else. It registers its job and host through the API, ships batches, holds the allocation
long-poll, checks every allocation (applies it, or refuses it and says why), and handles every
status the doc lists: a 400 naming one sample, 413, 429 with Retry-After, 401, the server gone.

The agent writes one JSON event a line; the tests read them and the control plane's records.
"""

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("node") is None,
        reason="node is not installed: the third-party agent of these tests is a Node.js script "
        "(scripts/ensure-test-tools installs Debian's nodejs)",
    ),
]

AGENT = Path(__file__).parent / "node_agent" / "agent.mjs"
STAGES = [{"name": "read", "max_workers": 8}, {"name": "parse", "max_workers": 8}]
# The stack's limits, low enough that an agent reaches them in a second: a per-host rate the
# other tests' agents stay under (4 batches and a poll or two a second), and fewer samples per
# batch than the protocol's 600, as a control plane may set (INTUNE_MAX_SAMPLES_PER_BATCH).
RATE_PER_S = 10
MAX_SAMPLES = 50
# What docs/agent-protocol.md lists for the agents' two endpoints.
ANSWERS = {200, 204, 400, 401, 403, 409, 413, 415, 429, 503}
NODE_S = 60  # the bound on any one run of the agent, beyond its own seconds
# The agent's own run time where the test stops it (``Run.stop_once``) once what it waits for
# is done: only a cap, past every wait of the test (version 1 within 20 s, then up to 30 s).
# A run time of 6 s stopped the agent by itself on a loaded machine before the override of
# the test reached it, and the test then waited 30 s for what could no longer come (the
# clean-clone CI of 2026-11-29 19:37).
STOPPED_BY_TEST_S = 90


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url):
    env = {
        "INTUNE_AGENT_RATE": f"{RATE_PER_S}/s",
        "INTUNE_MAX_SAMPLES_PER_BATCH": str(MAX_SAMPLES),
    }
    with LiveStack(tmp_path_factory.mktemp("node-agent"), extra_env=env) as live:
        live.operator = live.create_user(f"op-{uuid.uuid4().hex[:6]}")["token"]
        yield live


def node(command: str, config: dict, directory: Path, **popen) -> subprocess.Popen:
    path = directory / f"{command}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen(
        ["node", str(AGENT), command, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=directory, **popen,
    )  # fmt: skip


def register(stack, tmp_path, hosts: int = 1) -> dict:
    """The job and its hosts, registered by the Node script as the doc and schema say."""
    config = {
        "url": stack.url,
        "operator_token": stack.operator,
        "job_name": f"node-{uuid.uuid4().hex[:6]}",
        "stages": STAGES,
        "cpus": 4,
        "memory_mb": 16384,
        "hosts": hosts,
    }
    process = node("register", config, tmp_path)
    out, err = process.communicate(timeout=NODE_S)
    assert process.returncode == 0, err.decode()
    return config | json.loads(out)


def agent_config(registered: dict, **settings) -> dict:
    base = {
        "url": registered["url"],
        "hosts": registered["hosts"],
        "stages": STAGES,
        "cpus": registered["cpus"],
        "memory_mb": registered["memory_mb"],
        "sample_interval_s": 0.25,
        "batch_every": 1,
        "poll_wait_s": 20,
        "seconds": STOPPED_BY_TEST_S,
    }
    return base | settings


class Run:
    """One run of the agent in the background; its events are read as it writes them
    (``wait_for``), ``finish`` waits for the last of them."""

    def __init__(self, config: dict, directory: Path):
        self.config = config
        self.process = node("run", config, directory)
        self.events: list[dict] = []
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in (
                (self.process.stdout, self.lines),
                (self.process.stderr, self.errors),
            )
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.decode())

    def wait_for(self, kind: str, description: str, bound_s: float = 30, **match) -> dict:
        """The first event of ``kind`` with ``match``'s values the agent has written, waited for
        ``bound_s`` at most."""

        def written():
            events = [json.loads(line) for line in list(self.lines) if line.strip()]
            return next(
                (
                    e
                    for e in events
                    if e.get("event") == kind and all(e.get(k) == v for k, v in match.items())
                ),
                None,
            )

        return wait_until(written, bound_s, interval=0.05, what=description)

    def stop_once(self, condition, what: str, bound_s: float = 30) -> None:
        """SIGTERM the agent (it stops, then ships what it buffered) once ``condition`` holds:
        what a test waits for is done, and its ``seconds`` would only be waited out."""
        wait_until(condition, bound_s, what=what)
        self.process.terminate()

    def finish(self) -> list[dict]:
        self.process.wait(timeout=self.config["seconds"] + NODE_S)
        for reader in self.readers:  # the pipes close with the agent
            reader.join(10)
        assert self.process.returncode == 0, "".join(self.errors)
        self.events = [json.loads(line) for line in self.lines if line.strip()]
        answered = {e["status"] for e in self.events if e["event"] in ("batch", "poll", "retry")}
        # Every answer is one the doc lists for these endpoints (None: no answer, the server
        # away); a 500 or a 502 would be a defect whatever the agent made of it.
        assert answered <= ANSWERS | {None}, answered - ANSWERS
        return self.events

    def of(self, kind: str, **match) -> list[dict]:
        return [
            e
            for e in self.events
            if e["event"] == kind and all(e.get(k) == v for k, v in match.items())
        ]

    @property
    def summary(self) -> dict:
        (summary,) = self.of("summary")
        return summary


def host_record(stack, host_id: int) -> dict:
    with stack.client(stack.operator) as api:
        return api.get(f"/api/v1/hosts/{host_id}/").json()


def override(stack, host_id: int, body: dict) -> dict:
    with stack.client(stack.operator) as api:
        answer = api.put(f"/api/v1/hosts/{host_id}/override/", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stored_once(stack, registered: dict, summary: dict) -> None:
    """Every sample the agent made and did not drop on purpose is stored, once."""
    assert summary["buffered"] == 0 and summary["fatal"] is None, summary
    # A batch whose answer was lost is sent again and counted a duplicate then, not stored.
    assert summary["stored"] + summary["duplicates"] >= summary["generated"] - summary["invalid"]
    assert stack.stored_samples(registered["job_id"]) == summary["generated"] - summary["invalid"]


def test_a_node_agent_ships_its_metrics_and_applies_an_override(stack, tmp_path):
    registered = register(stack, tmp_path)
    host_id = registered["hosts"][0]["id"]
    run = Run(agent_config(registered), tmp_path)
    wait_until(lambda: host_record(stack, host_id)["applied_version"] == 1, 20, what="version 1")
    version = override(stack, host_id, {"workers": {"read": 2, "parse": 3}, "reason": "node"})[
        "version"
    ]
    run.stop_once(lambda: host_record(stack, host_id)["applied_version"] == version, "override")
    run.finish()
    assert [e["version"] for e in run.of("applied")] == [1, version]
    record = host_record(stack, host_id)
    assert record["applied_version"] == version and record["allocation"]["status"] == "applied"
    stored_once(stack, registered, run.summary)


def test_a_node_agent_refuses_a_layout_it_cannot_run_and_the_refusal_is_recorded(stack, tmp_path):
    registered = register(stack, tmp_path)
    host_id = registered["hosts"][0]["id"]
    run = Run(agent_config(registered), tmp_path)
    wait_until(lambda: host_record(stack, host_id)["applied_version"] == 1, 20, what="version 1")
    fused = {"workers": {"read+parse": 2}, "layout": [["read", "parse"]], "reason": "fuse"}
    version = override(stack, host_id, fused)["version"]
    run.stop_once(
        lambda: host_record(stack, host_id)["allocation"]["status"] == "refused", "the refusal"
    )
    run.finish()
    (refused,) = run.of("refused")
    assert refused["version"] == version
    allocation = host_record(stack, host_id)["allocation"]
    assert allocation["status"] == "refused"
    assert allocation["refusal_reason"] == refused["reason"]
    assert host_record(stack, host_id)["applied_version"] == 1
    stored_once(stack, registered, run.summary)


def test_a_node_agent_drops_only_the_sample_a_400_names(stack, tmp_path):
    registered = register(stack, tmp_path)
    run = Run(agent_config(registered, batch_every=4, invalid_samples=[2]), tmp_path)
    # The batch with the invalid sample (3 stored of its 4) and the next one.
    run.stop_once(lambda: stack.stored_samples(registered["job_id"]) >= 7, "two batches stored")
    run.finish()
    (dropped,) = run.of("dropped_invalid")
    assert re.match(r"samples\[\d\]\.stages\[0\]\.busy_fraction: ", dropped["detail"]), dropped
    assert run.summary["invalid"] == 1
    stored_once(stack, registered, run.summary)


def test_a_node_agent_sends_smaller_batches_after_a_413_and_loses_nothing(stack, tmp_path):
    registered = register(stack, tmp_path)
    # 4 * MAX_SAMPLES samples a batch, more than this control plane takes.
    config = agent_config(registered, sample_interval_s=0.01, batch_every=4 * MAX_SAMPLES)
    run = Run(config | {"seconds": 3}, tmp_path)
    run.finish()
    # Before: 400 ("at most 50 samples"), and an agent never retries a 400: it dropped them.
    assert run.of("batch", status=413) and run.of("smaller_batches")
    assert not run.of("dropped_batch")
    stored_once(stack, registered, run.summary)


def test_a_node_agent_waits_out_retry_after_on_429_and_loses_nothing(stack, tmp_path):
    registered = register(stack, tmp_path)
    # About 50 batches a second against a limit of RATE_PER_S a host.
    run = Run(agent_config(registered, sample_interval_s=0.02, seconds=3), tmp_path)
    run.finish()
    limited = run.of("retry", what="batch", status=429)
    assert limited, "the agent never reached the rate limit"
    for retry in limited:
        assert retry["retry_after"] is not None and 0 < retry["retry_after"] <= 60, retry
    stored_once(stack, registered, run.summary)


def test_a_node_agent_stops_at_a_401_saying_why(stack, tmp_path):
    registered = register(stack, tmp_path)
    registered["hosts"][0]["agent_token"] = "ia_" + "x" * 43
    run = Run(agent_config(registered, seconds=5), tmp_path)
    started = time.monotonic()
    run.finish()
    assert run.summary["fatal"] == {"status": 401, "detail": "unknown agent token"}
    assert time.monotonic() - started < 5, "the agent kept going after a 401"


def test_a_node_agent_rides_out_a_web_server_restart_and_loses_nothing(stack, tmp_path):
    registered = register(stack, tmp_path)
    host_id = registered["hosts"][0]["id"]
    run = Run(agent_config(registered, poll_wait_s=30), tmp_path)
    wait_until(lambda: host_record(stack, host_id)["applied_version"] == 1, 20, what="version 1")
    stack.group.kill("web")
    # The agent buffers, its requests refused: the server is started again once a batch has
    # been refused (it slept a fixed 3 s here), and is away while it starts.
    run.wait_for("retry", "a batch refused while the server is away", what="batch", status=None)
    stack.start_service("web")
    stack.wait_healthy()
    version = override(stack, host_id, {"workers": {"read": 3, "parse": 2}, "reason": "after"})[
        "version"
    ]
    run.stop_once(lambda: host_record(stack, host_id)["applied_version"] == version, "the override")
    run.finish()
    assert run.of("retry", status=None), "no request failed while the server was away"
    # The long-poll came back: the override made after the restart reached the agent.
    assert [e["version"] for e in run.of("applied")] == [1, version]
    assert host_record(stack, host_id)["applied_version"] == version
    stored_once(stack, registered, run.summary)


def test_the_node_agent_is_standard_library_only():
    # A third party's agent needs nothing installed beyond node: no package imports.
    imports = [line for line in AGENT.read_text().splitlines() if line.startswith("import ")]
    assert imports and all('from "node:' in line for line in imports), imports
    assert not (AGENT.parent / "package.json").exists()
    assert os.access(AGENT, os.R_OK)


def block_connections(stack, allowed: bool) -> None:
    """Let the stack's database take connections, or refuse them and end those it has (the
    database away, as for an agent; the shared PostgreSQL server is untouched)."""
    import psycopg

    name = stack.database.name
    with psycopg.connect(stack.database.base_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


def test_a_node_agent_waits_out_a_503_while_the_database_is_away_and_loses_nothing(stack, tmp_path):
    if not stack.database.url.startswith(("postgres://", "postgresql://")):
        pytest.skip("the database is taken away through PostgreSQL (DATABASE_URL names none)")
    registered = register(stack, tmp_path)
    host_id = registered["hosts"][0]["id"]
    run = Run(agent_config(registered), tmp_path)
    wait_until(lambda: host_record(stack, host_id)["applied_version"] == 1, 20, what="version 1")
    block_connections(stack, allowed=False)
    try:
        # Away until a batch has been answered 503 (a fixed 4 s before).
        run.wait_for("retry", "a batch answered 503", what="batch", status=503)
    finally:
        block_connections(stack, allowed=True)
    stored = stack.stored_samples(registered["job_id"])
    # The agent ships again by itself, after its Retry-After, before it is stopped.
    run.stop_once(
        lambda: stack.stored_samples(registered["job_id"]) > stored, "a batch after the outage"
    )
    run.finish()
    unavailable = run.of("retry", what="batch", status=503)
    assert unavailable, "no batch was answered 503 while the database was away"
    assert all(retry["retry_after"] == 5 for retry in unavailable), unavailable
    stored_once(stack, registered, run.summary)
