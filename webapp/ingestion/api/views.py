import time

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.ingestion import services
from webapp.ingestion.api.schema import metrics_batch_serializer
from webapp.ingestion.validation import (
    BatchError,
    latest_sample_ts,
    unpublished_version,
    validate_batch,
)
from webapp.jobs.models import Host
from webapp.metrics.instruments import observe_batch
from webapp.negotiation import AGENT_RENDERERS, JSONWhateverAccept
from webapp.permissions import AgentTokenAuthentication, IsHostAgent
from webapp.query_parameters import KnownQueryParameters
from webapp.throttles import AgentRateThrottle


def _query_float(request, name: str, default: float | None) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValidationError({name: f"must be a number, got {raw!r}"}) from exc
    if value != value or value in (float("inf"), float("-inf")):
        raise ValidationError({name: "must be finite"})
    return value


class HostMetricsView(KnownQueryParameters, APIView):
    """POST: an agent's batch of samples (agent token; idempotent by sequence number; all or
    nothing). GET: the host's series, downsampled on the server (people)."""

    renderer_classes = AGENT_RENDERERS
    content_negotiation_class = JSONWhateverAccept
    # A batch takes none: ``?x=1`` on one was stored without a word.
    query_parameters = {"get": frozenset({"since", "until", "step"})}

    def get_authenticators(self):
        method = self.request.method if self.request is not None else None
        if method == "POST":
            return [AgentTokenAuthentication()]
        if method == "OPTIONS":  # the endpoint's two users may both ask what it takes
            return [AgentTokenAuthentication(), *super().get_authenticators()]
        return super().get_authenticators()

    def get_permissions(self):
        if self.request.method == "POST":
            return [IsHostAgent()]
        if self.request.method == "OPTIONS" and isinstance(self.request.auth, Host):
            return [IsHostAgent()]  # as the allocation endpoint answers its agent
        return [IsAuthenticated()]

    def get_throttles(self):
        return [AgentRateThrottle()] if self.request.method == "POST" else []

    def dispatch(self, request, *args, **kwargs):
        started = time.perf_counter()
        response = super().dispatch(request, *args, **kwargs)
        if request.method == "POST":  # the whole server-side time: token, parsing, storing
            stored = response.data.get("stored", 0) if response.status_code == 200 else 0
            observe_batch(response.status_code, stored, time.perf_counter() - started)
        return response

    @extend_schema(
        request=metrics_batch_serializer(),
        responses=inline_serializer(
            "MetricsBatchStored",
            {
                "stored": serializers.IntegerField(),
                "duplicates": serializers.IntegerField(),
                "latest_allocation_version": serializers.IntegerField(),
            },
        ),
    )
    def post(self, request, host_id: int):
        host: Host = request.auth
        stage_names = services.stage_names_of(host.job)
        try:
            batch = validate_batch(
                request.data,
                stage_names,
                settings.INTUNE["MAX_SAMPLES_PER_BATCH"],
                latest_sample_ts(),
            )
        except BatchError as exc:
            return Response({"detail": str(exc)}, status=exc.status)
        problem = unpublished_version(batch["allocation_status"], host.allocation_version)
        if problem is not None:
            return Response({"detail": problem}, status=status.HTTP_400_BAD_REQUEST)
        try:
            result = services.store_batch(host, batch)
        except services.SequenceConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(result)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since",
                OpenApiTypes.DOUBLE,
                description="Unix seconds, before until; default an hour before until",
            ),
            OpenApiParameter("until", OpenApiTypes.DOUBLE, description="Unix seconds; default now"),
            OpenApiParameter(
                "step",
                {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                description="bucket width in seconds; widened to keep ~1000 points",
            ),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, host_id: int):
        host = get_object_or_404(Host.objects.select_related("job"), pk=host_id)
        now = time.time()
        until = _query_float(request, "until", now)
        since = _query_float(request, "since", until - 3600)
        if since >= until:
            raise ValidationError({"since": "must be before until"})
        requested = _query_float(request, "step", None)
        if requested is not None and requested <= 0:
            raise ValidationError({"step": "must be positive"})
        step = services.choose_step(
            since, until, requested, settings.INTUNE["MAX_POINTS_PER_SERIES"]
        )
        return Response(services.series(host, since, until, step))
