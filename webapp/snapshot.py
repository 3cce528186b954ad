"""Reads that see one moment of the database.

Under PostgreSQL's default isolation (read committed) every statement sees what was committed
when it began, so an answer built from several queries can mix two moments: a host's row read
before an agent's batch committed, and its newest allocation read after it (status "applied",
while the host still says the version before). ``snapshot()`` runs its block in one read-only
repeatable-read transaction, so every query in it sees the same moment. SQLite's transactions
already do.
"""

from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def snapshot():
    """Run the block's queries in one transaction that sees a single moment of the database."""
    with transaction.atomic():
        # Only as the outermost transaction's first statement (inside another one, as in a
        # test's, the block keeps that transaction's isolation).
        if connection.vendor == "postgresql" and len(connection.atomic_blocks) == 1:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
