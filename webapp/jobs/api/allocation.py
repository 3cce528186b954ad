import re

from django.conf import settings
from django.db import close_old_connections, connection
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp import pubsub
from webapp.jobs.models import Host
from webapp.jobs.services import latest_allocation
from webapp.metrics.instruments import held_long_poll
from webapp.negotiation import AGENT_RENDERERS, JSONWhateverAccept
from webapp.permissions import AgentTokenAuthentication, IsHostAgent
from webapp.throttles import AgentRateThrottle

from .serializers import AllocationSerializer

MAX_VERSION = 2**31 - 1  # allocation versions are 32-bit in the database
# Where an asynchronous front (webapp/agent_asgi.py) offers, in the request's WSGI environ, to
# hold a long-poll's wait on its event loop: the view then fills it in instead of blocking.
HOLD_KEY = "intune.hold"


class HostAllocationView(APIView):
    """The host's newest allocation, for its agent: answered at once when a version newer than
    ``after`` exists, else held up to ``wait`` seconds and answered as soon as one is published
    (Redis pub/sub wakes the request). 204 when nothing newer came."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsHostAgent]
    throttle_classes = [AgentRateThrottle]
    renderer_classes = AGENT_RENDERERS
    content_negotiation_class = JSONWhateverAccept

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0, "maximum": MAX_VERSION},
                description="the version the agent has; default 0",
            ),
            OpenApiParameter(
                "wait",
                {
                    "type": "number",
                    "minimum": 0,
                    "maximum": settings.INTUNE["LONG_POLL_MAX_WAIT_S"],
                },
                description="seconds to hold for a newer version; default 0",
            ),
        ],
        responses={
            200: AllocationSerializer,
            204: OpenApiResponse(description="no newer version within wait"),
        },
    )
    def get(self, request, host_id: int):
        host: Host = request.auth
        _only_after_and_wait(request.query_params)
        after = _int_param(request.query_params.get("after"), "after", 0, 0, MAX_VERSION)
        max_wait = settings.INTUNE["LONG_POLL_MAX_WAIT_S"]
        wait = _float_param(request.query_params.get("wait"), "wait", 0.0, 0.0, max_wait)

        version = Host.objects.filter(pk=host.pk).values_list("allocation_version", flat=True)
        version = version.first() or 0
        if version <= after and wait > 0:
            hold = request.META.get(HOLD_KEY)
            if hold is not None:
                # Served by webapp/agent_asgi.py: the wait is held on its event loop, not in
                # this thread; it answers when a newer version is published or wait runs out.
                hold.update(host_id=host.pk, after=after, wait=wait)
                return Response(status=status.HTTP_204_NO_CONTENT)

            def current_version() -> int:
                try:
                    return (
                        Host.objects.filter(pk=host.pk)
                        .values_list("allocation_version", flat=True)
                        .first()
                        or 0
                    )
                finally:
                    # Give the database connection back at once: this thread may now wait on
                    # Redis for up to a minute.
                    connection.close()

            connection.close()
            with held_long_poll():
                version = pubsub.wait_for_newer_version(host.pk, after, wait, current_version)
        if version <= after:
            return Response(status=status.HTTP_204_NO_CONTENT)
        allocation = latest_allocation(host)
        return Response(AllocationSerializer(allocation).data)


def _only_after_and_wait(params) -> None:
    """A name other than ``after`` and ``wait``, or either given twice, is a 400: a misspelt
    ``wait`` (``timeout=30``, ``wiat=30``) read as no wait had a third party's agent poll in a
    tight loop, every answer an immediate 204, and nothing said why."""
    for name in params:
        if name not in ("after", "wait"):
            raise ValidationError(
                {name: "unknown parameter: this endpoint takes after and wait "
                 "(docs/agent-protocol.md)"}
            )  # fmt: skip
        if len(params.getlist(name)) > 1:
            raise ValidationError({name: "given more than once"})


def _int_param(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    # ASCII digits only: str.isdigit() is also true of "²", which int() refuses.
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ValidationError({name: f"must be an integer between {low} and {high}, got {raw!r}"})
    return int(raw)


# A number as JSON writes one, in ASCII digits (a leading "-" for "-0"). float() also takes
# "1_0" (10), " 5", "５" (a fullwidth digit) and "٣" (an Arabic-Indic one), which a client
# sends only by mistake, and "nan" and "inf", which the range check below refuses as numbers.
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _float_param(raw: str | None, name: str, default: float, low: float, high: float) -> float:
    if raw is None:
        return default
    if _NUMBER.fullmatch(raw) is None:
        raise ValidationError({name: f"must be a number of seconds, got {raw!r}"})
    value = float(raw)
    if not low <= value <= high:
        raise ValidationError({name: f"must be between {low:g} and {high:g} seconds, got {raw}"})
    return value


# A query string of ``after`` and ``wait`` written plainly (digits, a decimal point), each at
# most once: what the lean path (webapp/jobs/api/lean.py) reads itself. Any other (escapes,
# other names, repeats) is Django's QueryDict's to read.
_PLAIN_PARAM = re.compile(rb"^(after|wait)=([0-9]+(?:\.[0-9]*)?)$")


def after_and_wait(query: bytes) -> tuple[int, float] | None:
    """``(after, wait)`` of a long-poll's query string, read by the view's own rules; None when
    the string is not plainly written or the view would refuse a value (its 400 answers it)."""
    values: dict[bytes, str] = {}
    for part in query.split(b"&") if query else ():
        match = _PLAIN_PARAM.match(part)
        if match is None or match.group(1) in values:
            return None
        values[match.group(1)] = match.group(2).decode("ascii")
    try:
        after = _int_param(values.get(b"after"), "after", 0, 0, MAX_VERSION)
        wait = _float_param(
            values.get(b"wait"), "wait", 0.0, 0.0, settings.INTUNE["LONG_POLL_MAX_WAIT_S"]
        )
    except ValidationError:
        return None
    return after, wait


# What ``render_newer_allocation`` returns for a host that no longer exists (its job deleted):
# the held poll answers 204 at once, and the agent's next request is a 401.
HOST_GONE = b""


def render_newer_allocation(host_id: int, after: int) -> bytes | None:
    """The JSON body a long-poll answers with when the host has a version newer than ``after``
    (as the view renders it), ``HOST_GONE`` when the host was deleted, else None. For
    webapp/agent_asgi.py, in its thread pool."""
    close_old_connections()
    try:
        host = Host.objects.filter(pk=host_id).first()
        if host is None:
            return HOST_GONE
        if host.allocation_version <= after:
            return None
        return JSONRenderer().render(AllocationSerializer(latest_allocation(host)).data)
    finally:
        close_old_connections()
