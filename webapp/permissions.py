"""Who may do what: anonymous reads nothing, a viewer reads, an operator also acts, an agent
reaches only its own host's endpoints."""

import functools
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from rest_framework import authentication, exceptions, permissions

from webapp.jobs.models import Host, Job, hash_agent_token

OPERATORS_GROUP = "operators"


def is_operator(user) -> bool:
    return bool(
        user
        and user.is_authenticated
        and (user.is_superuser or user.groups.filter(name=OPERATORS_GROUP).exists())
    )


class IsOperatorOrReadOnly(permissions.BasePermission):
    message = "this action needs an operator; viewers may only read"

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Agent <token>``: the request acts for the token's host."""

    keyword = "Agent"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "give the agent token as 'Authorization: Agent <token>'"
            )
        token = header[1].decode(errors="replace")
        # The hash is the lookup key; the lookup itself compares hashes, not secrets, and a
        # second constant-time comparison guards against a database collation surprise.
        host = host_by_token_hash(hash_agent_token(token))
        if host is None or not host.token_matches(token):
            raise exceptions.AuthenticationFailed("unknown agent token")
        return (AgentUser(host), host)

    def authenticate_header(self, request) -> str:
        return self.keyword


class AgentUser:
    """Stands for an agent in request.user: authenticated, not a person, tied to one host."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_staff = False
    username = "agent"
    pk = None

    def __init__(self, host: Host):
        self.host = host
        self.username = f"agent:{host.pk}"

    @property
    def groups(self):
        from django.contrib.auth.models import Group

        return Group.objects.none()


class IsHostAgent(permissions.BasePermission):
    """The agent token must belong to the host named in the URL."""

    message = "this agent token belongs to another host"

    def has_permission(self, request, view) -> bool:
        host = request.auth
        if not isinstance(host, Host):
            raise exceptions.NotAuthenticated(
                "this endpoint needs the host's agent token ('Authorization: Agent <token>')"
            )
        return str(host.pk) == str(view.kwargs.get("host_id"))


# The columns the agents' lean paths read of a host and its job (webapp/ingestion/api/lean.py,
# webapp/jobs/api/lean.py, services.store_usual_batch and services.stage_names_of): the lookup
# of every agent request reads these alone. The rest (the host's twin, a JSON document, and the
# job's tuning options among them) are deferred: read by a query of their own if touched.
AGENT_HOST_FIELDS = ("id", "job_id", "token_hash", "allocation_version", "applied_version")
AGENT_JOB_FIELDS = ("id", "created_at")


@functools.cache
def _token_lookup(narrow: bool = False) -> tuple[str, list, list, list, list]:
    """The SQL of ``host_by_token_hash``, each column's expression, the converters of the columns
    that have any (by index), and the attribute names of the host's and the job's columns in it
    (built once per process: the ORM would compile the same query anew on every request).
    ``narrow``: only the agents' fields."""
    quote = connection.ops.quote_name
    columns, expressions, converters, names = [], [], [], []
    for model, alias, wanted in ((Host, "h", AGENT_HOST_FIELDS), (Job, "j", AGENT_JOB_FIELDS)):
        fields = model._meta.concrete_fields
        if narrow:
            fields = [f for f in fields if f.attname in wanted]
        names.append([f.attname for f in fields])
        for field in fields:
            columns.append(f"{alias}.{quote(field.column)}")
            expression = field.get_col(alias)
            expressions.append(expression)
            converters.append(
                [
                    *connection.ops.get_db_converters(expression),
                    *field.get_db_converters(connection),
                ]
            )
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(Host._meta.db_table)} h "
        f"JOIN {quote(Job._meta.db_table)} j ON j.{quote('id')} = h.{quote('job_id')} "
        f"WHERE h.{quote('token_hash')} = %s"
    )
    # (column, its converters) of the columns that have any (none of the agents' fields do)
    converting = [(i, c) for i, c in enumerate(converters) if c]
    return sql, expressions, converting, names[0], names[1]


def host_by_token_hash(token_hash: str, *, agent_fields: bool = False) -> Host | None:
    """The host whose agent token hashes to ``token_hash``, its job loaded with it (as
    ``Host.objects.select_related("job").filter(token_hash=...).first()``, for a quarter of its
    CPU: every agent request starts here). None when no host has it (unknown or replaced).

    ``agent_fields``: only ``AGENT_HOST_FIELDS`` and ``AGENT_JOB_FIELDS`` are read, the others
    deferred (as ``.only()``): what the agents' lean paths need. With the connection looked up
    once and only the columns that have converters converted, the lookup took 113 us of CPU
    (agents' fields) and 128 us (all), against 243 us before (in process, PostgreSQL)."""
    from webapp.ingestion.inserts import prepare, prepared_cursor

    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the ``connection`` proxy looks it up
    sql, expressions, converters, host_fields, job_fields = _token_lookup(agent_fields)
    prefetched = getattr(_prefetched, "rows", None)
    if agent_fields and prefetched is not None and token_hash in prefetched:
        row = prefetched[token_hash]
    elif db.vendor == "postgresql" and prepare():
        with prepared_cursor() as cursor:
            cursor.execute(sql, [token_hash], prepare=True)
            row = cursor.fetchone()
    else:
        with db.cursor() as cursor:
            cursor.execute(sql, [token_hash])
            row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    for i, field_converters in converters:
        for convert in field_converters:
            values[i] = convert(values[i], expressions[i], db)
    host = Host.from_db(db.alias, host_fields, values[: len(host_fields)])
    job = Job.from_db(db.alias, job_fields, values[len(host_fields) :])
    Host.job.field.set_cached_value(host, job)
    return host


# Rows of the agents' lookup read ahead for a group of requests, on this thread
# (``agent_lookups_read_together``): token hash -> row, None for a hash no host has.
_prefetched = threading.local()


@contextmanager
def agent_lookups_read_together(token_hashes: Iterable[str]) -> Iterator[None]:
    """Within it, on this thread, ``host_by_token_hash(h, agent_fields=True)`` of any of
    ``token_hashes`` answers from ONE query made here for all of them (``token_hash = ANY``)
    instead of a query each: the web process serves the agents' requests that arrive together
    as a group (webapp/agent_asgi.py, ``Gathered``), and each lookup was a round trip of its own.
    Each call still builds a Host of its own. When that query fails (the database away, a kept
    connection gone), nothing is read ahead: each lookup queries as before, and handles the
    error as before."""
    from webapp.ingestion.inserts import prepare, prepared_cursor

    hashes = list(dict.fromkeys(token_hashes))
    db = connections[DEFAULT_DB_ALIAS]
    rows: dict[str, tuple | None] | None = None
    if len(hashes) > 1 and db.vendor == "postgresql" and prepare() and not db.in_atomic_block:
        sql, _, _, host_fields, _ = _token_lookup(True)
        sql = sql.replace(" = %s", " = ANY(%s)")
        at = host_fields.index("token_hash")
        try:
            with prepared_cursor() as cursor:
                cursor.execute(sql, [hashes], prepare=True)
                rows = dict.fromkeys(hashes)
                for row in cursor.fetchall():
                    rows[row[at]] = row
        except DatabaseError:
            db.close()  # as a failed lookup does: a checked connection next time
            rows = None
    _prefetched.rows = rows
    try:
        yield
    finally:
        _prefetched.rows = None
