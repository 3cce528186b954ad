"""The errors the pipeline runtime raises."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


class AllocationError(ValueError):
    """An allocation the pipeline refused; the pipeline kept the one it had."""


class StageFailed(RuntimeError):
    """A stage's function (or the source) raised on an item; raised to the consumer in order.
    ``error_type``: where the type of what was raised lives, ``"module:qualname"`` (empty
    where the runtime itself failed the item); ``source_seq``: the failed item's number in
    the source's order (``seq`` counts what the consumer took)."""

    def __init__(
        self,
        stage: str,
        seq: int = -1,
        error: str = "",
        traceback_text: str = "",
        error_type: str = "",
        source_seq: int = -1,
        worker: int = -1,
    ) -> None:
        if seq == -1 and not error and not traceback_text:
            # Built from a message alone, as ``type(exc)(message)`` builds any exception (code
            # that re-raises with context, torch's ExceptionWrapper): that raised TypeError.
            stage, error = "", stage
            error_type = error_type or getattr(type(self), "_raised_type", "")
        self.stage = stage
        self.seq = seq
        self.error = error
        self.traceback_text = traceback_text
        self.error_type = error_type
        self.source_seq = source_seq
        self.worker = worker
        # Set where the error is raised as torch's DataLoader raises a worker's, in its words
        # (``as_raised_type``): "in DataLoader worker process 0".
        self.where = ""
        if not stage and seq == -1 and not traceback_text:
            super().__init__(error)
            return
        super().__init__(
            f"stage '{stage}' failed on item {seq}: {error}\n"
            f"--- traceback in the worker ---\n{traceback_text}"
        )

    def __str__(self) -> str:
        if self.__dict__.get("where") == RAISED_HERE and self.traceback_text:
            return _as_raised_here(self)
        if self.__dict__.get("where") and self.traceback_text:
            # torch's ExceptionWrapper's words, which scripts and log searches look for, to the
            # last line, the original error (the stage and batch are in .stage and .seq).
            kind = short_type_name(self.error_type) or "Exception"
            return f"Caught {kind} {self.where}.\nOriginal {self.traceback_text.rstrip()}"
        return BaseException.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # It crosses process boundaries (a rank's trainer, a DDP worker, a test's child): an
        # exception pickles as its class and ``args``, and neither rebuilt it (``args`` is the
        # message alone; the class ``as_raised_type`` makes exists in this process only).
        fields = (self.stage, self.seq, self.error, self.traceback_text, self.error_type)
        return (_rebuild, (fields, self.source_seq, type(self) is not StageFailed), self.__dict__)


# ``StageFailed.where`` of an error that torch's loader would have raised in the training
# process itself (a loader without workers): see ``_as_raised_here``.
RAISED_HERE = "here"


def _as_raised_here(failure: StageFailed) -> str:
    """The message of an error torch's loader without workers raises itself: the original
    error's own message first (so that the script's stderr ends ``ValueError: row 8 is bad``
    as torch's, and a search for it finds it), then where ours raised it and its frames there,
    indented under it. Ours runs even a ``num_workers=0`` loader in a process of its own, to
    resize it live; its words were "stage 'fetch+collate' failed on item 0: ValueError: ..."
    and the worker's whole traceback, a second "Traceback" and error line in the script's
    stderr (the exit hunter, seed 9106)."""
    said = own_message(failure)
    lines = failure.traceback_text.rstrip().splitlines()
    if lines and lines[0].startswith("Traceback"):
        lines = lines[1:]
    ending = failure.error.splitlines()
    if ending and lines[-len(ending) :] == ending:
        lines = lines[: -len(ending)]
    frames = "\n".join(f"  {line}" for line in lines)
    return (
        f"{said}\n  (in stage '{failure.stage}', batch {failure.seq}, in the process of its own "
        f"that runs a loader without workers, so that it can be resized live; most recent "
        f"call last:)\n{frames}"
    )


def short_type_name(error_type: str) -> str:
    """``"module:Outer.KeyError"`` -> ``"KeyError"``: the name Python prints an error under."""
    return error_type.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def own_message(failure: StageFailed) -> str:
    """What the stage's error said itself: ``failure.error`` is ``"KeyError: 'x'"`` (its type's
    name, then its message), and this is ``"'x'"`` (empty for an error raised bare)."""
    kind = short_type_name(failure.error_type)
    said = failure.error
    if kind and said.startswith(f"{kind}: "):
        return said[len(kind) + 2 :]
    if said == kind:
        return ""
    return said


class LayoutBusy(AllocationError):
    """A layout change came while the previous one was still emptying the groups it replaced
    (a worker still in a long item); the pipeline kept the layout it runs."""


class PipelineStalled(TimeoutError):
    """No item reached the consumer within the pipeline's ``item_timeout_s``: a stage's
    function (or the source) blocks. The message says where the items stand, stage by stage."""


