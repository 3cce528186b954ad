"""``GET /metrics``: Prometheus's text format, for people's API tokens (a viewer's is enough).

Prometheus sends a token as ``Authorization: Bearer <token>`` (its scrape config's
``authorization``), so the endpoint takes the API's tokens under that keyword as well as under
``Token``; a logged-in person's browser session works too. docs/monitoring.md shows the scrape
config.
"""

from django.http import HttpResponse
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from .scrape import exposition


class BearerTokenAuthentication(TokenAuthentication):
    """``Authorization: Bearer <API token>``: the API's tokens as Prometheus sends them."""

    keyword = "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.metrics.views.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "a person's API token (a viewer's is enough), as Prometheus sends it",
        }


class ErrorsInJson(BaseContentNegotiation):
    """Whatever the scraper accepts, an error is JSON like the rest of the API's and the
    answer is Prometheus's text format (the view returns it itself)."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type

    def select_parser(self, request, parsers):
        return None


class MetricsView(APIView):
    authentication_classes = [TokenAuthentication, BearerTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = ErrorsInJson

    @extend_schema(
        summary="The control plane's Prometheus metrics",
        description="Prometheus's text exposition format 0.0.4 (docs/monitoring.md).",
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="the metrics, one sample a line"
            )
        },
    )
    def get(self, request):
        # The classic text format, which every Prometheus reads (our names need no escaping).
        return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
