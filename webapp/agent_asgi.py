"""The ASGI application in front of Django: agents' endpoints on a thread pool of its own, their
allocation long-polls held on the event loop, everything else to Django's ASGI handler.

Why: a fleet holds one allocation long-poll per agent at every moment. Held in a thread each (as
under gunicorn's gthread worker) they starve the threads the batches need when a fleet re-arms
its long-polls in step. Here a held long-poll is an asyncio future and the coroutine of its
connection (about 12 KB, no thread):

- ``POST /api/v1/hosts/{id}/metrics/`` and ``GET /api/v1/hosts/{id}/allocation/`` run Django's
  own views (the same token check, validation, throttle and errors as docs/agent-protocol.md
  documents) on a small pool of threads, ``INTUNE_WEB_THREADS`` per process.
- When the allocation view finds nothing newer than ``after`` and the agent asked to ``wait``,
  it hands the wait back here (``HOLD_KEY`` in the WSGI environ) instead of blocking a thread.
  The wait is a future that ONE Redis pattern subscription per process wakes when a version of
  that host is published (webapp/pubsub.py publishes); the database is read again only then.
- On SIGTERM (gunicorn stopping or replacing a worker) every held long-poll answers 204 at once,
  as a timed-out one does, and the agents re-arm on another process.
- A request line over 4,094 bytes is answered 414 here, as gunicorn's own limit did.
- A body is refused from the head alone, before any of it is read (so before a ``100 Continue``
  invites the client to send it): ``413`` when its Content-Length is over the limit, ``415``
  when it has a Content-Encoding (``body_refusal``). A chunked body is read here up to the limit
  (``413`` beyond) and handed to Django with its length: Django's ASGI handler took a chunked
  body whole, without a limit, and DRF read one without a Content-Length as empty.
- A request without a ``Host`` field (HTTP/1.1), or with two, is answered ``400`` here
  (``host_refusal``): Django took the server's own address for it.
- ``HEAD`` of an agent endpoint is served here as its ``GET``: through Django's handler a HEAD
  long-poll blocked the one thread Django's synchronous views share for its whole wait.
"""

import asyncio
import functools
import gc
import io
import json
import logging
import random
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis
import redis.asyncio
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

from webapp.env import envint
from webapp.ingestion.api import lean
from webapp.jobs.api import lean as lean_allocation
from webapp.jobs.api.allocation import HOLD_KEY, HOST_GONE, render_newer_allocation
from webapp.jobs.models import hash_agent_token
from webapp.metrics.instruments import held_long_poll
from webapp.permissions import agent_lookups_read_together
from webapp.pubsub import CONNECTION_OPTIONS as REDIS_OPTIONS
from webapp.pubsub import SOCKET_TIMEOUT_S
from webapp.stack.web_worker import CLIENT_EOF, TARGET_AUTHORITY

log = logging.getLogger(__name__)

AGENT_PATH = re.compile(r"^/api/v1/hosts/([0-9]+)/(allocation|metrics)/$")
AGENT_METHODS = ("GET", "HEAD", "POST")
# gunicorn's limit_request_line: the longest request line (method, URL, version) it reads.
MAX_REQUEST_LINE = 4094
# While the Redis subscription is down, a held long-poll re-reads the database this often, so
# that a version published meanwhile reaches the agent without waiting out its whole period.
DEGRADED_RECHECK_S = 5.0
# A long-poll nothing wakes is answered 204 at a moment drawn in the last SPREAD_FRACTION of its
# wait (a wait of SPREAD_MIN_WAIT_S or more; shorter ones are held whole), not at its very end.
# Why: a fleet's polls opened in the same instant (its hosts started together, or every agent
# reconnected after a restart of the control plane) otherwise time out together and re-arm
# together, for ever, every `wait` seconds: a burst of re-arms, and at the agents a burst of
# answers, beside whatever batches fall in it. Drawn afresh for each poll, the fleet's polls
# drift apart within a few periods whatever its clients do. Measured: 200 httpx agents whose
# polls (wait=30) were opened together, batches every 5 s spread, 90 s, alternated: p99 46 and
# 37 ms against 126 and 87 ms held whole, for a ninth more re-arms (the mean hold is 0.9 of
# the wait; docs/benchmarks.md). The protocol holds a poll "up to `wait` seconds"
# (docs/agent-protocol.md).
SPREAD_FRACTION = 0.2
SPREAD_MIN_WAIT_S = 10.0
# The subscription pings Redis when it has heard nothing for this long, and takes itself down
# (held long-polls degraded, a new subscription tried) when it has heard nothing for the limit:
# a Redis that accepts connections and then stalls is noticed within about 5 s. The pings cost
# one round trip per process every 2 s while no allocation is published.
SUBSCRIPTION_PING_S = 2.0
SUBSCRIPTION_SILENCE_LIMIT_S = 5.0
PING_MESSAGE = "intune-allocation-subscription"


