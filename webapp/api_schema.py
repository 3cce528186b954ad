"""The OpenAPI schema says what the API really answers: the agent's token scheme, and every
error status a request can get, each with the JSON body ``{"detail": ..., "errors": ...}``.

Written once here rather than on every view, so that a fuzzer reading the schema (tests/security)
and a client generated from it agree with the server about errors, not only about successes.
"""

import threading

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "detail": {"type": "string", "description": "what was wrong and what to do"},
        "errors": {"description": "the same, field by field, when the request body was invalid"},
    },
    "required": ["detail"],
}

# Why each status can happen; added to an operation only where the cause can apply to it.
ERRORS = {
    "400": "the request was invalid; `detail` names the field and the problem",
    "401": "no valid credentials (API token, session, or the host's agent token)",
    "403": "authenticated, but not allowed (a viewer acting, another host's agent token)",
    "404": "no such job or host",
    "409": "a sequence number was reused for a different sample",
    "413": "the body is larger than INTUNE_MAX_BODY_BYTES (a metrics batch: or it has more "
    "samples than INTUNE_MAX_SAMPLES_PER_BATCH; send them in smaller batches)",
    "414": "the URL is longer than the web server reads (gunicorn's limit_request_line)",
    "415": "the body is not sent as 'Content-Type: application/json', or has a Content-Encoding "
    "(send it as it is)",
    "429": "rate limited; retry after the Retry-After header's seconds",
    "503": "the database is unavailable; retry after the Retry-After header's seconds",
}
BODY_METHODS = {"post", "put", "patch"}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """``Authorization: Agent <token>`` on the agents' endpoints."""

    target_class = "webapp.permissions.AgentTokenAuthentication"
    name = "agentAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "the host's agent token, prefixed 'Agent ' (shown once when registered)",
        }


def document_errors(result, generator, request, public):
    """drf-spectacular post-processing hook: add the error responses to every operation."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR_SCHEMA)
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            codes = ["401", "403", "429", "503"]
            params = operation.get("parameters", [])
            if "{" in path:
                codes.append("404")
            if method in BODY_METHODS or any(p.get("in") == "query" for p in params):
                codes.append("400")
            if any(p.get("in") == "query" for p in params):
                codes.append("414")
            if method in BODY_METHODS:
                codes += ["413", "415"]
            if method == "post" and path.endswith("/metrics/"):
                codes.append("409")
            responses = operation.setdefault("responses", {})
            for code in sorted(codes):
                # gunicorn answers 414 itself, before Django, with a small HTML page.
                content = {"text/html": {"schema": {"type": "string"}}} if code == "414" else error
                responses.setdefault(code, {"description": ERRORS[code], "content": content})
    return result


class SchemaView(SpectacularAPIView):
    """``GET /api/schema/``, built by one request at a time in a process.

    drf-spectacular builds the schema with state shared by the process (its extensions are
    imported and registered lazily, its component registry): two requests building it at once
    on two threads of one web process broke each other with 500s (3 of 8 concurrent fetches,
    ``ModuleNotFoundError`` inside its optional-extension loading). Building it takes a fraction
    of a second; the others wait their turn."""

    _building = threading.Lock()

    @extend_schema(**SCHEMA_KWARGS)  # documented as drf-spectacular documents its own view
    def get(self, request, *args, **kwargs):
        with self._building:
            return super().get(request, *args, **kwargs)


def refuse_unknown_fields(result, generator, request, public):
    """drf-spectacular post-processing hook: the request bodies of serializers that refuse a
    field they do not have (``webapp.strict_fields.KnownFieldsOnly``) say so
    (``additionalProperties: false``), so a client generated from the schema, and a fuzzer,
    know it. Read-only fields are left out of request components, but still taken (ignored)."""
    from webapp.strict_fields import KnownFieldsOnly

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    bases = {cls.__name__.removesuffix("Serializer") for cls in subclasses(KnownFieldsOnly)}
    bases.add("TokenRequest")  # TokenView checks its two fields itself
    schemas = result.get("components", {}).get("schemas", {})
    for base in bases:
        for name in (f"{base}Request", f"Patched{base}Request"):
            component = schemas.get(name)
            if component is not None and component.get("type") == "object":
                component["additionalProperties"] = False
    return result
