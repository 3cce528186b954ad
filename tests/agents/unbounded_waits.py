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
  ``WNOHANG``, ``signal.pause()``, ``subprocess`` waits without ``timeout=``.

``with lock:`` is not counted: every lock of the agents guards a short critical section,
never a wait (the waits use a ``Condition`` with a timeout, which is counted).
"""

from __future__ import annotations

import ast
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

#: Waits bounded another way, each with its reason: ``(path, function, call)`` -> why.
#: ``function`` is the enclosing ``Class.method`` (or function), ``call`` the called expression
#: as written (``first.put``); an entry covers every such call in that function. An entry that
#: no longer matches a call fails the test, so this list never outlives the code it excuses.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("agents/pipeline/pipeline.py", "Pipeline._feed", "first.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
    ("agents/pipeline/pipeline.py", "Pipeline._collect", "ready.put"): (
        "an Inbox put: waits for room only until the pipeline stops, whose close() wakes it"
    ),
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
}


@dataclass(frozen=True)
class Wait:
    """One blocking call the check found without a bound."""

    path: str
    line: int
    function: str
    call: str
    why: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.call)

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function or '<module>'}: {self.call}() {self.why}"


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


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scopes: list[ast.AST] = []
        self.names: list[str] = []
        self.found: list[Wait] = []

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
    finder = _Finder(path)
    finder.visit(ast.parse(source, filename=path))
    return finder.found


def find(root: Path = ROOT, package: str = "agents") -> list[Wait]:
    """Every unbounded wait in ``root/package``, allowlisted ones included."""
    found = []
    for file in sorted((root / package).rglob("*.py")):
        relative = file.relative_to(root).as_posix()
        found += find_in_source(file.read_text(), relative)
    return found


def unexcused(found: list[Wait]) -> list[Wait]:
    """The waits that no entry of :data:`ALLOWED` excuses."""
    return [wait for wait in found if wait.key not in ALLOWED]


def stale(found: list[Wait]) -> list[tuple[str, str, str]]:
    """The entries of :data:`ALLOWED` that excuse no call any more."""
    keys = {wait.key for wait in found}
    return [key for key in ALLOWED if key not in keys]


if __name__ == "__main__":
    waits = find()
    for wait in waits:
        reason = ALLOWED.get(wait.key)
        print(f"{wait}" + (f"  [allowed: {reason}]" if reason else ""))
    sys.exit(1 if unexcused(waits) else 0)
