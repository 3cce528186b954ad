"""Who may do what: anonymous reads nothing, a viewer reads, an operator also acts, an agent
reaches only its own host's endpoints."""

from rest_framework import authentication, exceptions, permissions

from webapp.jobs.models import Host, hash_agent_token

OPERATORS_GROUP = "operators"


def is_operator(user) -> bool:
    return bool(
        user
        and user.is_authenticated
        and (user.is_superuser or user.groups.filter(name=OPERATORS_GROUP).exists())
    )


class IsOperatorOrReadOnly(permissions.BasePermission):
    message = "this action needs an operator; viewers may only read"

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Agent <token>``: the request acts for the token's host."""

    keyword = "Agent"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "give the agent token as 'Authorization: Agent <token>'"
            )
        token = header[1].decode(errors="replace")
        # The hash is the lookup key; the lookup itself compares hashes, not secrets, and a
        # second constant-time comparison guards against a database collation surprise.
        host = Host.objects.select_related("job").filter(token_hash=hash_agent_token(token)).first()
        if host is None or not host.token_matches(token):
            raise exceptions.AuthenticationFailed("unknown agent token")
        return (AgentUser(host), host)

    def authenticate_header(self, request) -> str:
        return self.keyword


class AgentUser:
    """Stands for an agent in request.user: authenticated, not a person, tied to one host."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_staff = False
    username = "agent"
    pk = None

    def __init__(self, host: Host):
        self.host = host
        self.username = f"agent:{host.pk}"

    @property
    def groups(self):
        from django.contrib.auth.models import Group

        return Group.objects.none()


class IsHostAgent(permissions.BasePermission):
    """The agent token must belong to the host named in the URL."""

    message = "this agent token belongs to another host"

    def has_permission(self, request, view) -> bool:
        host = request.auth
        if not isinstance(host, Host):
            raise exceptions.NotAuthenticated(
                "this endpoint needs the host's agent token ('Authorization: Agent <token>')"
            )
        return str(host.pk) == str(view.kwargs.get("host_id"))
