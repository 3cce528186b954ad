"""With ``tuning_options: {"layout": "auto"}`` a tuning step may fuse neighbouring stages: on a
small host whose samples show hand-offs costing more than the balance gains it fuses them and
keeps them fused; on a many-CPU host whose first stage has a low ceiling it keeps them staged;
without the option every step is the tuner's allocation alone, as before."""

import time

import pytest

from agents.layout import group_names
from webapp.ingestion.services import store_batch
from webapp.ingestion.validation import validate_batch
from webapp.jobs.services import register_host, register_job
from webapp.tuning import services
from webapp.tuning.layouts import HANDOFF_FRACTION, HOLD_STEPS
from webapp.tuning.models import Decision, TuningSession

# The DLRM twin's functions (tuner.layout.dlrm_scenario), us per sample.
DLRM = {"read": 0.40, "parse": 1.20, "transform": 1.80, "collate": 0.36}
CEILING_BOUND = {"read": 2.0, "parse": 2.0, "transform": 2.0}


def samples(host, start_seq: int, seconds: int, fn_us: dict, cpus: float, throughput: float):
    """``seconds`` samples of the allocation the agent applied, each stage's CPU its function's
    plus its group's hand-off (tuner/layout.py's constant), one row per stage as registered
    whatever the layout (a fused group's stages each say the group's workers)."""
    host.refresh_from_db()
    allocation = host.allocations.get(version=host.allocation_version)
    layout = allocation.layout or [[name] for name in fn_us]
    work = sum(fn_us.values())
    workers, cpu = {}, {}
    for group, name in zip(layout, group_names(layout), strict=True):
        share = HANDOFF_FRACTION * work / len(group)
        for stage in group:
            workers[stage] = allocation.workers[name]
            cpu[stage] = (fn_us[stage] + share) * throughput / 1e4
    now = time.time() + start_seq
    raw = {
        "samples": [
            {
                "seq": start_seq + i,
                "ts": now - seconds + i + 1,
                "allocation_version": host.allocation_version,
                "host": {
                    "cpus": cpus,
                    "cpu_percent": 90.0,
                    "per_cpu_percent": [90.0] * int(cpus),
                    "memory_used_mb": 4096.0,
                    "memory_limit_mb": 65536.0,
                    "worker_budget": int(2 * cpus),
                },
                "trainer": {
                    "throughput": throughput,
                    "idle_fraction": 0.3,
                    "step_ms": 8.0,
                    "wait_ms": 2.0,
                    "device": "cpu",
                },
                "stages": [
                    {
                        "name": stage,
                        "workers": workers[stage],
                        "items_per_s": throughput,
                        "busy_fraction": 0.8,
                        "in_queue": 1,
                        "out_queue": 2,
                        "queue_capacity": 8,
                        "cpu_percent": cpu[stage],
                        "rss_mb": 100.0 * workers[stage],
                    }
                    for stage in fn_us
                ],
            }
            for i in range(seconds)
        ],
        "allocation_status": {"applied_version": host.allocation_version},
    }
    store_batch(host, validate_batch(raw, set(fn_us), 600))


def session_on(operator, fn_us, cpus, ceilings=None, options=None):
    ceilings = ceilings or {}
    job = register_job(
        user=operator,
        name=f"layout-{time.time_ns()}",
        stages=[{"name": n, "max_workers": ceilings.get(n)} for n in fn_us],
        tuning_options=options if options is not None else {"layout": "auto"},
    )
    host, _ = register_host(
        job=job,
        user=operator,
        name=f"h-{time.time_ns()}",
        cpus=cpus,
        memory_mb=65536,
        worker_budget=None,
    )
    return TuningSession.objects.create(
        job=job,
        host=host,
        tuner="intune",
        decision_interval_s=5.0,
        last_sample_ts=time.time() - 60,
    )


def steps(session, fn_us, cpus, throughput, count):
    """Take ``count`` steps, each on 6 s of fresh samples; the allocation in force after each."""
    host = session.host
    seen = []
    for step in range(count):
        samples(host, 1 + 100 * step, 6, fn_us, cpus, throughput)
        assert services.take_step(session.pk, step)[0] == "decided"
        host.refresh_from_db()
        seen.append(host.allocations.get(version=host.allocation_version))
    return seen


@pytest.mark.django_db
def test_a_small_host_fuses_the_hand_off_heavy_pipeline_and_keeps_it_fused(operator):
    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4})
    seen = steps(session, DLRM, cpus=2, throughput=400_000.0, count=HOLD_STEPS + 2)
    first = seen[0]
    assert first.layout is not None and len(first.layout) < len(DLRM), first.layout
    assert set(first.workers) == set(group_names(first.layout))
    assert first.source == "policy"
    # Never back to staged, never another layout: the model still predicts this one best once
    # its hand-offs are measured as fused, and the hold keeps the first steps after a change.
    assert [a.layout for a in seen] == [first.layout] * len(seen)
    decisions = list(Decision.objects.filter(session=session).order_by("step"))
    assert decisions[0].info["layout_changed"] is True
    assert (
        decisions[0].info["layout_predicted"]
        >= 1.03 * decisions[0].info["layout_predicted_current"]
    )
    assert not any(d.info.get("layout_changed") for d in decisions[1:])
    assert all(d.info.get("layout_held") for d in decisions[1:HOLD_STEPS])
    # The dashboard's data and the budget read group-named workers as they are.
    for allocation in seen:
        assert all(name in group_names(first.layout) for name in allocation.workers)


