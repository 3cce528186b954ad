"""The control plane's HTTP API as the agent sees it (docs/agent-protocol.md, version 1).

Each request method makes one attempt and raises :class:`ControlPlaneError` when it fails;
:meth:`ControlPlaneClient.with_retries` repeats a callable with exponential backoff and full
jitter (tenacity's ``wait_random_exponential``), honours ``Retry-After`` on 429, never retries
a 400 or 413 (the same body would be refused again), and gives up only when the agent stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpcore
import httpx
import tenacity

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


# --- a bound on a whole request --------------------------------------------------------------
# httpx's timeouts bound each read and write, not a request: a control plane (or a proxy) that
# trickles its answer a byte at a time, each within the read timeout, held a request for as long
# as it trickled (measured: a 200-byte body at a byte every 0.5 s held a POST with timeout_s=2
# for over 20 s; a chunked body that never ends, forever). Every read, write and connect of a
# request is therefore cut to what is left of the request's own deadline, kept per thread.


class _Deadline(threading.local):
    at: float | None = None


_deadline = _Deadline()


@contextlib.contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Bound every network operation of this thread's requests to ``seconds`` in all."""
    _deadline.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.at = None


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    at = _deadline.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's whole time ran out (the control plane answers too slowly)")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):  # noqa: ANN001
        return _DeadlineStream(
            self._stream.start_tls(
                ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
            )
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ANN001
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(self, path, timeout=None, socket_options=None):  # noqa: ANN001
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


# How long an idle connection to the control plane is kept for the next request. httpx's
# default, 5 s, is the agent's batch period: the shipper waits 5 s after each batch's answer, so
# every batch found its connection expired and opened another (a TCP handshake each, and behind
# a TLS proxy a TLS handshake each: 400 a second for 2,000 agents). Under the control plane's
# own idle limit (INTUNE_KEEPALIVE_S, 30 s), so that this side lets go first; a connection the
# server or a proxy closed sooner is seen closed before it is used (httpcore reads its EOF).
KEEPALIVE_S = 25.0


def _bounded_client(**kwargs: Any) -> httpx.Client:
    """An httpx client whose requests honour ``_within`` and whose connections outlast the
    agent's batch period (``KEEPALIVE_S``)."""
    transport = httpx.HTTPTransport(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))
    # httpx offers no public way to give its transport a network backend; httpcore's pool
    # takes one (tests/agents/daemon/test_a_trickling_control_plane_never_holds_the_agent.py
    # fails if an upgrade moves it).
    transport._pool._network_backend = _DeadlineBackend()
    return httpx.Client(transport=transport, **kwargs)


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
        self._metrics_http = _bounded_client(base_url=self.url, headers=headers, timeout=timeout_s)
        self._poll_http = _bounded_client(base_url=self.url, headers=headers, timeout=timeout_s)

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
            with _within(self.timeout_s):
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
            with _within(wait_s + self.timeout_s):
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
            with _within(timeout_s), _bounded_client(timeout=timeout_s) as client:
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
