"""A live stack's database is dropped in the background when the stack stops; the session waits
for every such drop at its end and reports any that failed (tests/support/live_stack.py)."""

import os

import pytest

from tests.support.live_stack import FreshDatabase, wait_for_pending_drops
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(
    not os.getenv("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
    reason="databases are created and dropped on PostgreSQL only (DATABASE_URL)",
)


def databases_named(name: str) -> list[str]:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname = %s", (name,))
        return [row[0] for row in rows.fetchall()]


def test_a_database_dropped_in_the_background_is_gone_once_the_drops_are_waited_for(tmp_path):
    database = FreshDatabase(tmp_path)
    database.create()
    assert databases_named(database.name) == [database.name]
    database.drop(wait=False)
    assert wait_for_pending_drops(60) == []
    assert databases_named(database.name) == []


def test_a_background_drop_that_fails_is_reported_with_its_database(tmp_path, monkeypatch):
    database = FreshDatabase(tmp_path)
    database.create()
    try:
        unreachable = f"postgres://postgres@127.0.0.1:{free_port()}/postgres"
        monkeypatch.setattr(database, "base_url", unreachable)
        database.drop(wait=False)
        left = wait_for_pending_drops(60)
        assert len(left) == 1 and left[0].startswith(f"{database.name}: "), left
    finally:
        monkeypatch.undo()
        database.drop()
    assert databases_named(database.name) == []
