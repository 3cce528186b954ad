"""JSON endpoints only the dashboard needs (read-only; the REST API under /api/v1/ does the rest).

Routed under /dashboard/api/ by ``webapp/dashboard/urls.py``; session or token authentication.
"""

import time

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.ingestion.services import budget_summary
from webapp.jobs.api.serializers import AllocationSerializer, active_override_data
from webapp.jobs.models import Host, Job
from webapp.query_parameters import KnownQueryParameters

from . import queries
from .alerts import Thresholds, host_alerts


def _number(request, name: str, default: float | None = None) -> float | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValidationError({name: f"must be a number (Unix seconds), got {raw!r}"}) from exc
    if value != value or abs(value) == float("inf"):
        raise ValidationError({name: "must be finite"})
    return value


# Unix seconds a datetime can hold, with room: up to the year 5138.
LATEST_TS = 1e11


def _since(request) -> float | None:
    since = _number(request, "since")
    if since is not None and not 0 <= since <= LATEST_TS:
        raise ValidationError({"since": f"must be Unix seconds between 0 and {LATEST_TS:g}"})
    return since


class JobsSummaryView(KnownQueryParameters, APIView):
    """Every job with hosts by state, current throughput and idle time, tuning state and a
    15-minute sparkline: the home page's table."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response({"now": time.time(), "jobs": queries.jobs_summary()})


class AlertsView(KnownQueryParameters, APIView):
    """The alerts in force, for every host or (``job_id`` in the URL) one job's hosts."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, job_id: int | None = None):
        hosts = Host.objects.select_related("job")
        if job_id is not None:
            hosts = hosts.filter(job=get_object_or_404(Job, pk=job_id))
        thresholds = Thresholds.from_settings()
        alerts = host_alerts(list(hosts), thresholds)
        return Response(
            {"alerts": [a.as_dict() for a in alerts], "thresholds": thresholds.as_dict()}
        )


class JobHostsSummaryView(KnownQueryParameters, APIView):
    """The job's hosts for the job page's host table: state, current figures, allocation
    versions published and applied, whether an override holds."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, job_id: int):
        job = get_object_or_404(Job, pk=job_id)
        hosts = list(job.hosts.all())
        figures = queries.current_figures([h.pk for h in hosts])
        overridden = queries.overridden_hosts(hosts)
        return Response(
            {
                "hosts": [
                    {
                        "id": h.pk,
                        "name": h.name,
                        "state": h.state,
                        "throughput": figures.get(h.pk, {}).get("throughput"),
                        "idle_fraction": figures.get(h.pk, {}).get("idle_fraction"),
                        "allocation_version": h.allocation_version,
                        "applied_version": h.applied_version,
                        "override": h.pk in overridden,
                    }
                    for h in hosts
                ]
            }
        )


class HostAllocationsView(KnownQueryParameters, APIView):
    """The host's allocation history (oldest first) from the one in force at ``since``."""

    permission_classes = [IsAuthenticated]
    query_parameters = {"get": frozenset({"since"})}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since",
                {"type": "number", "minimum": 0, "maximum": LATEST_TS},
                description="Unix seconds; default: all of it",
            )
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, host_id: int):
        host = get_object_or_404(Host, pk=host_id)
        return Response(
            {"host": host.pk, "allocations": queries.allocation_history(host, _since(request))}
        )


class HostOverviewView(KnownQueryParameters, APIView):
    """What the host panel shows above its charts: state, allocation in force and applied,
    active override, limits for the override form, current figures and the twin's estimate."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, host_id: int):
        host = get_object_or_404(Host.objects.select_related("job"), pk=host_id)
        newest = host.allocations.select_related("created_by").order_by("-version").first()
        figures = queries.current_figures([host.pk]).get(host.pk)
        return Response(
            {
                "id": host.pk,
                "name": host.name,
                "state": host.state,
                "last_seen": host.last_seen.timestamp() if host.last_seen else None,
                "cpus": host.cpus,
                "ranks": host.ranks,
                "memory_mb": host.memory_mb,
                "worker_budget": host.worker_budget,
                "allocation_version": host.allocation_version,
                "applied_version": host.applied_version,
                "allocation": None if newest is None else AllocationSerializer(newest).data,
                "override": active_override_data(host),
                "limits": queries.stage_limits(host),
                "budget": budget_summary(host),
                "throughput": figures["throughput"] if figures else None,
                "idle_fraction": figures["idle_fraction"] if figures else None,
                "twin": queries.twin_estimate(host),
            }
        )
