"""Multi-row INSERTs for the ingestion path, written once per table and run as plain SQL.

A fleet posts hundreds of batches a second, and each batch is a few rows in two tables. The
ORM's ``bulk_create`` compiles its statement anew on every call, and with ``ignore_conflicts``
it cannot say which rows it skipped, so duplicates had to be looked for first (a SELECT per
batch). Writing a batch this way took a request from 4.9 to 4.3 ms of CPU (measured in
process, PostgreSQL). Here the statement is
``INSERT ... VALUES (...), (...) [ON CONFLICT (...) DO NOTHING] [RETURNING ...]``, which
PostgreSQL and SQLite (3.35+) both run; values still go through each field's own
``get_db_prep_save``, so JSON, foreign keys and the like are stored as the ORM would store them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DataError, connection, connections
from django.db.models import Model

# SQLSTATE of BatchInsertPostgres's whole-batch check (division_by_zero).
DIVISION_BY_ZERO = "22012"


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A cursor of Django's PostgreSQL connection (its transaction, its errors as Django's) that
    binds parameters on the server, so that ``execute(..., prepare=True)`` plans a statement
    once per connection instead of on every call. Django's own cursors bind on the client and
    never prepare (for transaction-pooling proxies such as PgBouncer: set
    ``INTUNE_DB_PREPARED_STATEMENTS=False`` behind one).

    One cursor is kept per connection (a new one when the connection is replaced): making one
    and reaching Django's connection through its proxy cost about 75 us of the 180 us of the
    token lookup (in process, PostgreSQL), and every agent request runs one or two of these."""
    import psycopg

    db = connections[DEFAULT_DB_ALIAS]
    if db.connection is None:
        db.ensure_connection()
    cursor = db.__dict__.get("intune_kept_cursor")
    if cursor is None or cursor.connection is not db.connection or cursor.closed:
        cursor = db.intune_kept_cursor = psycopg.Cursor(db.connection)
    with db.wrap_database_errors:
        yield cursor


def prepare() -> bool:
    """Whether the ingestion path's statements are prepared (INTUNE_DB_PREPARED_STATEMENTS)."""
    return settings.INTUNE_DB_PREPARED_STATEMENTS


class MultiRowInsert:
    """INSERTs of many rows of ``model`` at once, given as mappings of attribute names.

    ``columns`` are attribute names (``host_id`` for a foreign key); ``skip_conflicts_on``
    names the columns of a unique constraint whose duplicates are skipped; ``returning``, the
    columns the statement returns for the rows it inserted.
    """

    def __init__(
        self,
        model: type[Model],
        columns: Sequence[str],
        skip_conflicts_on: Sequence[str] = (),
        returning: Sequence[str] = (),
    ) -> None:
        fields = {f.attname: f for f in model._meta.concrete_fields}
        unknown = [c for c in [*columns, *skip_conflicts_on, *returning] if c not in fields]
        if unknown:
            raise ValueError(f"{model.__name__} has no column(s) {', '.join(unknown)}")
        self.fields = [fields[c] for c in columns]
        quote = connection.ops.quote_name
        self.head = (
            f"INSERT INTO {quote(model._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in self.fields)}) VALUES "
        )
        self.row = "(" + ", ".join(["%s"] * len(self.fields)) + ")"
        self.tail = ""
        if skip_conflicts_on:
            targets = ", ".join(quote(fields[c].column) for c in skip_conflicts_on)
            self.tail += f" ON CONFLICT ({targets}) DO NOTHING"
        if returning:
            self.tail += " RETURNING " + ", ".join(quote(fields[c].column) for c in returning)
        self.returns = bool(returning)

    def run(self, rows: Iterable[Mapping[str, Any]]) -> list[tuple]:
        """Insert ``rows`` (in as few statements as the database's limit on parameters
        allows); return what ``returning`` asks for, per row inserted (skipped duplicates
        return nothing)."""
        values = [
            [field.get_db_prep_save(row[field.attname], connection) for field in self.fields]
            for row in rows
        ]
        if not values:
            return []
        size = max(1, connection.ops.bulk_batch_size(self.fields, values))
        returned: list[tuple] = []
        with connection.cursor() as cursor:
            for start in range(0, len(values), size):
                chunk = values[start : start + size]
                sql = self.head + ", ".join([self.row] * len(chunk)) + self.tail
                cursor.execute(sql, [value for row in chunk for value in row])
                if self.returns:
                    returned += cursor.fetchall()
        return returned


