"""Find the blocking calls in ``agents/`` that have no bound: an AST check.

A hang is the worst defect a training job can meet, so every wait in the agents has a bound:
a timeout argument, a socket timeout set in the same function or class, or a reason written
in :data:`ALLOWED` (bounded another way: an inbox that ``close()`` wakes, a pipe the other
side closes). The check is syntactic and errs towards flagging:

- ``x.get()``, ``x.put(item)``, ``x.join()``, ``x.wait()``, ``x.acquire()``, ``x.result()``
  with no timeout argument (``.get(key)`` and ``", ".join(names)`` take one positional
  argument and are left alone: they are a dict's and a string's; ``.wait(None)`` is flagged);
- ``block=False`` / ``blocking=False`` / ``False`` first, or ``*_nowait``, are not waits;
- socket and pipe reads and accepts (``recv``, ``recv_bytes``, ``recv_into``, ``recvfrom``,
  ``recv_fds``, ``accept``, ``connect``, ``sendall``) unless ``settimeout`` is called in the
  same function or class;
- ``select.select`` with three arguments, ``poll()`` without one, ``os.waitpid`` without
  ``WNOHANG``, ``signal.pause()``, ``subprocess`` waits without ``timeout=``;
- ``os.read`` not preceded, in the same function, by a ``select``/``poll`` with a timeout;
- ``with lock:``, an acquire with no timeout: a lock-like object is a name or attribute bound
  in the module to ``Lock()``, ``RLock()``, ``Condition()``, ``Semaphore()`` or
  ``BoundedSemaphore()`` (of ``threading``, ``multiprocessing`` or a context of it), a
  ``.get_lock()`` (a ``multiprocessing.Value``'s), or a name that says it is one (``lock``,
  ``mutex``, ``cv``, ``cond``...). Such a wait is bounded by what the holders do while they
  hold it, so each lock needs a reason in :data:`ALLOWED_LOCKS` (what its holders do, and why
  none waits while holding it), or a bounded ``acquire(timeout=...)`` instead;
- inside ``with lock:``, a call that may block while the lock is held (a send or write, a
  queue put or get, a join, a sleep, a read, another lock, a process): every other holder
  then waits as long. It needs its own entry in :data:`ALLOWED` (``call`` written
  ``with <lock>: <call>``), whatever its timeout. A ``Condition``'s ``wait`` on the lock held
  releases it and is not counted here (its own bound is checked as above).

What the holders call further down is not followed: the reasons in :data:`ALLOWED_LOCKS` say it.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Calls that wait until something happens, by method name, and the keyword that bounds them.
_TIMEOUT_KEYWORDS = {"timeout", "timeout_s", "timeout_seconds"}
_QUEUE_LIKE = {"get", "put", "join", "wait", "acquire", "result", "wait_for"}
_SOCKET_LIKE = {
    "recv",
    "recv_bytes",
    "recv_into",
    "recvfrom",
    "recvmsg",
    "recv_fds",
    "accept",
    "connect",
    "sendall",
}
_SUBPROCESS = {"run", "call", "check_call", "check_output", "communicate"}
_LOCK_TYPES = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"}
# A name that says it is a lock (``lock``, ``_send_lock``, ``FORK_LOCK``, ``cv``, ``mutex``).
_LOCK_NAME = re.compile(r"(^|_)(r?lock|mutex|cv|cond|condition|sem|semaphore)$", re.IGNORECASE)
# Calls that may block while a lock is held, by method name (``os.read`` and the like by
# dotted name); their bound does not matter there: the other holders wait as long.
_BLOCKING_UNDER_LOCK = {
    *_QUEUE_LIKE,
    *_SOCKET_LIKE,
    "send",
    "send_bytes",
    "sendmsg",
    "sendto",
    "send_fds",
    "sleep",
    "select",
    "poll",
    "waitpid",
    "communicate",
    "fork",
    "spawn",
}
_BLOCKING_DOTTED = {"os.read", "os.write", "os.fork", "os.waitpid", "time.sleep"}

#: Waits bounded another way, each with its reason: ``(path, function, call)`` -> why.
#: ``function`` is the enclosing ``Class.method`` (or function), ``call`` the called expression
#: as written (``first.put``); an entry covers every such call in that function. An entry that
#: no longer matches a call fails the test, so this list never outlives the code it excuses.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("agents/pipeline/pool.py", "StagePool._feed", "self.outbox.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
    ("agents/pipeline/pool.py", "StagePool._read", "self.outbox.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
    ("agents/pipeline/pool.py", "StagePool._recover", "self.outbox.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
    ("agents/pipeline/worker.py", "serve_thread", "outbox.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
    ("agents/pipeline/worker.py", "serve_process", "items.recv_bytes"): (
        "a worker process idle between items: it leaves when the pipeline closes its pipe "
        "(end-of-file), and the kernel kills it with its launcher (PR_SET_PDEATHSIG)"
    ),
    ("agents/pipeline/zygote.py", "_launcher", "socket.recv_fds"): (
        "read only after select() said the socket is readable, one datagram (SOCK_SEQPACKET)"
    ),
    ("agents/torch/loader.py", "_Plans.begin", "self._queue.put"): (
        "an unbounded queue.Queue(): put never waits"
    ),
    ("agents/torch/loader.py", "_Plans.close", "self._queue.put"): (
        "an unbounded queue.Queue(): put never waits"
    ),
    # Blocking calls made while a lock is held.
    ("agents/daemon/ranks.py", "_Lines.send", "with self._send_lock: self.sock.sendall"): (
        "the lock is there to keep two messages' bytes apart on one socket, so it is held "
        "across the send; the socket always has a timeout: a rank's 2 s from "
        "RankLink._connect until its first receive(), then at most RECEIVE_SLICE_S (0.2 s) "
        "(the hub receives a hello before it sends), after which sendall raises and the "
        "connection is dropped"
    ),
    ("agents/pipeline/zygote.py", "Zygote.__init__", "with FORK_LOCK: os.fork"): (
        "the fork is what FORK_LOCK is held for: no fork of ours copies pipe ends that are "
        "being handed to a worker; a fork copies the process and waits for nothing"
    ),
    ("agents/pipeline/zygote.py", "Zygote.request", "with self._lock: socket.send_fds"): (
        "one request to the launcher at a time (the answers are numbered in order): the "
        "socket's timeout (_REQUEST_TIMEOUT_S, 10 s) bounds the send, and the launcher only "
        "reads requests, so the send waits only when the launcher is gone"
    ),
    ("agents/pipeline/zygote.py", "Zygote.how_it_ended", "with self._lock: self._socket.recv"): (
        "MSG_DONTWAIT: never waits; it reads what a dead launcher left on its socket"
    ),
    ("agents/pipeline/zygote.py", "Zygote.request", "with FORK_LOCK: socket.send_fds"): (
        "the pipe ends in flight must not be copied by another fork of ours until they are "
        "sent and closed here; bounded by the socket's timeout (_REQUEST_TIMEOUT_S, 10 s)"
    ),
}

_ONLY_STATE = "its holders only read or change a few fields and counters: none calls out or waits"

#: The locks of the agents, each with what its holders do while they hold it, which bounds how
#: long ``with lock:`` waits: ``(path, lock)`` -> why. ``lock`` is ``Class.attribute`` for an
#: attribute bound in that class of the module, the name for a module's lock, else
#: ``function: expression`` as written. An entry that no longer matches fails the test.
ALLOWED_LOCKS: dict[tuple[str, str], str] = {
    ("agents/daemon/agent.py", "Agent._lock"): (
        "the allocation state and counters: its holders copy or update a few fields (a "
        "log.debug line at most); the sends, polls and applies happen outside it"
    ),
    ("agents/daemon/buffer.py", "SampleBuffer._lock"): (
        "a deque of samples and two counters: appends, pops and a slice copy of at most the "
        "buffer's capacity; the shipper sends outside it"
    ),
    ("agents/daemon/ranks.py", "_Lines._send_lock"): (
        "held across one sendall, bounded by the socket's timeout (2 s, then 0.2 s: see "
        "the ALLOWED entry for _Lines.send)"
    ),
    ("agents/daemon/ranks.py", "HostPipelines._lock"): (
        "the hub's state (connected ranks, split, generation): its holders copy or update "
        "dicts and start a thread; its waits are wait_for on this Condition with a timeout, "
        "which release it; every message to a rank is sent after it is released"
    ),
    ("agents/daemon/ranks.py", "HostPipelines._moving"): (
        "held for a whole move of the ranks' shares, by apply() and rebalance() only: at most "
        "two steps and a move back, each a send per rank (socket timeout 0.2 s) and a wait "
        "for the answers bounded by apply_timeout_s; nothing that samples or ships takes it"
    ),
    ("agents/daemon/ranks.py", "RankLink._hosting_lock"): (
        "around self.hosted's changes: a listener closed, or host_here() starting the hub's "
        "and the agent's threads (no network wait); the old host agent is stopped outside it"
    ),
    ("agents/dlrm/trainer.py", "Trainer._lock"): _ONLY_STATE,
    ("agents/pipeline/inbox.py", "Inbox._lock"): (
        "a deque of items: appends and pops; the waits for room or items are on its "
        "Conditions, with a timeout or close() to wake them, and release it"
    ),
    ("agents/pipeline/pipeline.py", "_exit_lock"): (
        "a flag and a set of threads: joined_at_exit() reads the flag and adds one thread, "
        "the exit sets the flag; no wait and no call out while it is held"
    ),
    ("agents/transport.py", "Cancel._lock"): (
        "a flag and a set of sockets: track() adds one, set() sets the flag and copies the "
        "set; the sockets are shut down after it is released"
    ),
    ("agents/pipeline/pipeline.py", "Pipeline._lock"): (
        "the pipeline's structure (pools, inboxes, layout): its holders resize pools, which "
        "start workers through the launcher (one request each, bounded by its socket's 10 s "
        "timeout) and retire them without waiting, and stop() shuts the pools down within "
        "stop_timeout_s; nothing waits for items or for the trainer while holding it"
    ),
    ("agents/pipeline/pipeline.py", "Pipeline._stop_lock"): (
        "one stop() at a time, to its end: bounded as stop() is (stop_timeout_s plus the "
        "0.5 s joins and the launcher's close)"
    ),
    ("agents/pipeline/pipeline.py", "Pipeline._stats_lock"): (
        "the consumer's counters: a few additions and a copy"
    ),
    ("agents/pipeline/pool.py", "WorkerHandle.cv"): (
        "a worker's outstanding items: appends, clears and notify; its wait is cv.wait(POLL_S), "
        "which releases it; put_front on the inbox appends without waiting"
    ),
    ("agents/pipeline/shm.py", "_Pool.lock"): (
        "this process's shared files: dict operations and opening and mapping a file in "
        "/dev/shm (memory, no device to wait for)"
    ),
    ("agents/pipeline/zygote.py", "FORK_LOCK"): (
        "held for a fork, or for handing two pipe ends to the launcher (a send bounded by "
        "the socket's 10 s timeout) and closing them: see the ALLOWED entries"
    ),
    ("agents/pipeline/zygote.py", "Zygote._lock"): (
        "one request to the launcher at a time (a send bounded by the socket's 10 s "
        "timeout), and the answers read: answer() waits at most its wait_s (the pool's "
        "START_WAIT_S, 0.5 s, or 0), in 0.05 s slices that look for a stop, each read "
        "preceded by a select() saying it is there; forget() and behind() only touch dicts"
    ),
    ("agents/torch/auto.py", "_Tuned.lock"): (
        "intune-run's list of a process's loaders and its one agent: its holders append a weak "
        "reference, read the list or swap a field; the attach and the agent's stop run outside it"
    ),
    ("agents/torch/loader.py", "DataLoader._lock"): (
        "the references to the epoch's pipeline, receiver and iterator, and the allocation: "
        "its holders swap or copy them, or build an unstarted pipeline (no worker, no user "
        "code); no stop, start or resize runs under it, so metrics() and apply() never wait "
        "on an epoch switch"
    ),
    ("agents/torch/loader.py", "DataLoader._switch_lock"): (
        "one epoch switch or close() at a time: held across stopping the previous epoch's "
        "pipeline (stop_timeout_s plus about a second) and starting the next (worker launches, "
        "each bounded by the launcher's 10 s timeout); only iter() and close() take it, never "
        "the agent's calls"
    ),
    ("agents/torch/loader.py", "DataLoader._apply_lock"): (
        "one resize at a time: held across a Pipeline.apply() (worker launches, each bounded "
        "by the launcher's 10 s timeout), by apply() and by an epoch's start as it makes its "
        "started pipeline current at the allocation applied meanwhile; no stop or start "
        "runs under it"
    ),
    ("agents/torch/loader.py", "_ConsumerStats._lock"): _ONLY_STATE,
    ("agents/torch/observed.py", "_Observation._lock"): _ONLY_STATE,
    ("agents/process_lock.py", "SharedCount._lock"): (
        "a ProcessLock held to read and set one integer (a worker's id as it starts, a count "
        "of skipped lines); its `with` raises TimeoutError after its timeout (60 s), and a "
        "holder that dies frees it at once"
    ),
    ("agents/torch/steps.py", "InitWatch.lock"): (
        "an agents.process_lock.ProcessLock held to set or clear one worker's mark, or to look "
        "through the marks of the workers inside worker_init_fn (a read of /proc for each, "
        "psutil), once per worker start; its `with` raises TimeoutError after 60 s, and a "
        "holder that dies frees it at once"
    ),
    ("agents/torch/steps.py", "Read.lock"): (
        "an agents.process_lock.ProcessLock held to look through the readers' pids (a read of "
        "/proc for each, psutil) and set one, or to compare and set one integer, once per "
        "reader process and epoch; its `with` raises TimeoutError after 60 s, and a holder "
        "that dies frees it at once"
    ),
}


@dataclass(frozen=True)
class Wait:
    """One blocking call the check found without a bound (or a ``with lock:``, ``lock`` set)."""

    path: str
    line: int
    function: str
    call: str
    why: str
    lock: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.call)

    @property
    def lock_key(self) -> tuple[str, str] | None:
        return None if self.lock is None else (self.path, self.lock)

    def __str__(self) -> str:
        call = self.call if self.lock is not None else f"{self.call}()"
        return f"{self.path}:{self.line} in {self.function or '<module>'}: {call} {self.why}"


def _keyword(call: ast.Call, *names: str) -> ast.keyword | None:
    for keyword in call.keywords:
        if keyword.arg in names:
            return keyword
    return None


def _is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _bounded_by_keyword(call: ast.Call) -> bool:
    keyword = _keyword(call, *_TIMEOUT_KEYWORDS)
    return keyword is not None and not _is_none(keyword.value)


def _non_blocking(call: ast.Call) -> bool:
    keyword = _keyword(call, "block", "blocking")
    return keyword is not None and _is_false(keyword.value)


def _queue_like_problem(name: str, call: ast.Call) -> str | None:
    """Why a get/put/join/wait/acquire/result call waits without a bound (None: it does not)."""
    if _bounded_by_keyword(call) or _non_blocking(call):
        return None
    args = call.args
    if name == "get":
        # dict.get(key) has a positional argument; Queue.get(), get(True) do not bound.
        if not args or (
            len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value is True
        ):
            return "waits for an item without a timeout"
        if len(args) >= 2 and _is_none(args[1]):
            return "waits for an item with timeout None"
        return None
    if name == "put":
        if len(args) == 1:
            return "waits for room without a timeout"
        if len(args) == 2 and not _is_false(args[1]):
            return "waits for room without a timeout"
        if len(args) >= 3 and _is_none(args[2]):
            return "waits for room with timeout None"
        return None
    if name in {"join", "wait", "result"}:
        if not args:
            return "waits without a timeout"
        if _is_none(args[0]):
            return "waits with timeout None"
        return None
    if name == "wait_for":
        if len(args) < 2:
            return "waits for its predicate without a timeout"
        return "waits with timeout None" if _is_none(args[1]) else None
    if name == "acquire":
        if not args:
            return "waits for the lock without a timeout"
        if _is_false(args[0]):
            return None
        if len(args) >= 2 and not _is_none(args[1]):
            return None
        return "waits for the lock without a timeout"
    return None


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - every node here unparses
        return "?"


def _last_name(node: ast.AST) -> str | None:
    """``_lock`` of ``self._lock``, ``FORK_LOCK`` of ``FORK_LOCK``; ``None`` for other nodes."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _makes_a_lock(value: ast.AST | None) -> ast.Call | None:
    """The lock constructor call ``value`` is (``threading.Lock()``, ``ctx.RLock()``,
    ``field(default_factory=threading.Condition)``), or ``None``."""
    if not isinstance(value, ast.Call):
        return None
    if _last_name(value.func) in _LOCK_TYPES:
        return value
    factory = _keyword(value, "default_factory")
    if factory is not None and _last_name(factory.value) in _LOCK_TYPES:
        return value
    return None