class LauncherFailed(RuntimeError):
    """The pipeline's worker launcher died before it had started a worker, again and again
    (``agents.pipeline.pipeline.LAUNCHER_STARTS``, with a growing wait between tries): no
    worker can start, so no item would ever come. Raised to the consumer once the items
    already done are taken; the message says how the last launcher ended and what it raised."""


class PipelineStopped(RuntimeError):
    """The pipeline was stopped (``stop()``, from another thread or before this loop) while its
    consumer still iterated, before the source's end: the items in flight were dropped. A loop
    that ended quietly here would look like a whole epoch that was not one; a loop meant to
    run until someone stops the pipeline catches this."""


def _rebuild(fields: tuple, source_seq: int, raised_type: bool) -> BaseException:
    """Unpickle a ``StageFailed``: as it was, or as the type its stage raised (see
    ``as_raised_type``), rebuilt in this process."""
    failure = StageFailed(*fields, source_seq=source_seq)
    return as_raised_type(failure) if raised_type else failure


_BOTH_TYPES: dict[type, type | None] = {}


def as_raised_type(failure: StageFailed, in_worker: bool | None = None) -> BaseException:
    """The stage's error as torch's DataLoader raises a worker's: of the type the dataset (or
    collate_fn, ...) raised, so that ``except KeyError`` in a training loop catches it.

    It is a ``StageFailed`` too (a class deriving from both), naming the stage and holding the
    worker's traceback; the original type's own fields are unset (an ``OSError``'s ``errno``
    is ``None``, as in torch's, which builds it from the message). Where the two cannot be
    combined (an extension type with an instance layout of its own), it is built from the
    message, as torch builds it, with the ``StageFailed`` as its cause; where that fails too
    (a constructor that wants other arguments), the ``StageFailed`` itself, a
    ``RuntimeError``, as torch's fallback is. Either pickles and unpickles as itself.

    ``in_worker``: ``True``, the loader has worker processes, so its message is torch's for a
    worker's error ("Caught KeyError in DataLoader worker process 0.\nOriginal Traceback
    ..."); ``False``, it has none, and torch raises the error itself, so its message is the
    error's own, the frames after it (``_as_raised_here``); ``None``, the runtime's own words.

    Always a new error: ``failure`` is left as it was (it may be raised again elsewhere, or
    be another error's cause)."""
    failure = _copy_of(failure)
    if in_worker and failure.worker >= 0:
        failure.where = f"in DataLoader worker process {failure.worker}"
    elif in_worker is False:
        failure.where = RAISED_HERE  # torch's loader without workers raises it itself
    kind = _resolve_type(failure.error_type)
    if kind is None or not issubclass(kind, Exception) or isinstance(failure, kind):
        return failure
    if kind not in _BOTH_TYPES:
        try:
            both = type(
                kind.__name__,
                (StageFailed, kind),
                {
                    "__module__": kind.__module__,
                    "__str__": StageFailed.__str__,
                    # StageFailed's arguments are not the original type's (OSError's __new__
                    # would read them as errno, strerror, filename, ...).
                    "__new__": _bare_new(kind),
                    "_raised_type": failure.error_type,  # for one built from a message
                },
            )
        except TypeError:  # instance lay-out conflict
            both = None
        _BOTH_TYPES[kind] = both
    both = _BOTH_TYPES[kind]
    args = (failure.stage, failure.seq, failure.error, failure.traceback_text, failure.error_type)
    if both is not None:
        raised = both(*args, source_seq=failure.source_seq, worker=failure.worker)
        raised.where = failure.where
        raised.__cause__ = failure.__cause__
        return raised
    try:
        raised = kind(str(failure))
    except Exception:
        return failure
    raised.__cause__ = failure
    return raised


def _copy_of(failure: StageFailed) -> StageFailed:
    """A plain ``StageFailed`` with ``failure``'s fields, ``where``, cause, context and
    traceback (what raising ``failure`` itself again would have shown)."""
    fields = (failure.stage, failure.seq, failure.error, failure.traceback_text,
              failure.error_type)  # fmt: skip
    copy = StageFailed(*fields, source_seq=failure.source_seq, worker=failure.worker)
    copy.where = failure.__dict__.get("where", "")
    copy.__cause__, copy.__context__ = failure.__cause__, failure.__context__
    copy.__suppress_context__ = failure.__suppress_context__
    return copy.with_traceback(failure.__traceback__)


def _bare_new(kind: type) -> Callable[..., Any]:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return kind.__new__(cls)

    return __new__


def _resolve_type(name: str) -> type | None:
    """The type a ``"module:qualname"`` names, if this process has it (else ``None``)."""
    module_name, _, qualname = name.partition(":")
    if not qualname:
        return None
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            return None
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found if isinstance(found, type) else None
