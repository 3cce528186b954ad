"""Train DLRM on the pipeline's batches, and measure how long each step waited for input.

A step is split in two: the time inside ``next()`` on the pipeline (waiting for input) and the
time computing forward, backward and the optimiser step. The accelerator idle fraction is
waiting time over wall time. On CUDA the compute time comes from CUDA events and every step is
synchronised, so time the host waits is time the device has nothing to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from agents.dlrm.model import DLRM, ModelConfig
from agents.dlrm.stages import batch_rows
from agents.pipeline.errors import PipelineStopped

log = logging.getLogger(__name__)

__all__ = ["ModelConfig", "Trainer"]


class Trainer:
    """Consumes batches, trains, and keeps its own compute-versus-wait figures.

    ``stats()`` (safe to call from another thread) returns, since its previous call, the same
    keys as ``Pipeline.consumer_stats()``: throughput (samples/s), idle_fraction, step_ms,
    wait_ms, device.
    """

    def __init__(self, model_config: ModelConfig | None = None, device: str | None = None) -> None:
        self.config = model_config or ModelConfig()
        #: Called after each backward pass, before the optimiser step (a DDP job reduces the
        #: embedding tables' sparse gradients there: ``agents.dlrm.ddp``).
        self.after_backward: Callable[[], None] | None = None
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = DLRM(self.config).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config.learning_rate)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.steps = 0
        self.samples = 0
        self.last_loss = float("nan")
        self._lock = threading.Lock()
        self._window_at = time.monotonic()
        self._wait_s = 0.0
        self._compute_s = 0.0
        self._window_steps = 0
        self._window_samples = 0
        self._waiting_since: float | None = None

    def step(self, batch: dict[str, Any]) -> float:
        """One optimisation step on a batch; return its loss."""
        batch = _to_device(batch, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(batch), batch["labels"])
        loss.backward()
        if self.after_backward is not None:
            self.after_backward()
        self.optimizer.step()
        return float(loss.detach())  # synchronises the device: the step is over when it returns

    def run(
        self,
        pipeline: Iterable[Any],
        stop_event: threading.Event | None = None,
        max_steps: int | None = None,
    ) -> int:
        """Train on batches until ``stop_event`` is set, ``max_steps`` is reached or the
        pipeline ends; return the steps taken."""
        stop_event = stop_event or threading.Event()
        self.model.train()
        batches = iter(pipeline)
        taken = 0
        cuda = self.device.type == "cuda"
        while not stop_event.is_set() and (max_steps is None or taken < max_steps):
            began = time.monotonic()
            with self._lock:
                self._waiting_since = began
            try:
                batch = next(batches)
            except StopIteration:
                with self._lock:
                    self._waiting_since = None
                break
            except PipelineStopped:
                with self._lock:
                    self._waiting_since = None
                if stop_event.is_set():
                    break  # stopped as asked: the agent stops the pipeline after the event
                raise
            got = time.monotonic()
            if cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
            loss = self.step(batch)
            if cuda:
                end.record()
                end.synchronize()
                compute = start.elapsed_time(end) / 1000.0
            else:
                compute = time.monotonic() - got
            rows = batch_rows(batch)
            with self._lock:
                self._waiting_since = None
                self._wait_s += got - max(began, self._window_at)
                self._compute_s += compute
                self._window_steps += 1
                self._window_samples += rows
            self.steps += 1
            self.samples += rows
            self.last_loss = loss
            taken += 1
        return taken

    def stats(self) -> dict[str, Any]:
        """Throughput and waiting since the previous call (``Pipeline.consumer_stats`` keys)."""
        with self._lock:
            now = time.monotonic()
            wall = max(now - self._window_at, 1e-9)
            wait = self._wait_s
            if self._waiting_since is not None:
                wait += now - max(self._waiting_since, self._window_at)
            steps, samples, compute = self._window_steps, self._window_samples, self._compute_s
            self._window_at = now
            self._wait_s = self._compute_s = 0.0
            self._window_steps = self._window_samples = 0
        return {
            "throughput": samples / wall,
            "idle_fraction": min(1.0, max(0.0, wait / wall)),
            "step_ms": 1000.0 * compute / steps if steps else 0.0,
            "wait_ms": 1000.0 * wait / steps if steps else 0.0,
            "device": self.device.type,
        }


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    if device.type == "cpu":
        return batch

    def move(t: torch.Tensor) -> torch.Tensor:
        return t if t.device == device else t.to(device, non_blocking=True)

    return {k: [move(t) for t in v] if isinstance(v, list) else move(v) for k, v in batch.items()}