class _Locks:
    """The names a module binds to locks: attributes by class, module names, other names, and
    which lock each ``Condition(lock)`` waits on."""

    def __init__(self, tree: ast.Module) -> None:
        self.attributes: dict[str, set[str]] = {}  # attribute -> classes that bind it
        self.module_names: set[str] = set()
        self.names: set[str] = set()
        self.condition_of: dict[str, str] = {}  # a Condition's name -> its lock's name
        self._bindings(tree, None, "module")

    def _bindings(self, node: ast.AST, cls: str | None, where: str) -> None:
        """Record the lock bindings under ``node``; ``where`` it is: module, class or function
        (a bare name bound in a class body is a class attribute, a dataclass field)."""
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                self._bindings(child, child.name, "class")
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self._bindings(child, cls, "function")
                continue
            if isinstance(child, ast.Assign | ast.AnnAssign):
                call = _makes_a_lock(child.value)
                annotated = isinstance(child, ast.AnnAssign) and (
                    _last_name(child.annotation) in _LOCK_TYPES
                )
                if call is not None or annotated:
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    for target in targets:
                        self._bind(target, cls, where, call)
            self._bindings(child, cls, where)

    def _bind(self, target: ast.AST, cls: str | None, where: str, call: ast.Call | None) -> None:
        name = _last_name(target)
        if name is None:
            return
        if isinstance(target, ast.Attribute) or where == "class":
            self.attributes.setdefault(name, set()).add(cls or "")
        elif where == "module":
            self.module_names.add(name)
        else:
            self.names.add(name)
        if call is not None and _last_name(call.func) == "Condition" and call.args:
            lock = _last_name(call.args[0])
            if lock is not None:
                self.condition_of[name] = lock

    def is_lock(self, node: ast.AST) -> bool:
        """Whether ``with node:`` takes a lock."""
        if isinstance(node, ast.Call):
            return isinstance(node.func, ast.Attribute) and node.func.attr == "get_lock"
        name = _last_name(node)
        if name is None:
            return False
        if isinstance(node, ast.Attribute) and name in self.attributes:
            return True
        if isinstance(node, ast.Name) and name in self.module_names | self.names:
            return True
        return bool(_LOCK_NAME.search(name))

    def same_lock(self, waited: ast.AST, held: ast.AST) -> bool:
        """Whether waiting on ``waited`` (a Condition) releases ``held``."""
        if _dotted(waited) == _dotted(held):
            return True
        name, held_name = _last_name(waited), _last_name(held)
        return name is not None and self.condition_of.get(name) == held_name

    def identity(self, node: ast.AST, cls: str | None, function: str) -> str:
        """The lock's key in :data:`ALLOWED_LOCKS`."""
        name = _last_name(node)
        if isinstance(node, ast.Attribute) and name is not None:
            if _dotted(node.value) == "self" and cls is not None:
                return f"{cls}.{name}"
            owners = self.attributes.get(name, set())
            if len(owners) == 1 and "" not in owners:
                return f"{next(iter(owners))}.{name}"
        if isinstance(node, ast.Name) and node.id in self.module_names:
            return node.id
        return f"{function}: {_dotted(node)}"


