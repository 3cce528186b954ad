"""Generated sequences of 1 to 4 faults, at generated moments, under a running system: the web
server killed (SIGKILL) or stopped (SIGTERM) and started again, the Celery worker killed and
another started, Redis restarted, a service paused (SIGSTOP) for a few seconds, and in the long
form PostgreSQL restarted. The real agent (``python -m agents``, a real pipeline: what is
checked is its buffer and resend) runs with a tuning session on throughout.

Once the faults end and the stack is healthy: every sample the agent took is stored exactly once
(its state file's last shipped sequence number against the database, no gap, none twice, none
dropped), the agent is still running and applies an allocation published after recovery, the
session takes decisions again, every request made during the faults and the recovery ended
within its bound (no process was left hung), and the logs say what happened.

Redis and PostgreSQL are servers of this module's own (tests/reliability/servers.py): the
machine's shared ones serve other tests. The short form (make test) uses the shared PostgreSQL
and leaves PostgreSQL restarts to the long form, whose private cluster costs a fresh migration.
"""

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from agents.daemon.state import AgentState
from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

from .conftest import count_samples, register, start_agent
from .servers import PrivatePostgres, PrivateRedis

pytestmark = pytest.mark.slow

SHORT_FAULTS = (
    "kill web",
    "terminate web",
    "kill worker",
    "restart redis",
    "pause web",
    "pause worker",
    "pause redis",
)
LONG_FAULTS = SHORT_FAULTS + ("restart postgres",)

# A request made while the faults go on may wait out a pause (the server holds it, then answers)
# but no more than this beyond the longest pause: a request that waits longer found a hung
# process. The probes' own client timeout is above it, so a hang is measured, not cut short.
REQUEST_BOUND_S = 15.0
RECOVERY_BOUND_S = 60.0

# Like the other generated tests: no deadline (a case takes seconds), the failing case printed
# for @reproduce_failure, no shrinking (a case that fails is rerun by hand, not shrunk through
# dozens of stack-wide fault runs).
PROFILE = dict(
    deadline=None,
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[],
)


@dataclass(frozen=True)
class Fault:
    kind: str
    after_s: float  # from the end of the fault before
    length_s: float  # how long the service stays down or paused


def fault_plans(kinds: tuple[str, ...], min_faults: int, max_faults: int):
    fault = st.builds(
        Fault,
        kind=st.sampled_from(kinds),
        after_s=st.floats(0.0, 3.0).map(lambda s: round(s, 1)),
        length_s=st.floats(0.5, 4.0).map(lambda s: round(s, 1)),
    )
    return st.lists(fault, min_size=min_faults, max_size=max_faults)


@dataclass
class Probe:
    """Requests made in a loop while the faults go on and the stack recovers: how long each took
    and how it ended."""

    url: str
    agent_token: str
    host_id: int
    results: list = field(default_factory=list)  # (what, seconds, outcome)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Agent {self.agent_token}"}
        # No retries and a timeout well past the bound: a hang shows up as a long request.
        with httpx.Client(base_url=self.url, headers=headers, timeout=REQUEST_BOUND_S + 30) as c:
            while not self.stop.is_set():
                for what, send in (
                    ("healthz", lambda: c.get("/healthz")),
                    (
                        "long-poll",
                        lambda: c.get(
                            f"/api/v1/hosts/{self.host_id}/allocation/",
                            params={"after": 10**6, "wait": 1},
                        ),
                    ),
                ):
                    started = time.monotonic()
                    try:
                        outcome = str(send().status_code)
                    except httpx.TimeoutException as exc:
                        outcome = f"timeout {type(exc).__name__}"
                    except httpx.HTTPError as exc:
                        outcome = type(exc).__name__  # refused or reset: the server is away
                    self.results.append((what, time.monotonic() - started, outcome))
                self.stop.wait(0.3)


