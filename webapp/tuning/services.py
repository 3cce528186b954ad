"""Tuning sessions: start, stop, take one step; overrides that pause the policy."""

import logging
import time

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

import tuner as tuner_lib
from webapp.ingestion.services import host_budget
from webapp.jobs.models import CONTROL_PLANE_OPTIONS, Allocation, Host, Job
from webapp.jobs.services import (
    Budget,
    audit,
    create_allocation,
    latest_allocation,
    validate_allocation,
)

from . import layouts
from .models import Decision, Override, TuningSession
from .observations import build_observation, fresh_window, summarise
from .signals import session_started
from .twins import MIN_SAMPLES_FOR_TWIN, fit_host_twin

log = logging.getLogger(__name__)

# A decision waits this long for the agent to apply the previous allocation before going on
# with the samples of the allocation it still runs.
APPLY_GRACE_S = 30.0


def active_override(host: Host) -> Override | None:
    """The override in force on the host, if any: the policy is paused while there is one."""
    return host.overrides.in_force()


def check_allocation(
    host: Host, workers: object, budget: Budget | None = None, layout: object = None
) -> dict[str, int]:
    """``validate_allocation`` against the host's budget as measured (``host_budget``), or
    the one given (ValidationError with every problem)."""
    return validate_allocation(host, workers, budget or host_budget(host), layout)


def start_tuning(
    job: Job, user, *, tuner: str | None = None, hosts=None, max_steps=None
) -> list[TuningSession]:
    """Start a session on every host of the job that has none running; returns the new ones.
    Each session's first task is queued once the sessions are committed (``session_started``)."""
    name = tuner or job.tuner
    if name not in tuner_lib.TUNER_NAMES:
        raise ValidationError(
            {"tuner": f"unknown tuner {name!r}; choose one of {sorted(tuner_lib.TUNER_NAMES)}"}
        )
    started = []
    with transaction.atomic():
        for host in hosts if hosts is not None else job.hosts.all():
            if host.sessions.filter(
                status__in=[TuningSession.Status.RUNNING, TuningSession.Status.PRETRAINING]
            ).exists():
                continue
            # InTune first learns this host on its twin when there are samples to fit one.
            pretrain = (
                name == "intune"
                and host.samples.filter(resolution_s=1).count() >= MIN_SAMPLES_FOR_TWIN
            )
            session = TuningSession.objects.create(
                job=job,
                host=host,
                tuner=name,
                status=TuningSession.Status.PRETRAINING
                if pretrain
                else TuningSession.Status.RUNNING,
                decision_interval_s=job.decision_interval_s,
                max_steps=max_steps,
                created_by=user,
                last_sample_ts=time.time(),
                heartbeat_at=timezone.now(),
            )
            started.append(session)
            transaction.on_commit(
                lambda session=session, pretrain=pretrain: session_started.send(
                    TuningSession, session=session, pretrain=pretrain
                )
            )
        if started:
            audit(user, "tuning.start", job=job, tuner=name, sessions=[s.pk for s in started])
    return started


def stop_tuning(job: Job, user) -> int:
    """Stop every running session of the job; the allocation in force stays."""
    with transaction.atomic():
        stopped = job.sessions.filter(
            status__in=[TuningSession.Status.RUNNING, TuningSession.Status.PRETRAINING]
        ).update(status=TuningSession.Status.STOPPED, stopped_at=timezone.now())
        if stopped:
            audit(user, "tuning.stop", job=job, sessions=stopped)
    return stopped


def _new_tuner(session: TuningSession):
    options = {
        k: v
        for k, v in (session.job.tuning_options or {}).items()
        if k not in CONTROL_PLANE_OPTIONS
    }
    return tuner_lib.make_tuner(session.tuner, session.job.stage_names, seed=session.pk, **options)


