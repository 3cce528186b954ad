"""Every API error as JSON with a ``detail`` that says what is wrong; never an HTML 500 page."""

import logging

from django.core.exceptions import DisallowedHost
from django.db import DatabaseError, DataError, IntegrityError
from django.http import JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.authentication import get_authorization_header
from rest_framework.response import Response
from rest_framework.views import exception_handler

from webapp.database_guard import RETRY_AFTER_S, unavailable_detail

log = logging.getLogger(__name__)


# What an agent token reaches (docs/agent-protocol.md, "Identity and authentication").
AGENT_TOKEN_ELSEWHERE = (
    "an agent token reaches only its own host's POST /api/v1/hosts/{id}/metrics/ and "
    "GET /api/v1/hosts/{id}/allocation/; this needs a person's API token "
    "('Authorization: Token <token>')"
)


def json_exception_handler(exc, context):
    request = context.get("request")
    if isinstance(exc, exceptions.NotAuthenticated) and _agent_scheme(request):
        # DRF's "credentials were not provided" to a client that did provide them, but the
        # agents' kind, where a person's are needed.
        exc = exceptions.NotAuthenticated(AGENT_TOKEN_ELSEWHERE)
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        # DRF's 'Unsupported media type "" in request.' does not say what to send.
        given = request.content_type if request is not None else ""
        exc = exceptions.UnsupportedMediaType(
            given,
            detail=(f"Content-Type {given!r} is" if given else "a body without a Content-Type is")
            + " not supported: send it as JSON with 'Content-Type: application/json'",
        )
    response = exception_handler(exc, context)
    if response is not None:
        if isinstance(response.data, dict) and "detail" not in response.data:
            response.data = {"detail": _summarise(response.data), "errors": response.data}
        elif isinstance(response.data, list):
            response.data = {"detail": _summarise(response.data), "errors": response.data}
        return response
    if isinstance(exc, OverflowError):
        # A number too big for the database (an id, a count) that a validator let through.
        log.warning("number out of range in %s: %s", context["request"].path, exc)
        return Response({"detail": "a number in the request is out of range"}, status=400)
    if isinstance(exc, DataError):
        # The database refused a value the request carried (a NUL character in text, a number
        # out of its range): the client's data, not an outage. The transaction rolled back.
        log.warning(
            "data the database cannot store in %s: %s", context["request"].path, type(exc).__name__
        )
        return Response(
            {
                "detail": "the request holds a value the database cannot store "
                "(e.g. a NUL character or an out-of-range number)"
            },
            status=400,
        )
    if isinstance(exc, IntegrityError):
        # A conflict with what is stored (a concurrent write won): retrying the same request
        # cannot succeed, so it is not a 503.
        log.warning("conflict while serving %s: %s", context["request"].path, type(exc).__name__)
        return Response(
            {"detail": "the request conflicts with what is stored; re-read and retry"}, status=409
        )
    if isinstance(exc, DatabaseError):
        # The database is restarting or unreachable: say so and let the client retry.
        log.error(
            "database unavailable while serving %s: %s: %s",
            context["request"].path,
            type(exc).__name__,
            # The first line says why (refused, pool exhausted); psycopg never includes passwords.
            (str(exc).splitlines() or [""])[0][:200],
        )
        return Response(
            {"detail": unavailable_detail(exc)},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": RETRY_AFTER_S},
        )
    return None


def _agent_scheme(request) -> bool:
    if request is None:
        return False
    words = get_authorization_header(request).split()
    return bool(words) and words[0].lower() == b"agent"


def _summarise(errors) -> str:
    """One line from DRF's nested error structure: 'field: message; other: message'."""
    parts: list[str] = []

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list):
            for inner in value:
                walk(inner, path)
        else:
            parts.append(f"{path}: {value}" if path else str(value))

    walk(errors, "")
    return "; ".join(parts)[:2000]


def _is_api(request) -> bool:
    return request.path.startswith(("/api/", "/dashboard/api/"))


def _sized(response):
    """The response with its Content-Length. A handler's answer to an exception raised in a
    middleware (a Host not allowed is refused by CommonMiddleware's) skips the middleware that
    sets it, and without it the web server sent the answer chunked, which the protocol says it
    never does (docs/agent-protocol.md, "HTTP")."""
    if not response.streaming and not response.has_header("Content-Length"):
        response["Content-Length"] = str(len(response.content))
    return response


def bad_request(request, exception=None):
    """handler400 (a SuspiciousOperation: a Host header not in DJANGO_ALLOWED_HOSTS above all):
    JSON under the API's paths, saying what was wrong, where Django's page said nothing."""
    if _is_api(request):
        if isinstance(exception, DisallowedHost):
            detail = (
                "the request's Host header is not a name this server answers to "
                "(DJANGO_ALLOWED_HOSTS): send the host name of the control plane's URL"
            )
        else:
            detail = "the request was refused as malformed or suspicious"
        return _sized(JsonResponse({"detail": detail}, status=400))
    return _sized(defaults.bad_request(request, exception))


def not_found(request, exception=None):
    """handler404: JSON under the API's paths (clients parse it), Django's page elsewhere."""
    if _is_api(request):
        return _sized(
            JsonResponse({"detail": f"no such resource: {request.path[:200]}"}, status=404)
        )
    return _sized(defaults.page_not_found(request, exception))


def server_error(request):
    """handler500: JSON under the API's paths; never a traceback (DEBUG is off in production)."""
    if _is_api(request):
        detail = "internal error; it was logged; retry, or report it if it persists"
        return _sized(JsonResponse({"detail": detail}, status=500))
    return _sized(defaults.server_error(request))