def _calls_outside_nested_scopes(body: list[ast.stmt]) -> list[ast.Call]:
    """The calls in ``body`` that run where it runs (not in a def, lambda or class in it)."""
    calls: list[ast.Call] = []
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _zero(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, 0.0) and node.value is not False


def _may_block_under_lock(call: ast.Call, held: ast.AST, locks: _Locks) -> bool:
    """Whether ``call``, made while ``held`` is held, may wait for something."""
    dotted = _dotted(call.func)
    if dotted in _BLOCKING_DOTTED:
        return True
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in _BLOCKING_UNDER_LOCK:
        return False
    name, owner = func.attr, func.value
    if _non_blocking(call) or isinstance(owner, ast.Constant) or _dotted(owner) == "os.path":
        return False  # acquire(blocking=False), ", ".join(...), os.path.join(...)
    if name in {"wait", "wait_for"} and locks.same_lock(owner, held):
        return False  # releases the lock while it waits
    if name == "get":
        return not call.args or _bounded_by_keyword(call)  # dict.get(key) does not wait
    if name == "acquire":
        return not (call.args and _is_false(call.args[0]))
    if name == "put":
        return not (len(call.args) >= 2 and _is_false(call.args[1]))
    if name == "poll":
        return not (call.args and _zero(call.args[0]))
    if name == "select":
        return not (len(call.args) >= 4 and _zero(call.args[3]))
    return True