def take_step(session_id: int, expected_step: int) -> tuple[str, float | None]:
    """Take one decision of a session if it is due. Returns what happened and, when the chain
    must go on, the delay in seconds before the next task.

    Runs in one transaction with the session row locked: the decision, the allocation, the
    checkpoint and the step counter commit together or not at all, so a worker killed here loses
    at most this one decision, and a duplicate task finds the step already taken.
    """
    with transaction.atomic():
        session = (
            TuningSession.objects.select_for_update()
            .select_related("host", "job")
            .filter(pk=session_id)
            .first()
        )
        if session is None or session.status != TuningSession.Status.RUNNING:
            return "not running", None
        if session.steps != expected_step:
            return (
                f"stale (session is at step {session.steps}, task expected {expected_step})",
                None,
            )
        if session.max_steps is not None and session.steps >= session.max_steps:
            session.status = TuningSession.Status.STOPPED
            session.stopped_at = timezone.now()
            session.save(update_fields=["status", "stopped_at"])
            return "finished", None
        host = Host.objects.get(pk=session.host_id)
        session.heartbeat_at = timezone.now()
        session.save(update_fields=["heartbeat_at"])
        interval = session.decision_interval_s
        if active_override(host) is not None:
            return "paused by override", max(1.0, interval / 2)
        newest = latest_allocation(host)
        if newest is not None and newest.status == Allocation.Status.PENDING:
            waited = (timezone.now() - newest.created_at).total_seconds()
            if waited < APPLY_GRACE_S:
                return "waiting for the agent to apply", 0.5
        window = list(fresh_window(host, session.last_sample_ts))
        span = (window[-1].ts - window[0].ts + 1.0) if window else 0.0
        if span < interval:
            return "waiting for fresh metrics", max(0.5, min(interval - span, interval))
        # One budget for the tuner's mask and the check of its decision, so that they agree.
        budget = host_budget(host)
        observation = build_observation(host, window, budget)
        policy = (
            tuner_lib.loads(bytes(session.checkpoint))
            if session.checkpoint
            else _new_tuner(session)
        )
        started = time.perf_counter()
        decision = policy.decide(observation)
        latency_ms = (time.perf_counter() - started) * 1000
        current = newest.workers if newest is not None else None
        current_layout = newest.layout if newest is not None else None
        info = dict(decision.info or {})
        proposed, layout = decision.allocation, None
        if layouts.layout_mode(session.job.tuning_options) == "auto":
            proposed, layout = _with_layout(session, observation, decision, current_layout, info)
        elif current_layout is not None:  # a person's layout stays: the tuner moves its groups
            proposed, layout = (
                layouts.to_groups(decision.allocation, observation.allocation, current_layout),
                current_layout,
            )
        try:
            workers = check_allocation(host, proposed, budget, layout)
        except ValidationError as exc:
            if current is None:
                raise
            # The budget is measured, and moves (a stage's CPU per worker rose, the host lost
            # CPUs): a decision that no longer fits is refused, not the session's end. The
            # allocation in force stays; the tuner sees the new budget at the next step.
            workers, layout = current, current_layout
            info["refused"] = str(exc.detail)[:500]
            if info.pop("layout_changed", None):
                info["layout"] = current_layout
            log.warning(
                "session %s step %s on host %s: decision %s refused by the budget (%s); keeping %s",
                session.pk,
                session.steps,
                host.pk,
                proposed,
                info["refused"],
                current,
            )
        allocation = newest
        if workers != current or layout != current_layout:
            allocation = create_allocation(host, workers, Allocation.Source.POLICY, layout=layout)
        Decision.objects.create(
            session=session,
            host=host,
            step=session.steps,
            observation=summarise(observation, window[-1].ranks),
            action=decision.action[:200],
            q_values=decision.q_values,
            reward=decision.reward,
            epsilon=decision.epsilon,
            info=info,
            allocation=allocation,
            latency_ms=latency_ms,
        )
        session.checkpoint = tuner_lib.dumps(policy)
        session.steps += 1
        session.last_sample_ts = window[-1].ts
        session.last_step_at = timezone.now()
        session.save(update_fields=["checkpoint", "steps", "last_sample_ts", "last_step_at"])
        log.info(
            "session %s step %s on host %s: %s -> %s (%.1f ms)",
            session.pk,
            session.steps,
            host.pk,
            decision.action,
            workers,
            latency_ms,
        )
        return "decided", 0.0


