"""An agent's metrics batch stored without Django's request handling or DRF around it.

Why: a fleet in step posts its batches in the same instant (200 agents, 200 requests), and each
waits for the CPU of those ahead of it. Through Django's handler, its middleware and DRF (content
negotiation, authentication, permission and throttle classes, the parser, the renderer) a batch
cost about twice the CPU of what the protocol needs: the token lookup, the validation, the
statement that stores it (docs/benchmarks.md, "Ingestion CPU per batch").

This path does only the usual case, with the same parts the view uses (the prepared token
lookup ``webapp.permissions.host_by_token_hash``, ``webapp.ingestion.validation``,
``services.store_batch``, the agent rate limit, the Prometheus instruments), and answers exactly
what Django would: the same body, status and headers. The usual batch (none of it stored before,
no allocation status to record) is stored by ``services.store_usual_batch``: the same rows, in
one statement that is its own transaction. Anything else it hands back (returns None)
for Django's view to answer: a missing or wrong token, another host's token, an invalid batch
(a key given twice among it, or escapes that leave that unsure: ``keys_may_repeat``),
a body too large, an unusual Content-Type or Accept, a rate limit reached, a sequence number
reused, a value the database refuses. Those answers are then Django's own, the ones
docs/agent-protocol.md documents, by construction; nothing was stored by the attempt here (the
validation refuses before storing, and a failed store rolls its transaction back).

``tests/webapp/test_lean_ingestion_answers_as_django.py`` sends the same requests both ways
and compares the answers.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from types import SimpleNamespace

import orjson
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware

from webapp.database_guard import RETRY_AFTER_S, unavailable_detail, waited_out_a_lock
from webapp.ingestion import services
from webapp.ingestion.validation import (
    BatchError,
    latest_sample_ts,
    unpublished_version,
    validate_batch,
)
from webapp.jobs.models import hash_agent_token
from webapp.lean_requests import LeanAgentRequest
from webapp.metrics.instruments import observe_batch
from webapp.parsers import keys_may_repeat
from webapp.permissions import host_by_token_hash
from webapp.throttles import AgentRateThrottle

log = logging.getLogger(__name__)

# The middleware this path stands in for. With any other list Django serves every request (a
# middleware added later must not be skipped without a word).
EXPECTED_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "webapp.parsers.BodySizeLimitMiddleware",
    "webapp.database_guard.DatabaseUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "webapp.slashes.SlashRedirectKeepingMethod",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
# What DRF's JSON parser takes without a question (a charset other than UTF-8 goes to Django).
JSON_TYPES = frozenset(
    {b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8"}
)
# DRF's APIView adds these to every answer of HostMetricsView (its renderer, its methods; no
# "Vary: Accept": it answers JSON whatever Accept says, webapp/negotiation.py).
VIEW_HEADERS = [
    ("Content-Type", "application/json"),
    ("Allow", "GET, POST, HEAD, OPTIONS"),
]


@dataclass(slots=True)
class Admitted:
    """A batch that passed everything but its storing (``LeanBatchPost.admit``)."""

    host: object
    batch: dict
    secure: bool
    started: float


class Fallback(Exception):
    """Not the usual case: Django's view answers this request."""


def enabled() -> bool:
    """Whether the lean path serves agents' batches in this process (``INTUNE_LEAN_INGESTION``,
    on by default; off, or with another middleware list, Django's view serves them all)."""
    return settings.INTUNE_LEAN_INGESTION and tuple(settings.MIDDLEWARE) == EXPECTED_MIDDLEWARE


