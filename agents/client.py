"""The control plane's HTTP API as the agent sees it (docs/agent-protocol.md, version 1).

Each request method makes one attempt and raises :class:`ControlPlaneError` when it fails;
:meth:`ControlPlaneClient.with_retries` repeats a callable with exponential backoff and full
jitter (tenacity's ``wait_random_exponential``), honours ``Retry-After`` on 429, never retries
a 400 or 413 (the same body would be refused again), and gives up only when the agent stops.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import tenacity

from agents.transport import KEEPALIVE_S, Cancel, bounded_client, within

__all__ = ["KEEPALIVE_S", "ControlPlaneClient", "ControlPlaneError", "register_host"]

log = logging.getLogger("agents.client")

T = TypeVar("T")
API = "/api/v1"
PROTOCOL_VERSION = 1


class ControlPlaneError(Exception):
    """A request to the control plane failed: no answer, or an error status."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        detail: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later. Network errors, 5xx and 429 may; a
        400, 409 (a sequence number reused), 413 or 422 will not: the body itself is wrong.
        401/403/404 are retried too, slowly: an operator can fix a token or host on the control
        plane while training goes on."""
        return self.status not in (400, 409, 413, 422)


def _answer(response: httpx.Response, what: str) -> dict:
    """The JSON object a successful answer carries; a ``ControlPlaneError`` (retryable) when
    it carries something else. A URL that reaches another server, or a proxy's or a login
    page, answered 200 with HTML: ``attach()`` raised a bare "JSONDecodeError: Expecting
    value: line 1 column 1 (char 0)", and a JSON list killed the agent's poll thread."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    kind = response.headers.get("Content-Type", "no Content-Type") or "no Content-Type"
    raise ControlPlaneError(
        f"{what} answered {response.status_code} with {kind}, not the control plane's JSON "
        f"object ({response.text[:80]!r}): check the URL, and any proxy in front of it",
        status=response.status_code,
        detail=response.text[:500],
    )


def _error_from_response(response: httpx.Response, what: str) -> ControlPlaneError:
    try:
        detail = str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        detail = response.text[:500]
    retry_after = None
    if response.status_code == 429:
        try:
            retry_after = float(response.headers.get("Retry-After", ""))
        except ValueError:
            retry_after = None
    hint = {
        401: " (the agent token is wrong or missing: register the host again or pass --token)",
        403: " (this token belongs to another host: check --host-id)",
        404: " (no such host or job on this control plane: check --url and --host-id)",
    }.get(response.status_code, "")
    return ControlPlaneError(
        f"{what} answered {response.status_code}: {detail}{hint}",
        status=response.status_code,
        detail=detail,
        retry_after=retry_after,
    )