def _bounded_select_or_poll(call: ast.Call) -> bool:
    """A ``select.select`` or ``poll`` call with a timeout (that returns when it passes)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "select":
        if len(call.args) >= 4:
            return not _is_none(call.args[3])
        return _bounded_by_keyword(call)
    if func.attr == "poll":
        return bool(call.args) and not _is_none(call.args[0])
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, locks: _Locks) -> None:
        self.path = path
        self.locks = locks
        self.scopes: list[ast.AST] = []
        self.names: list[str] = []
        self.found: list[Wait] = []

    @property
    def _function(self) -> str:
        return ".".join(self.names)

    @property
    def _class(self) -> str | None:
        for scope, name in zip(reversed(self.scopes), reversed(self.names), strict=True):
            if isinstance(scope, ast.ClassDef):
                return name
        return None

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            held = item.context_expr
            if not self.locks.is_lock(held):
                continue
            expr = _dotted(held)
            lock = self.locks.identity(held, self._class, self._function or "<module>")
            why = "waits for the lock without a timeout (bounded only by what its holders do)"
            self.found.append(
                Wait(self.path, node.lineno, self._function, f"with {expr}", why, lock=lock)
            )
            for call in _calls_outside_nested_scopes(node.body):
                if _may_block_under_lock(call, held, self.locks):
                    self.found.append(
                        Wait(
                            self.path,
                            call.lineno,
                            self._function,
                            f"with {expr}: {_dotted(call.func)}",
                            f"may block while holding {expr} (its other holders wait as long)",
                        )
                    )
        self.generic_visit(node)

    visit_AsyncWith = visit_With  # type: ignore[assignment]

    def _read_after_a_bounded_select(self, node: ast.Call) -> bool:
        """Whether a ``select``/``poll`` with a timeout comes before ``node`` in its function."""
        for scope in reversed(self.scopes):
            if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                return any(
                    isinstance(call, ast.Call)
                    and (call.lineno, call.col_offset) < (node.lineno, node.col_offset)
                    and _bounded_select_or_poll(call)
                    for call in ast.walk(scope)
                )
        return False

    def _scope(self, node: ast.AST, name: str) -> None:
        self.scopes.append(node)
        self.names.append(name)
        self.generic_visit(node)
        self.scopes.pop()
        self.names.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scope(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scope(node, node.name)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _settimeout_nearby(self) -> bool:
        """Whether ``settimeout`` is called in the enclosing function or class."""
        for scope in reversed(self.scopes):
            for node in ast.walk(scope):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "settimeout"
                    and not (node.args and _is_none(node.args[0]))
                ):
                    return True
        return False

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        name, owner, call = func.attr, _dotted(func.value), _dotted(func)
        why = None
        if name in _QUEUE_LIKE:
            why = _queue_like_problem(name, node)
        elif name in _SOCKET_LIKE:
            if not self._settimeout_nearby():
                why = "reads or waits on a socket or pipe with no timeout set here"
        elif owner == "select" and name == "select":
            if len(node.args) < 4 and not _bounded_by_keyword(node):
                why = "waits without a timeout"
            elif len(node.args) >= 4 and _is_none(node.args[3]):
                why = "waits with timeout None"
        elif name == "poll" and not node.args and not node.keywords:
            why = "polls without a timeout"
        elif owner == "os" and name == "waitpid":
            flags = _dotted(node.args[1]) if len(node.args) > 1 else ""
            if "WNOHANG" not in flags:
                why = "waits for a child without WNOHANG"
        elif owner == "os" and name == "read":
            if not self._read_after_a_bounded_select(node):
                why = "reads a file descriptor with no select/poll with a timeout before it"
        elif owner == "signal" and name in {"pause", "sigwait"}:
            why = "waits for a signal without a bound"
        elif owner == "subprocess" and name in _SUBPROCESS or name == "communicate":
            if not _bounded_by_keyword(node):
                why = "waits for a process without timeout="
        if why is not None:
            function = ".".join(self.names)
            self.found.append(Wait(self.path, node.lineno, function, call, why))


def find_in_source(source: str, path: str) -> list[Wait]:
    """The unbounded waits in one module's source (``path`` as it is reported)."""
    tree = ast.parse(source, filename=path)
    finder = _Finder(path, _Locks(tree))
    finder.visit(tree)
    return finder.found


