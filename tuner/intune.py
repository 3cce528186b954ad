"""The InTune tuner (Netflix, RecSys 2023): a double DQN that moves CPU between pipeline stages.

After CleanRL's ``dqn.py`` (one dataclass of hyperparameters, in :mod:`tuner.intune_config`; a
linear epsilon schedule, a target network) with Stable-Baselines3's numerics (Huber loss,
gradient-norm clipping). The state is an :class:`~tuner.actions.EncodedState`; actions and
masking are in :mod:`tuner.actions`; the network in :mod:`tuner.qnetwork`. The reward is the log
change of measured throughput, with a penalty for running out of memory and a smaller one for
coming close to it.

One object serves both phases: ``mode="pretrain"`` (epsilon schedule, large buffer) when
:mod:`tuner.pretrain` trains across random twins, ``mode="online"`` when it tunes a real pipeline
and keeps learning from every decision.
"""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np
import torch
import torch.nn.functional as functional

from agents.budget import WorkerCpuMeter
from tuner.actions import (
    EncodedState,
    encode,
    estimated_capacity,
    measure_worker_cpu,
    oversubscribed_stage,
)
from tuner.capacity import CapacityFit, HostContentionFit
from tuner.incumbent import MOVE_SIGMAS, PROBE_SIGMAS, MeasuredAllocations, Z, allocation_key
from tuner.intune_config import IntuneConfig
from tuner.memory import MemoryEstimator
from tuner.observation import Decision, Observation
from tuner.qnetwork import QNetwork
from tuner.refusals import Refusals
from tuner.replay import ReplayBuffer
from tuner.reward import tuning_reward
from tuner.scaling import ScalingEstimator


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    """Epsilon at decision ``t``: linear from ``start_e`` to ``end_e`` over ``duration``."""
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


def _to_tensors(state: EncodedState):
    slots = int(state.stage_present.sum())
    stage = torch.as_tensor(state.stage_features[:slots]).unsqueeze(0)
    glob = torch.as_tensor(state.global_features).unsqueeze(0)
    present = torch.as_tensor(state.stage_present[:slots]).unsqueeze(0)
    return stage, glob, present


