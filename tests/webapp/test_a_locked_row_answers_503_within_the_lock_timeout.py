"""A request that needs a row another transaction holds (a frozen tuning step, a stuck request)
answers 503 with Retry-After, naming the lock, within PostgreSQL's lock_timeout: before, it
waited on the row for as long as the holder lived (webapp/settings.py, webapp/database_guard.py).

The lock is held from a connection of the test's own, as a Celery worker's transaction would."""

import threading
import time

import psycopg
import pytest
from django.conf import settings
from django.conf import settings as django_settings
from django.db import connection

from webapp.database_guard import LOCKED_DETAIL

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
        reason="lock_timeout is PostgreSQL's; SQLite waits its busy timeout (30 s)",
    ),
]

# The bound plus a second for the request's own work on a loaded 2-core machine.
SLACK_S = 3.0
# The requests' lock_timeout here (the default is 5 s, INTUNE_DB_LOCK_TIMEOUT_S): the bound is
# the server's, read from the connection's options, however long it is.
SHORT_LOCK_TIMEOUT_S = 1.0


@pytest.fixture
def short_lock_timeout(settings):
    """Connections wait SHORT_LOCK_TIMEOUT_S for a row lock, as INTUNE_DB_LOCK_TIMEOUT_S=1
    sets it in production: lock_timeout in the connections' options (webapp/settings.py), and
    DB_LOCK_TIMEOUT_S, which the assertions read. The connection pool is made again, so that
    its connections are opened with these options (and again after, with the default)."""
    options = django_settings.DATABASES["default"]["OPTIONS"]
    before = options["options"]
    default_ms = f"lock_timeout={round(settings.DB_LOCK_TIMEOUT_S * 1000)}"
    assert default_ms in before, before
    _new_pool()
    options["options"] = before.replace(
        default_ms, f"lock_timeout={round(SHORT_LOCK_TIMEOUT_S * 1000)}"
    )
    settings.DB_LOCK_TIMEOUT_S = SHORT_LOCK_TIMEOUT_S
    try:
        yield
    finally:
        options["options"] = before
        _new_pool()


def _new_pool() -> None:
    """The pool's connections closed: the next ones are opened with the options then set."""
    connection.close()
    if connection.settings_dict["OPTIONS"].get("pool"):
        connection.close_pool()


def _holder():
    """A connection of its own to the test database, outside Django's pool."""
    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        autocommit=False,
    )


def _timed(call):
    """Run ``call`` in a thread with a hard bound; fail (not hang) if it outlives it."""
    outcome = {}

    def run():
        began = time.monotonic()
        try:
            outcome["response"] = call()
        finally:
            outcome["took"] = time.monotonic() - began
            connection.close()  # this thread's pooled connection goes back

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(settings.DB_LOCK_TIMEOUT_S + 30)
    assert not thread.is_alive(), "the request was still waiting on the locked row"
    return outcome["response"], outcome["took"]


def test_every_connection_carries_the_lock_and_idle_transaction_bounds():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('lock_timeout', 'idle_in_transaction_session_timeout')"
        )
        bounds = dict(cursor.fetchall())
    assert bounds == {
        "lock_timeout": str(round(settings.DB_LOCK_TIMEOUT_S * 1000)),
        "idle_in_transaction_session_timeout": str(
            round(settings.DB_IDLE_IN_TRANSACTION_TIMEOUT_S * 1000)
        ),
    }


def test_an_override_of_a_host_whose_row_is_held_answers_503_within_the_bound(
    api, operator, job_and_host, short_lock_timeout
):
    _, host, _ = job_and_host
    workers = {"read": 2, "parse": 3, "transform": 3, "collate": 1, "prefetch": 1}
    holder = _holder()
    try:
        holder.execute("SELECT id FROM jobs_host WHERE id = %s FOR UPDATE", (host.pk,))
        client = api.as_user(operator)
        response, took = _timed(
            lambda: client.put(
                f"/api/v1/hosts/{host.pk}/override/",
                {"workers": workers, "reason": "x"},
                format="json",
            )
        )
    finally:
        holder.rollback()
        holder.close()
    assert response.status_code == 503, response.content
    assert response["Retry-After"]
    assert response.json()["detail"] == LOCKED_DETAIL
    assert took < settings.DB_LOCK_TIMEOUT_S + SLACK_S, took
    # Nothing half-done: no new version; and once the lock is gone the same request succeeds.
    assert host.allocations.count() == 1
    again = client.put(
        f"/api/v1/hosts/{host.pk}/override/", {"workers": workers, "reason": "x"}, format="json"
    )
    assert again.status_code == 200, again.content


def test_an_agents_batch_for_a_host_whose_row_is_held_answers_503_within_the_bound(
    api, job_and_host, sample, short_lock_timeout
):
    job, host, token = job_and_host
    holder = _holder()
    try:
        # The batch updates its host's row (last seen, newest sequence number): a plain UPDATE
        # waits on the row lock as select_for_update does.
        holder.execute("SELECT id FROM jobs_host WHERE id = %s FOR UPDATE", (host.pk,))
        client = api.as_agent(token)
        batch = {"samples": [sample(1, job.stage_names)]}
        response, took = _timed(
            lambda: client.post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
        )
    finally:
        holder.rollback()
        holder.close()
    assert response.status_code == 503, response.content
    assert response.json()["detail"] == LOCKED_DETAIL
    assert took < settings.DB_LOCK_TIMEOUT_S + SLACK_S, took
    stored = client.post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
    assert stored.status_code == 200, stored.content
