"""The bounded buffer of samples waiting to reach the control plane.

Samples leave the buffer only when the control plane has acknowledged them, so a failed or
timed-out send loses nothing; sequence numbers make a resend harmless. When the control plane
is away for longer than the buffer holds, the oldest samples are dropped and counted, and the
count is reported (``dropped_samples``) in the first batch that gets through.
"""

from __future__ import annotations

import threading
from collections import deque


class SampleBuffer:
    """A thread-safe FIFO of samples (dicts with an integer ``seq``), at most ``capacity`` long.

    One thread appends (the sampler), one thread sends (the shipper) with
    :meth:`begin_send` / :meth:`ack` / :meth:`release`.
    """

    def __init__(self, capacity: int = 3600) -> None:
        if capacity < 1:
            raise ValueError(f"the sample buffer needs room for at least 1 sample, got {capacity}")
        self.capacity = capacity
        self._samples: deque[dict] = deque()
        self._lock = threading.Lock()
        self._dropped = 0  # dropped and not yet reported
        self._dropped_total = 0  # over the agent's life, for logs and Prometheus
        # Samples dropped while a batch holding them is in flight are counted apart: if that
        # batch is stored they were not lost after all.
        self._in_flight_upto: int | None = None
        self._dropped_in_flight = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._samples)

    @property
    def dropped_total(self) -> int:
        """Samples dropped by overflow over the buffer's life."""
        with self._lock:
            return self._dropped_total

    def newest_seq(self) -> int | None:
        """The sequence number of the newest sample held, or None when empty."""
        with self._lock:
            return self._samples[-1]["seq"] if self._samples else None

    def holds_upto(self, seq: int | None) -> bool:
        """Whether a sample numbered ``seq`` or lower is still held (None: False)."""
        with self._lock:
            return seq is not None and bool(self._samples) and self._samples[0]["seq"] <= seq

    def append(self, sample: dict) -> None:
        """Add a sample at the tail, dropping the oldest one when the buffer is full."""
        with self._lock:
            if len(self._samples) >= self.capacity:
                oldest = self._samples.popleft()
                if self._in_flight_upto is not None and oldest["seq"] <= self._in_flight_upto:
                    self._dropped_in_flight += 1
                else:
                    self._dropped += 1
                    self._dropped_total += 1
            self._samples.append(sample)

    def begin_send(self, limit: int) -> tuple[list[dict], int]:
        """Return the oldest ``limit`` samples (left in the buffer) and the dropped count to
        report with them. Call :meth:`ack` when the batch was stored, :meth:`release` if not."""
        with self._lock:
            batch = [self._samples[i] for i in range(min(limit, len(self._samples)))]
            self._in_flight_upto = batch[-1]["seq"] if batch else None
            self._dropped_in_flight = 0
            return batch, self._dropped

    def ack(self, batch: list[dict], reported_dropped: int) -> None:
        """The control plane stored ``batch``: remove it and forget the drops reported with it."""
        with self._lock:
            if batch:
                last = batch[-1]["seq"]
                while self._samples and self._samples[0]["seq"] <= last:
                    self._samples.popleft()
            self._dropped -= reported_dropped
            self._in_flight_upto = None
            self._dropped_in_flight = 0

    def release(self) -> None:
        """The send failed: samples dropped meanwhile from the batch were really lost."""
        with self._lock:
            self._dropped += self._dropped_in_flight
            self._dropped_total += self._dropped_in_flight
            self._in_flight_upto = None
            self._dropped_in_flight = 0

    def discard(self, batch: list[dict]) -> None:
        """The control plane refused ``batch`` as invalid: remove it and count it as dropped,
        so the gap is reported instead of the same batch being refused forever."""
        with self._lock:
            if batch:
                last = batch[-1]["seq"]
                while self._samples and self._samples[0]["seq"] <= last:
                    self._samples.popleft()
                    self._dropped += 1
                    self._dropped_total += 1
            self._in_flight_upto = None
            self._dropped_in_flight = 0

    def discard_seq(self, seq: int) -> None:
        """The control plane refused one sample as invalid: remove it and count it dropped."""
        with self._lock:
            for i, sample in enumerate(self._samples):
                if sample["seq"] == seq:
                    del self._samples[i]
                    self._dropped += 1
                    self._dropped_total += 1
                    break
            self._in_flight_upto = None
            self._dropped_in_flight = 0