class IntuneTuner:
    """InTune's DQN tuner; see the module docstring."""

    name = "intune"

    def __init__(
        self,
        stage_names: list[str] | None = None,
        config: IntuneConfig | None = None,
        seed: int = 0,
        mode: str = "online",
    ) -> None:
        # One thread: the tuner shares the host with the pipeline it tunes.
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.stage_names = list(stage_names) if stage_names else None
        self.config = config or IntuneConfig()
        self.seed = seed
        self.mode = mode
        self.rng = np.random.default_rng(seed)
        self.q_network = QNetwork(self.config.hidden, self.config.change_cost)
        self.target_network = QNetwork(self.config.hidden, self.config.change_cost)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self._set_mode(mode)
        self.global_step = 0
        self.learn_steps = 0
        self.reset_episode()

    def _set_mode(self, mode: str) -> None:
        if mode not in ("online", "pretrain"):
            raise ValueError(f"mode must be 'online' or 'pretrain', got {mode!r}")
        self.mode = mode
        c = self.config
        online = mode == "online"
        self.replay = ReplayBuffer(c.online_buffer_size if online else c.buffer_size)
        self.optimizer = torch.optim.Adam(
            self.q_network.parameters(),
            lr=c.online_learning_rate if online else c.learning_rate,
            fused=True,  # one kernel for all parameters: a third of the step's time on CPU
        )

    def reset_episode(self) -> None:
        """Forget the current pipeline (a new twin while pretraining); keep what was learnt."""
        self.memory = MemoryEstimator()
        self.scaling = ScalingEstimator()
        self.capacity = CapacityFit()
        self.contention = HostContentionFit()
        self.measured = MeasuredAllocations()
        self.refusals = Refusals()
        self.worker_cpu = WorkerCpuMeter()
        self.previous: tuple[EncodedState, int] | None = None
        self.last_good_throughput: float | None = None
        self.per_worker_capacity: dict[str, float] = {}

    # Acting -------------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The exploration rate of the next decision."""
        c = self.config
        if self.mode == "online":
            return c.online_epsilon
        return linear_schedule(c.start_e, c.end_e, c.exploration_steps, self.global_step)

    def reward(self, observation: Observation) -> float:
        """Reward of the previous decision, from the observation it led to."""
        c = self.config
        changed = self.previous is not None and self.previous[1] != 0
        return tuning_reward(
            observation, self.last_good_throughput, c.oom_penalty, c.memory_soft_limit,
            c.memory_penalty, changed, c.change_cost,
        )  # fmt: skip

    def q_values(self, state: EncodedState) -> np.ndarray:
        """Q-value of every action index (masked ones included) for an encoded state."""
        with torch.no_grad():
            return self.q_network(*_to_tensors(state))[0].numpy()

    def decide(self, observation: Observation) -> Decision:
        """Choose the next allocation; first learn from the transition ending here."""
        names = [s.name for s in observation.stages]
        if self.stage_names is not None and self.mode == "online" and names != self.stage_names:
            raise ValueError(
                f"this tuner was made for stages {self.stage_names} but the observation has "
                f"{names}; make a new tuner for the new pipeline"
            )
        for stage in observation.stages:
            if stage.workers < 1:
                raise ValueError(
                    f"stage '{stage.name}' reports {stage.workers} workers; an observation must "
                    "describe the allocation in force, where every stage has at least 1"
                )
        self.memory.update(observation)
        self.scaling.update(observation)
        if self.uses_measured_best and self.measured.update(observation) == "load":
            # The same allocation now measures differently: the fits' older points would read
            # the host's load change as the stages' scaling or contention. A change of the
            # trainer's rate ("consumer") leaves the stages' capacities, and the fits, as they were.
            self.capacity.forget()
            self.contention.forget()
        exponents = {s.name: self.scaling.scaling(s.name) for s in observation.stages}
        worker_cpu = measure_worker_cpu(self.worker_cpu, observation)
        usl = host_usl = None
        if self.uses_capacity_fit:
            self.capacity.update(observation, worker_cpu)
            usl = self.capacity.usl()
            if self.config.host_contention_fit:
                self.contention.update(observation, worker_cpu)
                # A stage's own law, where fitted, explains its points already.
                host_usl = {k: v for k, v in self.contention.usl().items() if k not in usl}
            # A stage a law describes is fitted whole: its power-law exponent is dropped.
            exponents.update({name: 1.0 for name in usl})
            exponents.update({name: 1.0 for name in host_usl or ()})
        state = encode(
            observation, self.memory, self.per_worker_capacity, exponents, worker_cpu, usl,
            host_usl,
        )  # fmt: skip
        current = allocation_key(observation)
        if self.uses_refusals:
            self.refusals.update(observation, current)
            self.refusals.mask(current[0], state.allocations, state.mask)
        reward = None
        if self.previous is not None:
            reward = self.reward(observation)
            previous_state, previous_action = self.previous
            self.replay.add(previous_state, previous_action, reward, state)
            self._maybe_learn()
        if observation.throughput > 0:
            self.last_good_throughput = observation.throughput
            capacity = estimated_capacity(observation)
            self.per_worker_capacity = {
                s.name: float(c / s.workers)
                for s, c in zip(observation.stages, capacity, strict=True)
            }
        epsilon = self.epsilon
        q = self.q_values(state)
        valid = np.flatnonzero(state.mask)
        explored = bool(self.rng.random() < epsilon)
        verdict, allocation = "policy", None
        if explored:
            action = int(self.rng.choice(valid))
        elif self.uses_measured_best and observation.throughput > 0:
            action, verdict, allocation = self._hold_measured_best(
                observation, state, q, valid, worker_cpu
            )
        else:
            action = int(valid[np.argmax(q[valid])])
        if allocation is None:
            allocation = state.allocations[action]
            label = state.labels[action]
            self.previous = (state, action)
        else:
            # The incumbent is no single action away: nothing to learn a Q-value for.
            label = "return to the best measured"
            self.previous = None
        if self.uses_refusals:
            self.refusals.request(allocation_key(observation, allocation), current)
        self.global_step += 1
        return Decision(
            allocation=dict(zip(names, allocation, strict=False)),
            action=label,
            q_values={state.labels[i]: float(q[i]) for i in valid},
            epsilon=epsilon,
            reward=reward,
            info={
                "explored": explored,
                "masked_actions": int(len(state.labels) - len(valid)),
                "learn_steps": self.learn_steps,
                "measured_best": verdict,
            },
        )

    def _hold_measured_best(
        self, observation: Observation, state: EncodedState, q, valid, worker_cpu=None
    ):
        """The action under :mod:`tuner.incumbent`'s rules: ``(action, verdict, allocation)``,
        ``allocation`` set only when the incumbent is no single action away."""
        current = allocation_key(observation)
        layout = current[0]
        verdict = self.measured.verdict(current)
        # Compared as plain tuples within this layout: a decision has 5 ms at 16 stages.
        measured = {k[1] for k in self.measured.table if k[0] == layout}
        sigma = self.measured.noise()
        # An untried move must promise more than one reading's noise: the model's gain comes
        # from one window's rates, as noisy as the throughput it predicts.
        floor = q[0] + MOVE_SIGMAS * sigma if state.mask[0] else -np.inf
        if verdict == "incumbent":
            losers = {k[1] for k in self.measured.losers(current) if k[0] == layout}
            allowed = [
                int(i) for i in valid
                if i == 0 or (
                    state.allocations[int(i)] not in losers
                    and (q[i] > floor or state.allocations[int(i)] in measured)
                )
            ] or list(valid)  # fmt: skip
            action = int(allowed[np.argmax(q[allowed])])
            if action == 0 and self.measured.may_step_back(current):
                step_back = self._untried_step_back(observation, state, valid, measured, worker_cpu)
                if step_back:
                    action = int(step_back[np.argmax(q[step_back])])
                    self.measured.probed(allocation_key(observation, state.allocations[action]))
                    return action, "step back", None
            if action == 0 and self.measured.settled(current):
                probe_floor = q[0] - PROBE_SIGMAS * sigma
                untried = [
                    int(i) for i in valid
                    if i != 0 and state.allocations[int(i)] not in measured and q[i] > probe_floor
                ]  # fmt: skip
                if untried:
                    self.measured.probed()
                    return int(untried[np.argmax(q[untried])]), "probe", None
            return action, verdict, None
        onward_floor = q[0] + Z * sigma if state.mask[0] else -np.inf
        onward = [
            int(i) for i in valid
            if i != 0 and state.allocations[int(i)] not in measured and q[i] > onward_floor
        ]  # fmt: skip
        if onward and verdict == "measure":
            # Only from a trial inside the noise: from one measured worse, back to the best.
            return int(onward[np.argmax(q[onward])]), "onward", None
        if verdict == "measure" and state.mask[0]:
            return 0, verdict, None
        target = self.measured.incumbent()
        if target is None or target[0] != layout:
            # A layout change is the layout decision's to make; follow the policy.
            return int(valid[np.argmax(q[valid])]), "policy", None
        for i in valid:
            if state.allocations[int(i)] == target[1]:
                return int(i), "return", None
        return 0, "return", target[1]

    @staticmethod
    def _untried_step_back(observation, state, valid, measured, worker_cpu) -> list[int]:
        """The untried actions that take one worker from a stage whose workers alone, one
        fewer, still ask for every CPU (:func:`tuner.actions.oversubscribed_stage`): removed
        (one worker fewer) or moved to another stage (as many). :mod:`tuner.incumbent` measures
        these whatever their predicted gain: the gain rests on CPUs time-sliced at no cost,
        which is what an oversubscribed stage puts in doubt."""
        largest = oversubscribed_stage(observation, worker_cpu)
        if largest is None:
            return []
        base = [s.workers for s in observation.stages]
        steps = []
        for i in valid:
            new = state.allocations[int(i)]
            if i == 0 or new in measured or new[largest] != base[largest] - 1:
                continue
            others = [n - b for k, (n, b) in enumerate(zip(new, base, strict=True)) if k != largest]
            if min(others, default=0) >= 0 and sum(others) <= 1:
                steps.append(int(i))
        return steps

    @property
    def uses_measured_best(self) -> bool:
        """Whether decisions follow :mod:`tuner.incumbent`'s rules (online only)."""
        return self.config.hold_measured_best and self.mode == "online"

    @property
    def uses_refusals(self) -> bool:
        """Whether refused requests are remembered and masked (:mod:`tuner.refusals`)."""
        return self.config.remember_refusals and self.uses_measured_best

    @property
    def uses_capacity_fit(self) -> bool:
        """Whether decisions use the online capacity fit (:mod:`tuner.capacity`)."""
        return self.config.capacity_fit

    # Learning -----------------------------------------------------------------------------

    def _maybe_learn(self) -> None:
        c = self.config
        online = self.mode == "online"
        starts = c.online_learning_starts if online else c.learning_starts
        frequency = 1 if online else c.train_frequency
        if len(self.replay) < starts or self.global_step % frequency:
            return
        self.learn(c.online_batch_size if online else c.batch_size)
        target_every = c.online_target_network_frequency if online else c.target_network_frequency
        if self.learn_steps % target_every == 0:
            for target, source in zip(
                self.target_network.parameters(), self.q_network.parameters(), strict=False
            ):
                target.data.copy_(c.tau * source.data + (1.0 - c.tau) * target.data)

    def learn(self, batch_size: int) -> float:
        """One double-DQN gradient step on a replay batch; returns the Huber loss."""
        sample = self.replay.sample(self.rng, batch_size)
        # Stages fill slots from the first, so slots no pipeline in the batch uses are dropped.
        slots = int(max(sample["present"].sum(1).max(), sample["next_present"].sum(1).max()))
        for key in ("stage", "present", "next_stage", "next_present"):
            sample[key] = sample[key][:, :slots]
        batch = {k: torch.as_tensor(v) for k, v in sample.items()}
        # One forward pass of the online network over states and next states together: a
        # decision's latency is dominated by the number of torch calls, not their size.
        both = self.q_network(
            torch.cat([batch["stage"], batch["next_stage"]]),
            torch.cat([batch["global"], batch["next_global"]]),
            torch.cat([batch["present"], batch["next_present"]]),
        )
        current, next_online = both[:batch_size], both[batch_size:].detach()
        with torch.no_grad():
            best = next_online.masked_fill(~batch["next_mask"], -1e9).argmax(dim=1, keepdim=True)
            next_target = self.target_network(
                batch["next_stage"], batch["next_global"], batch["next_present"]
            ).gather(1, best)
            target = batch["reward"].unsqueeze(1) + self.config.gamma * next_target
        predicted = current.gather(1, batch["action"].unsqueeze(1))
        loss = functional.smooth_l1_loss(predicted, target)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(
            self.q_network.parameters(), self.config.max_grad_norm, foreach=True
        )
        self.optimizer.step()
        self.learn_steps += 1
        return float(loss.detach())

    # Persistence --------------------------------------------------------------------------

    def policy_dict(self) -> dict:
        """The weights and config only: what a shipped policy file holds."""
        return {"config": asdict(self.config), "q_network": self.q_network.state_dict()}

    def load_policy(self, policy: dict) -> None:
        """Start from a pretrained policy (weights into both networks, fresh optimiser)."""
        self.q_network.load_state_dict(policy["q_network"])
        self.target_network.load_state_dict(policy["q_network"])
        self._set_mode(self.mode)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: weights, optimiser, buffer, counters, RNG."""
        previous = None
        if self.previous is not None:
            state, action = self.previous
            previous = {
                "stage_features": torch.as_tensor(state.stage_features),
                "global_features": torch.as_tensor(state.global_features),
                "stage_present": torch.as_tensor(state.stage_present),
                "mask": torch.as_tensor(state.mask),
                "action": action,
            }
        replay = self.replay.state_dict()
        replay["arrays"] = {k: torch.as_tensor(v) for k, v in replay["arrays"].items()}
        return {
            "stage_names": self.stage_names,
            "config": asdict(self.config),
            "seed": self.seed,
            "mode": self.mode,
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": replay,
            "memory": self.memory.state_dict(),
            "scaling": self.scaling.state_dict(),
            "capacity": self.capacity.state_dict(),
            "contention": self.contention.state_dict(),
            "measured": self.measured.state_dict(),
            "refusals": self.refusals.state_dict(),
            "worker_cpu": self.worker_cpu.state_dict(),
            "previous": previous,
            "last_good_throughput": self.last_good_throughput,
            "per_worker_capacity": dict(self.per_worker_capacity),
            "global_step": self.global_step,
            "learn_steps": self.learn_steps,
            "rng": _rng_state_to_strings(self.rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state made by :meth:`state_dict`."""
        names = {f.name for f in fields(IntuneConfig)}
        self.config = IntuneConfig(**{k: v for k, v in state["config"].items() if k in names})
        self.stage_names = state["stage_names"]
        self.seed = state["seed"]
        self.q_network = QNetwork(self.config.hidden, self.config.change_cost)
        self.target_network = QNetwork(self.config.hidden, self.config.change_cost)
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self._set_mode(state["mode"])
        self.optimizer.load_state_dict(state["optimizer"])
        replay = dict(state["replay"])
        replay["arrays"] = {k: np.asarray(v) for k, v in replay["arrays"].items()}
        self.replay.load_state_dict(replay)
        self.memory = MemoryEstimator()
        self.memory.load_state_dict(state["memory"])
        self.scaling = ScalingEstimator()
        self.scaling.load_state_dict(state["scaling"])
        self.capacity = CapacityFit()
        if "capacity" in state:  # checkpoints from before the capacity fit
            self.capacity.load_state_dict(state["capacity"])
        self.contention = HostContentionFit()
        if "contention" in state:  # checkpoints from before the host contention fit
            self.contention.load_state_dict(state["contention"])
        self.measured = MeasuredAllocations()
        if "measured" in state:  # checkpoints from before the measured-best rules
            self.measured.load_state_dict(state["measured"])
        self.refusals = Refusals()
        if "refusals" in state:  # checkpoints from before refusals were remembered
            self.refusals.load_state_dict(state["refusals"])
        self.worker_cpu = WorkerCpuMeter()
        if "worker_cpu" in state:  # checkpoints from before waiting stages were measured
            self.worker_cpu.load_state_dict(state["worker_cpu"])
        previous = state["previous"]
        if previous is None:
            self.previous = None
        else:
            encoded = EncodedState(
                stage_features=np.asarray(previous["stage_features"]),
                global_features=np.asarray(previous["global_features"]),
                stage_present=np.asarray(previous["stage_present"]),
                mask=np.asarray(previous["mask"]),
                allocations={},
                labels={},
            )
            self.previous = (encoded, int(previous["action"]))
        self.last_good_throughput = state["last_good_throughput"]
        self.per_worker_capacity = dict(state["per_worker_capacity"])
        self.global_step = int(state["global_step"])
        self.learn_steps = int(state["learn_steps"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = _rng_state_from_strings(state["rng"])


def _rng_state_to_strings(state: dict) -> dict:
    # PCG64's state holds 128-bit integers; strings survive any serialiser.
    return {
        k: (_rng_state_to_strings(v) if isinstance(v, dict) else str(v)) for k, v in state.items()
    }


def _rng_state_from_strings(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out[key] = _rng_state_from_strings(value)
        elif key == "bit_generator":
            out[key] = value
        else:
            out[key] = int(value)
    return out
