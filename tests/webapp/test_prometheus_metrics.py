"""GET /metrics: what it counts, who may read it, and what it answers when Redis is away.

In one process (no PROMETHEUS_MULTIPROC_DIR), on the suite's database and its real Redis. The
web processes' counters live as long as the test process, so each test compares a figure before
and after what it does. tests/e2e/test_prometheus_counts_every_process.py runs the real
multi-process server and Celery worker.
"""

import json
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from celery import Celery
from django.conf import settings
from django.test.utils import override_settings
from prometheus_client.parser import text_string_to_metric_families

from webapp.jobs.services import create_allocation
from webapp.metrics.decisions import record_decision
from webapp.tuning.models import TuningSession

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
# What Prometheus sends (its scrape_protocols, OpenMetrics first).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
)


def scrape_text(client, token: str, keyword: str = "Bearer") -> str:
    response = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"{keyword} {token}", HTTP_ACCEPT=PROMETHEUS_ACCEPT
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def token(viewer):
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=viewer)[0].key


def test_an_unauthenticated_scrape_is_refused(client, db):
    response = client.get("/metrics", HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 401
    assert "credentials" in response.json()["detail"]
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-a-token")
    assert wrong.status_code == 401


def test_an_agent_token_cannot_scrape(client, job_and_host):
    _, _, agent_token = job_and_host
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Agent {agent_token}")
    assert response.status_code == 401


def test_a_viewers_token_scrapes_as_bearer_or_as_token(client, token):
    for keyword in ("Bearer", "Token"):
        text = scrape_text(client, token, keyword)
        assert "# TYPE intune_ingested_batches_total counter" in text


def test_a_stored_batch_counts_its_samples_and_its_time(client, api, token, job_and_host, sample):
    job, host, agent_token = job_and_host
    before = scrape_text(client, token)
    batch = {"samples": [sample(i, job.stage_names) for i in (1, 2, 3)]}
    response = api.as_agent(agent_token).post(
        f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json"
    )
    assert response.status_code == 200
    # A resent batch is acknowledged (one more batch) but stores nothing new.
    api.post(f"/api/v1/hosts/{host.pk}/metrics/", batch, format="json")
    after = scrape_text(client, token)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("intune_ingested_batches_total") == 2
    assert delta("intune_ingested_samples_total") == 3
    assert delta("intune_ingestion_seconds_count") == 2
    assert 0 < delta("intune_ingestion_seconds_sum") < 10
    assert delta("intune_ingestion_seconds_bucket", le="+Inf") == 2


def test_a_refused_batch_is_counted_by_its_status(client, api, token, job_and_host, sample):
    job, host, agent_token = job_and_host
    before = scrape_text(client, token)
    bad = sample(1, job.stage_names)
    bad["trainer"]["idle_fraction"] = 7
    url = f"/api/v1/hosts/{host.pk}/metrics/"
    assert api.as_agent(agent_token).post(url, {"samples": [bad]}, format="json").status_code == 400
    api.as_agent("not-a-token").post(url, {"samples": []}, format="json")
    after = scrape_text(client, token)
    assert (
        value(after, "intune_refused_batches_total", status="400")
        - value(before, "intune_refused_batches_total", status="400")
        == 1
    )
    assert (
        value(after, "intune_refused_batches_total", status="401")
        - value(before, "intune_refused_batches_total", status="401")
        == 1
    )
    assert value(after, "intune_ingested_batches_total") == value(
        before, "intune_ingested_batches_total"
    )


@pytest.mark.django_db(transaction=True)
def test_a_held_long_poll_is_counted_while_it_waits(live_server, job_and_host, viewer):
    from rest_framework.authtoken.models import Token

    job, host, agent_token = job_and_host
    token = Token.objects.get_or_create(user=viewer)[0].key

    def held() -> float:
        text = httpx.get(
            f"{live_server.url}/metrics", headers={"Authorization": f"Bearer {token}"}
        ).text
        return value(text, "intune_held_long_polls")

    idle = held()
    answers = []
    poll = threading.Thread(
        target=lambda: answers.append(
            httpx.get(
                f"{live_server.url}/api/v1/hosts/{host.pk}/allocation/",
                params={"after": 1, "wait": 20},
                headers={"Authorization": f"Agent {agent_token}"},
                timeout=30,
            )
        )
    )
    poll.start()
    deadline = time.monotonic() + 10
    while held() < idle + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held() == idle + 1
    create_allocation(host, {s: 2 for s in job.stage_names}, "policy")
    poll.join(timeout=15)
    assert answers and answers[0].status_code == 200
    assert held() == idle


def test_sessions_are_counted_by_state(client, token, job_and_host, operator):
    job, host, _ = job_and_host
    before = scrape_text(client, token)
    for status in ("running", "running", "failed"):
        TuningSession.objects.create(job=job, host=host, tuner="static", status=status)
    after = scrape_text(client, token)
    assert value(after, "intune_tuning_sessions", state="running") == (
        value(before, "intune_tuning_sessions", state="running") + 2
    )
    assert value(after, "intune_tuning_sessions", state="failed") == (
        value(before, "intune_tuning_sessions", state="failed") + 1
    )
    # Every state is there, at 0 when no session is in it, so a graph shows 0, not a gap.
    assert ("intune_tuning_sessions", (("state", "pretraining"),)) in samples(after)
    assert value(after, "intune_hosts", status="new") >= 1


def test_decisions_counted_by_workers_are_read_from_redis(client, token):
    before = scrape_text(client, token)
    record_decision(0.03)
    record_decision(0.2)
    record_decision(99.0)
    after = scrape_text(client, token)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("intune_decisions_total") == 3
    assert delta("intune_decision_seconds_count") == 3
    assert delta("intune_decision_seconds_sum") == pytest.approx(99.23)
    assert delta("intune_decision_seconds_bucket", le="0.025") == 0
    assert delta("intune_decision_seconds_bucket", le="0.05") == 1
    assert delta("intune_decision_seconds_bucket", le="0.25") == 2
    assert delta("intune_decision_seconds_bucket", le="30.0") == 2
    assert delta("intune_decision_seconds_bucket", le="+Inf") == 3


def test_the_celery_queue_depth_is_what_the_broker_holds(client, token):
    # Tasks published by kombu itself, as the web processes and beat do, to a queue no worker
    # reads: the scrape must find them wherever kombu put them, whatever their priority.
    prefix = f"intune-test-queue-{uuid.uuid4().hex[:8]}"
    options = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS, "global_keyprefix": f"{prefix}:celery:"}
    producer = Celery(broker=settings.CELERY_BROKER_URL)
    producer.conf.broker_transport_options = options
    producer.conf.task_default_queue = prefix
    with override_settings(
        CELERY_BROKER_TRANSPORT_OPTIONS=options, CELERY_TASK_DEFAULT_QUEUE=prefix
    ):
        assert value(scrape_text(client, token), "intune_celery_queue_length", queue=prefix) == 0
        for priority in (0, 0, 9):
            producer.send_task("webapp.tuning.tasks.expire_overrides", priority=priority)
        text = scrape_text(client, token)
    assert value(text, "intune_redis_up") == 1
    assert value(text, "intune_celery_queue_length", queue=prefix) == 3


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_with_redis_away_the_scrape_answers_what_it_can_and_says_so(client, token):
    with override_settings(REDIS_CLIENT_URL=f"redis://127.0.0.1:{closed_port()}/0"):
        started = time.monotonic()
        text = scrape_text(client, token)
        elapsed = time.monotonic() - started
    assert value(text, "intune_redis_up") == 0
    assert "intune_celery_queue_length" not in text and "intune_decisions_total" not in text
    # What needs no Redis is still there.
    assert "intune_tuning_sessions" in text and "intune_ingested_batches_total" in text
    assert elapsed < 3


