"""Celery tasks of tuning: one short task per decision, chained; periodic housekeeping."""

import logging
import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.dispatch import receiver
from django.utils import timezone
from kombu.exceptions import OperationalError

from webapp.jobs.models import Host
from webapp.metrics.decisions import record_decision

from . import services
from .models import Override, TuningSession
from .signals import session_started
from .twins import fit_host_twin

log = logging.getLogger(__name__)


# A database that does not answer for a moment (no pooled connection within its timeout on a
# loaded host, a failover) is not a broken policy: the same step is tried again, a bounded number
# of times with growing waits (1, 2, 4, 8, 16 s), before the session fails.
TRANSIENT_RETRIES = 5


@shared_task(acks_late=True, soft_time_limit=30, time_limit=60)
def run_tuning_step(session_id: int, expected_step: int, attempt: int = 0) -> str:
    """Take the session's next decision when its metrics are fresh, then schedule the next task."""
    started = time.perf_counter()
    try:
        outcome, delay = services.take_step(session_id, expected_step)
    except (DatabaseOperationalError, InterfaceError) as exc:
        if attempt >= TRANSIENT_RETRIES:
            log.exception("tuning session %s failed at step %s", session_id, expected_step)
            services.fail_session(
                session_id, f"the database did not answer {attempt + 1} times: {exc}"
            )
            return "failed"
        log.warning(
            "tuning session %s, step %s: the database did not answer (%s); trying again in %d s",
            session_id,
            expected_step,
            exc,
            2**attempt,
        )
        run_tuning_step.apply_async((session_id, expected_step, attempt + 1), countdown=2**attempt)
        return "retrying"
    except Exception as exc:  # a broken policy must stop its session, visibly, not loop forever
        log.exception("tuning session %s failed at step %s", session_id, expected_step)
        services.fail_session(session_id, f"{type(exc).__name__}: {exc}")
        return "failed"
    if outcome == "decided":  # committed: count it where every web process can read it
        record_decision(time.perf_counter() - started)
    if delay is not None:
        next_step = expected_step + 1 if outcome == "decided" else expected_step
        run_tuning_step.apply_async((session_id, next_step), countdown=delay)
    return outcome


PRETRAIN_TIME_LIMIT_S = 300


@shared_task(
    acks_late=True, soft_time_limit=PRETRAIN_TIME_LIMIT_S - 60, time_limit=PRETRAIN_TIME_LIMIT_S
)
def pretrain_session(session_id: int) -> str:
    """Fit the host's twin, fine-tune the policy on it, then start the chain of online steps."""
    try:
        started = services.pretrain(session_id)
    except Exception as exc:
        log.exception("pretraining of session %s failed", session_id)
        services.fail_session(session_id, f"pretraining failed: {type(exc).__name__}: {exc}")
        return "failed"
    if started:
        run_tuning_step.delay(session_id, 0)
    return "started" if started else "not waiting for pretraining"


@shared_task(soft_time_limit=240, time_limit=300)
def fit_twins() -> int:
    """Refit every online host's twin from its newest samples (the dashboard's 'best this host
    allows' and the next session's pretraining use it)."""
    fitted = 0
    for host in Host.objects.filter(status=Host.Status.ONLINE):
        try:
            fitted += fit_host_twin(host) is not None
        except Exception:  # one host's odd samples must not stop the others' fits
            log.exception("could not fit the twin of host %s", host.pk)
    return fitted


@shared_task(soft_time_limit=20, time_limit=40)
def resume_stalled_sessions() -> int:
    """Re-start the chain of any running session whose tasks stopped (their worker died or the
    broker lost the message). A duplicate chain finds its step taken and ends by itself."""
    stalled_before = timezone.now() - timedelta(seconds=settings.INTUNE["STALLED_AFTER_S"])
    resumed = 0
    for session in TuningSession.objects.filter(
        status=TuningSession.Status.RUNNING, heartbeat_at__lt=stalled_before
    ):
        log.warning("session %s stalled at step %s; resuming it", session.pk, session.steps)
        run_tuning_step.delay(session.pk, session.steps)
        resumed += 1
    # Pretraining is one task of at most PRETRAIN_TIME_LIMIT_S: one silent for longer died with
    # its worker. Touch the heartbeat so the next sweep does not queue it again at once.
    pretrain_stalled_before = stalled_before - timedelta(seconds=PRETRAIN_TIME_LIMIT_S)
    for session in TuningSession.objects.filter(
        status=TuningSession.Status.PRETRAINING, heartbeat_at__lt=pretrain_stalled_before
    ):
        log.warning("session %s stalled while pretraining; pretraining it again", session.pk)
        TuningSession.objects.filter(pk=session.pk).update(heartbeat_at=timezone.now())
        pretrain_session.delay(session.pk)
        resumed += 1
    return resumed


@shared_task(soft_time_limit=20, time_limit=40)
def expire_overrides() -> int:
    """End overrides past their expiry; the policy takes the host back."""
    now = timezone.now()
    expired = Override.objects.filter(ended_at__isnull=True, expires_at__lte=now).update(
        ended_at=now, end_reason="expired"
    )
    if expired:
        log.info("%s override(s) expired", expired)
    return expired


@receiver(session_started)
def queue_first_task(sender, session: TuningSession, pretrain: bool, **kwargs) -> None:
    """Queue a started session's first task. With the broker (Redis) away the session is still
    started: the watchdog (resume_stalled_sessions) queues its step once the broker is back."""
    task, args = (
        (pretrain_session, (session.pk,)) if pretrain else (run_tuning_step, (session.pk, 0))
    )
    try:
        task.delay(*args)
    except OperationalError as exc:
        log.warning("could not queue %s%s (%s); the watchdog will resume it", task.name, args, exc)
