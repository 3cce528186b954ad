"""Hysteresis for a noisy host: keep the best allocation measured unless a move measures better.

The model's predicted gains come from one window's busy fractions and rates. On a real, shared
host those readings scatter by far more than on the twins (the 2-core development machine, DLRM
staged, under load: intune 0.86 of ``prior`` and 0.80 of ``hillclimb``, with allocation changes
in most decisions). A predicted gain of a few percent is then noise, and a tuner that follows it
walks away from a good allocation and back, paying a resize stall each time. On a twin with 10%
noise, intune changed its allocation in 32 of 40 decisions (median of the default suite).

:class:`MeasuredAllocations` keeps, per allocation in force (and layout), the mean and spread of
the log throughput measured there: a bandit's table next to the model. It gives the tuner three
rules, each a plain comparison of measured means against their noise:

- **Incumbent.** The incumbent is the allocation with the highest lower bound, the mean less one
  standard error (a single lucky window does not make an allocation the best).
- **No move to a measured loser.** From the incumbent, an action whose allocation was measured
  and came out no better than the incumbent is masked: the model may propose it again and
  again, the measurements already said no.
- **No move inside the noise.** From the incumbent, a move to an allocation never measured must
  have a predicted gain (its Q-value over hold's) above ``MOVE_SIGMAS`` standard deviations of
  one reading.
- **Probe the neighbours the noise hides.** Once the incumbent has its full readings, one
  untried move whose predicted gain is within ``PROBE_SIGMAS`` standard deviations of hold's is
  measured, at most once every ``PROBE_EVERY`` decisions: without it, the one move of a
  near-tie the model ranks just below hold would never be measured (on the twin ``small-8c``
  the optimum is such a move; intune found it before these rules only because noise pushed it
  there).
- **Step back from an oversubscribed stage.** When one stage of the incumbent, one worker fewer,
  still asks for every CPU of the host (:func:`tuner.actions.oversubscribed_stage`), the
  incumbent's untried neighbours that take one worker from it (one worker fewer, or the worker
  moved to another stage) are measured whatever their predicted gain, once the incumbent has
  ``STEP_BACK_READINGS`` readings, at most once every ``STEP_BACK_EVERY`` decisions; one measured
  is kept ``FAR_LOSER_STALE`` decisions, not ``STALE`` (on the twin ``loader-01-16c-2st``, 17
  workers on 16 CPUs, the step backs came back every 40 decisions and cost intune up to 1.3% of the
  optimum). The model prices that step with CPUs time-sliced at no cost, and that is where it is
  wrong: DLRM fused on the 2-core host, the fused stage at 3 workers and prefetch 1, the model
  rated the step back to 2 between -0.054 and +0.031 over hold (Q, in log throughput; never above
  the move's one noise) and the move to 2 with prefetch 2 at -0.26 to -0.34, far outside the
  probe's reach, while the quiet machine's sweep measured that one 7% faster; intune held 3 for 35
  decisions (the run of 2026-11-29 14:06, its decision log). Fewer readings than a probe's: in that
  run no probe was made though "remove 1 worker" was rated within its reach from the 25th decision
  on, so the incumbent never had its ``PER_ALLOCATION`` readings; the samples/s swung from 50,000
  to 200,000 under the host's load (average 4 to 12), and a jump beyond ``MIN_CHANGE`` clears the
  table.
- **Back to the best when a move measures worse.** On an allocation that is not the incumbent,
  the tuner returns to the incumbent once the gap exceeds ``Z`` standard errors of the
  difference, or after ``TRIAL_READINGS`` readings; inside the noise it measures again first.
  A move from there that the model rates ``Z`` standard deviations above hold is still taken: a probe may land
  next to a better allocation the incumbent's readings could not see.

The noise is the pooled standard deviation of repeated readings at the same allocation, with a
prior of ``PRIOR_NOISE`` worth ``PRIOR_DOF`` readings, so the rules are strict where readings
are noisy and get out of the way where they are not (the twins' 1-3% noise). A reading at the
allocation in force that differs from its mean by more than ``CHANGE_SIGMAS`` standard
deviations (and at least ``MIN_CHANGE`` in log) means the host changed under the pipeline (a
co-tenant, CPUs taken); so does a change of the host's CPUs, CPU slots or memory limit. Either
clears the table: what was measured before says nothing about the new conditions.

A jump is reported as ``"consumer"`` rather than ``"load"`` when the trainer set the pace on the
side of the jump where the rate was lower: a rise from a reading where the trainer was never idle
(below ``CONSUMER_BOUND``), or a fall to one. The trainer's rate changed, not the stages': the
table goes (every allocation that kept up measured the same), but the capacity fits keep their
points. Forgetting those too on ``mw-holdout-11-consumer_change`` (the consumer 6.3 times faster
at step 61, seed 0) took away the contention the fit had learned; the model then saw no gain in
the move to the new optimum and intune held 0.926 of it to the end (0.995 before these rules).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.observation import Observation

Z = 2.0
MOVE_SIGMAS = 1.0
PROBE_SIGMAS = 2.0
PROBE_EVERY = 16
TRIAL_READINGS = 2
STEP_BACK_READINGS = 4
STEP_BACK_EVERY = 8
PRIOR_NOISE = 0.03
PRIOR_DOF = 1.0
MIN_NOISE = 0.005
CHANGE_SIGMAS = 4.0
MIN_CHANGE = 0.25
NOISE_MEMORY = 0.98
PER_ALLOCATION = 8
STALE = 40
# A measurement far below the best one (by more than MIN_CHANGE in log) is kept this long: a
# probe that lost by that much is not tried again every STALE decisions (a waiting stage the
# model read as CPU-bound was probed from 17 workers down to 4, at a quarter of the
# throughput, every 20 to 26 decisions). A change of the host clears it as any other.
FAR_LOSER_STALE = 4 * STALE
CONSUMER_BOUND = 0.05


def allocation_key(observation: Observation, allocation: Sequence[int] | None = None) -> tuple:
    """What a measurement is kept by: the layout in force and the workers of each stage."""
    layout = tuple(tuple(group) for group in observation.layout or ())
    workers = allocation if allocation is not None else [s.workers for s in observation.stages]
    return (layout, tuple(int(w) for w in workers))


class MeasuredAllocations:
    """Per allocation key, ``[mean log throughput, readings, sum of squared deviations, last
    step]``; see the module docstring."""

    def __init__(self) -> None:
        self.table: dict[tuple, list[float]] = {}
        self.host: tuple | None = None
        self.step = 0
        self.changes = 0
        self.last_probe = 0
        # The trainer's idle fraction at the last reading: see update()'s "consumer".
        self.last_idle: float | None = None
        # Squared deviations of repeated readings and their degrees of freedom, over all
        # allocations and kept across forget(): the noise of the host outlives what was measured.
        self.squares = 0.0
        self.dof = 0.0
        # Keys a step back from an oversubscribed stage measured: kept FAR_LOSER_STALE.
        self.step_backs: set[tuple] = set()

    def forget(self) -> None:
        """Drop every measurement (the host changed)."""
        self.table.clear()
        self.step_backs.clear()
        self.changes += 1

    def update(self, observation: Observation) -> str | None:
        """Add the reading of the allocation in force. Returns ``"host"`` when the host's CPUs,
        slots or memory limit changed, ``"consumer"`` when the reading jumped because the
        trainer's rate changed, ``"load"`` when it jumped otherwise (a co-tenant), else None."""
        self.step += 1
        host = observation.host
        signature = (host.cpus, host.worker_budget, host.memory_limit_mb)
        changed = "host" if self.host is not None and signature != self.host else None
        self.host = signature
        best = max((v[0] for v in self.table.values()), default=-math.inf)
        for key in [
            k for k, v in self.table.items()
            if self.step - v[3] > (
                FAR_LOSER_STALE if best - v[0] > MIN_CHANGE or k in self.step_backs else STALE
            )
        ]:  # fmt: skip
            del self.table[key]
            self.step_backs.discard(key)
        if changed:
            self.forget()
        last_idle, self.last_idle = self.last_idle, observation.trainer_idle_fraction
        if observation.throughput <= 0:
            return changed
        value = math.log(observation.throughput)
        key = allocation_key(observation)
        same = self.table.get(key)
        if same is not None:
            threshold = max(MIN_CHANGE, CHANGE_SIGMAS * self.noise() * math.sqrt(1 + 1 / same[1]))
            if abs(value - same[0]) > threshold:
                self.forget()
                trainer_paced = (
                    last_idle is not None and last_idle < CONSUMER_BOUND
                    if value > same[0]
                    else observation.trainer_idle_fraction < CONSUMER_BOUND
                )
                changed = "consumer" if trainer_paced else "load"
                same = None
        if same is None:
            self.table[key] = [value, 1.0, 0.0, float(self.step)]
        else:
            # Welford's update; the count is capped so a slow drift is followed.
            count = min(same[1] + 1.0, PER_ALLOCATION)
            delta = value - same[0]
            same[0] += delta / count
            same[1], same[3] = count, float(self.step)
            self.squares = NOISE_MEMORY * self.squares + delta * (value - same[0])
            self.dof = NOISE_MEMORY * self.dof + (count - 1.0) / count
        return changed

    def noise(self) -> float:
        """Standard deviation of one log-throughput reading: pooled over repeated readings at
        the same allocation (the last ``1 / (1 - NOISE_MEMORY)`` or so), with a prior of
        ``PRIOR_NOISE`` worth ``PRIOR_DOF`` readings."""
        variance = (self.squares + PRIOR_DOF * PRIOR_NOISE**2) / (self.dof + PRIOR_DOF)
        return max(MIN_NOISE, math.sqrt(variance))

    def settled(self, current: tuple) -> bool:
        """Whether ``current`` has its full ``PER_ALLOCATION`` readings and no probe was made in
        ``PROBE_EVERY`` decisions: time to measure one untried neighbour (:meth:`probed`)."""
        entry = self.table.get(current)
        return (
            entry is not None
            and entry[1] >= PER_ALLOCATION
            and self.step - self.last_probe >= PROBE_EVERY
        )

    def may_step_back(self, current: tuple) -> bool:
        """Whether ``current`` has ``STEP_BACK_READINGS`` readings and no probe was made in
        ``STEP_BACK_EVERY`` decisions: time to measure a step back from an oversubscribed
        stage (:meth:`probed` notes it)."""
        entry = self.table.get(current)
        return (
            entry is not None
            and entry[1] >= STEP_BACK_READINGS
            and self.step - self.last_probe >= STEP_BACK_EVERY
        )

    def probed(self, step_back: tuple | None = None) -> None:
        """Note that an untried neighbour is being measured now; ``step_back``, its key when it
        is a step back from an oversubscribed stage (kept ``FAR_LOSER_STALE`` once measured)."""
        self.last_probe = self.step
        if step_back is not None:
            self.step_backs.add(step_back)

    def mean(self, key: tuple) -> float | None:
        """Mean log throughput measured at ``key``; None when never measured."""
        entry = self.table.get(key)
        return None if entry is None else entry[0]

    def incumbent(self) -> tuple | None:
        """The key with the highest mean less one standard error; None when nothing is known."""
        if not self.table:
            return None
        sigma = self.noise()
        return max(self.table, key=lambda k: self.table[k][0] - sigma / math.sqrt(self.table[k][1]))

    def losers(self, current: tuple) -> set[tuple]:
        """Keys measured no better than ``current``, the incumbent: moves there are masked."""
        mean = self.mean(current)
        if mean is None:
            return set()
        return {k for k, v in self.table.items() if k != current and v[0] <= mean}

    def verdict(self, current: tuple) -> str:
        """At an allocation that is not the incumbent: ``"return"`` to the incumbent when the
        gap is beyond the noise or the trial has had its readings, else ``"measure"`` again;
        ``"incumbent"`` when ``current`` is the incumbent (or nothing is known)."""
        best = self.incumbent()
        here = self.table.get(current)
        if best is None or here is None or best == current:
            return "incumbent"
        top = self.table[best]
        sigma = self.noise()
        gap = top[0] - here[0]
        if gap > Z * sigma * math.sqrt(1.0 / here[1] + 1.0 / top[1]) or here[1] >= TRIAL_READINGS:
            return "return"
        return "measure"

    def state_dict(self) -> dict:
        """The table, for checkpoints."""
        return {
            "step": self.step,
            "changes": self.changes,
            "last_probe": self.last_probe,
            "last_idle": self.last_idle,
            "squares": self.squares,
            "dof": self.dof,
            "host": list(self.host) if self.host is not None else None,
            "step_backs": [[[list(g) for g in k[0]], list(k[1])] for k in self.step_backs],
            "table": [[[list(g) for g in k[0]], list(k[1]), *v] for k, v in self.table.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.step = int(state["step"])
        self.changes = int(state["changes"])
        self.last_probe = int(state.get("last_probe", 0))
        last_idle = state.get("last_idle")
        self.last_idle = float(last_idle) if last_idle is not None else None
        self.squares = float(state.get("squares", 0.0))
        self.dof = float(state.get("dof", 0.0))
        self.host = tuple(state["host"]) if state["host"] is not None else None
        self.step_backs = {
            (tuple(tuple(g) for g in layout), tuple(int(w) for w in workers))
            for layout, workers in state.get("step_backs", [])  # older checkpoints: none
        }
        self.table = {
            (tuple(tuple(g) for g in layout), tuple(int(w) for w in workers)): [
                float(x) for x in rest
            ]
            for layout, workers, *rest in state["table"]
        }
