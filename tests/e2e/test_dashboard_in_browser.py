"""The dashboard in a real headless Chromium against a live stack: web server, Celery worker and
an agent running the DLRM pipeline, all real processes.

A person logs in, sees every chart drawn with data and a new point arrive, starts tuning, reads
the refusal of an invalid override, applies a valid one and sees the agent apply it. Screenshots
of every page at a laptop's and a wide monitor's width go to test-artifacts/dashboard/.
"""

import os
import shutil
import time
from pathlib import Path

import pytest

from agents.dlrm.schema import STAGE_NAMES as STAGES
from webapp.stack.supervisor import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
CHARTS = ["throughput", "idle", "stages", "allocation", "cpu", "memory", "reward"]
WIDTHS = {"laptop": 1280, "wide": 1920}

if not Path(CHROMIUM).exists():
    if os.getenv("CI"):
        pytest.fail(
            f"{CHROMIUM} is missing on CI: install Debian's chromium (.ci/run does)", pytrace=False
        )
    pytest.skip(
        f"{CHROMIUM} is missing: install Debian's chromium to run the browser tests",
        allow_module_level=True,
    )


def protocol_sample(
    seq: int, ts: float, throughput: float = 900.0, stages: list[str] = STAGES
) -> dict:
    """One sample in the agent protocol's format (docs/agent-protocol.md)."""
    return {
        "seq": seq,
        "ts": ts,
        "allocation_version": 1,
        "host": {
            "cpus": 4.0,
            "cpu_percent": 50.0,
            "memory_used_mb": 2048.0,
            "memory_limit_mb": 8192.0,
            "worker_budget": 9,
        },
        "trainer": {
            "throughput": throughput,
            "idle_fraction": 0.25,
            "step_ms": 8.0,
            "wait_ms": 2.0,
            "device": "cpu",
        },
        "stages": [
            {
                "name": name,
                "workers": 1,
                "items_per_s": throughput,
                "busy_fraction": 0.5,
                "in_queue": 1,
                "out_queue": 2,
                "queue_capacity": 8,
                "cpu_percent": 80.0,
                "rss_mb": 100.0,
            }
            for name in stages
        ],
    }