class FaultyStack:
    """The live stack, its private servers, and the faults done to them (reusing LiveStack's
    process group: the same kill, stop and start the one-fault tests use)."""

    def __init__(self, stack: LiveStack, redis: PrivateRedis, postgres: PrivatePostgres | None):
        self.stack, self.redis, self.postgres = stack, redis, postgres
        self.worker = "worker"
        self.workers_started = 1
        self.done: list[str] = []

    def _pid(self, service: str) -> int:
        if service == "redis":
            return self.redis.process.pid
        return self.stack.group.children[self.worker if service == "worker" else service].pid

    def apply(self, fault: Fault) -> None:
        action, _, service = fault.kind.partition(" ")
        started = time.monotonic()
        if action == "pause":
            pid = self._pid(service)
            # The whole group: gunicorn's and Celery's children with their master.
            kill = os.killpg if service != "redis" else os.kill
            kill(pid, signal.SIGSTOP)
            try:
                time.sleep(fault.length_s)
            finally:
                kill(pid, signal.SIGCONT)
        elif fault.kind == "kill web":
            self.stack.group.kill("web")
            time.sleep(fault.length_s)
            self.stack.start_service("web")
        elif fault.kind == "terminate web":
            self.stack.group.stop("web")  # gunicorn's graceful stop, bounded by group.stop
            time.sleep(fault.length_s)
            self.stack.start_service("web")
        elif fault.kind == "kill worker":
            self.stack.group.kill(self.worker)
            time.sleep(fault.length_s)
            self.workers_started += 1
            self.worker = f"worker-{self.workers_started}"
            self.stack.start_service("worker", instance=self.worker)
        elif fault.kind == "restart redis":
            self.redis.stop()
            time.sleep(fault.length_s)
            self.redis.start()
        elif fault.kind == "restart postgres":
            self.postgres.stop()
            time.sleep(fault.length_s)
            self.postgres.start()
        else:
            raise AssertionError(f"unknown fault {fault.kind!r}")
        self.done.append(f"{fault.kind} ({time.monotonic() - started:.1f} s)")

    def assert_alive(self) -> None:
        """No process of the stack (nor the agent) exited by itself; else its log's end."""
        dead = self.stack.group.poll_dead()
        assert not dead, f"processes died: {dead}\n{self.stack.log(dead[0])[-4000:]}"

    def wait(self, condition, timeout: float, what: str):
        """wait_until, failing at once (with the log) when a process of the stack died."""
        result = wait_until(lambda: self.stack.group.poll_dead() or condition(), timeout, what=what)
        self.assert_alive()
        return result

    def healthy(self) -> bool:
        answer = httpx.get(f"{self.stack.url}/healthz", timeout=5)
        return answer.status_code == 200 and answer.json().get("redis") == "ok"


# What the logs say after each fault, where something is sure to notice it: the agent's client
# while the web server is away (its long-poll is always held, so it is cut), the worker's
# consumer when Redis goes, the web server when PostgreSQL goes (the probes' requests meet it).
# A pause or a killed worker may pass unnoticed (the next task waits in Redis), so asks nothing.
SAID = {
    "kill web": ("agent", ("training goes on",)),
    "terminate web": ("agent", ("training goes on",)),
    "restart redis": ("worker", ("Connection to broker lost",)),
    # A request during the outage (503, "unavailable"), or a dead pooled connection found after.
    "restart postgres": ("web", ("unavailable", "error connecting", "discarding closed")),
}


class LogMarks:
    """The size of each log of the stack at a moment; ``since`` reads what was written after."""

    def __init__(self, stack: LiveStack):
        self.directory = stack.directory / "logs"
        self.sizes = {p.name: p.stat().st_size for p in self.directory.glob("*.log")}

    def since(self, name: str) -> str:
        """What the log ``name`` (each of ``name``'s instances: worker, worker-2...) got since."""
        text = []
        paths = [self.directory / f"{name}.log", *self.directory.glob(f"{name}-*.log")]
        for path in sorted(p for p in set(paths) if p.exists()):
            with open(path, "rb") as f:
                f.seek(self.sizes.get(path.name, 0))
                text.append(f.read().decode(errors="replace"))
        return "\n".join(text)