class LeanBatchPost(LeanAgentRequest):
    """``POST /api/v1/hosts/{id}/metrics/`` for the usual case; see the module's docstring."""

    def __call__(
        self, host_id: int, scheme: str, headers: dict[bytes, bytes], query: bytes, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """Store the batch and return ``(status, headers, body)``; None when Django must answer.

        ``headers`` are the request's, names in lower case, each given once (a header repeated
        goes to Django)."""
        admitted = self.admit(host_id, scheme, headers, query, body)
        if not isinstance(admitted, Admitted):
            return admitted
        return self.store_alone(admitted)

    def admit(
        self, host_id: int, scheme: str, headers: dict[bytes, bytes], query: bytes, body: bytes
    ) -> Admitted | tuple[int, list[tuple[str, str]], bytes] | None:
        """Everything before storing: the request's form, its token looked up, the batch
        validated, the rate limit counted. ``Admitted`` when the batch is to be stored (by
        ``store_alone``, or with others by ``store_together``); else the answer, or None when
        Django must answer. Nothing is stored here."""
        started = time.perf_counter()
        secure = self._is_secure(scheme, headers)
        if (
            query
            or headers.get(b"content-type") not in JSON_TYPES
            or len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        ):
            return None
        token = self.agent_token(scheme, headers)
        if token is None:
            return None
        try:
            # orjson, for a third of the CPU of json.loads (60 against 166 us a batch of 5 x 8).
            # It refuses all DRF's parser refuses (invalid UTF-8, NaN and the infinities) and
            # more, which then goes to Django: a number out of a double's range (1e400, which
            # json reads as inf), an escaped lone surrogate, a nesting over 1,024. The one thing
            # it reads otherwise is an integer beyond 64 bits, as a float: the validation refuses
            # that in an integer's place (Django refuses the int too), and in a float's place the
            # value stored is the same double.
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if keys_may_repeat(body, orjson.dumps(data)):
            return None  # orjson kept one value of a repeated key: Django's parser refuses it
        # This thread keeps its database connection from one batch to the next (Django's
        # handler gives it back to the pool after every request, and the pool checks it with a
        # round trip of its own before lending it again). A kept connection that fails (the
        # database restarted) goes back to the pool, which replaces it, and the lookup is tried
        # once more on a checked one.
        kept = connection.connection is not None
        for attempt in (1, 2):
            try:
                return Admitted(*self._admit(host_id, token, data), secure, started)
            except Fallback:
                return None
            except (IntegrityError, DataError, OverflowError):
                connection.close()
                return None
            except DatabaseError as exc:
                connection.close()
                # A lock waited out is not a dead kept connection: trying again would wait
                # the whole lock timeout a second time.
                if attempt == 1 and kept and not waited_out_a_lock(exc):
                    continue
                return self._unavailable(exc, secure)
        raise AssertionError("unreachable")

    def store_alone(self, admitted: Admitted) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """Store an admitted batch in its own statement (or transaction); its answer, or None
        when Django must answer (a sequence number reused, a value the database refuses)."""
        host, batch = admitted.host, admitted.batch
        kept = connection.connection is not None
        for attempt in (1, 2):
            try:
                result = services.store_usual_batch(host, batch) or services.store_batch(
                    host, batch
                )
                break
            except services.SequenceConflict:
                return None
            except (IntegrityError, DataError, OverflowError):
                connection.close()
                return None  # rolled back; Django's view answers 409 or 400 in its own words
            except DatabaseError as exc:
                connection.close()
                if attempt == 1 and kept and not waited_out_a_lock(exc):
                    continue
                return self._unavailable(exc, admitted.secure)
        return self.answer(admitted, result)

    def store_together(self, admitted: list[Admitted]) -> list | None:
        """Store admitted batches of several agents by ONE statement
        (``services.store_usual_batches_together``): each one's answer, every batch committed
        before this returns; or None, nothing stored, when they must be stored each alone
        (``store_alone``: one is not the usual batch, a sample was stored before, the database
        refused one or went away)."""
        if not all(services.is_usual_batch(a.host, a.batch) for a in admitted):
            return None
        try:
            results = services.store_usual_batches_together([(a.host, a.batch) for a in admitted])
        except (DatabaseError, OverflowError):
            connection.close()  # rolled back; each is tried alone, on a checked connection
            return None
        if results is None:
            return None
        return [self.answer(a, result) for a, result in zip(admitted, results, strict=True)]

    def answer(self, admitted: Admitted, result: dict) -> tuple[int, list[tuple[str, str]], bytes]:
        content = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode()
        observe_batch(200, result["stored"], time.perf_counter() - admitted.started)
        return 200, self._headers(content, admitted.secure), content

    def _admit(self, host_id: int, token: str, data):
        host = host_by_token_hash(hash_agent_token(token), agent_fields=True)
        if host is None or not host.token_matches(token) or host.pk != host_id:
            raise Fallback
        try:
            batch = validate_batch(
                data,
                services.stage_names_of(host.job),
                settings.INTUNE["MAX_SAMPLES_PER_BATCH"],
                latest_sample_ts(),
            )
        except BatchError:
            raise Fallback from None
        if unpublished_version(batch["allocation_status"], host.allocation_version):
            raise Fallback  # the view's 400
        # Last, so that a request Django answers is counted once (DRF counts it there).
        if not AgentRateThrottle().allow_request(SimpleNamespace(auth=host), None):
            raise Fallback
        return host, batch

    def _unavailable(self, exc: DatabaseError, secure: bool) -> tuple[int, list, bytes]:
        """The database is away: 503 with Retry-After, as webapp/api_errors.py answers (not
        handed to Django, whose attempt would wait out the pool's timeout a second time)."""
        log.error(
            "database unavailable while serving an agent's batch: %s: %s",
            type(exc).__name__,
            (str(exc).splitlines() or [""])[0][:200],
        )
        content = json.dumps({"detail": unavailable_detail(exc)}, separators=(",", ":")).encode()
        observe_batch(503, 0, 0.0)
        return 503, [*self._headers(content, secure), ("Retry-After", RETRY_AFTER_S)], content

    def _headers(self, content: bytes, secure: bool) -> list[tuple[str, str]]:
        security = self._security.get(secure)
        if security is None:
            security = self._security[secure] = _middleware_headers(secure)
        return [*VIEW_HEADERS, ("Content-Length", str(len(content))), *security]


def _middleware_headers(secure: bool) -> list[tuple[str, str]]:
    """The headers SecurityMiddleware and XFrameOptionsMiddleware add to an answer of the API,
    from the settings as they run them."""
    request = HttpRequest()
    request.META = {"wsgi.url_scheme": "https" if secure else "http", "SERVER_NAME": "x"}
    if secure and settings.SECURE_PROXY_SSL_HEADER:
        request.META[settings.SECURE_PROXY_SSL_HEADER[0]] = settings.SECURE_PROXY_SSL_HEADER[1]
    response = HttpResponse()
    before = set(response.headers)
    response = XFrameOptionsMiddleware(lambda r: response).process_response(request, response)
    response = SecurityMiddleware(lambda r: response).process_response(request, response)
    return [(name, value) for name, value in response.headers.items() if name not in before]