def post_samples(stack, host_id: int, token: str, samples: list[dict]) -> None:
    with stack.client() as client:
        response = client.post(
            f"/api/v1/hosts/{host_id}/metrics/",
            json={"samples": samples},
            headers={"Authorization": f"Agent {token}"},
        )
        assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def plane(live_stack):
    """A job with one host whose agent streams real measurements, and two people."""
    operator = live_stack.create_user("dash-operator", role="operator")
    viewer = live_stack.create_user("dash-viewer", role="viewer")
    job_id, host_id, agent_token = live_stack.register_job_and_host(
        operator["token"],
        {
            "name": "dlrm-browser",
            "stages": [{"name": s} for s in STAGES],
            "tuner": "intune",
            "decision_interval_s": 2,
        },
        {"name": "trainer-a", "cpus": 4, "memory_mb": 8192},
    )
    with live_stack.client(operator["token"]) as api:
        # The agent's own budget must match the one registered (4 CPUs + 5 stages), whatever
        # this machine's core count. It sends its samples every second (5 s by default): the
        # waits below for its samples end within a second of their being taken.
        live_stack.start_agent(host_id, agent_token, "--worker-budget", "9", "--batch-seconds", "1")

        def metrics_arrived():
            series = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 120}
            ).json()
            return len(series["series"]["ts"]) >= 3

        wait_until(metrics_arrived, 60, interval=1, what="the agent's first metrics")
        # A second host that this test feeds itself, so that it knows the instant a sample lands.
        fed = api.post(
            f"/api/v1/jobs/{job_id}/hosts/",
            json={"name": "trainer-b", "cpus": 4, "memory_mb": 8192},
        )
        assert fed.status_code == 201, fed.text
        fed_id, fed_token = fed.json()["id"], fed.json()["agent_token"]
        now = time.time()
        post_samples(
            live_stack, fed_id, fed_token, [protocol_sample(i + 1, now - 60 + i) for i in range(60)]
        )
    return {
        "stack": live_stack,
        "url": live_stack.url,
        "job": job_id,
        "host": host_id,
        "fed_host": fed_id,
        "fed_token": fed_token,
        "operator": operator | {"name": "dash-operator"},
        "viewer": viewer | {"name": "dash-viewer"},
    }


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def log_in(browser, plane, who: str, width: int = 1280):
    """A new browser context logged in through the login form; returns its page."""
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.js_errors = errors
    page.goto(f"{plane['url']}/")
    assert "/accounts/login/" in page.url, "the home page should send a visitor to the login page"
    page.fill("input[name=username]", plane[who]["name"])
    page.fill("input[name=password]", plane[who]["password"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{plane['url']}/")
    return page


def open_job(page, plane):
    page.goto(f"{plane['url']}/jobs/{plane['job']}/")
    wait_for_refreshes(page, 1)


def wait_for_refreshes(page, count: int, timeout_ms: int = 20_000):
    """Wait until the page has drawn ``count`` more live refreshes."""
    before = page.evaluate("Number(document.body.dataset.refreshedAt || 0)")
    for _ in range(count):
        page.wait_for_function(
            f"Number(document.body.dataset.refreshedAt || 0) > {before}", timeout=timeout_ms
        )
        before = page.evaluate("Number(document.body.dataset.refreshedAt || 0)")


LAST_TS = (
    "(() => { const x = document.getElementById('chart-throughput').data[0].x;"
    " return +new Date(x[x.length - 1]); })()"
)


def points(page, chart: str) -> int:
    return page.evaluate(
        f"(document.getElementById('chart-{chart}').data || [])"
        ".reduce((n, t) => n + ((t.x || []).length), 0)"
    )


def shoot(page, name: str):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_a_visitor_is_sent_to_log_in_and_then_sees_the_job_list(browser, plane):
    for label, width in WIDTHS.items():
        page = log_in(browser, plane, "operator", width)
        row = page.locator(f"tr[data-job-id='{plane['job']}']")
        page.wait_for_function(
            f"document.querySelector(\"tr[data-job-id='{plane['job']}'] [data-field=throughput]\")"
            ".textContent.includes('/s')"
        )
        # The agent's host is online (the test-fed one too, until it falls silent).
        assert int(row.locator("[data-field=hosts]").inner_text().split(" online")[0]) >= 1
        page.wait_for_function(
            f"Number(document.getElementById('spark-{plane['job']}').dataset.points || 0) > 0"
        )
        shoot(page, f"home-{label}")
        assert page.js_errors == []
        page.context.close()


def test_an_operator_starts_tuning_and_sees_the_decisions_arrive(browser, plane):
    page = log_in(browser, plane, "operator")
    open_job(page, plane)
    page.select_option("#tuning-form select[name=tuner]", "intune")
    page.click("#start-tuning")
    page.wait_for_function(
        "document.getElementById('tuning-message').textContent.includes('Started')"
    )
    page.wait_for_function(
        "document.querySelector('#decisions-table tbody tr[data-step]')"
        " || document.getElementById('session-summary').textContent.includes('failed')",
        timeout=60_000,
    )
    summary = page.inner_text("#session-summary")
    if "failed" in summary:
        pytest.fail(
            f"the tuning session failed on the control plane, not in the dashboard: {summary}"
        )
    page.wait_for_function(
        "document.getElementById('session-summary').textContent.includes('running')"
    )
    assert points(page, "reward") >= 1
    assert page.js_errors == []
    page.context.close()


def test_every_chart_is_drawn_with_data_and_new_points_arrive_without_losing_the_zoom(
    browser, plane
):
    page = log_in(browser, plane, "operator")
    open_job(page, plane)
    for chart in CHARTS:
        page.wait_for_function(
            f"(document.getElementById('chart-{chart}').data || [])"
            ".some(t => (t.x || []).length > 0)",
            timeout=60_000,
        )
        title = page.evaluate(f"document.getElementById('chart-{chart}').layout.title.text")
        y_title = page.evaluate(f"document.getElementById('chart-{chart}').layout.yaxis.title.text")
        assert title and y_title, f"chart {chart} needs a title and a y-axis title with units"
    verdict = page.inner_text("#verdict")
    assert "input-bound" in verdict

    # The agent sends a batch every 5 s: its next one shows up as a new point.
    before = page.evaluate(LAST_TS)
    page.wait_for_function(f"{LAST_TS} > {before}", timeout=10_000)

    # A zoom a person chose survives the live refreshes.
    zoom = page.evaluate("""() => {
        const x = document.getElementById('chart-throughput').data[0].x;
        const range = [new Date(+x[0] - 5000).toISOString(),
                       new Date(+x[x.length - 1]).toISOString()];
        return Plotly.relayout('chart-throughput', {'xaxis.range': range})
            .then(() => document.getElementById('chart-throughput').layout.xaxis.range);
    }""")
    wait_for_refreshes(page, 2)
    assert page.evaluate("document.getElementById('chart-throughput').layout.xaxis.range") == zoom

    # Paused, the page stops refreshing; resumed, it goes on.
    page.click("[data-live-toggle]")
    page.wait_for_timeout(1_500)  # a refresh already in flight may still land
    frozen = page.evaluate("document.body.dataset.refreshedAt")
    page.wait_for_timeout(2_500)
    assert page.evaluate("document.body.dataset.refreshedAt") == frozen
    assert page.inner_text("[data-live-status]") == "Paused"
    page.click("[data-live-toggle]")
    wait_for_refreshes(page, 1)

    for label, width in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(500)  # Plotly's responsive relayout
        shoot(page, f"job-{label}")
    assert page.js_errors == []
    page.context.close()


def test_a_sample_shows_on_the_page_within_two_seconds_of_reaching_the_server(browser, plane):
    page = log_in(browser, plane, "operator")
    page.goto(f"{plane['url']}/jobs/{plane['job']}/#host-{plane['fed_host']}")
    page.wait_for_function(
        "(document.getElementById('chart-throughput').data || []).some(t => t.x.length > 0)"
    )
    ts = time.time()
    post_samples(
        plane["stack"],
        plane["fed_host"],
        plane["fed_token"],
        [protocol_sample(1000, ts, throughput=2500.0)],
    )
    landed = time.monotonic()
    page.wait_for_function(f"{LAST_TS} >= {int(ts * 1000)}", timeout=2_000)
    assert time.monotonic() - landed < 2.0
    page.context.close()


def test_an_invalid_override_is_refused_with_the_reason_on_the_page(browser, plane):
    page = log_in(browser, plane, "operator")
    open_job(page, plane)
    page.fill("input[data-stage=read]", "50")
    assert "over the budget" in page.inner_text("#override-total")
    page.fill("input[name=reason]", "trying far too many readers")
    page.click("#override-submit")
    page.wait_for_function(
        "document.getElementById('override-message').classList.contains('error')"
    )
    message = page.inner_text("#override-message")
    assert "Refused" in message and "the host budget is 9 CPU slots (4 CPUs)" in message
    shoot(page, "override-refused")
    page.context.close()


def test_a_valid_override_is_applied_by_the_agent_and_shows_in_the_audit_trail(browser, plane):
    page = log_in(browser, plane, "operator")
    open_job(page, plane)
    workers = {"read": 1, "parse": 3, "transform": 2, "collate": 1, "prefetch": 1}
    for stage, count in workers.items():
        page.fill(f"input[data-stage={stage}]", str(count))
    page.fill("input[name=reason]", "parse is the bottleneck")
    page.select_option("select[name=expires_in]", "3600")
    page.click("#override-submit")
    page.wait_for_function(
        "document.getElementById('override-message').textContent.includes('Override sent')"
    )
    version = page.inner_text("#override-message").split("allocation v")[1].split(";")[0]
    page.wait_for_function(
        f"(() => {{ const s = document.getElementById('override-allocation-status');"
        f" return s && s.dataset.version === '{version}' && s.dataset.status === 'applied'; }})()",
        timeout=30_000,
    )
    assert "Override in force" in page.inner_text("#override-current")
    assert not page.is_disabled("#override-release")
    page.wait_for_function(
        "document.getElementById('audit-table').textContent.includes('override.set')"
    )
    # The allocation chart marks the override where it happened.
    page.wait_for_function(
        "document.getElementById('chart-allocation').data"
        ".some(t => t.name === 'override by a person')"
    )
    shoot(page, "override-applied")

    page.click("#override-release")
    page.wait_for_function(
        "document.getElementById('override-current').textContent.includes('No override')"
    )
    page.context.close()


def test_a_chart_exports_its_data_as_csv_and_json(browser, plane):
    page = log_in(browser, plane, "operator")
    open_job(page, plane)
    page.wait_for_function(
        "(document.getElementById('chart-throughput').data || []).some(t => t.x.length > 0)"
    )
    with page.expect_download() as csv_download:
        page.click("[data-chart-id=chart-throughput][data-export=csv]")
    csv_text = Path(csv_download.value.path()).read_text()
    header, first = csv_text.splitlines()[:2]
    assert header == "series,time,samples/s"
    assert first.startswith("end-to-end throughput,") and float(first.split(",")[2]) >= 0
    with page.expect_download() as json_download:
        page.click("[data-chart-id=chart-idle][data-export=json]")
    import json

    exported = json.loads(Path(json_download.value.path()).read_text())
    assert [s["name"] for s in exported["series"]] == ["compute", "waiting for input"]
    assert exported["y"] == "% of wall time" and len(exported["series"][0]["x"]) > 0
    page.context.close()


def test_a_viewer_sees_the_charts_but_no_controls(browser, plane):
    page = log_in(browser, plane, "viewer")
    open_job(page, plane)
    assert page.locator("#override-form").count() == 0
    assert page.locator("#tuning-form").count() == 0
    page.wait_for_function(
        "(document.getElementById('chart-throughput').data || []).some(t => t.x.length > 0)"
    )
    shoot(page, "job-viewer")
    page.context.close()


def test_two_hosts_compare_on_one_chart(browser, plane):
    page = log_in(browser, plane, "operator", WIDTHS["laptop"])
    page.goto(
        f"{plane['url']}/compare/?mode=hosts&a={plane['host']}&b={plane['fed_host']}&metric=throughput"
    )
    page.wait_for_function(
        "(document.getElementById('chart-compare').data || [])"
        ".filter(t => t.x.length > 0).length === 2"
    )
    names = page.evaluate("document.getElementById('chart-compare').data.map(t => t.name)")
    assert names == ["A: dlrm-browser / trainer-a", "B: dlrm-browser / trainer-b"]
    page.select_option("#compare-mode", "sessions")
    page.wait_for_function(
        "document.getElementById('chart-compare').layout.xaxis.title.text === 'decision step'"
    )
    shoot(page, "compare-laptop")
    assert page.js_errors == []
    page.context.close()


def test_fused_stages_are_drawn_and_overridden_under_their_joined_names(browser, plane):
    fused = ["read+parse", "transform+collate", "prefetch"]
    stack = plane["stack"]
    job_id, host_id, token = stack.register_job_and_host(
        plane["operator"]["token"],
        {"name": "dlrm-fused", "stages": [{"name": s} for s in fused]},
        {"name": "trainer-fused", "cpus": 4, "memory_mb": 8192},
    )
    now = time.time()
    samples = [protocol_sample(i + 1, now - 30 + i, stages=fused) for i in range(30)]
    post_samples(stack, host_id, token, samples)
    page = log_in(browser, plane, "operator")
    open_job(page, plane | {"job": job_id})
    page.wait_for_function(
        "document.getElementById('chart-stages').data"
        ".some(t => (t.name || '').includes('read+parse'))"
    )
    page.fill('input[data-stage="read+parse"]', "3")
    page.fill("input[name=reason]", "parse is the bottleneck")
    page.click("#override-submit")
    page.wait_for_function(
        "document.getElementById('override-message').textContent.includes('Override sent')"
    )
    with stack.client(plane["operator"]["token"]) as api:
        state = api.get(f"/api/v1/hosts/{host_id}/").json()
    assert state["allocation"]["workers"]["read+parse"] == 3
    shoot(page, "fused-stages")
    assert page.js_errors == []
    page.context.close()
