from django.contrib.auth import authenticate
from django.db import IntegrityError, connection, transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import generics, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp import pubsub
from webapp.jobs import services
from webapp.jobs.models import AuditEntry, Host, Job
from webapp.permissions import IsOperatorOrReadOnly
from webapp.query_parameters import KnownQueryParameters
from webapp.snapshot import snapshot
from webapp.throttles import LoginRateThrottle

from .serializers import (
    MAX_ID,
    AuditEntrySerializer,
    HostRegisteredSerializer,
    HostSerializer,
    JobSerializer,
)


class TokenView(KnownQueryParameters, APIView):
    """Exchange a username and password for an API token (POST), or revoke yours (DELETE)."""

    permission_classes = [AllowAny]
    throttle_classes = [LoginRateThrottle]
    throttle_scope = "login"

    @extend_schema(
        request=inline_serializer(
            "TokenRequest",
            {"username": serializers.CharField(), "password": serializers.CharField()},
        ),
        responses=inline_serializer("TokenResponse", {"token": serializers.CharField()}),
    )
    def post(self, request):
        username = request.data.get("username") if isinstance(request.data, dict) else None
        password = request.data.get("password") if isinstance(request.data, dict) else None
        if (
            not isinstance(username, str)
            or not isinstance(password, str)
            or not username
            or not password
        ):
            raise ValidationError({"detail": "give a username and a password"})
        unknown = sorted(set(request.data) - {"username", "password"})
        if unknown:  # as every other body of the people's API (strict_fields.KnownFieldsOnly)
            raise ValidationError(
                {key[:64]: ["unknown field; this takes password, username"] for key in unknown[:5]}
            )
        user = authenticate(request, username=username, password=password)
        if user is None:
            return Response(
                {"detail": "wrong username or password"}, status=status.HTTP_400_BAD_REQUEST
            )
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})

    @extend_schema(request=None, responses={204: None})
    def delete(self, request):
        if not request.user.is_authenticated:
            return Response({"detail": "log in first"}, status=status.HTTP_401_UNAUTHORIZED)
        Token.objects.filter(user=request.user).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobViewSet(KnownQueryParameters, viewsets.ModelViewSet):
    """Register and manage training jobs: their pipeline stages and tuning settings."""

    serializer_class = JobSerializer
    permission_classes = [IsOperatorOrReadOnly]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return Job.objects.prefetch_related("stages", "hosts", "sessions").order_by("id")

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            serializer.instance = services.register_job(user=self.request.user, **data)
        except IntegrityError as exc:
            raise ValidationError({"name": f"a job named {data['name']!r} exists already"}) from exc

    @transaction.atomic
    def perform_update(self, serializer):
        job = serializer.instance
        # Locked while it changes, and gone is gone: a delete that committed since the job was
        # read would otherwise have save() (an UPDATE of no row) INSERT it again, stageless (the
        # fuzz tests' stateful phase, a PATCH and a DELETE of one job from two workers).
        if not list(Job.objects.select_for_update().filter(pk=job.pk).values_list("pk")):
            raise NotFound("no such job; it was deleted")
        data = dict(serializer.validated_data)
        stages = data.pop("stages", None)
        for key, value in data.items():
            setattr(job, key, value)
        try:
            with transaction.atomic():
                job.save(force_update=True)
        except IntegrityError as exc:
            raise ValidationError(
                {"name": f"a job named {data.get('name')!r} exists already"}
            ) from exc
        if stages is not None:
            # Names are fixed once hosts exist (checked by the serializer); limits may change.
            job.stages.all().delete()
            for position, stage in enumerate(stages):
                job.stages.create(position=position, **stage)
        services.audit(
            self.request.user, "job.update", job=job, fields=sorted(serializer.validated_data)
        )

    def perform_destroy(self, instance):
        services.audit(self.request.user, "job.delete", name=instance.name, job_id=instance.pk)
        job_id = instance.pk
        # The Celery worker may store a decision of the job's tuning session while the delete
        # collects what cascades (PostgreSQL, under the fuzz tests): the constraints are checked
        # at once, and on a violation the delete is collected again, twice at most.
        for attempt in range(3):
            try:
                with transaction.atomic():
                    hosts = list(instance.hosts.values_list("pk", flat=True))
                    instance.delete()
                    connection.check_constraints()
                    # Their agents' held long-polls answer now, not at the end of their wait.
                    transaction.on_commit(
                        lambda hosts=hosts: [pubsub.publish_host_gone(h) for h in hosts]
                    )
                return
            except IntegrityError:
                instance = Job.objects.filter(pk=job_id).first()
                if instance is None:
                    return
                if attempt == 2:
                    raise


class JobHostsView(KnownQueryParameters, generics.ListCreateAPIView):
    """List a job's hosts with their state, or register one (its agent token is shown once)."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = HostSerializer

    def get_job(self) -> Job:
        return get_object_or_404(Job, pk=self.kwargs["job_id"])

    def get_queryset(self):
        return (
            Host.objects.filter(job=self.get_job()).prefetch_related("allocations").order_by("id")
        )

    @extend_schema(responses={201: HostRegisteredSerializer})
    def post(self, request, *args, **kwargs):
        job = self.get_job()
        serializer = HostSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            host, token = services.register_host(
                job=job,
                user=request.user,
                name=data["name"],
                cpus=data["cpus"],
                memory_mb=data["memory_mb"],
                worker_budget=data.get("worker_budget"),
                ranks=data.get("ranks", 1),
            )
        except IntegrityError as exc:
            raise ValidationError(
                {"name": f"this job has a host named {data['name']!r} already"}
            ) from exc
        host.agent_token = token
        return Response(HostRegisteredSerializer(host).data, status=status.HTTP_201_CREATED)


class HostDetailView(KnownQueryParameters, generics.RetrieveAPIView):
    """One host, with its state, allocation in force and override."""

    permission_classes = [IsAuthenticated]
    serializer_class = HostSerializer
    queryset = Host.objects.all()
    lookup_url_kwarg = "host_id"

    def retrieve(self, request, *args, **kwargs):
        # The host's row and its newest allocation from one moment: an allocation "applied"
        # with the host still at the version before is a moment that never was.
        with snapshot():
            return super().retrieve(request, *args, **kwargs)


def id_parameter(name: str, description: str) -> OpenApiParameter:
    """A query parameter holding a database id, as the list views check it."""
    return OpenApiParameter(
        name, {"type": "integer", "minimum": 0, "maximum": MAX_ID}, description=description
    )


@extend_schema_view(
    get=extend_schema(
        parameters=[
            id_parameter("job", "only changes to this job"),
            id_parameter("host", "only changes to this host"),
        ]
    )
)
class AuditView(KnownQueryParameters, generics.ListAPIView):
    """Every change people made, newest first; filter with ?job= or ?host=."""

    query_parameters = {"get": frozenset({"job", "host"})}

    permission_classes = [IsAuthenticated]
    serializer_class = AuditEntrySerializer

    def get_queryset(self):
        entries = AuditEntry.objects.all()
        for key in ("job", "host"):
            value = self.request.query_params.get(key)
            if value is not None:
                if not (value.isascii() and value.isdigit()) or int(value) > MAX_ID:
                    raise ValidationError({key: f"must be an id between 0 and {MAX_ID}"})
                entries = entries.filter(**{key: int(value)})
        return entries