class BatchInsertPostgres:
    """A whole batch in ONE PostgreSQL statement: its samples, their stage rows and the host's
    update, from the validated batch sent as one JSON parameter.

    - the samples: ``json_to_recordset`` of the batch, ``INSERT ... ON CONFLICT (host_id, seq)
      DO NOTHING``, so that two requests storing one sequence number at once store it once;
    - their stage rows: joined to the sample ids that INSERT returned (a skipped duplicate's
      stage rows are skipped with it);
    - the host: last_seen, status, last_seq, applied_version and dropped_samples, as the ORM
      update of the generic path sets them (``GREATEST`` ignores a NULL, as ``Coalesce`` did).

    Returns ``(id, seq)`` of the samples inserted. One round trip, a statement text that is the
    same for every batch, and values serialized at once by ``samples_json`` (validation has
    already made them plain numbers and strings) instead of field by field.
    """

    def __init__(
        self,
        sample_model: type[Model],
        sample_columns: Sequence[str],
        stage_model: type[Model],
        stage_columns: Sequence[str],
        host_model: type[Model],
    ) -> None:
        q = connection.ops.quote_name
        sample_fields = {f.attname: f for f in sample_model._meta.concrete_fields}
        stage_fields = {f.attname: f for f in stage_model._meta.concrete_fields}

        def record(fields: dict, columns: Sequence[str]) -> str:
            return ", ".join(f"{q(c)} {fields[c].db_type(connection)}" for c in columns)

        cols = ", ".join(q(c) for c in sample_columns)
        stage_cols = ", ".join(q(c) for c in stage_columns)
        self.sql = (
            f"WITH s AS (SELECT * FROM json_to_recordset(%(samples)s::json) AS s("
            f"{record(sample_fields, sample_columns)}, {q('stages')} json)), "
            f"new AS (INSERT INTO {q(sample_model._meta.db_table)} "
            f"({q('host_id')}, {q('resolution_s')}, {cols}) "
            f"SELECT %(host)s, 1, {cols} FROM s "
            f"ON CONFLICT ({q('host_id')}, {q('seq')}) DO NOTHING "
            f"RETURNING {q('id')}, {q('seq')}, {q('ts')}), "
            f"stages AS (INSERT INTO {q(stage_model._meta.db_table)} "
            f"({q('sample_id')}, {q('host_id')}, {q('ts')}, {stage_cols}) "
            f"SELECT new.{q('id')}, %(host)s, new.{q('ts')}, "
            + ", ".join(f"st.{q(c)}" for c in stage_columns)
            + f" FROM new JOIN s ON s.{q('seq')} = new.{q('seq')}, "
            f"json_to_recordset(s.{q('stages')}) AS st({record(stage_fields, stage_columns)})), "
            f"host AS (UPDATE {q(host_model._meta.db_table)} SET "
            f"{q('last_seen')} = %(now)s, {q('status')} = %(status)s, "
            f"{q('last_seq')} = GREATEST({q('last_seq')}, %(max_seq)s::bigint), "
            f"{q('applied_version')} = GREATEST({q('applied_version')}, %(applied)s::integer), "
            f"{q('dropped_samples')} = {q('dropped_samples')} + %(dropped)s::bigint "
            f"WHERE {q('id')} = %(host)s{{guard}}) "
            f"SELECT {q('id')}, {q('seq')} FROM new"
        )
        # A group of batches of several hosts (``run_group``): the same statement over a JSON
        # array of batches, each with its host and the figures of its host's update. A host
        # with two batches in the group is updated once, as two updates one after the other
        # would leave it (the greatest seq and version, the dropped samples summed).
        host_type = host_model._meta.pk.db_type(connection)
        self.sql_group = (
            f"WITH b AS (SELECT * FROM json_to_recordset(%(batches)s::json) AS b("
            f"{q('host')} {host_type}, {q('max_seq')} bigint, {q('applied')} integer, "
            f"{q('dropped')} bigint, {q('samples')} json)), "
            f"s AS (SELECT b.{q('host')}, x.* FROM b, json_to_recordset(b.{q('samples')}) AS x("
            f"{record(sample_fields, sample_columns)}, {q('stages')} json)), "
            f"hosts AS (SELECT {q('host')}, max({q('max_seq')}) AS {q('max_seq')}, "
            f"max({q('applied')}) AS {q('applied')}, sum({q('dropped')}) AS {q('dropped')} "
            f"FROM b GROUP BY {q('host')}), "
            f"new AS (INSERT INTO {q(sample_model._meta.db_table)} "
            f"({q('host_id')}, {q('resolution_s')}, {cols}) "
            f"SELECT s.{q('host')}, 1, {cols} FROM s "
            f"ON CONFLICT ({q('host_id')}, {q('seq')}) DO NOTHING "
            f"RETURNING {q('id')}, {q('host_id')}, {q('seq')}, {q('ts')}), "
            f"stages AS (INSERT INTO {q(stage_model._meta.db_table)} "
            f"({q('sample_id')}, {q('host_id')}, {q('ts')}, {stage_cols}) "
            f"SELECT new.{q('id')}, new.{q('host_id')}, new.{q('ts')}, "
            + ", ".join(f"st.{q(c)}" for c in stage_columns)
            + f" FROM new JOIN s ON s.{q('host')} = new.{q('host_id')} "
            f"AND s.{q('seq')} = new.{q('seq')}, "
            f"json_to_recordset(s.{q('stages')}) AS st({record(stage_fields, stage_columns)})), "
            f"host AS (UPDATE {q(host_model._meta.db_table)} AS h SET "
            f"{q('last_seen')} = %(now)s, {q('status')} = %(status)s, "
            f"{q('last_seq')} = GREATEST(h.{q('last_seq')}, hosts.{q('max_seq')}), "
            f"{q('applied_version')} = GREATEST(h.{q('applied_version')}, hosts.{q('applied')}), "
            f"{q('dropped_samples')} = h.{q('dropped_samples')} + hosts.{q('dropped')} "
            f"FROM hosts WHERE h.{q('id')} = hosts.{q('host')} "
            f"AND 1 / (CASE WHEN (SELECT count(*) FROM new) = %(count)s::bigint "
            f"THEN 1 ELSE 0 END) = 1) "
            f"SELECT count(*) FROM new"
        )
        self.sql, self.sql_whole = (
            self.sql.format(guard=""),
            # All or nothing without a transaction around it: a statement is atomic, and this
            # one fails (division by zero, SQLSTATE 22012) when the database skipped any sample
            # (stored before, perhaps by a copy racing this one), so that nothing of the batch
            # is stored and the caller can tell a resend from a reuse in a transaction. The
            # check sits in the host's UPDATE because a data-modifying statement always runs to
            # its end (a plain SELECT over no sample would not evaluate it).
            self.sql.format(
                guard=" AND 1 / (CASE WHEN (SELECT count(*) FROM new) = %(count)s::bigint "
                "THEN 1 ELSE 0 END) = 1"
            ),
        )

    def run(
        self,
        host_id: int,
        samples: Sequence[Mapping[str, Any]],
        *,
        now,
        status: str,
        applied_version: int | None,
        dropped: int,
        whole: bool = False,
    ) -> list[tuple]:
        """Store validated ``samples`` (each with its ``stages``) of one host and update it.

        ``whole``: every sample or none (the statement fails with ``WholeBatchRefused`` when
        one was stored before); for a statement run on its own, outside a transaction."""
        sql = self.sql_whole if whole else self.sql
        params = {
            "samples": samples_json(samples),
            "host": host_id,
            "now": now,
            "status": status,
            "max_seq": max((s["seq"] for s in samples), default=None),
            "applied": applied_version,
            "dropped": dropped,
            "count": len(samples),
        }
        return _execute(sql, params, whole=whole)

    def run_group(self, batches: Sequence[GroupBatch], *, now, status: str) -> None:
        """Store the validated samples of several hosts' batches and update the hosts, in ONE
        statement, every sample or none: it fails with ``WholeBatchRefused``, nothing stored,
        when the database skipped any sample (stored before, or twice in the group). Run on
        its own, outside a transaction, the statement is its own transaction: committed when
        this returns.

        Why: a web process stores the batches that arrive together as a group (a fleet in step
        sends 200 at once); one statement a batch cost each batch a round trip, its own
        execution of the statement's plan and, in the web process, psycopg's work to send it
        and read its answer (docs/benchmarks.md, "One statement a group")."""
        # In host order: the host rows are locked as the statement reaches them, and two
        # processes storing overlapping groups then take them in the same order.
        ordered = sorted(batches, key=lambda batch: batch.host_id)
        params = {
            "batches": samples_json(
                [
                    {
                        "host": batch.host_id,
                        "max_seq": max((s["seq"] for s in batch.samples), default=None),
                        "applied": batch.applied_version,
                        "dropped": batch.dropped,
                        "samples": batch.samples,
                    }
                    for batch in ordered
                ]
            ),
            "now": now,
            "status": status,
            "count": sum(len(batch.samples) for batch in ordered),
        }
        _execute(self.sql_group, params, whole=True)


