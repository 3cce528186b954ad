"""The job page in the three engines people use: Chromium (Chrome, Edge), Firefox (ESR, over
WebDriver BiDi) and WebKit (Safari's engine: WebKitGTK through WebKitWebDriver on Xvfb), against
one live stack (web server, Celery worker) and a simulated agent that reports and applies
allocations. INTUNE_TEST_BROWSERS (default all three) picks the engines; tests/support/browsers.py
drives them. Each engine runs the same tests: the page loads without errors, the charts draw and
update live, the decisions table fills, the override form sends (and names a worker count the
browser cannot read instead of sending it), pause and resume, the zoom across refreshes, no
refresh while the page is hidden, and the live controls on a phone's width.
"""

import os
import time

import pytest

from tests.support import browsers
from tests.support.simulated_agent import SimulatedAgent

pytestmark = [pytest.mark.slow, pytest.mark.browser]

STAGES = ["read", "parse", "transform"]
LAPTOP = (1280, 900)
PHONE = (390, 844)  # an iPhone 12 to 15; WebKitGTK's window is no narrower than ~450 px
REFRESHED_AT = "Number(document.body.dataset.refreshedAt || 0)"
LAST_TS = (
    "(() => { const t = document.getElementById('chart-throughput').data;"
    " const x = (t && t[0] && t[0].x) || []; return x.length ? +new Date(x[x.length - 1]) : 0; })()"
)
# Makes the page hidden, or visible again, as a background tab or a locked phone does: the
# property the page reads, and the event a browser sends when it changes.
SET_HIDDEN = """((hidden) => {
  if (hidden) Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "hidden"});
  else delete document.visibilityState;
  document.dispatchEvent(new Event("visibilitychange"));
  return document.visibilityState;
})(HIDDEN)"""


@pytest.fixture(scope="module")
def plane(live_stack):
    """A job of one host whose simulated agent reports twice a second, with a tuning session
    deciding every second, and an operator."""
    operator = live_stack.create_user("engines-operator", role="operator")
    job_id, host_id, token = live_stack.register_job_and_host(
        operator["token"],
        {"name": "dlrm-engines", "stages": [{"name": s} for s in STAGES], "decision_interval_s": 1},
        {"name": "trainer-engines", "cpus": 8, "memory_mb": 16384},
    )
    agent = SimulatedAgent(live_stack.url, host_id, token, STAGES, hz=2.0)
    agent.start()
    try:
        with live_stack.client(operator["token"]) as api:
            started = api.post(f"/api/v1/jobs/{job_id}/tuning/", json={})
            assert started.status_code == 201, started.text
        yield {
            "stack": live_stack,
            "host": host_id,
            "url": live_stack.url,
            "job_url": f"{live_stack.url}/jobs/{job_id}/",
            "operator": operator | {"name": "engines-operator"},
            "agent": agent,
        }
    finally:
        agent.stop()


@pytest.fixture(scope="module", params=browsers.selected_engines())
def page(request, plane):
    """One engine's page, logged in through the login form, for all of this file's tests."""
    engine = request.param
    missing = browsers.missing_for(engine)
    if missing:
        install = f"apt-get install {' '.join(missing)} (scripts/ensure-test-tools does)"
        if os.getenv("CI"):
            pytest.fail(f"{engine} is missing on CI: {install}", pytrace=False)
        pytest.skip(f"{engine} is missing: {install}, or leave it out of INTUNE_TEST_BROWSERS")
    driver = browsers.launch(engine, *LAPTOP)
    try:
        driver.goto(f"{plane['url']}/accounts/login/")
        driver.type_into("input[name=username]", plane["operator"]["name"])
        driver.type_into("input[name=password]", plane["operator"]["password"])
        driver.click("button[type=submit]")
        driver.wait_for("location.pathname === '/'", what="the job list after logging in")
        yield driver
    finally:
        driver.close()


def open_job(page, plane, viewport=LAPTOP, fresh: bool = False):
    """The job page at ``viewport``, live and visible. The page a test before left is used again
    when it is so (a load and its first refresh take seconds in WebKit on a busy machine)."""
    if getattr(page, "viewport", None) != viewport:
        page.set_viewport(*viewport)
        page.viewport = viewport
    reusable = page.evaluate(
        f"location.href === {plane['job_url']!r} && !!window.live && !window.live.paused"
        " && document.visibilityState === 'visible'"
    )
    if fresh or not reusable:
        page.goto(plane["job_url"])
    page.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")


