"""InTune's online capacity fit: where a stage's measured capacity contradicts the power law.

The model-based prior assumes a stage's capacity grows as ``w ** s`` with its workers (the
exponent from :mod:`tuner.scaling`). Stages that contend for a lock, or spend more time agreeing
with each other the more of them there are, follow the Universal Scalability Law instead:
``w / (1 + sigma (w - 1) + kappa w (w - 1))``, which peaks and then falls. No power law
describes that, and a tuner that believes one keeps feeding the stage workers past its peak.

Each good observation gives, per stage, a point ``(w, n)``: ``n`` its capacity (output over busy
fraction) with the CPU share the prior already models divided out. The fit keeps, per stage and
worker count, the mean of ``log n`` over the last ``PER_COUNT`` measurements (at most
``COUNTS`` worker counts, the least recently measured dropped first), weighted by how many
measurements it holds and by age (``FORGET`` per decision), and fits both models to them: the
power law by least squares in log-log, and the law by its usual linearisation, ``w / n = a +
b (w - 1) + c w (w - 1)``, with ``b`` and ``c`` kept at or above zero. It reports a stage's
``(sigma, kappa)`` only when

- its points span at least ``MIN_DISTINCT`` worker counts, and
- the power law misses them by more than measurement noise (``NOISE`` in log capacity), and
- the law explains them at least ``BETTER`` times better (sum of squared log errors).

Everywhere else the stage keeps the prior's power law: where that model is right, this fit
changes nothing. A measurement that differs from the mean at its worker count by more than
``CHANGE`` (log) means the pipeline changed under it (co-located work took CPUs the agent does
not see): the stage's older points are dropped.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.actions import MIN_BUSY
from tuner.observation import Observation

PER_COUNT = 8
COUNTS = 12
FORGET = 0.98
MIN_DISTINCT = 2
NOISE = 0.04
BETTER = 4.0
CHANGE = 0.2
REFIT_EVERY = 2


class CapacityFit:
    """Per stage name and worker count, ``[mean log capacity, measurements, last step]``."""

    def __init__(self) -> None:
        self.points: dict[str, dict[int, list[float]]] = {}
        self.step = 0
        self.fitted: dict[str, tuple[float, float]] = {}
        self._dirty = False

    def update(self, observation: Observation, worker_cpu: dict[str, float]) -> None:
        """Add one observation's points (ignored when it measured nothing)."""
        self.step += 1
        if observation.throughput <= 0:
            return
        slots = sum(s.workers * worker_cpu.get(s.name, 1.0) for s in observation.stages)
        share = min(1.0, max(observation.host.cpus, 1.0) / max(slots, 1e-9))
        total = sum(int(s.workers) for s in observation.stages)
        for stage in observation.stages:
            if stage.items_per_s <= 0:
                continue
            cost = worker_cpu.get(stage.name, 1.0)
            capacity = stage.items_per_s / max(stage.busy_fraction, MIN_BUSY)
            # What the stage would make at a whole CPU: the prior's own share model undone.
            normalised = capacity * ((1.0 - cost) + cost / share)
            value = math.log(normalised)
            points = self.points.setdefault(stage.name, {})
            key = self._key(int(stage.workers), total)
            same = points.get(key)
            if same is not None and abs(value - same[0]) > CHANGE:
                points.clear()
                self.fitted.pop(stage.name, None)
                same = None
            if same is None:
                points[key] = [value, 1.0, float(self.step)]
                if len(points) > COUNTS:
                    del points[min(points, key=lambda k: points[k][2])]
            else:
                count = min(same[1] + 1.0, PER_COUNT)
                same[0] += (value - same[0]) / count
                same[1], same[2] = count, float(self.step)
        self._dirty = True

    def forget(self) -> None:
        """Drop every point and fit: the host's load changed under them (a co-tenant), and
        points from before and after would read the change as the stages' own scaling."""
        self.points.clear()
        self.fitted.clear()
        self._dirty = False

    @staticmethod
    def _key(workers: int, total: int):
        """What a point is kept by: the stage's own workers."""
        return workers

    def usl(self) -> dict[str, tuple[float, float]]:
        """``{stage: (sigma, kappa)}`` for the stages the law describes far better than the
        power law; refitted every ``REFIT_EVERY`` decisions."""
        if self._dirty and self.step % REFIT_EVERY == 0:
            self.fitted = {}
            for name in _power_law_misses(self.points, self.step):
                fit = _fit_stage(self.points[name], self.step)
                if fit is not None:
                    self.fitted[name] = fit
            self._dirty = False
        return self.fitted

    def state_dict(self) -> dict:
        """The points and fit, for checkpoints."""
        return {
            "step": self.step,
            "points": {k: [[w, *p] for w, p in v.items()] for k, v in self.points.items()},
            "fitted": {k: list(v) for k, v in self.fitted.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.step = int(state["step"])
        self.points = {
            k: {int(w): [float(x) for x in p] for w, *p in v} for k, v in state["points"].items()
        }
        self.fitted = {k: (float(a), float(b)) for k, (a, b) in state["fitted"].items()}
        self._dirty = False


def _power_law_misses(
    points: dict[str, dict], step: int, names: list[str] | None = None
) -> list[str]:
    """The stages whose points the power law of their own workers misses by more than noise:
    one weighted regression for all stages at once (a decision has 5 ms for everything). A
    point's key is the stage's workers, or ``(workers, total)`` (:class:`HostContentionFit`)."""
    if names is None:
        names = [name for name, counts in points.items() if len(counts) >= MIN_DISTINCT]
    if not names:
        return []
    width = max(len(points[name]) for name in names)
    x = np.zeros((len(names), width))
    y = np.zeros((len(names), width))
    weights = np.zeros((len(names), width))
    for row, name in enumerate(names):
        counts = points[name]
        own = [key[0] if isinstance(key, tuple) else key for key in counts]
        x[row, : len(counts)] = np.log(own)
        values = np.array(list(counts.values()))
        y[row, : len(counts)] = values[:, 0]
        weights[row, : len(counts)] = values[:, 1] * FORGET ** (step - values[:, 2])
    total = weights.sum(1)
    mean_x = (weights * x).sum(1) / total
    mean_y = (weights * y).sum(1) / total
    dx = np.where(weights > 0, x - mean_x[:, None], 0.0)
    spread = (weights * dx * dx).sum(1)
    slope = (weights * dx * (y - mean_y[:, None])).sum(1) / np.maximum(spread, 1e-12)
    slope = np.clip(slope, 0.3, 1.0)  # the exponents tuner.scaling allows
    offset = ((weights * (y - slope[:, None] * x)).sum(1)) / total
    error = (weights * (y - offset[:, None] - slope[:, None] * x) ** 2).sum(1) / total
    return [name for name, e in zip(names, error, strict=True) if e > NOISE**2]


def _weighted_lstsq(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    root = np.sqrt(weights)
    return np.linalg.lstsq(x * root[:, None], y * root, rcond=None)[0]


def _fit_stage(points: dict[int, list[float]], step: int) -> tuple[float, float] | None:
    if len(points) < MIN_DISTINCT:
        return None
    w = np.array(list(points), dtype=float)
    rows = np.array(list(points.values()))
    log_n, log_w = rows[:, 0], np.log(w)
    n = np.exp(log_n)
    weights = rows[:, 1] * FORGET ** (step - rows[:, 2])
    # The prior's model: a power law (exponent as tuner.scaling bounds it).
    slope, intercept = _weighted_lstsq(np.stack([log_w, np.ones_like(log_w)], 1), log_n, weights)
    slope = min(1.0, max(0.3, slope))
    offset = float(np.average(log_n - slope * log_w, weights=weights))
    power_error = float(weights @ (log_n - offset - slope * log_w) ** 2)
    total = float(weights.sum())
    if power_error / total < NOISE**2:
        return None
    # The law, linearised; the terms are kept at or above zero (dropped when negative).
    columns = np.stack([np.ones_like(w), w - 1.0, w * (w - 1.0)], 1)
    y = w / n
    best = None
    for keep in ((0, 1, 2), (0, 2), (0, 1), (0,)):
        coefficients = np.zeros(3)
        coefficients[list(keep)] = _weighted_lstsq(columns[:, keep], y, weights)
        if coefficients[0] <= 0 or (coefficients[1:] < 0).any():
            continue
        predicted = np.log(w / (columns @ coefficients))
        error = float(weights @ (log_n - predicted) ** 2)
        if best is None or error < best[0]:
            best = (error, coefficients)
    if best is None or best[0] * BETTER > power_error:
        return None
    a, b, c = best[1]
    return float(b / a), float(c / a)


class HostContentionFit(CapacityFit):
    """The USL against the pipeline's TOTAL workers ``W``: where stages contend for the host's
    memory bandwidth or caches, every stage slows as workers are added anywhere, which no
    per-stage curve can tell from the stage's own scaling.

    Per stage it keeps, per ``(w, W)`` (its workers, the pipeline's), the mean log capacity at a
    whole CPU, as :class:`CapacityFit` does (same ``PER_COUNT``, ``COUNTS``, ``FORGET`` and
    ``CHANGE``). It compares two models of those points:

    - the prior's: ``log n = a + s log w``, the stage's own power law (``s`` in 0.3..1);
    - contention: ``n = w / (A (1 + sigma (W - 1) + kappa W (W - 1)))``, linear in its own
      workers and slowed by everyone's, fitted linearised (``w / n = A + B (W - 1) + C W (W -
      1)``, ``B`` and ``C`` at or above zero).

    and reports ``(sigma, kappa)`` only where the prior's model misses by more than ``NOISE``
    and contention explains the points ``BETTER`` times better: a stage whose capacity fell while
    its own workers stayed, or fell more than any power law of its own workers allows. Where the
    stage's workers grow with the total, the prior's exponent explains the points as well, and
    the gate stays closed.
    """

    @staticmethod
    def _key(workers: int, total: int):
        """What a point is kept by: the stage's workers and the pipeline's."""
        return (workers, total)

    def usl(self) -> dict[str, tuple[float, float]]:
        """``{stage: (sigma, kappa)}`` of the stages that contention describes far better than
        their own power law; refitted every ``REFIT_EVERY`` decisions."""
        if self._dirty and self.step % REFIT_EVERY == 0:
            self.fitted = {}
            # The prior's own power law first, for all stages at once: a decision has 5 ms.
            names = [
                name
                for name, counts in self.points.items()
                if len({total for _, total in counts}) >= MIN_DISTINCT
            ]
            for name in _power_law_misses(self.points, self.step, names):
                fit = _fit_contention(self.points[name], self.step)
                if fit is not None:
                    self.fitted[name] = fit
            self._dirty = False
        return self.fitted

    def state_dict(self) -> dict:
        """The points and fit, for checkpoints."""
        return {
            "step": self.step,
            "points": {k: [[w, t, *p] for (w, t), p in v.items()] for k, v in self.points.items()},
            "fitted": {k: list(v) for k, v in self.fitted.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.step = int(state["step"])
        self.points = {
            k: {(int(w), int(t)): [float(x) for x in p] for w, t, *p in v}
            for k, v in state["points"].items()
        }
        self.fitted = {k: (float(a), float(b)) for k, (a, b) in state["fitted"].items()}
        self._dirty = False


def _fit_contention(
    points: dict[tuple[int, int], list[float]], step: int
) -> tuple[float, float] | None:
    keys = np.array(list(points), dtype=float)
    rows = np.array(list(points.values()))
    w, total, log_n = keys[:, 0], keys[:, 1], rows[:, 0]
    weights = rows[:, 1] * FORGET ** (step - rows[:, 2])
    log_w = np.log(w)
    # The prior's model: the stage's own power law (exponent as tuner.scaling bounds it).
    if np.ptp(log_w) > 0:
        slope = _weighted_lstsq(np.stack([log_w, np.ones_like(log_w)], 1), log_n, weights)[0]
        slope = min(1.0, max(0.3, float(slope)))
    else:
        slope = 1.0
    offset = float(np.average(log_n - slope * log_w, weights=weights))
    power_error = float(weights @ (log_n - offset - slope * log_w) ** 2)
    if power_error / float(weights.sum()) < NOISE**2:
        return None
    columns = np.stack([np.ones_like(total), total - 1.0, total * (total - 1.0)], 1)
    y = w / np.exp(log_n)
    best = None
    for keep in ((0, 1, 2), (0, 2), (0, 1)):
        coefficients = np.zeros(3)
        coefficients[list(keep)] = _weighted_lstsq(columns[:, keep], y, weights)
        if coefficients[0] <= 0 or (coefficients[1:] < 0).any() or not coefficients[1:].any():
            continue
        predicted = np.log(w / (columns @ coefficients))
        error = float(weights @ (log_n - predicted) ** 2)
        if best is None or error < best[0]:
            best = (error, coefficients)
    if best is None or best[0] * BETTER > power_error:
        return None
    a, b, c = best[1]
    return float(b / a), float(c / a)
