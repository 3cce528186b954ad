"""Query parameters a view does not take are refused, naming them and the ones it takes.

DRF reads the parameters a view asks for and ignores the rest: ``?sesion=3`` on a host's
decisions answered every session's, ``?bogus=1`` on an agent's batch stored it. A client's typo
must be a 400 that says so, not an answer to another question. Each view lists what it takes
per method; list views take the paginator's ``limit`` and ``offset`` too, and every view DRF's
``format`` (its browsable API's). ``tests/webapp/test_a_query_parameter_a_view_does_not_take_is_refused.py``
checks the lists against the OpenAPI schema, so the two say the same.
"""

from rest_framework.exceptions import ValidationError
from rest_framework.mixins import ListModelMixin

PAGINATION = frozenset({"limit", "offset"})
ALWAYS = frozenset({"format"})


class KnownQueryParameters:
    """A DRF view mixin: ``query_parameters`` maps a method (``"get"``) to the parameters it
    takes; any other is a 400 (after authentication, permissions and throttles, so that an
    anonymous client learns nothing from it)."""

    query_parameters: dict[str, frozenset[str]] = {}

    def taken_query_parameters(self, method: str) -> frozenset[str]:
        """The query parameters this view takes for ``method`` (lower case)."""
        method = "get" if method == "head" else method
        taken = ALWAYS | self.query_parameters.get(method, frozenset())
        action = getattr(self, "action", None)  # a viewset's
        lists = action == "list" if action is not None else isinstance(self, ListModelMixin)
        if method == "get" and lists and getattr(self, "pagination_class", None) is not None:
            taken |= PAGINATION
        return taken

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.method == "OPTIONS":
            return
        taken = self.taken_query_parameters(request.method.lower())
        unknown = sorted(set(request.query_params) - taken)
        if unknown:
            listed = ", ".join(sorted(taken - ALWAYS)) or "none"
            raise ValidationError(
                {name[:64]: f"unknown query parameter; this takes {listed}" for name in unknown[:5]}
            )