def _with_layout(session, observation, decision, current_layout, info):
    """The step's allocation and layout when the job lets the control plane choose layouts
    (``webapp.tuning.layouts``): a new layout with its predicted best allocation, when one is
    predicted ``MARGIN`` better and the last change is ``HOLD_STEPS`` steps old; otherwise the
    tuner's decision, as the groups of the layout in force run it."""
    names = session.job.stage_names
    last_change = (
        Decision.objects.filter(session=session, info__layout_changed=True)
        .order_by("-step")
        .values_list("step", flat=True)
        .first()
    )
    held = last_change is not None and session.steps - last_change < layouts.HOLD_STEPS
    choice = None if held else layouts.choose(observation, names, current_layout)
    if choice is not None:
        info["layout_predicted"] = round(choice.predicted, 3)
        info["layout_predicted_current"] = round(choice.predicted_current, 3)
    if choice is not None and choice.changed:
        info["layout_changed"] = True
        info["layout"] = choice.layout
        return choice.workers, choice.layout
    info["layout"] = current_layout
    if held:
        info["layout_held"] = True
    if current_layout is None:
        return decision.allocation, None
    return (
        layouts.to_groups(decision.allocation, observation.allocation, current_layout),
        current_layout,
    )


# Decisions taken on the twin before online tuning; a few seconds of CPU on a worker.
PRETRAIN_STEPS = 300


def pretrain(session_id: int) -> bool:
    """Fit the host's twin and fine-tune the session's policy on it, then switch the session to
    online tuning. Returns False when the session is no longer waiting for it."""
    session = TuningSession.objects.select_related("host", "job").get(pk=session_id)
    if session.status != TuningSession.Status.PRETRAINING:
        return False
    policy = _new_tuner(session)
    scenario = fit_host_twin(session.host)
    if scenario is not None:
        steps = int((session.job.tuning_options or {}).get("pretrain_steps", PRETRAIN_STEPS))
        policy = tuner_lib.finetune(policy, scenario, steps=steps, seed=session.pk)
    with transaction.atomic():
        updated = TuningSession.objects.filter(
            pk=session_id, status=TuningSession.Status.PRETRAINING
        ).update(
            status=TuningSession.Status.RUNNING,
            checkpoint=tuner_lib.dumps(policy),
            last_sample_ts=time.time(),
            heartbeat_at=timezone.now(),
        )
    return bool(updated)


def fail_session(session_id: int, error: str) -> None:
    TuningSession.objects.filter(pk=session_id).update(
        status=TuningSession.Status.FAILED, error=error[:4000], stopped_at=timezone.now()
    )


@transaction.atomic
def set_override(
    host: Host, user, *, workers, reason: str, expires_at=None, layout=None
) -> Override:
    """Put a person's allocation in force (in ``layout``, if given: agents.layout); the
    policy on this host pauses until it ends."""
    clean = check_allocation(host, workers, layout=layout)
    if not reason or not reason.strip():
        raise ValidationError({"reason": "say why you override the policy"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "must be in the future"})
    now = timezone.now()
    Override.objects.filter(host=host, ended_at__isnull=True).update(
        ended_at=now, ended_by=user, end_reason="replaced"
    )
    allocation = create_allocation(
        host, clean, Allocation.Source.OVERRIDE, user=user, layout=layout
    )
    override = Override.objects.create(
        host=host,
        workers=clean,
        reason=reason.strip(),
        created_by=user,
        expires_at=expires_at,
        allocation=allocation,
    )
    audit(
        user,
        "override.set",
        host=host,
        workers=clean,
        layout=layout,
        reason=override.reason,
        expires_at=expires_at.isoformat() if expires_at else None,
        version=allocation.version,
    )
    return override


@transaction.atomic
def release_override(host: Host, user, *, end_reason: str = "released") -> int:
    """Hand the host back to the policy. Returns how many overrides ended (0 or 1)."""
    ended = Override.objects.filter(host=host, ended_at__isnull=True).update(
        ended_at=timezone.now(), ended_by=user, end_reason=end_reason
    )
    if ended and user is not None:
        audit(user, "override.release", host=host)
    return ended