class _Wait(tenacity.wait.wait_base):
    """Full-jitter exponential backoff, but never sooner than a 429's ``Retry-After``."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._jitter = tenacity.wait_random_exponential(multiplier=initial_s, max=max_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = self._jitter(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, ControlPlaneError) and exc.retry_after:
            wait = max(wait, exc.retry_after)
        return wait


class ControlPlaneClient:
    """Talks to one control plane as one host, with that host's agent token."""

    def __init__(
        self,
        url: str,
        host_id: int,
        token: str,
        *,
        timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 15.0,
        stop_event: threading.Event | None = None,
        cancel: Cancel | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.host_id = int(host_id)
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stop_event = stop_event or threading.Event()
        headers = {"Authorization": f"Agent {token}", "User-Agent": "intune-agent/1"}
        # Two connection pools: the long-poll holds its connection for up to a minute and must
        # never make a metrics batch wait behind it.
        # ``cancel``: set from another thread, it cuts both pools' requests at once.
        self._metrics_http = bounded_client(
            cancel, base_url=self.url, headers=headers, timeout=timeout_s
        )
        self._poll_http = bounded_client(
            cancel, base_url=self.url, headers=headers, timeout=timeout_s
        )

    def interrupt_poll(self) -> None:
        """Cut a long-poll in progress (its thread sees an error), so stopping never waits for
        the control plane to answer it."""
        self._poll_http.close()

    def close(self) -> None:
        """Close both connection pools."""
        self._metrics_http.close()
        self._poll_http.close()

    def post_metrics(self, body: dict | bytes) -> dict:
        """POST one batch to ``/hosts/{id}/metrics/`` once; return the answer
        (``stored``, ``duplicates``, ``latest_allocation_version``). ``body`` may be already
        encoded JSON (the agent encodes once to check the size limit)."""
        what = f"POST {API}/hosts/{self.host_id}/metrics/"
        if isinstance(body, dict):
            body = json.dumps(body, separators=(",", ":")).encode()
        try:
            with within(self.timeout_s):
                response = self._metrics_http.post(
                    f"{API}/hosts/{self.host_id}/metrics/",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
        except httpx.HTTPError as exc:
            raise ControlPlaneError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise _error_from_response(response, what)
        return _answer(response, what)

    def poll_allocation(self, after: int, wait_s: float = 30.0) -> dict | None:
        """Long-poll ``/hosts/{id}/allocation/`` once for a version newer than ``after``.

        Returns the allocation (``version``, ``workers``, ``source``, ``created_at``), or
        ``None`` when nothing newer came within ``wait_s`` (the control plane's 204).
        """
        wait_s = min(float(wait_s), 60.0)
        what = f"GET {API}/hosts/{self.host_id}/allocation/"
        try:
            # The answer may take the whole wait; allow the usual timeout on top of it.
            with within(wait_s + self.timeout_s):
                response = self._poll_http.get(
                    f"{API}/hosts/{self.host_id}/allocation/",
                    params={"after": int(after), "wait": wait_s},
                    timeout=httpx.Timeout(self.timeout_s, read=wait_s + self.timeout_s),
                )
        except httpx.HTTPError as exc:
            raise ControlPlaneError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 204:
            return None
        if response.status_code != 200:
            raise _error_from_response(response, what)
        return _answer(response, what)

    def with_retries(self, attempt: Callable[[], T], what: str) -> T:
        """Call ``attempt`` until it succeeds, backing off with jitter between failures.

        Raises the last :class:`ControlPlaneError` when it is not retryable or when the agent
        is stopping (``stop_event`` set); sleeping between attempts wakes up on stop.
        """

        def log_retry(state: tenacity.RetryCallState) -> None:
            n = state.attempt_number
            # Log the 1st, 2nd, 4th, 8th... failure: a long outage should not flood the log.
            if n & (n - 1) == 0:
                exc = state.outcome.exception() if state.outcome else None
                log.warning(
                    "%s: %s; retrying in %.1f s (attempt %d, training goes on)",
                    what,
                    exc,
                    state.next_action.sleep if state.next_action else 0.0,
                    n,
                )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, ControlPlaneError) and e.retryable
            ),
            wait=_Wait(self.backoff_initial_s, self.backoff_max_s),
            stop=lambda state: self.stop_event.is_set(),
            sleep=self.stop_event.wait,
            before_sleep=log_retry,
            reraise=True,
        )
        return retrying(attempt)


def register_host(
    url: str,
    job_id: int,
    api_token: str,
    *,
    name: str,
    cpus: float,
    memory_mb: float,
    worker_budget: int | None = None,
    ranks: int = 1,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Register this host under a job with a person's API token (``POST /jobs/{id}/hosts/``).

    Returns the control plane's answer, which holds ``id`` and the ``agent_token`` (shown only
    once: the caller must store it). Retries network errors and 5xx a few times.
    """
    what = f"POST {API}/jobs/{job_id}/hosts/"
    body = {"name": name, "cpus": cpus, "memory_mb": memory_mb, "worker_budget": worker_budget}
    if ranks > 1:  # a multi-rank host (docs/agent-protocol.md); absent means one rank
        body["ranks"] = ranks

    def attempt() -> dict[str, Any]:
        try:
            with within(timeout_s), bounded_client(timeout=timeout_s) as client:
                response = client.post(
                    f"{url.rstrip('/')}{API}/jobs/{job_id}/hosts/",
                    json=body,
                    headers={"Authorization": f"Token {api_token}"},
                )
        except httpx.HTTPError as exc:
            raise ControlPlaneError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code not in (200, 201):
            raise _error_from_response(response, what)
        return _answer(response, what)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(
            lambda e: isinstance(e, ControlPlaneError) and (e.status is None or e.status >= 500)
        ),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=5),
        stop=tenacity.stop_after_attempt(5),
        reraise=True,
    )
    return retrying(attempt)