def exposed_names(text: str) -> set[str]:
    """The series names a query can use: each family's samples' names, and for a family without
    samples yet (a labelled counter nobody incremented) the names its type gives it."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, [""])}
    return names


def test_the_grafana_dashboard_plots_only_metrics_the_endpoint_exposes(client, token):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    assert dashboard["templating"]["list"][0]["query"] == "prometheus"
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs
    for panel in dashboard["panels"]:
        if panel.get("type") != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    queried = {name for expr in exprs for name in re.findall(r"\bintune_[a-z_]+\b", expr)}
    exposed = exposed_names(scrape_text(client, token))
    assert queried - exposed == set()
    # And every family the endpoint exposes is plotted.
    families = {f.name for f in text_string_to_metric_families(scrape_text(client, token))}
    assert {f for f in families if not any(q.startswith(f) for q in queried)} == set()


def test_the_shared_directory_is_emptied_at_start_and_a_dead_workers_gauges_dropped(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from webapp.metrics import multiprocess

    monkeypatch.setenv(multiprocess.ENV, "")  # restored after the test, whatever prepare() sets
    stale = tmp_path / f"prometheus-{socket.gethostname()}"
    stale.mkdir()
    (stale / "counter_123.db").write_bytes(b"a previous run")
    directory = multiprocess.prepare(tmp_path)
    assert directory == stale and list(directory.iterdir()) == []
    assert multiprocess.enabled() and str(directory) == os.environ[multiprocess.ENV]

    (directory / "counter_456.db").write_bytes(b"")
    (directory / "gauge_livesum_456.db").write_bytes(b"")
    multiprocess.child_exit(None, SimpleNamespace(pid=456))
    # A dead worker's counts stay (a counter must not go back), its live gauges go.
    assert sorted(p.name for p in directory.iterdir()) == ["counter_456.db"]