def _execute(sql: str, params: dict[str, Any], *, whole: bool) -> list[tuple]:
    """Run one of ``BatchInsertPostgres``'s statements and return its rows (prepared where the
    connection allows: the statements are long and always the same, planned once a
    connection). ``whole``: the statement's all-or-nothing guard (a division by zero when the
    database skipped a sample) is raised as ``WholeBatchRefused``."""
    try:
        if prepare():
            with prepared_cursor() as cursor:
                cursor.execute(sql, params, prepare=True)
                return cursor.fetchall()
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    except DataError as exc:
        if whole and getattr(exc.__cause__, "sqlstate", None) == DIVISION_BY_ZERO:
            raise WholeBatchRefused from exc
        raise


class GroupBatch(NamedTuple):
    """One host's batch of a group (``BatchInsertPostgres.run_group``)."""

    host_id: int
    samples: Sequence[Mapping[str, Any]]
    applied_version: int | None
    dropped: int


def samples_json(samples: Sequence[Mapping[str, Any]]) -> str:
    """The JSON text of validated samples: orjson's (36 against 224 us a batch of 5 x 8 by
    ``json.dumps``, a tenth of an in-step burst's web CPU). orjson writes NaN and the infinities
    as null where json.dumps(allow_nan=False) refuses them, so a non-finite float (which the
    validation never lets through) takes json.dumps and is refused as before; so does what
    orjson cannot write (an integer beyond 64 bits, a lone surrogate: json.dumps writes them)."""
    try:
        text = orjson.dumps(samples)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(samples, separators=(",", ":"), allow_nan=False)
    if b"null" in text and _non_finite(samples):
        return json.dumps(samples, separators=(",", ":"), allow_nan=False)  # ValueError
    return text.decode()


def _non_finite(value: Any) -> bool:
    """Whether a non-finite float is anywhere in ``value`` (mappings and sequences, nested).

    A loop over the exact types validation builds (dicts, lists, floats, ints, strings, None),
    the ABCs only for anything else: a batch without ``per_cpu_percent`` writes ``null``, so
    every such batch is walked, and the recursive walk through ``isinstance`` with the ABCs was
    68 us of CPU a batch of 5 x 8, 5% of the web processes' in-step samples (py-spy)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return True
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is int or kind is str or item is None or kind is bool:
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


class WholeBatchRefused(Exception):
    """``BatchInsertPostgres.run(whole=True)`` stored nothing: a sample was stored before."""