def find(root: Path = ROOT, package: str = "agents") -> list[Wait]:
    """Every unbounded wait in ``root/package``, allowlisted ones included."""
    found = []
    for file in sorted((root / package).rglob("*.py")):
        relative = file.relative_to(root).as_posix()
        found += find_in_source(file.read_text(), relative)
    return found


def reason(wait: Wait) -> str | None:
    """What bounds ``wait``, from :data:`ALLOWED_LOCKS` or :data:`ALLOWED`; ``None``: nothing."""
    if wait.lock_key is not None:
        return ALLOWED_LOCKS.get(wait.lock_key)
    return ALLOWED.get(wait.key)


def unexcused(found: list[Wait]) -> list[Wait]:
    """The waits that no entry of :data:`ALLOWED` or :data:`ALLOWED_LOCKS` excuses."""
    return [wait for wait in found if reason(wait) is None]


def stale(found: list[Wait]) -> list[tuple[str, ...]]:
    """The entries of :data:`ALLOWED` and :data:`ALLOWED_LOCKS` that excuse nothing any more."""
    keys = {wait.key for wait in found if wait.lock is None}
    lock_keys = {wait.lock_key for wait in found if wait.lock is not None}
    return [key for key in ALLOWED if key not in keys] + [
        key for key in ALLOWED_LOCKS if key not in lock_keys
    ]


if __name__ == "__main__":
    waits = find()
    for wait in waits:
        why = reason(wait)
        lock = f" [lock {wait.lock}]" if wait.lock else ""
        print(f"{wait}{lock}" + (f"  [allowed: {why}]" if why else ""))
    sys.exit(1 if unexcused(waits) else 0)
