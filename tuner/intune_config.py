"""InTune's hyperparameters (:class:`IntuneConfig`), apart from :mod:`tuner.intune` so that the
control plane can read them (the tuning options a job may set, webapp/jobs/api/tuning_options.py)
without importing torch: a web process that only validates and serves does not pay its import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IntuneConfig:
    """Every hyperparameter of InTune, pretraining and online."""

    gamma: float = 0.8
    """Discount: a rebalance crosses the host in a step, so the next few moves matter most."""
    learning_rate: float = 2.5e-4
    """Adam step size while pretraining."""
    hidden: int = 48
    """Width of the Q-network's layers."""
    batch_size: int = 64
    """Transitions per gradient step while pretraining."""
    buffer_size: int = 50_000
    """Replay capacity while pretraining."""
    learning_starts: int = 2_000
    """Transitions collected before the first gradient step."""
    train_frequency: int = 2
    """Decisions between gradient steps while pretraining."""
    target_network_frequency: int = 500
    """Decisions between target-network updates."""
    tau: float = 1.0
    """Target update rate (1 = hard copy, as in CleanRL)."""
    start_e: float = 1.0
    """Exploration rate at the start of pretraining."""
    end_e: float = 0.05
    """Exploration rate at the end of the schedule."""
    exploration_steps: int = 40_000
    """Decisions over which epsilon falls linearly from start_e to end_e."""
    max_grad_norm: float = 10.0
    """Gradient-norm clipping (SB3's default)."""
    online_epsilon: float = 0.0
    """Exploration while tuning a live pipeline: off, exploration costs real throughput."""
    online_buffer_size: int = 256
    """Replay capacity online; it lives in every checkpoint, so it stays small."""
    online_batch_size: int = 8
    """Transitions per online gradient step (keeps a decision under 5 ms at 16 stages)."""
    online_learning_starts: int = 16
    """Online transitions collected before online learning starts."""
    online_learning_rate: float = 1e-4
    """Adam step size online: fine-tuning, not relearning."""
    online_target_network_frequency: int = 50
    """Online decisions between target-network updates."""
    oom_penalty: float = 1.0
    """Reward of a step that ran out of memory."""
    memory_soft_limit: float = 0.98
    """Memory use (fraction of the limit) above which the soft penalty starts. High, because
    memory-bound optima sit close to the limit and the action mask already keeps a margin of
    three standard errors of the memory estimate; the penalty only breaks ties near the edge."""
    memory_penalty: float = 0.5
    """Soft penalty at 100% of the memory limit."""
    change_cost: float = 0.015
    """Reward cost of a decision that changes the allocation (a resize stalls the pipeline;
    chasing differences smaller than the measurement noise only dithers)."""
    capacity_fit: bool = True
    """Fit each stage's capacity curve online (:mod:`tuner.capacity`) and use it where the
    measurements contradict the prior's power law (``prior`` never does: it is learning)."""
    hold_measured_best: bool = True
    """Online, keep the best allocation measured unless a move measures better
    (:mod:`tuner.incumbent`): no move to an allocation measured no better than the incumbent,
    and back to the incumbent when a move measures worse beyond the readings' noise. Measured
    throughput remembered per allocation is learning, so ``prior`` never does it."""
    host_contention_fit: bool = True
    """With ``capacity_fit``, also fit each stage's capacity per worker against the pipeline's
    total workers (:class:`tuner.capacity.HostContentionFit`): stages that contend for the
    host's memory bandwidth slow together as workers are added anywhere."""
    remember_refusals: bool = True
    """Online, mask allocations the host was asked for and did not apply, and any with at least
    their workers in every stage (:mod:`tuner.refusals`): the tuner's estimate of a worker's CPU
    may be wrong where the budget's is not. Remembering outcomes is learning: ``prior`` never does."""