@pytest.mark.django_db
def test_a_many_cpu_host_keeps_the_stages_apart(operator):
    session = session_on(operator, CEILING_BOUND, cpus=16, ceilings={"read": 2})
    seen = steps(session, CEILING_BOUND, cpus=16, throughput=900_000.0, count=2)
    assert all(a.layout is None for a in seen)
    assert all(set(a.workers) == set(CEILING_BOUND) for a in seen)
    decisions = Decision.objects.filter(session=session)
    assert all("layout_predicted" in d.info and not d.info.get("layout_changed") for d in decisions)


@pytest.mark.django_db
def test_without_the_option_no_step_chooses_a_layout(operator):
    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4}, options={})
    seen = steps(session, DLRM, cpus=2, throughput=400_000.0, count=2)
    assert all(a.layout is None for a in seen)
    assert not any("layout" in d.info for d in Decision.objects.filter(session=session))


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["fused", 1, None, ["auto"]])
def test_a_bad_layout_option_is_refused_with_a_400(api, operator, value):
    client = api.as_user(operator)
    response = client.post(
        "/api/v1/jobs/",
        {
            "name": "bad-layout",
            "stages": [{"name": "read"}, {"name": "parse"}],
            "tuning_options": {"layout": value},
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "must be one of off, auto" in response.json()["errors"]["tuning_options"]["layout"]


@pytest.mark.django_db
@pytest.mark.parametrize("tuner", ["intune", "static"])
def test_the_layout_option_is_taken_by_every_tuner(api, operator, tuner):
    client = api.as_user(operator)
    response = client.post(
        "/api/v1/jobs/",
        {
            "name": f"auto-{tuner}",
            "stages": [{"name": "read"}, {"name": "parse"}],
            "tuner": tuner,
            "tuning_options": {"layout": "auto"},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["tuning_options"] == {"layout": "auto"}


@pytest.mark.django_db
def test_the_dashboard_shows_a_fused_allocation_by_its_groups(client, operator):
    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4})
    (fused,) = steps(session, DLRM, cpus=2, throughput=400_000.0, count=1)
    host = session.host
    client.force_login(operator)
    history = client.get(f"/dashboard/api/hosts/{host.pk}/allocations/").json()["allocations"]
    assert history[-1]["layout"] == fused.layout and history[0]["layout"] is None
    assert history[-1]["workers"] == fused.workers
    overview = client.get(f"/dashboard/api/hosts/{host.pk}/overview/")
    assert overview.status_code == 200, overview.content
    page = client.get(f"/jobs/{session.job.pk}/")
    assert page.status_code == 200


@pytest.mark.django_db
def test_the_decisions_api_shows_the_group_named_workers(api, operator):
    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4})
    (fused,) = steps(session, DLRM, cpus=2, throughput=400_000.0, count=1)
    response = api.as_user(operator).get(f"/api/v1/hosts/{session.host.pk}/decisions/?limit=10")
    assert response.status_code == 200, response.content
    body = response.json()
    rows = body["results"] if isinstance(body, dict) else body
    assert rows[0]["workers"] == fused.workers and rows[0]["info"]["layout_changed"] is True


@pytest.mark.django_db
def test_without_the_option_a_layout_a_person_set_stays_and_the_tuner_moves_its_groups(operator):
    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4}, options={})
    layout = [["read", "parse"], ["transform", "collate"]]
    services.set_override(
        session.host,
        operator,
        workers={"read+parse": 1, "transform+collate": 1},
        layout=layout,
        reason="fused by hand",
    )
    services.release_override(session.host, operator)
    seen = steps(session, DLRM, cpus=2, throughput=400_000.0, count=2)
    assert all(a.layout == layout for a in seen)
    assert all(set(a.workers) == {"read+parse", "transform+collate"} for a in seen)


@pytest.mark.django_db
def test_the_tuner_is_shown_the_layout_in_force_so_it_counts_a_group_once(operator):
    from webapp.tuning.observations import build_observation, fresh_window

    session = session_on(operator, DLRM, cpus=2, ceilings={"read": 4})
    (fused,) = steps(session, DLRM, cpus=2, throughput=400_000.0, count=1)
    host = session.host
    samples(host, 1000, 6, DLRM, cpus=2, throughput=400_000.0)
    host.refresh_from_db()
    observation = build_observation(host, list(fresh_window(host, 0.0)))
    assert observation.layout == fused.layout
    assert len(observation.layout) < len(DLRM)
