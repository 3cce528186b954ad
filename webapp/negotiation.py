"""The agents' endpoints answer JSON whatever the request's Accept says.

docs/agent-protocol.md: "All bodies are JSON". Under DRF's default negotiation an agent's
request with ``Accept: text/html`` (a library's default, a browser's) got the browsable API's
HTML page, a held long-poll included, and one with ``Accept: application/xml`` a ``406`` the
protocol does not list. RFC 9110 12.5.1 lets a server disregard Accept and send its one
representation; these endpoints have one.
"""

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer


class JSONWhateverAccept(DefaultContentNegotiation):
    """DRF's negotiation (its choice of parser), with the view's JSON renderer always."""

    def select_renderer(self, request, renderers, format_suffix=None):
        renderer = next((r for r in renderers if isinstance(r, JSONRenderer)), JSONRenderer())
        return renderer, renderer.media_type


AGENT_RENDERERS = [JSONRenderer]
