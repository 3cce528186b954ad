"""Django's CommonMiddleware, redirecting a URL without its trailing slash with ``308`` rather
than ``301``.

Every path of the API ends in ``/`` (docs/agent-protocol.md). A client that leaves it out got
``301 Moved Permanently``, after which HTTP clients (curl -L, fetch, requests, urllib) send a
``POST`` again as a ``GET`` without its body: an agent's batch to ``.../metrics`` came back as a
``401`` of the people's ``GET`` of that endpoint, which says nothing of the slash. ``308
Permanent Redirect`` (RFC 9110 15.4.9) keeps the method and the body, so the request is served
where it belongs, and Django's DEBUG-only refusal to redirect a POST has no reason left.
"""

from django.http.response import HttpResponseRedirectBase
from django.middleware.common import CommonMiddleware
from django.utils.http import escape_leading_slashes


class HttpResponsePermanentRedirectKeepingMethod(HttpResponseRedirectBase):
    status_code = 308


class SlashRedirectKeepingMethod(CommonMiddleware):
    response_redirect_class = HttpResponsePermanentRedirectKeepingMethod

    def get_full_path_with_slash(self, request):
        # The scheme-relative guard of Django's own; without its DEBUG error for a POST, which
        # a 308 redirects with its body.
        return escape_leading_slashes(request.get_full_path(force_append_slash=True))
