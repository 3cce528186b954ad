"""A fingerprint of a live stack's whole database, to show that a refused request changed
nothing: one digest per table of every row (PostgreSQL or SQLite, as FreshDatabase makes)."""

from __future__ import annotations

import hashlib
import sqlite3
from urllib.parse import urlsplit

# Rows that change without any request (a browser's session).
IGNORED_TABLES = frozenset({"django_session"})


def fingerprint(database_url: str) -> dict[str, str]:
    """``{table: digest of its rows}`` of the database at ``database_url``."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(urlsplit(database_url).path) as conn:
            tables = [
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return {
                table: _digest(conn.execute(f'SELECT * FROM "{table}"').fetchall())
                for table in tables
                if table not in IGNORED_TABLES
            }
    import psycopg

    with psycopg.connect(database_url) as conn:
        tables = [
            row[0]
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        return {
            table: _digest(conn.execute(f'SELECT * FROM "{table}"').fetchall())
            for table in tables
            if table not in IGNORED_TABLES
        }


def _digest(rows) -> str:
    return hashlib.sha256("\n".join(sorted(map(repr, rows))).encode()).hexdigest()


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The tables whose rows differ."""
    return sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))