def tuning(api: httpx.Client, job_id: int) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}/tuning/").raise_for_status().json()[0]


def run_case(faulty: FaultyStack, plan: list[Fault], agent_dir) -> dict:
    stack = faulty.stack
    faulty.wait(faulty.healthy, RECOVERY_BOUND_S, "a healthy stack before the case")
    host = register(stack, decision_interval_s=1)
    agent = f"agent-{host.host_id}"
    state_dir = agent_dir / agent
    # The state file an agent that registered itself keeps: the agent then writes the last
    # sequence number it shipped there when it stops (an agent given only --host-id keeps none).
    AgentState(url=stack.url, host_id=host.host_id, agent_token=host.token).save(state_dir)
    start_agent(stack, host, state_dir, name=agent)
    api = stack.client(host.api_token)
    api.post(f"/api/v1/jobs/{host.job_id}/tuning/", json={"tuner": "random"}).raise_for_status()
    faulty.wait(lambda: (count_samples(stack, host.host_id)["n"] or 0) >= 2, 60, "samples")
    faulty.wait(lambda: tuning(api, host.job_id)["steps"] >= 1, 60, "a first decision")
    first_seq = count_samples(stack, host.host_id)["first"]

    probe = Probe(stack.url, host.token, host.host_id)
    probing = threading.Thread(target=probe.run, daemon=True)
    probing.start()
    marks = LogMarks(stack)
    began = time.monotonic()
    for fault in plan:
        time.sleep(fault.after_s)
        faulty.apply(fault)
    faults_s = time.monotonic() - began

    faulty.wait(faulty.healthy, RECOVERY_BOUND_S, "a healthy stack after the faults")
    healthy_at = time.monotonic()
    # Healthy is not yet answering: right after a PostgreSQL restart the web server's pool may
    # have one connection back (the health check's) and answer others a clean 503 a while.
    steps_at_recovery = (
        faulty.wait(
            lambda: tuning(api, host.job_id)["steps"] + 1, RECOVERY_BOUND_S, "the API answering"
        )
        - 1
    )
    answering_s = time.monotonic() - healthy_at
    at_recovery = count_samples(stack, host.host_id)
    # A decision taken after recovery is published and applied by the agent that lived through
    # the faults; the session goes on.
    faulty.wait(
        lambda: count_samples(stack, host.host_id)["applied"] > (at_recovery["version"] or 0),
        RECOVERY_BOUND_S,
        f"the agent applying an allocation published after recovery ({at_recovery})",
    )
    allocation_s = time.monotonic() - healthy_at
    faulty.wait(
        lambda: tuning(api, host.job_id)["steps"] >= steps_at_recovery + 2,
        RECOVERY_BOUND_S,
        "two decisions after recovery",
    )
    session = tuning(api, host.job_id)
    assert session["status"] == "running", session
    probe.stop.set()
    probing.join(REQUEST_BOUND_S + 35)
    faulty.assert_alive()

    api.delete(f"/api/v1/jobs/{host.job_id}/tuning/").raise_for_status()
    stack.group.stop(agent)  # SIGTERM: the agent's last flush, then its state file
    stats = count_samples(stack, host.host_id)
    log = stack.log(agent)
    shipped = AgentState.load(state_dir).last_seq
    # Every sample taken, from the first stored before the faults to the last the agent says
    # it shipped, is stored once: none lost, none twice, none dropped from a full buffer.
    assert stats["first"] == first_seq, (stats, first_seq)
    assert stats["last"] == shipped, (stats, shipped)
    assert stats["n"] == stats["distinct"] == stats["last"] - stats["first"] + 1, stats
    assert stats["dropped"] == 0, stats
    assert "agent stopped; 0 samples were still buffered" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

    for fault in plan:
        if fault.kind in SAID:
            service, words = SAID[fault.kind]
            written = marks.since(agent if service == "agent" else service)
            assert any(w in written for w in words), f"{fault.kind}: no {words} in {service}'s log"

    decisions = api.get(f"/api/v1/hosts/{host.host_id}/decisions/", params={"limit": 500})
    steps = sorted(d["step"] for d in decisions.raise_for_status().json()["results"])
    assert steps == list(range(len(steps))), steps  # each step once: none taken twice
    api.close()

    longest_pause = max([f.length_s for f in plan if f.kind.startswith("pause")] or [0.0])
    slow = [r for r in probe.results if r[1] > longest_pause + REQUEST_BOUND_S]
    assert not slow, f"requests that hung past their bound: {slow}"
    assert probe.results, "no request was made during the faults"
    assert all(not o.startswith("timeout") for _, _, o in probe.results), probe.results
    # Answers are never a 5xx but the database's clean 503 (PostgreSQL away) or none at all.
    codes = {o for _, _, o in probe.results}
    assert not {c for c in codes if c.startswith("5") and c != "503"}, codes
    return {
        "faults": faulty.done[-len(plan) :],
        "faults_s": faults_s,
        "answering_s": answering_s,
        "allocation_s": allocation_s,
        "samples": stats["n"],
        "requests": len(probe.results),
        "slowest_s": max(r[1] for r in probe.results),
    }


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("chaos-redis")).start()
    yield server
    server.stop()


