"""The errors the pipeline runtime raises."""

from __future__ import annotations


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
        seq: int,
        error: str,
        traceback_text: str,
        error_type: str = "",
        source_seq: int = -1,
    ) -> None:
        self.stage = stage
        self.seq = seq
        self.error = error
        self.traceback_text = traceback_text
        self.error_type = error_type
        self.source_seq = source_seq
        super().__init__(
            f"stage '{stage}' failed on item {seq}: {error}\n"
            f"--- traceback in the worker ---\n{traceback_text}"
        )


class LayoutBusy(AllocationError):
    """A layout change came while the previous one was still emptying the groups it replaced
    (a worker still in a long item); the pipeline kept the layout it runs."""


class PipelineStalled(TimeoutError):
    """No item reached the consumer within the pipeline's ``item_timeout_s``: a stage's
    function (or the source) blocks. The message says where the items stand, stage by stage."""


class PipelineStopped(RuntimeError):
    """The pipeline was stopped (``stop()``, from another thread or before this loop) while its
    consumer still iterated, before the source's end: the items in flight were dropped. A loop
    that ended quietly here would look like a whole epoch that was not one; a loop meant to
    run until someone stops the pipeline catches this."""
