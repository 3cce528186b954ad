"""What every lean agent endpoint checks as Django's middleware would, before it answers an
agent's request without Django (``webapp.ingestion.api.lean``, the batches;
``webapp.jobs.api.lean``, the allocation long-poll's re-arm). Outside the apps, so that
neither app imports the other for it."""

from __future__ import annotations

from django.conf import settings
from django.http.request import split_domain_port, validate_host

# Accept headers for which DRF's negotiation picks its JSON renderer with no parameters.
JSON_ACCEPTS = frozenset({None, b"*/*", b"application/json"})


class LeanAgentRequest:
    """What every lean agent endpoint checks as Django's middleware would (the host header, the
    HTTPS redirect, the Accept header, the form of ``Authorization: Agent <token>``) and the
    headers it answers with. ``webapp.ingestion.api.lean.LeanBatchPost`` and
    ``webapp.jobs.api.lean.LeanAllocationPoll`` build on it."""

    def __init__(self) -> None:
        self._hosts: dict[bytes, bool] = {}
        self._security: dict[bool, list[tuple[str, str]]] = {}
        proxy = settings.SECURE_PROXY_SSL_HEADER
        self._proxy_header = (
            (proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode(), proxy[1])
            if proxy
            else None
        )

    def agent_token(self, scheme: str, headers: dict[bytes, bytes]) -> str | None:
        """The agent token of a request the lean path may answer (its Accept, host, scheme and
        ``Authorization: Agent <token>`` as Django's handler takes them without a word); None
        when Django must answer."""
        if (
            headers.get(b"accept") not in JSON_ACCEPTS
            or (settings.SECURE_SSL_REDIRECT and not self._is_secure(scheme, headers))
            or not self._allowed_host(headers.get(b"host"))
        ):
            return None
        authorization = (headers.get(b"authorization") or b"").split()
        if len(authorization) != 2 or authorization[0].lower() != b"agent":
            return None
        return authorization[1].decode(errors="replace")

    def _is_secure(self, scheme: str, headers: dict[bytes, bytes]) -> bool:
        # HttpRequest.is_secure(): the proxy's header when one is configured, else the scheme.
        if self._proxy_header is not None:
            value = headers.get(self._proxy_header[0])
            if value is not None:
                return value.decode("latin-1").split(",", 1)[0].strip() == self._proxy_header[1]
        return scheme == "https"

    def _allowed_host(self, host: bytes | None) -> bool:
        """HttpRequest.get_host()'s check (CommonMiddleware makes it on every request)."""
        if host is None or settings.USE_X_FORWARDED_HOST:
            return False
        allowed = self._hosts.get(host)
        if allowed is None:
            domain, _ = split_domain_port(host.decode("latin-1"))
            patterns = settings.ALLOWED_HOSTS
            if settings.DEBUG and not patterns:
                patterns = [".localhost", "127.0.0.1", "[::1]"]
            allowed = bool(domain) and validate_host(domain, patterns)
            if len(self._hosts) < 1000:
                self._hosts[host] = allowed
        return allowed
