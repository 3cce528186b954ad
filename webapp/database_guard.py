"""A database outage answers 503 with Retry-After on every page, not a 500 error page.

The API's views already do (webapp/api_errors.py); this middleware covers the rest: the
dashboard's pages, login, admin.
"""

import logging

from django.db import DatabaseError, DataError, IntegrityError
from django.http import HttpResponse, JsonResponse

log = logging.getLogger(__name__)
RETRY_AFTER_S = "5"
# PostgreSQL's lock_not_available: a statement waited out lock_timeout (webapp/settings.py).
LOCK_NOT_AVAILABLE = "55P03"
LOCKED_DETAIL = (
    "a row this request needs is locked by another transaction (a tuning step or another "
    "request) past the lock timeout; nothing was changed: retry shortly"
)
UNAVAILABLE_DETAIL = "the database is unavailable; retry shortly"


def waited_out_a_lock(exc: BaseException) -> bool:
    """Whether a database error is a lock wait that reached its bound, not an outage."""
    cause = getattr(exc, "__cause__", None)
    return getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE


def unavailable_detail(exc: BaseException) -> str:
    """What a 503 for this database error says."""
    return LOCKED_DETAIL if waited_out_a_lock(exc) else UNAVAILABLE_DETAIL


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, DatabaseError) or isinstance(
            exception, (IntegrityError, DataError)
        ):
            return None
        log.error("database unavailable serving %s: %s", request.path, type(exception).__name__)
        detail = unavailable_detail(exception)
        if request.path.startswith(("/api/", "/dashboard/api/")):
            response = JsonResponse({"detail": detail}, status=503)
        else:
            response = HttpResponse(detail, status=503, content_type="text/plain")
        response["Retry-After"] = RETRY_AFTER_S
        return response