def wait_for_refreshes(page, count: int = 1, timeout: float = 10):
    for _ in range(count):
        before = page.evaluate(REFRESHED_AT)
        page.wait_for(f"{REFRESHED_AT} > {before}", timeout, what="a live refresh")


def assert_no_refresh_for(page, seconds: float):
    """No refresh lands for ``seconds``, once the one in flight, if any, has landed."""
    page.wait_for("!window.live.running", what="the refresh in flight")
    frozen = page.evaluate(REFRESHED_AT)
    time.sleep(seconds)
    assert page.evaluate(REFRESHED_AT) == frozen, f"{page.engine}: the page went on refreshing"


def test_the_job_page_loads_without_console_errors(page, plane):
    open_job(page, plane, fresh=True)
    wait_for_refreshes(page, 1)
    assert "trainer-engines" in page.evaluate("document.getElementById('host-name').textContent")
    assert page.console_errors() == []


def test_the_throughput_and_idle_charts_draw_and_take_new_points_live(page, plane):
    open_job(page, plane)
    for chart in ("throughput", "idle"):
        page.wait_for(
            f"(document.getElementById('chart-{chart}').data || [])"
            ".some(t => (t.x || []).length > 0)",
            what=f"the {chart} chart's first points",
        )
        # Plotly drew it: lines or bars in the SVG, not only data on the node.
        drawn = page.evaluate(f"document.querySelectorAll('#chart-{chart} g.trace path').length")
        assert drawn > 0, f"{page.engine}: the {chart} chart has data but nothing drawn"
    before = page.evaluate(LAST_TS)
    page.wait_for(f"{LAST_TS} > {before}", 10, what="a newer point on the throughput chart")
    assert page.console_errors() == []


def test_the_decisions_table_fills_as_the_policy_decides(page, plane):
    open_job(page, plane)
    steps = (
        "[...document.querySelectorAll('#decisions-table tbody tr[data-step]')]"
        ".map(row => Number(row.dataset.step))"
    )
    shown = page.wait_for(f"(s => s.length > 0 && s)({steps})", 60, what="the first decisions")
    with plane["stack"].client(plane["operator"]["token"]) as api:
        answer = api.get(f"/api/v1/hosts/{plane['host']}/decisions/", params={"limit": 500})
    assert set(shown) <= {d["step"] for d in answer.json()["results"]}, shown
    action = page.evaluate(
        "document.querySelector('#decisions-table tbody tr[data-step]').cells[2].textContent.trim()"
    )
    assert action, f"{page.engine}: a decision row without its action"
    assert page.console_errors() == []


def test_an_override_typed_into_the_form_is_sent_and_applied_by_the_agent(page, plane):
    open_job(page, plane)
    typed = {"read": 2, "parse": 3, "transform": 2}
    for stage, workers in typed.items():
        page.type_into(f"input[data-stage={stage}]", str(workers))
    page.type_into("input[name=reason]", f"checking the form in {page.engine}")
    page.click("#override-submit")
    message = page.wait_for(
        "(t => t.includes('Override sent') && t)"
        "(document.getElementById('override-message').textContent)",
        what="the override's acknowledgement",
    )
    version = message.split("allocation v")[1].split(";")[0]
    page.wait_for(
        "(s => s && s.dataset.status === 'applied' && s.dataset.version === "
        f"'{version}')(document.getElementById('override-allocation-status'))",
        20,
        what=f"allocation v{version} applied by the agent",
    )
    assert plane["agent"].workers == typed
    page.click("#override-release")
    page.wait_for(
        "document.getElementById('override-current').textContent.includes('No override')",
        what="the override released",
    )
    assert page.console_errors() == []


def test_a_worker_count_the_browser_cannot_read_is_named_and_not_sent(page, plane):
    open_job(page, plane)
    page.evaluate("""(() => {
        window.overridesSent = 0;
        const fetch = window.fetch;
        window.fetch = (url, options) => {
            if (String(url).includes("/override/")) window.overridesSent += 1;
            return fetch(url, options);
        };
        return true;
    })()""")
    page.type_into("input[data-stage=parse]", "3,5")  # a comma for a decimal mark
    page.type_into("input[data-stage=read]", "")
    page.type_into("input[name=reason]", "a typo")
    page.click("#override-submit")
    message = page.wait_for(
        "(n => n.classList.contains('error') && n.textContent)"
        "(document.getElementById('override-message'))",
        what="the form's error",
    )
    assert "Not sent" in message and "'read'" in message, message
    parse = page.evaluate("document.querySelector('input[data-stage=parse]').value")
    if page.engine == "chromium":
        # Chromium drops the comma as it is typed: the field holds 35, a number it can read.
        assert parse == "35" and "'parse'" not in message, (parse, message)
    else:
        # Firefox and WebKit keep what was typed and cannot read it: the field's value is empty.
        assert parse == "" and "'parse'" in message, (parse, message)
    time.sleep(0.3)  # a request the click started would have been counted by now
    assert page.evaluate("window.overridesSent") == 0
    assert page.console_errors() == []