def live_stack(directory, redis: PrivateRedis, **kwargs) -> LiveStack:
    extra = {
        "REDIS_URL": redis.url,
        "INTUNE_STALLED_AFTER_S": "4",
        "INTUNE_AGENT_OFFLINE_AFTER_S": "3",
    }
    return LiveStack(directory, beat=True, extra_env=extra, **kwargs)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, private_redis, redis_url):
    with live_stack(tmp_path_factory.mktemp("chaos"), private_redis) as stack:
        yield FaultyStack(stack, private_redis, None)


def report(case: dict) -> None:
    print(
        f"{' -> '.join(case['faults'])}: faults {case['faults_s']:.1f} s, API answering "
        f"{case['answering_s']:.1f} s after healthy, allocation applied "
        f"{case['allocation_s']:.1f} s after recovery, {case['samples']} samples once each, "
        f"{case['requests']} requests, slowest {case['slowest_s']:.1f} s"
    )


def test_two_generated_faults_lose_nothing_and_recover(faulty, tmp_path_factory):
    @settings(max_examples=1, **PROFILE)
    @given(plan=fault_plans(SHORT_FAULTS, 2, 2))
    def case(plan):
        report(run_case(faulty, plan, tmp_path_factory.mktemp("agents")))

    case()


@pytest.fixture(scope="module")
def faulty_with_postgres(tmp_path_factory, private_redis, redis_url):
    postgres = PrivatePostgres().init()
    postgres.start()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("DATABASE_URL", f"{postgres.url}?connect_timeout=1")
            stack = live_stack(
                tmp_path_factory.mktemp("chaos-pg"),
                private_redis,
                web_env={"INTUNE_DB_POOL_TIMEOUT_S": "1"},
            )
            stack.drop_in_background = False  # the cluster is removed right after the module
            with stack:
                yield FaultyStack(stack, private_redis, postgres)
    finally:
        postgres.remove()


@pytest.mark.soak
def test_generated_fault_sequences_lose_nothing_and_recover(faulty_with_postgres, tmp_path_factory):
    @settings(max_examples=int(os.getenv("INTUNE_CHAOS_CASES", "25")), **PROFILE)
    @given(plan=fault_plans(LONG_FAULTS, 1, 4))
    def case(plan):
        report(run_case(faulty_with_postgres, plan, tmp_path_factory.mktemp("agents")))

    case()
