from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.jobs.api.serializers import MAX_ID
from webapp.jobs.api.views import id_parameter
from webapp.jobs.models import Host, Job
from webapp.permissions import IsOperatorOrReadOnly
from webapp.query_parameters import KnownQueryParameters
from webapp.tuning import services
from webapp.tuning.models import Decision

from .serializers import (
    DecisionSerializer,
    OverrideSerializer,
    TuningSessionSerializer,
    TuningStartSerializer,
)

# The most sessions one answer lists, newest first.
SESSIONS_LISTED = 200


class JobTuningView(KnownQueryParameters, APIView):
    """GET the job's tuning sessions with progress; POST starts tuning on its hosts; DELETE stops it."""

    permission_classes = [IsOperatorOrReadOnly]
    query_parameters = {"get": frozenset({"host"})}

    @extend_schema(
        parameters=[id_parameter("host", "only this host's sessions")],
        responses=TuningSessionSerializer(many=True),
    )
    def get(self, request, job_id: int):
        job = get_object_or_404(Job, pk=job_id)
        sessions = job.sessions.select_related("host").order_by("-started_at", "-id")
        # The job page shows one host's sessions: asked for the job's newest 200, a job of more
        # hosts than that left most of them out ("No tuning session on this host yet" on 300 of
        # 500 tuned hosts), and each refresh read and sent every host's (70 kB, 0.6 s).
        host = request.query_params.get("host")
        if host is not None:
            if not (host.isascii() and host.isdigit()) or int(host) > MAX_ID:
                raise ValidationError({"host": "must be a host id"})
            sessions = sessions.filter(host_id=int(host))
        return Response(TuningSessionSerializer(sessions[:SESSIONS_LISTED], many=True).data)

    @extend_schema(
        request=TuningStartSerializer, responses={201: TuningSessionSerializer(many=True)}
    )
    def post(self, request, job_id: int):
        job = get_object_or_404(Job, pk=job_id)
        if not isinstance(request.data, dict):
            raise ValidationError({"detail": 'send a JSON object, e.g. {"max_steps": 500}'})
        params = TuningStartSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        hosts = None
        if "hosts" in params.validated_data:
            ids = params.validated_data["hosts"]
            hosts = list(job.hosts.filter(pk__in=ids))
            if len(hosts) != len(set(ids)):
                raise ValidationError({"hosts": f"not every host in {ids} belongs to job {job.pk}"})
        if not job.hosts.exists():
            raise ValidationError({"detail": "this job has no hosts yet; register one first"})
        started = services.start_tuning(
            job,
            request.user,
            tuner=params.validated_data.get("tuner"),
            hosts=hosts,
            max_steps=params.validated_data.get("max_steps"),
        )
        return Response(
            TuningSessionSerializer(started, many=True).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer("TuningStopped", {"stopped": serializers.IntegerField()})
        },
    )
    def delete(self, request, job_id: int):
        job = get_object_or_404(Job, pk=job_id)
        return Response({"stopped": services.stop_tuning(job, request.user)})


@extend_schema_view(
    get=extend_schema(parameters=[id_parameter("session", "only this tuning session's decisions")])
)
class HostDecisionsView(KnownQueryParameters, generics.ListAPIView):
    """The policy's decisions on a host, newest first, paginated; ?session= filters."""

    permission_classes = [IsAuthenticated]
    serializer_class = DecisionSerializer
    query_parameters = {"get": frozenset({"session"})}

    def get_queryset(self):
        host = get_object_or_404(Host, pk=self.kwargs["host_id"])
        decisions = (
            Decision.objects.filter(host=host)
            .select_related("allocation")
            .order_by("-created_at", "-id")
        )
        session = self.request.query_params.get("session")
        if session is not None:
            if not (session.isascii() and session.isdigit()) or int(session) > MAX_ID:
                raise ValidationError({"session": "must be a session id"})
            decisions = decisions.filter(session_id=int(session))
        return decisions


class HostOverrideView(KnownQueryParameters, APIView):
    """PUT a person's allocation for the host (pauses the policy there until it expires or is
    released); GET the active override; DELETE hands the host back to the policy."""

    permission_classes = [IsOperatorOrReadOnly]

    def get_host(self) -> Host:
        return get_object_or_404(Host.objects.select_related("job"), pk=self.kwargs["host_id"])

    @extend_schema(responses={200: OverrideSerializer, 204: None})
    def get(self, request, host_id: int):
        override = services.active_override(self.get_host())
        if override is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(OverrideSerializer(override).data)

    @extend_schema(request=OverrideSerializer, responses=OverrideSerializer)
    def put(self, request, host_id: int):
        host = self.get_host()
        serializer = OverrideSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        override = services.set_override(
            host,
            request.user,
            workers=data["workers"],
            reason=data["reason"],
            expires_at=data.get("expires_at"),
            layout=data.get("layout"),
        )
        return Response(OverrideSerializer(override).data)

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer("OverrideReleased", {"released": serializers.IntegerField()})
        },
    )
    def delete(self, request, host_id: int):
        return Response({"released": services.release_override(self.get_host(), request.user)})