def test_pause_stops_the_live_refresh_and_resume_starts_it_again(page, plane):
    open_job(page, plane)
    page.click("[data-live-toggle]")
    assert page.evaluate("document.querySelector('[data-live-status]').textContent") == "Paused"
    assert_no_refresh_for(page, 2.5)  # a period is 1 s
    page.click("[data-live-toggle]")
    wait_for_refreshes(page, 1)
    assert page.evaluate("document.querySelector('[data-live-toggle]').textContent") == "Pause"
    assert page.console_errors() == []


def test_a_zoom_a_person_chose_survives_the_live_refreshes(page, plane):
    open_job(page, plane)
    page.wait_for(f"{LAST_TS} > 0", what="the throughput chart's points")
    zoom = page.evaluate("""(() => {
        const x = document.getElementById('chart-throughput').data[0].x;
        const range = [new Date(+x[0] - 5000).toISOString(), new Date(+x[x.length - 1]).toISOString()];
        return Plotly.relayout('chart-throughput', {'xaxis.range': range})
            .then(() => document.getElementById('chart-throughput').layout.xaxis.range);
    })()""")
    before = page.evaluate(LAST_TS)
    page.wait_for(f"{LAST_TS} > {before}", 10, what="a newer point under the zoom")
    wait_for_refreshes(page, 1)
    assert page.evaluate("document.getElementById('chart-throughput').layout.xaxis.range") == zoom
    assert page.console_errors() == []


def test_a_hidden_page_makes_no_refreshes_and_a_paused_one_stays_paused_when_shown(page, plane):
    open_job(page, plane)
    assert page.evaluate(SET_HIDDEN.replace("HIDDEN", "true")) == "hidden"
    assert_no_refresh_for(page, 2.5)  # longer than two periods
    assert page.evaluate(SET_HIDDEN.replace("HIDDEN", "false")) == "visible"
    wait_for_refreshes(page, 1)

    page.click("[data-live-toggle]")
    page.evaluate(SET_HIDDEN.replace("HIDDEN", "true"))
    page.evaluate(SET_HIDDEN.replace("HIDDEN", "false"))
    assert_no_refresh_for(page, 2.0)  # shown, a page refreshes at once unless it is paused
    assert page.evaluate("document.querySelector('[data-live-status]').textContent") == "Paused"
    page.click("[data-live-toggle]")
    wait_for_refreshes(page, 1)
    assert page.console_errors() == []


def test_on_a_phone_the_live_controls_fit_on_the_screen_and_work(page, plane):
    open_job(page, plane, PHONE)
    width = page.evaluate("window.innerWidth")
    assert width < 720, f"{page.engine}: a {width} px wide page is not the phone layout"
    outside = page.evaluate("""(() => [...document.querySelectorAll('[data-live] select, [data-live] button, [data-live-status]')]
        .map(n => [n.tagName, n.getBoundingClientRect()])
        .filter(([, r]) => r.left < 0 || r.right > window.innerWidth || r.width === 0)
        .map(([tag, r]) => `${tag} ${Math.round(r.left)}..${Math.round(r.right)}`))()""")
    assert outside == [], f"{page.engine}: live controls off a {width} px screen: {outside}"
    sideways = "document.documentElement.scrollWidth - window.innerWidth"
    try:  # the charts follow the new width once Plotly's resize handler has run
        page.wait_for(f"{sideways} <= 0", 5)
    except TimeoutError:
        pytest.fail(f"{page.engine}: the page scrolls sideways by {page.evaluate(sideways)} px")
    page.click("[data-live-toggle]")
    assert page.evaluate("document.querySelector('[data-live-status]').textContent") == "Paused"
    page.click("[data-live-toggle]")
    wait_for_refreshes(page, 1)
    assert page.console_errors() == []