def disconnect_only_after_body(receive):
    """``receive`` for Django's ASGI handler: once the body has been read, nothing but
    ``http.disconnect`` comes from it.

    The web worker wakes the request in progress when its client shuts its writing down
    (``web_worker.BoundedHttpTools.eof_received``: a held long-poll here answers at once then),
    and uvicorn's receive() then returns another, empty ``http.request``. Django's handler,
    its body read, listens for the disconnect alone and asserts anything else: a client that
    half-closed after its request (docs/agent-protocol.md, "Half-close": it is still answered)
    got a 500 about half the time, and every live stack logged the traceback once at startup
    (its health check's client timing out). Such a wake is not a message for Django: the next
    one (the disconnect, or the answer complete) is."""
    body_read = False

    async def after_body() -> dict:
        nonlocal body_read
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            if not body_read:
                body_read = not message.get("more_body", False)
                return message

    return after_body


class AllocationWaker:
    """Futures of held long-polls by host id, woken by one Redis pattern subscription."""

    def __init__(self) -> None:
        self.waiters: dict[int, set[asyncio.Future]] = {}
        self.connected = False
        self.closing = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the subscription on the running loop (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        self.closing = True
        self.wake_all()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping anyway
                pass
            self._task = None

    def register(self, host_id: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(host_id, set()).add(future)
        return future

    def discard(self, host_id: int, future: asyncio.Future) -> None:
        futures = self.waiters.get(host_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self.waiters[host_id]

    def wake(self, host_id: int) -> None:
        for future in self.waiters.pop(host_id, ()):
            if not future.done():
                future.set_result(True)

    def wake_all(self) -> None:
        for host_id in list(self.waiters):
            self.wake(host_id)

    async def _listen(self) -> None:
        pattern = f"{settings.REDIS_KEY_PREFIX}:host:*:allocation"
        while not self.closing:
            # socket_timeout bounds the connection's handshake and every write; the reads below
            # pass their own timeouts.
            client = redis.asyncio.Redis.from_url(
                settings.REDIS_CLIENT_URL, socket_timeout=SOCKET_TIMEOUT_S, **REDIS_OPTIONS
            )
            pubsub = client.pubsub()
            try:
                await self._subscribed(pubsub, pattern)
            except (redis.RedisError, OSError, TimeoutError) as exc:
                if self.connected:
                    log.warning(
                        "allocation subscription lost (%s); held long-polls re-read "
                        "the database every %g s until it is back",
                        str(exc) or type(exc).__name__,
                        DEGRADED_RECHECK_S,
                    )
            finally:
                if self.connected:
                    self.connected = False
                    # Held long-polls waiting on the subscription re-read the database now, and
                    # (not connected) every DEGRADED_RECHECK_S after.
                    self.wake_all()
                try:
                    async with asyncio.timeout(SOCKET_TIMEOUT_S):
                        await pubsub.aclose()
                        await client.aclose()
                except (redis.RedisError, OSError, TimeoutError):
                    pass
            await asyncio.sleep(1.0)

    async def _subscribed(self, pubsub, pattern: str) -> None:
        """Subscribe and wake held long-polls until the subscription ends (an error) or Redis
        says nothing for SUBSCRIPTION_SILENCE_LIMIT_S though pinged (TimeoutError).

        A server that accepts the connection and then stalls says nothing, and a read with a
        timeout cannot tell that from a quiet night: hence the pings. redis-py's own health
        check sends one but hides its answer, so this sends its own, and counts any word
        from Redis (a message, a confirmation, a pong) as a sign of life."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(SUBSCRIPTION_SILENCE_LIMIT_S):
            await pubsub.psubscribe(pattern)
        heard = pinged = loop.time()
        while True:
            now = loop.time()
            if now - heard > SUBSCRIPTION_SILENCE_LIMIT_S:
                raise TimeoutError(f"Redis said nothing for {now - heard:.1f} s, though pinged")
            if now - max(heard, pinged) >= SUBSCRIPTION_PING_S:
                async with asyncio.timeout(SOCKET_TIMEOUT_S):
                    await pubsub.ping(PING_MESSAGE)
                pinged = now
            async with asyncio.timeout(SUBSCRIPTION_SILENCE_LIMIT_S):  # a reconnect's too
                message = await pubsub.get_message(timeout=SUBSCRIPTION_PING_S / 2)
            if message is None:
                continue
            heard = loop.time()
            kind = message.get("type")
            if kind == "psubscribe" and not self.connected:
                self.connected = True
                # Versions published while the subscription was down were missed: every held
                # long-poll reads the database again, now that Redis confirmed the subscription.
                self.wake_all()
            if kind != "pmessage":
                continue
            try:
                host_id = int(message["channel"].rsplit(b":", 2)[-2])
            except (ValueError, IndexError):
                continue
            self.wake(host_id)


def held_for(wait: float, draw=random.random) -> float:
    """Seconds a long-poll asking to ``wait`` is held when nothing wakes it: the whole wait
    when it is short, else a moment drawn uniformly in its last ``SPREAD_FRACTION`` (see
    SPREAD_FRACTION for why)."""
    if wait < SPREAD_MIN_WAIT_S:
        return wait
    return wait * (1.0 - SPREAD_FRACTION * draw())


def host_refusal(scope: dict) -> tuple[int, bytes, list] | None:
    """The ``400`` of a request whose Host field is missing (an HTTP/1.1 request must send one;
    HTTP/1.0 need not, and is answered as to the server's own name) or given more than once
    (RFC 9112 3.2); None otherwise. Before, such a request was served as if to the server's own
    address (``scope["server"]``), which passed DJANGO_ALLOWED_HOSTS."""
    given = [value.strip() for name, value in scope["headers"] if name == b"host"]
    authority = scope.get(TARGET_AUTHORITY)
    if authority is not None and len(given) == 1 and authority.lower() != given[0].lower():
        # RFC 9112 3.2.2: the target's authority is the request's host, whatever Host says;
        # one that names another host than Host is refused rather than served as Host's.
        detail = (
            f"the request target names host {authority.decode('latin-1')[:100]!r} but its Host "
            f"header says {given[0].decode('latin-1')[:100]!r}: send the path alone "
            "(/api/v1/...), or the same host in both"
        )
        return 400, _detail(detail), [(b"connection", b"close")]
    if len(given) == 1 or (not given and scope.get("http_version") == "1.0"):
        return None
    detail = (
        "the request has no Host header; HTTP/1.1 requires one: send the host name of the "
        "control plane's URL"
        if not given
        else f"the request has {len(given)} Host headers; send exactly one"
    )
    return 400, _detail(detail), [(b"connection", b"close")]


def body_refusal(headers, max_body: int) -> tuple[int, bytes, list] | None:
    """``(status, content, headers)`` of the answer to a request whose body is refused from its
    head alone (a Content-Length over ``max_body``: 413; a Content-Encoding: 415), else None.
    Answered before the body is read, so before any ``100 Continue``; a client that waits for
    one never sends its body, so that answer also closes the connection."""
    length = encoding = None
    expects = chunked = False
    codings = []
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == b"content-encoding":
            encoding = value
        elif name == b"transfer-encoding":
            chunked = True
            codings += [c.strip().lower() for c in value.split(b",")]
        elif name == b"expect":
            expects = value.strip().lower() == b"100-continue"
    if chunked and codings != [b"chunked"]:
        # RFC 9112 6.1: a transfer coding the server does not know is a 501. The parser
        # de-chunked "gzip, chunked" and handed the gzip-coded bytes over as the body.
        said = b", ".join(codings).decode("latin-1")[:100]
        detail = (
            f"the body's Transfer-Encoding is {said!r}: this server reads only 'chunked' "
            "(or a Content-Length); send the body without other codings"
        )
        return 501, _detail(detail), [(b"connection", b"close")]
    if length is None and encoding is None:
        return None
    extra = [(b"connection", b"close")] if expects else []
    size = int(length) if length is not None and length.isdigit() else 0
    if size > max_body:
        detail = f"the body is {size} bytes; the limit is {max_body} bytes: send smaller batches"
        return 413, _detail(detail), extra
    if encoding is not None and (size or chunked):
        coding = encoding.strip().lower()
        if coding not in (b"", b"identity"):
            detail = (
                f"the body is {coding.decode('latin-1')}-encoded (Content-Encoding): this server "
                "reads bodies only as they are (identity); send it without Content-Encoding"
            )
            return 415, _detail(detail), [(b"accept-encoding", b"identity"), *extra]
    return None


def _detail(detail: str) -> bytes:
    return json.dumps({"detail": detail}).encode()


def wsgi_environ(scope: dict, body: bytes) -> dict:
    """The WSGI environ of an ASGI HTTP request whose whole body is ``body``."""
    server = scope.get("server") or ("localhost", 80)
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": scope.get("root_path", "").encode().decode("latin-1"),
        "PATH_INFO": scope["path"].encode().decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 80),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    client = scope.get("client")
    if client:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope.get("headers", ()):
        if b"_" in raw_name:
            # As gunicorn and Django's ASGI handler: X_Forwarded_Proto must not pass for
            # X-Forwarded-Proto (a proxy strips only the one it knows), nor Content_Type for
            # Content-Type.
            continue
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_LENGTH":
            continue  # the body's own length, above
        key = name if name == "CONTENT_TYPE" else f"HTTP_{name}"
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


POST, POLL = "post", "poll"
# A group whose serving took longer than this (the database away: each request waits out its
# connection attempts) hands its remaining requests back, to be served each on its own thread.
GROUP_SERIAL_LIMIT_S = 0.5
ALONE = object()  # a gathered request's answer: serve me alone
# The most lean requests one thread serves together (a group's batches share a transaction,
# whose host rows stay locked until its commit).
GATHERED_AT_MOST = 32


class _Raised:
    """An exception raised serving one request of a group, raised again in its coroutine."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _token_hashes(requests) -> list[str]:
    """The hashes of the agent tokens of gathered requests (``Authorization: Agent <token>``)
    whose lookups one query reads ahead; a request without one is looked up (or refused) as
    before."""
    if len(requests) < 2:
        return []
    hashes = []
    for _, scope, _, _ in requests:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                parts = value.split()
                if len(parts) == 2 and parts[0].lower() == b"agent":
                    hashes.append(hash_agent_token(parts[1].decode(errors="replace")))
                break
    return hashes


class Gathered:
    """The lean agents' requests that arrive in one turn of the event loop, handed to the pool
    together: one thread serves up to GATHERED_AT_MOST of them (``serve``), and their batches
    are stored by one statement.

    Why: a fleet in step sends its batches and re-arms in the same instant. Handed to the pool
    one by one, each request cost a future, a thread's wake-up and a ``call_soon_threadsafe``
    back (about a fifth of the web process's CPU in such a burst, py-spy), and each batch a
    commit of its own in PostgreSQL (a quarter of its CPU for a batch). Gathered, a group costs
    one hop and one commit; nothing waits for a group to fill: the requests of one turn are
    handed over at the end of it (``call_soon``), however few."""

    def __init__(self, pool: ThreadPoolExecutor, serve, at_once: int = 2) -> None:
        self.pool = pool
        self.serve = serve
        # Groups in flight at once (``INTUNE_GATHERED_GROUPS``): while they are, the requests
        # that arrive wait and form the next group. 2 keeps both cores of a small host busy
        # (one group's Python beside another's statements) and the groups large.
        self.at_once = max(1, at_once)
        self.in_flight = 0
        self.scheduled = False
        self.pending: list[tuple[tuple, asyncio.Future]] = []

    async def submit(self, kind: str, scope: dict, host_id: int, data: bytes):
        """The request's answer, once the group it joined is served."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append(((kind, scope, host_id, data), future))
        if not self.scheduled and self.in_flight < self.at_once:
            self.scheduled = True
            loop.call_soon(self._hand_over, loop)
        answer = await future
        if isinstance(answer, _Raised):
            raise answer.exc
        return answer

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        self.scheduled = False
        while self.pending and self.in_flight < self.at_once:
            group = self.pending[:GATHERED_AT_MOST]
            del self.pending[:GATHERED_AT_MOST]
            try:
                done = self.pool.submit(self.serve, [request for request, _ in group])
            except RuntimeError as exc:  # the pool shut down: the process is stopping
                self._answer(group, None, exc)
                continue
            self.in_flight += 1
            done.add_done_callback(functools.partial(self._served, loop, group))

    def _served(self, loop: asyncio.AbstractEventLoop, group, done) -> None:
        try:
            loop.call_soon_threadsafe(self._answer, group, done, None)
        except RuntimeError:  # the loop has closed: no one is waiting any more
            pass

    def _answer(self, group, done, error: BaseException | None) -> None:
        if done is not None:
            self.in_flight -= 1
            if self.pending and not self.scheduled:
                self.scheduled = True
                asyncio.get_running_loop().call_soon(self._hand_over, asyncio.get_running_loop())
        cancelled = error is None and done.cancelled()  # the pool shut down before serving it
        if error is None and not cancelled:
            error = done.exception()
        answers = done.result() if error is None and not cancelled else [None] * len(group)
        for (_, future), answer in zip(group, answers, strict=True):
            if future.done():  # its request was cancelled (its client went away)
                continue
            if cancelled:
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(answer)


class AgentFront:
    """The ASGI application: see the module's docstring."""

    def __init__(self, django_asgi, threads: int | None = None) -> None:
        self.django = django_asgi
        self.wsgi = WSGIHandler()
        self.threads = threads or envint("INTUNE_WEB_THREADS", 8)
        self.pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="agent")
        self.waker = AllocationWaker()
        self.max_body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440
        self.lean_post = lean.LeanBatchPost() if lean.enabled() else None
        # The usual re-arm of an allocation long-poll, without Django (webapp/jobs/api/lean.py).
        self.lean_poll = lean_allocation.LeanAllocationPoll() if lean.enabled() else None
        # The lean requests that arrive together, served together (Gathered).
        self.gathered = Gathered(
            self.pool, self._serve_together, envint("INTUNE_GATHERED_GROUPS", 2)
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http":
            line = len(scope["method"]) + len(scope.get("raw_path") or scope["path"].encode())
            query = scope.get("query_string", b"")
            line += (len(query) + 1 if query else 0) + len(" HTTP/1.1") + 1
            if line > MAX_REQUEST_LINE:
                await self._respond(
                    send,
                    414,
                    b"<html><body><h1>414 Request-URI Too Long</h1></body></html>",
                    b"text/html",
                )
                return
            refusal = host_refusal(scope) or body_refusal(scope["headers"], self.max_body)
            if refusal is not None:
                await self._refuse(send, *refusal)
                return
            match = AGENT_PATH.match(scope["path"])
            if match and scope["method"] in AGENT_METHODS:
                self.waker.start()
                await self._agent(scope, receive, send, int(match.group(1)), match.group(2))
                return
            receive = disconnect_only_after_body(receive)
            if any(name == b"transfer-encoding" for name, _ in scope["headers"]):
                await self._django_chunked(scope, receive, send)
                return
        await self.django(scope, receive, send)

    async def _django_chunked(self, scope, receive, send) -> None:
        """Django's with a chunked body: read here up to the limit and handed over with its
        length (Django's ASGI handler read it whole, unbounded, and DRF took it for empty)."""
        body = await self._read_body(receive, send)
        if body is None:
            return
        headers = [(k, v) for k, v in scope["headers"] if k != b"transfer-encoding"]
        scope = dict(scope, headers=[*headers, (b"content-length", str(len(body)).encode())])
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.django(scope, replay, send)

    async def _read_body(self, receive, send) -> bytes | None:
        """The request's whole body; None when the client went away, or when it passed the
        limit (then answered 413 here: the rest is left unread, and the server discards it)."""
        body, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                detail = f"the body is over {self.max_body} bytes, the limit: send smaller batches"
                await self._refuse(send, 413, _detail(detail), [])
                return None
            body.append(chunk)
            if not message.get("more_body"):
                return body[0] if len(body) == 1 else b"".join(body)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._chain_signals()
                self._start_pool_threads()
                self.waker.start()
                # Everything the process holds once started (Django, the apps, the settings:
                # about 120,000 objects) is left out of the garbage collector's passes from now
                # on: the process keeps it for its whole life, and every full pass walked it
                # (70 ms a pass at load 17 on this 2-core machine). Before, the collector was
                # 5.5% of the web processes' CPU in step (perf, docs/benchmarks.md).
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.waker.stop()
                self.pool.shutdown(wait=False, cancel_futures=True)
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _start_pool_threads(self) -> None:
        """Every thread of the pool at startup, as the web process opens a connection per thread
        up front (webapp/gunicorn_conf.py): a ThreadPoolExecutor starts one only when none is
        idle, so the process's threads otherwise grew with the first bursts, after it was taken
        as ready. Each start-up task waits for the others (bounded), so none is idle before all
        have started; the loop does not wait for them."""
        gathered = threading.Barrier(self.threads)

        def arrive() -> None:
            try:
                gathered.wait(timeout=10)
            except threading.BrokenBarrierError:
                pass  # a thread that was slow to start: the pool starts it on demand instead

        for _ in range(self.threads):
            self.pool.submit(arrive)

    def _chain_signals(self) -> None:
        """On SIGTERM/SIGINT, after the server's own handler, answer every held long-poll (the
        server waits for open requests before it exits, and these would wait their period)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                if callable(previous):
                    previous(signum, frame)
                self.waker.closing = True
                loop.call_soon_threadsafe(self.waker.wake_all)

            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread: no signals to chain
                return

    async def _agent(self, scope, receive, send, host_id: int, endpoint: str) -> None:
        data = await self._read_body(receive, send)
        if data is None:
            return
        loop = asyncio.get_running_loop()
        if self.lean_post and endpoint == "metrics" and scope["method"] == "POST":
            answer = await self.gathered.submit(POST, scope, host_id, data)
            if answer is ALONE:
                answer = await loop.run_in_executor(
                    self.pool, self._lean, self.lean_post, scope, host_id, data
                )
            elif isinstance(answer, lean.Admitted):
                # Its group could not be stored together: stored alone, on a thread of its own.
                answer = await loop.run_in_executor(self.pool, self.lean_post.store_alone, answer)
            if answer is not None:
                await self._send(send, *answer)
                return
        # Registered before the version is read (here or by the view): a version published
        # after that read wakes this future, so none is missed between the read and the wait.
        future = self.waker.register(host_id) if scope["method"] in ("GET", "HEAD") else None
        if (
            future is not None
            and self.lean_poll
            and endpoint == "allocation"
            and scope["method"] == "GET"
        ):
            try:
                held = await self.gathered.submit(POLL, scope, host_id, data)
                if held is ALONE:
                    held = await loop.run_in_executor(
                        self.pool, self._lean, self.lean_poll, scope, host_id, data
                    )
                if held is not None:
                    with held_long_poll():
                        after, wait = held
                        await self._hold(
                            scope,
                            receive,
                            send,
                            host_id,
                            {"host_id": host_id, "after": after, "wait": wait},
                            future,
                        )
                    return
            except BaseException:
                self.waker.discard(host_id, future)
                raise
        environ = wsgi_environ(scope, data)
        hold = environ[HOLD_KEY] = {}
        try:
            status, headers, content = await loop.run_in_executor(self.pool, self._run, environ)
            if not hold:
                await self._send(send, status, headers, content)
                return
            with held_long_poll():
                await self._hold(scope, receive, send, host_id, hold, future)
        finally:
            if future is not None:
                self.waker.discard(host_id, future)

    async def _hold(
        self, scope, receive, send, host_id: int, hold: dict, future: asyncio.Future
    ) -> None:
        """Hold the long-poll until a newer allocation, its wait, shutdown, or its client
        going away: the request's body is read, so the server's next message is the
        disconnect, and a poll whose agent timed out (and re-armed) is let go at once
        rather than held, and counted, to the end of its wait. A client that shut its
        writing down (``CLIENT_EOF``: half-closed, or closed) is answered at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + held_for(hold["wait"])
        connected = self.waker.connected
        gone = asyncio.ensure_future(receive())
        try:
            while not self.waker.closing and CLIENT_EOF not in scope:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if not connected:
                    remaining = min(remaining, DEGRADED_RECHECK_S)
                await asyncio.wait({future, gone}, timeout=remaining, return_when="FIRST_COMPLETED")
                if gone.done():
                    if gone.result().get("type") == "http.disconnect":
                        self.waker.discard(host_id, future)
                        return
                    gone = asyncio.ensure_future(receive())
                if self.waker.closing or CLIENT_EOF in scope:
                    break
                if (
                    not future.done()
                    and connected
                    and self.waker.connected
                    and loop.time() >= deadline
                ):
                    # Its wait is over and nothing woke it, with the subscription up from the
                    # read (or the last wake) to now: no version was published meanwhile (a
                    # subscription that came back wakes every future), so the database is not
                    # read again. A fleet in step times out all its long-polls in one instant,
                    # beside its batches; that read was 13% of such a burst's web CPU
                    # (py-spy, benchmarks/burst_cpu.py).
                    break
                self.waker.discard(host_id, future)
                future = self.waker.register(host_id)
                connected = self.waker.connected
                content = await loop.run_in_executor(
                    self.pool, render_newer_allocation, hold["host_id"], hold["after"]
                )
                if content == HOST_GONE:
                    break  # its job was deleted (woken by publish_host_gone): 204 now
                if content is not None:
                    await self._respond(send, 200, content, b"application/json")
                    return
            self.waker.discard(host_id, future)
            await self._respond(send, 204, b"", None)
        finally:
            gone.cancel()

    def _serve_together(self, requests: list[tuple[str, dict, int, bytes]]) -> list:
        """On a thread of the pool: the answers of lean requests gathered from one turn of the
        event loop (``Gathered``), in order. A re-arm's is ``LeanAllocationPoll``'s; a batch's
        is ``LeanBatchPost``'s, the batches admitted stored by ONE statement
        (``store_together``), each answered only once all are committed; when they cannot be
        stored together, each batch's answer is its ``Admitted``, to be stored alone. A request
        whose handling raised gets its exception (``_Raised``), the others their answers."""
        with agent_lookups_read_together(_token_hashes(requests)):
            return self._serve_gathered(requests)

    def _serve_gathered(self, requests: list[tuple[str, dict, int, bytes]]) -> list:
        answers: list = []
        admitted: list[int] = []
        alone_after = time.monotonic() + GROUP_SERIAL_LIMIT_S
        for kind, scope, host_id, data in requests:
            if time.monotonic() > alone_after:
                # Slow (the database away, a lock waited on): the rest each on a thread of its
                # own, as before grouping, rather than one after another behind this one.
                answers.append(ALONE)
                continue
            try:
                if kind == POLL:
                    answers.append(self._lean(self.lean_poll, scope, host_id, data))
                    continue
                answer = self._lean(self.lean_post.admit, scope, host_id, data)
            except Exception as exc:  # noqa: BLE001 - raised again in that request's coroutine
                answers.append(_Raised(exc))
                continue
            if isinstance(answer, lean.Admitted):
                admitted.append(len(answers))
            answers.append(answer)
        if len(admitted) == 1:
            i = admitted[0]
            try:
                answers[i] = self.lean_post.store_alone(answers[i])
            except Exception as exc:  # noqa: BLE001
                answers[i] = _Raised(exc)
        elif admitted:
            try:
                stored = self.lean_post.store_together([answers[i] for i in admitted])
            except Exception:  # noqa: BLE001 - each is stored alone, which answers for itself
                log.exception("storing %d batches together failed", len(admitted))
                stored = None
            if stored is not None:
                for i, answer in zip(admitted, stored, strict=True):
                    answers[i] = answer
        return answers

    @staticmethod
    def _lean(path, scope: dict, host_id: int, data: bytes):
        """A request by a lean path (webapp/ingestion/api/lean.py, webapp/jobs/api/lean.py);
        None: Django's."""
        headers = {}
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name in headers:
                return None  # a header given twice: as Django joins them, its view decides
            headers[name] = value
        return path(
            host_id, scope.get("scheme", "http"), headers, scope.get("query_string", b""), data
        )

    def _run(self, environ: dict) -> tuple[int, list, bytes]:
        started = {}

        def start_response(status, headers, exc_info=None):
            started["status"], started["headers"] = status, headers

        response = self.wsgi(environ, start_response)
        try:
            content = b"".join(response)
        finally:
            response.close()  # request_finished: the database connection goes back
        return int(started["status"].split(" ", 1)[0]), started["headers"], content

    @staticmethod
    async def _send(send, status: int, headers: list, content: bytes) -> None:
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        if status not in (204, 304) and not any(k.lower() == b"content-length" for k, _ in raw):
            raw.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})

    @staticmethod
    async def _refuse(send, status: int, content: bytes, headers: list) -> None:
        """A JSON refusal with ``detail`` (413, 415), before the body was read."""
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(content)).encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})

    @staticmethod
    async def _respond(send, status: int, content: bytes, content_type: bytes | None) -> None:
        headers = [] if status == 204 else [(b"content-length", str(len(content)).encode())]
        if content_type:
            headers.append((b"content-type", content_type))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
