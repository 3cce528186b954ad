"""The home page's table: hosts by state, current throughput, idle time, tuning, sparkline."""

import re
from datetime import timedelta

from django.utils import timezone

from webapp.jobs.models import Host
from webapp.tuning.models import TuningSession


def test_the_summary_adds_up_throughput_and_averages_idle_time_over_reporting_hosts(
    client, operator, make_job, make_host, report
):
    job = make_job(name="ctr-model")
    first, first_token = make_host(job, name="trainer-1")
    second, second_token = make_host(job, name="trainer-2")
    make_host(job, name="trainer-3")  # registered, never reported
    report(first, first_token, [(3, 1000.0, 0.2), (2, 1000.0, 0.2)])
    report(second, second_token, [(3, 500.0, 0.6), (2, 500.0, 0.6)])
    client.force_login(operator)

    jobs = client.get("/dashboard/api/jobs/").json()["jobs"]

    row = next(j for j in jobs if j["name"] == "ctr-model")
    assert row["hosts_total"] == 3 and row["hosts_online"] == 2 and row["hosts_new"] == 1
    assert row["throughput"] == 1500.0
    assert abs(row["idle_fraction"] - 0.4) < 1e-9
    assert row["tuning"] == "stopped"
    assert len(row["sparkline"]["ts"]) >= 1 and row["sparkline"]["throughput"][-1] > 0


def test_a_silent_host_counts_as_offline_and_a_running_session_as_tuning(
    client, operator, make_job, make_host, report
):
    job = make_job()
    host, token = make_host(job)
    report(host, token, [(1, 800.0, 0.1)])
    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now() - timedelta(minutes=5))
    TuningSession.objects.create(job=job, host=host, tuner="intune")
    client.force_login(operator)

    row = client.get("/dashboard/api/jobs/").json()["jobs"][0]

    assert row["hosts_offline"] == 1 and row["hosts_online"] == 0
    assert row["tuning"] == "running" and row["tuning_sessions"] == 1


def test_the_home_page_lists_jobs_with_a_sparkline_and_loads_plotly_from_this_server(
    client, viewer, make_job
):
    make_job(name="ranking-a")
    make_job(name="ranking-b")
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert "ranking-a" in page and "ranking-b" in page
    assert page.count('class="sparkline"') == 2
    assert '<script src="/static/vendor/plotly/plotly.min.js">' in page
    # Nothing is loaded from another server (a CDN). Not a search for "cdn" in the page: the
    # logout form's random CSRF token holds those three letters about once in 500 pages.
    assert not re.findall(r'(?:src|href)="(?:https?:)?//', page)
