"""URLs: the REST API under /api/v1/, its schema and docs, /metrics, the dashboard, login."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from webapp.ingestion.api.views import HostMetricsView
from webapp.jobs.api.allocation import HostAllocationView
from webapp.jobs.api.views import AuditView, HostDetailView, JobHostsView, JobViewSet, TokenView
from webapp.metrics.views import MetricsView
from webapp.tuning.api.views import HostDecisionsView, HostOverrideView, JobTuningView

from . import api_schema  # the schema view; importing it registers the agent token scheme
from .health import healthz

router = DefaultRouter(trailing_slash=True)
router.register("jobs", JobViewSet, basename="job")

api_v1 = [
    path("auth/token/", TokenView.as_view(), name="auth-token"),
    path("jobs/<int:job_id>/hosts/", JobHostsView.as_view(), name="job-hosts"),
    path("jobs/<int:job_id>/tuning/", JobTuningView.as_view(), name="job-tuning"),
    path("hosts/<int:host_id>/", HostDetailView.as_view(), name="host-detail"),
    path("hosts/<int:host_id>/metrics/", HostMetricsView.as_view(), name="host-metrics"),
    path("hosts/<int:host_id>/allocation/", HostAllocationView.as_view(), name="host-allocation"),
    path("hosts/<int:host_id>/decisions/", HostDecisionsView.as_view(), name="host-decisions"),
    path("hosts/<int:host_id>/override/", HostOverrideView.as_view(), name="host-override"),
    path("audit/", AuditView.as_view(), name="audit"),
    path("", include(router.urls)),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", api_schema.SchemaView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("webapp.dashboard.urls")),
]

handler400 = "webapp.api_errors.bad_request"
handler404 = "webapp.api_errors.not_found"
handler500 = "webapp.api_errors.server_error"
