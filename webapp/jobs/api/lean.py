"""An agent's allocation long-poll taken on without Django's request handling or DRF around it.

Why: a fleet in step re-arms its long-polls in the same instant (every agent's poll times out
together), and those re-arms land beside the fleet's batches. Through Django's handler, its
middleware and DRF, a re-arm cost a request's CPU and two queries (the token lookup, then the
host's version) only to find nothing newer and hand the wait to the event loop.

This path does only that usual case: the token looked up by the prepared statement the
ingestion path uses (``webapp.permissions.host_by_token_hash``, whose row carries the host's
``allocation_version``: the version check costs no second query), the agent rate limit, and the
same parameter rules as the view (``webapp.jobs.api.allocation.after_and_wait``). When nothing
newer than ``after`` exists and the agent asked to wait, it returns the wait for
webapp/agent_asgi.py to hold, as the view hands it over (``HOLD_KEY``); the held poll then
answers exactly as one handed over by the view does. Anything else (a newer version to answer
at once, no wait, a missing or wrong token, another host's token, parameters the view refuses,
an unusual header, the rate limit reached, the database away) returns None: Django's view
answers it, in the words docs/agent-protocol.md documents.

``tests/webapp/test_lean_allocation_poll_answers_as_django.py`` compares the two.
"""

from __future__ import annotations

from types import SimpleNamespace

from django.db import DatabaseError, connection

from webapp.jobs.api.allocation import after_and_wait
from webapp.jobs.models import hash_agent_token
from webapp.lean_requests import LeanAgentRequest
from webapp.permissions import host_by_token_hash
from webapp.throttles import AgentRateThrottle


class LeanAllocationPoll(LeanAgentRequest):
    """``GET /api/v1/hosts/{id}/allocation/?after=..&wait=..`` when it is to be held."""

    def __call__(
        self, host_id: int, scheme: str, headers: dict[bytes, bytes], query: bytes, body: bytes
    ) -> tuple[int, float] | None:
        """``(after, wait)`` of a long-poll to hold; None when Django's view must answer.

        ``headers`` are the request's, names in lower case, each given once."""
        if body:
            return None
        params = after_and_wait(query)
        if params is None:
            return None
        after, wait = params
        if wait <= 0:
            return None  # answered at once either way: Django's view does it
        token = self.agent_token(scheme, headers)
        if token is None:
            return None
        # As the batch path does (webapp/ingestion/api/lean.py): this thread keeps its
        # connection; a kept one that fails is replaced and the lookup tried once more.
        kept = connection.connection is not None
        for attempt in (1, 2):
            try:
                host = host_by_token_hash(hash_agent_token(token), agent_fields=True)
                break
            except DatabaseError:
                connection.close()
                if attempt == 1 and kept:
                    continue
                return None  # Django's view answers (its 503)
        if host is None or not host.token_matches(token) or host.pk != host_id:
            return None
        if host.allocation_version > after:
            return None  # a newer version: the view renders it
        # Last, so that a request Django answers is counted once (DRF counts it there).
        if not AgentRateThrottle().allow_request(SimpleNamespace(auth=host), None):
            return None
        return after, wait
