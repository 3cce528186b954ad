"""webapp/agent_asgi.py in process: the request-line limit gunicorn had, and the WSGI environ its
agent endpoints hand to Django."""

import asyncio

from webapp.agent_asgi import MAX_REQUEST_LINE, AgentFront, wsgi_environ


def call(app, scope) -> list[dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def scope_of(path: str, query: bytes = b"") -> dict:
    return {
        "type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
        "query_string": query, "headers": [(b"host", b"testserver")], "http_version": "1.1",
        "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
    }  # fmt: skip


def test_a_request_line_over_gunicorns_limit_is_answered_414_before_django():
    reached = []

    async def django(scope, receive, send):
        reached.append(scope["path"])

    app = AgentFront(django, threads=1)
    path = "/api/v1/jobs/"
    fixed = len("GET ") + len(path) + len("?") + len(" HTTP/1.1")
    longest = b"q=" + b"x" * (MAX_REQUEST_LINE - fixed - 2)
    assert call(app, scope_of(path, longest)) == [] and reached == [path]
    sent = call(app, scope_of(path, longest + b"x"))
    assert sent[0]["status"] == 414 and reached == [path]


def test_the_environ_carries_the_request_as_gunicorn_gave_it():
    scope = scope_of("/api/v1/hosts/3/metrics/", b"a=1")
    scope["method"] = "POST"
    scope["headers"] += [(b"authorization", b"Agent t"), (b"content-type", b"application/json"),
                         (b"content-length", b"999"), (b"x-forwarded-for", b"10.0.0.1")]  # fmt: skip
    environ = wsgi_environ(scope, b'{"samples": []}')
    assert environ["REQUEST_METHOD"] == "POST"
    assert environ["PATH_INFO"] == "/api/v1/hosts/3/metrics/"
    assert environ["QUERY_STRING"] == "a=1"
    assert environ["HTTP_AUTHORIZATION"] == "Agent t"
    assert environ["CONTENT_TYPE"] == "application/json"
    assert environ["CONTENT_LENGTH"] == str(len(b'{"samples": []}'))  # the body's, not the header's
    assert environ["wsgi.input"].read() == b'{"samples": []}'
    assert environ["REMOTE_ADDR"] == "127.0.0.1"
