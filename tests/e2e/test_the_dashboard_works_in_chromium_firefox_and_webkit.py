"""The dashboard in the three engines people use: Chromium (Chrome, Edge), Firefox (ESR, over
WebDriver BiDi) and WebKit (Safari's engine: WebKitGTK through WebKitWebDriver on Xvfb), against
one live stack (web server, Celery worker) and a simulated agent that reports and applies
allocations. INTUNE_TEST_BROWSERS (default all three) picks the engines; tests/support/browsers/
drives them, one browser per engine for the whole module.

Each engine runs the same tests: a visitor is sent to log in and then sees the job list, the job
page loads without errors, every chart draws and updates live, the decisions table fills, an
override typed into the form is applied by the agent and shows in the audit trail (and a worker
count the browser cannot read is named instead of sent), pause and resume, the zoom across
refreshes, no refresh while the page is hidden, and the live controls on a phone's width.

What does not depend on the engine runs in Chromium only: starting tuning from the form, a sample
on the page at a live refresh once it reaches the server, the refusal of an invalid override, the
export of a chart's data, a viewer's page, the comparison of two hosts, fused stages, and a host of
two ranks. Screenshots of the pages at a laptop's and a wide monitor's width go to
test-artifacts/dashboard/.
"""

import contextlib
import itertools
import json
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support import browsers
from tests.support.browsers.driver import START_TIMEOUT_S
from tests.support.restarting_tcp import RestartingAddress
from tests.support.simulated_agent import SimulatedAgent

pytestmark = [pytest.mark.slow, pytest.mark.browser]

STAGES = ["read", "parse", "transform"]
LAPTOP = (1280, 900)
WIDE = (1920, 900)
PHONE = (390, 844)  # an iPhone 12 to 15; WebKitGTK's window is no narrower than ~450 px
CHARTS = ["throughput", "idle", "stages", "allocation", "cpu", "memory", "reward"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
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


def chromium_only(test):
    """Runs ``test`` in Chromium alone: what it checks does not depend on the engine, or it needs
    what only Playwright gives (downloads, a second person's browser context)."""
    test.engines = ["chromium"]
    return test


def pytest_generate_tests(metafunc):
    """Every test gets the page of each engine it runs in, in ENGINES' order, so that the tests of
    one engine run together on one browser (a Chromium-only test shares Chromium's)."""
    if "page" in metafunc.fixturenames:
        selected = browsers.selected_engines()
        engines = getattr(metafunc.function, "engines", selected)
        engines = [e for e in browsers.ENGINES if e in engines and e in selected]
        metafunc.parametrize("page", engines, indirect=True, scope="module")


def protocol_sample(seq: int, ts: float, throughput: float = 900.0, stages=STAGES) -> dict:
    """One sample in the agent protocol's format (docs/agent-protocol.md)."""
    return {
        "seq": seq,
        "ts": ts,
        "allocation_version": 1,
        "host": {"cpus": 4.0, "cpu_percent": 50.0, "memory_used_mb": 2048.0,
                 "memory_limit_mb": 8192.0},
        "trainer": {"throughput": throughput, "idle_fraction": 0.25, "step_ms": 8.0,
                    "wait_ms": 2.0, "device": "cpu"},
        "stages": [
            {"name": name, "workers": 1, "items_per_s": throughput, "busy_fraction": 0.5,
             "in_queue": 1, "out_queue": 2, "queue_capacity": 8, "cpu_percent": 80.0,
             "rss_mb": 100.0}
            for name in stages
        ],
    }  # fmt: skip


def post_samples(stack, host_id: int, token: str, samples: list[dict]) -> None:
    with stack.client() as client:
        answer = client.post(
            f"/api/v1/hosts/{host_id}/metrics/",
            json={"samples": samples},
            headers={"Authorization": f"Agent {token}"},
        )
        assert answer.status_code == 200, answer.text


def job_with_ten_samples(plane, job_name: str, host_name: str) -> tuple[int, int, str]:
    """A job of the DLRM stages with one host (4 CPUs, 8 GB) and its last 10 s of samples;
    returns (job id, host id, agent token)."""
    stack = plane["stack"]
    job_id, host_id, token = stack.register_job_and_host(
        plane["operator"]["token"],
        {"name": job_name, "stages": [{"name": s} for s in STAGES]},
        {"name": host_name, "cpus": 4, "memory_mb": 8192},
    )
    now = time.time()
    post_samples(stack, host_id, token, [protocol_sample(i + 1, now - 10 + i) for i in range(10)])
    return job_id, host_id, token


@pytest.fixture(scope="module")
def plane(live_stack):
    """A job of two hosts: one whose simulated agent reports twice a second, with a tuning session
    deciding every second, and one this module feeds itself, so that it knows the instant a
    sample lands. An operator and a viewer."""
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    operator = live_stack.create_user("engines-operator", role="operator")
    viewer = live_stack.create_user("engines-viewer", role="viewer")
    job_id, host_id, token = live_stack.register_job_and_host(
        operator["token"],
        {"name": "dlrm-engines", "stages": [{"name": s} for s in STAGES], "decision_interval_s": 1},
        {"name": "trainer-engines", "cpus": 8, "memory_mb": 16384},
    )
    agent = SimulatedAgent(live_stack.url, host_id, token, STAGES, hz=2.0)
    agent.start()
    try:
        with live_stack.client(operator["token"]) as api:
            fed = api.post(
                f"/api/v1/jobs/{job_id}/hosts/",
                json={"name": "trainer-fed", "cpus": 4, "memory_mb": 8192},
            )
            assert fed.status_code == 201, fed.text
            started = api.post(f"/api/v1/jobs/{job_id}/tuning/", json={})
            assert started.status_code == 201, started.text
        fed_id, fed_token = fed.json()["id"], fed.json()["agent_token"]
        now = time.time()
        post_samples(
            live_stack, fed_id, fed_token, [protocol_sample(i + 1, now - 60 + i) for i in range(60)]
        )
        yield {
            "stack": live_stack,
            "job": job_id,
            "host": host_id,
            "fed_host": fed_id,
            "fed_token": fed_token,
            "url": live_stack.url,
            "job_url": f"{live_stack.url}/jobs/{job_id}/",
            "operator": operator | {"name": "engines-operator"},
            "viewer": viewer | {"name": "engines-viewer"},
            "agent": agent,
        }
    finally:
        agent.stop()


def log_in(driver, plane, who: str) -> None:
    """Log ``who`` in through the login form, from the home page that sends a visitor there."""
    driver.goto(f"{plane['url']}/")
    assert "/accounts/login/" in driver.evaluate("location.pathname"), (
        f"{driver.engine}: the home page should send a visitor to the login page"
    )
    driver.type_into("input[name=username]", plane[who]["name"])
    driver.type_into("input[name=password]", plane[who]["password"])
    driver.click("button[type=submit]")
    driver.wait_for("location.pathname === '/'", what="the job list after logging in")


class Launches:
    """Firefox and WebKit launched in a thread while the tests before theirs run: each took 4 s
    of its first test's setup (3.95 and 3.97 s, 2026-11-29), the tests meanwhile mostly wait on
    the page's live refreshes. Started once the first page is logged in (started beside it,
    Chromium's setup took 34 s instead of 19 at load 15), one after the other, so that at most
    one browser starts beside a test. Chromium is launched where its tests run: Playwright's
    sync API keeps to the thread that started it. A browser launched and never handed to its
    tests is closed at the end."""

    def __init__(self, engines: list[str]):
        self.engines = [engine for engine in engines if engine != "chromium"]
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="browser launch")
        self.ahead: dict[str, Future] = {}

    def start(self) -> None:
        """Launch the engines not launched yet, in the background."""
        for engine in self.engines:
            if engine not in self.ahead:
                self.ahead[engine] = self.pool.submit(browsers.launch, engine, *LAPTOP)
        self.engines = []

    def take(self, engine: str) -> browsers.Driver:
        if engine in self.engines:
            self.engines.remove(engine)
        launch = self.ahead.pop(engine, None)
        if launch is None:
            return browsers.launch(engine, *LAPTOP)
        return launch.result(timeout=2 * START_TIMEOUT_S)

    def close(self) -> None:
        for launch in self.ahead.values():
            launch.cancel()
        self.pool.shutdown(wait=True)
        for launch in self.ahead.values():
            if not launch.cancelled() and launch.exception() is None:
                launch.result().close()


@pytest.fixture(scope="module")
def launches(request, plane):
    """The browsers of the engines this run's tests of the module use (``-k`` may leave some
    out) that are installed, launched ahead (Launches)."""
    params = [
        getattr(getattr(item, "callspec", None), "params", {})
        for item in request.session.items
        if item.module is request.module
    ]
    used = {each["page"] for each in params if "page" in each}
    engines = [e for e in browsers.ENGINES if e in used and not browsers.missing_for(e)]
    ahead = Launches(engines)
    yield ahead
    ahead.close()


@pytest.fixture(scope="module")
def page(request, plane, launches):
    """One engine's page, the operator logged in through the login form, for all of its tests."""
    engine = request.param
    missing = browsers.missing_for(engine)
    if missing:
        install = f"apt-get install {' '.join(missing)} (scripts/ensure-test-tools does)"
        if os.getenv("CI"):
            pytest.fail(f"{engine} is missing on CI: {install}", pytrace=False)
        pytest.skip(f"{engine} is missing: {install}, or leave it out of INTUNE_TEST_BROWSERS")
    driver = launches.take(engine)
    try:
        log_in(driver, plane, "operator")
        launches.start()
        yield driver
    finally:
        driver.close()


def set_viewport(page, viewport) -> None:
    if getattr(page, "viewport", LAPTOP) != viewport:
        page.set_viewport(*viewport)
        page.viewport = viewport


def open_job(page, plane, viewport=LAPTOP, fresh: bool = False):
    """The job page of the agent's host at ``viewport``, live and visible. The page a test before
    left is used again when it is so (a load and its first refresh take seconds in WebKit on a
    busy machine). The page names the host it shows in its address (#host-N)."""
    set_viewport(page, viewport)
    reusable = page.evaluate(
        f"location.href === {plane['job_url'] + '#host-' + str(plane['host'])!r}"
        " && !!window.live && !window.live.paused && document.visibilityState === 'visible'"
    )
    if fresh or not reusable:
        page.goto(plane["job_url"])  # no #host-N: a load, not a jump within the page
    page.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")


def wait_for_refreshes(page, count: int = 1, timeout: float = 10):
    for _ in range(count):
        before = page.evaluate(REFRESHED_AT)
        page.wait_for(f"{REFRESHED_AT} > {before}", timeout, what="a live refresh")


# The page's refresh period while a test checks that no refresh comes: a quarter of the page's
# own (1 s), so that "none for longer than two periods" takes 1 s, not 2.5. The page reads the
# period each time it schedules the next refresh (static/dashboard/common.js, Live).
SHORT_PERIOD_MS = 250
NO_REFRESH_S = 1.0  # four short periods


@contextlib.contextmanager
def short_refresh_period(page):
    """The page's live refresh every SHORT_PERIOD_MS while in the block, its own period after."""
    period = page.evaluate(f"(p => {{ window.live.periodMs = {SHORT_PERIOD_MS}; return p; }})"
                           "(window.live.periodMs)")  # fmt: skip
    try:
        yield
    finally:
        page.evaluate(f"(() => {{ window.live.periodMs = {int(period)}; return true; }})()")


def assert_no_refresh_for(page, seconds: float):
    """No refresh lands for ``seconds``, once the one in flight, if any, has landed."""
    page.wait_for("!window.live.running", what="the refresh in flight")
    frozen = page.evaluate(REFRESHED_AT)
    time.sleep(seconds)
    assert page.evaluate(REFRESHED_AT) == frozen, f"{page.engine}: the page went on refreshing"


def has_points(chart: str) -> str:
    return (
        f"(document.getElementById('chart-{chart}').data || []).some(t => (t.x || []).length > 0)"
    )


def points(page, chart: str) -> int:
    return page.evaluate(
        f"(document.getElementById('chart-{chart}').data || [])"
        ".reduce((n, t) => n + ((t.x || []).length), 0)"
    )


# Plotly's responsive relayout has followed the window's width.
CHARTS_FIT = (
    "[...document.querySelectorAll('.js-plotly-plot')].every(n => !n._fullLayout"
    " || Math.abs(n._fullLayout.width - n.getBoundingClientRect().width) <= 2)"
)


def shoot(page, name: str, viewports=(("laptop", LAPTOP),)) -> None:
    """Screenshots of the page for people to look at, from Chromium, at each of ``viewports``;
    the page is left at a laptop's width."""
    if page.engine != "chromium":
        return
    for label, viewport in viewports:
        set_viewport(page, viewport)
        page.wait_for(CHARTS_FIT, 5, what="the charts' relayout to the window's width")
        suffix = f"-{label}" if len(viewports) > 1 else ""
        page.screenshot(ARTIFACTS / f"{name}{suffix}.png")
    set_viewport(page, LAPTOP)


BOTH_WIDTHS = (("laptop", LAPTOP), ("wide", WIDE))


# --- in every engine ----------------------------------------------------------------------------
def test_a_visitor_is_sent_to_log_in_and_then_sees_the_job_list(page, plane):
    # The page fixture logged in through the form, from the home page (log_in checks the
    # redirect); the job list is where it landed. Chromium checks it at a wide monitor's width too.
    assert page.evaluate("location.pathname") == "/"
    widths = BOTH_WIDTHS if page.engine == "chromium" else (("laptop", LAPTOP),)
    for label, viewport in widths:
        set_viewport(page, viewport)
        row = f"document.querySelector(\"tr[data-job-id='{plane['job']}']"
        # Null-safe: a row not yet in the page is waited for (its TypeError failed the wait at
        # once, Chromium at load 12).
        page.wait_for(
            f"(c => !!c && c.textContent.includes('/s'))({row} [data-field=throughput]\"))",
            what="the job's throughput in the list",
        )
        # The agent's host is online (the test-fed one too, until it falls silent).
        hosts = page.evaluate(f'{row} [data-field=hosts]").textContent')
        assert int(hosts.split(" online")[0]) >= 1, hosts
        page.wait_for(
            f"Number(document.getElementById('spark-{plane['job']}').dataset.points || 0) > 0",
            what="the job's sparkline",
        )
        shoot(page, f"home-{label}", ((label, viewport),))
    set_viewport(page, LAPTOP)
    assert page.console_errors() == []


def test_the_job_page_loads_without_console_errors(page, plane):
    open_job(page, plane, fresh=True)
    wait_for_refreshes(page, 1)
    assert "trainer-engines" in page.evaluate("document.getElementById('host-name').textContent")
    assert page.console_errors() == []


def test_every_chart_draws_with_titles_and_the_throughput_chart_takes_new_points_live(page, plane):
    open_job(page, plane)
    for chart in CHARTS:
        page.wait_for(has_points(chart), 60, what=f"the {chart} chart's first points")
        # Plotly drew it: lines or bars in the SVG, not only data on the node.
        drawn = page.evaluate(f"document.querySelectorAll('#chart-{chart} g.trace path').length")
        assert drawn > 0, f"{page.engine}: the {chart} chart has data but nothing drawn"
        titles = page.evaluate(
            f"(l => [l.title.text, l.yaxis.title.text])"
            f"(document.getElementById('chart-{chart}').layout)"
        )
        assert all(titles), f"chart {chart} needs a title and a y-axis title with units: {titles}"
    assert "input-bound" in page.evaluate("document.getElementById('verdict').textContent")
    before = page.evaluate(LAST_TS)
    page.wait_for(f"{LAST_TS} > {before}", 10, what="a newer point on the throughput chart")
    shoot(page, "job", BOTH_WIDTHS)
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


def test_an_override_typed_into_the_form_is_applied_by_the_agent_and_shows_in_the_audit_trail(
    page, plane
):
    open_job(page, plane)
    typed = {"read": 2, "parse": 3, "transform": 2}
    for stage, workers in typed.items():
        page.type_into(f"input[data-stage={stage}]", str(workers))
    page.type_into("input[name=reason]", f"checking the form in {page.engine}")
    page.select("select[name=expires_in]", "3600")
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
    assert "Override in force" in page.evaluate(
        "document.getElementById('override-current').textContent"
    )
    assert page.evaluate("!document.getElementById('override-release').disabled")
    page.wait_for(
        "document.getElementById('audit-table').textContent.includes('override.set')",
        what="the override in the audit trail",
    )
    # The allocation chart marks the override where it happened.
    page.wait_for(
        "document.getElementById('chart-allocation').data"
        ".some(t => t.name === 'override by a person')",
        what="the override's mark on the allocation chart",
    )
    shoot(page, "override-applied")
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
    with short_refresh_period(page):
        page.click("[data-live-toggle]")
        assert page.evaluate("document.querySelector('[data-live-status]').textContent") == "Paused"
        assert_no_refresh_for(page, NO_REFRESH_S)
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
    with short_refresh_period(page):
        assert page.evaluate(SET_HIDDEN.replace("HIDDEN", "true")) == "hidden"
        assert_no_refresh_for(page, NO_REFRESH_S)  # longer than two periods
        assert page.evaluate(SET_HIDDEN.replace("HIDDEN", "false")) == "visible"
        wait_for_refreshes(page, 1)

        page.click("[data-live-toggle]")
        page.evaluate(SET_HIDDEN.replace("HIDDEN", "true"))
        page.evaluate(SET_HIDDEN.replace("HIDDEN", "false"))
        assert_no_refresh_for(page, NO_REFRESH_S)  # shown, a page refreshes at once unless paused
        assert page.evaluate("document.querySelector('[data-live-status]').textContent") == "Paused"
        page.click("[data-live-toggle]")
        wait_for_refreshes(page, 1)
    assert page.console_errors() == []


def test_on_a_phone_the_live_controls_fit_on_the_screen_and_work(page, plane):
    open_job(page, plane, PHONE, fresh=True)  # laid out for a phone from the start
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


@pytest.fixture(scope="module")
def front(plane):
    """An address in front of the live stack's web server that a test can take away and bring
    back, or make slow (tests/support/restarting_tcp.py); the browsers' login holds there too."""
    address = RestartingAddress(("127.0.0.1", plane["stack"].port))
    yield address
    address.close()


def open_job_through(page, plane, front) -> str:
    """The job page loaded through ``front``, after its first refresh; its address. The page
    adds #host-N to its address, so that loading the address again is a load, not a jump."""
    set_viewport(page, LAPTOP)
    url = f"{front.url}/jobs/{plane['job']}/"
    page.goto(url)
    page.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")
    return url


# What the browser itself logs of a request that had no answer (Chromium: "Failed to load
# resource: net::ERR_CONNECTION_REFUSED"): one line a request, not the page's doing.
def page_errors(page) -> list[str]:
    return [e for e in page.console_errors() if not e.startswith("Failed to load resource")]


def browser_network_errors(page) -> list[str]:
    return [e for e in page.console_errors() if e.startswith("Failed to load resource")]


LEFT_DURING_REFRESH = 3  # navigations, each with the page's refresh held in flight


def test_a_refresh_in_flight_when_the_page_is_left_puts_nothing_in_the_console(page, plane, front):
    """Every engine fails the requests in flight when their page is left, and hands the failure
    to the page before it goes: the page's live refresh reported it as a console error, which
    Firefox's driver counts against the page loaded next ("TypeError: NetworkError when
    attempting to fetch resource." failed the phone-size test on a loaded host, at a reload that
    came while a refresh was out: 2 reloads of 25 at random times)."""
    url = open_job_through(page, plane, front)
    try:
        for _ in range(LEFT_DURING_REFRESH):
            front.delay_s = 1.0  # the server slow: each refresh is out for a second
            page.wait_for("window.live.running", 10, what="a refresh in flight")
            page.goto(url)
            front.delay_s = 0.0
            page.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")
            assert page.console_errors() == [], f"{page.engine}: {page.console_errors()}"
    finally:
        front.delay_s = 0.0


@chromium_only
def test_a_host_or_range_picked_while_a_refresh_is_out_is_shown_without_an_error(
    page, plane, front
):
    """A host picked, or a range chosen, while a refresh was out set the page's metrics to null
    under it: "TypeError: Cannot read properties of null (reading 'series')" in the console and
    that refresh failed (found by the full module's run: a click in one test, the error in the
    next)."""
    open_job_through(page, plane, front)
    page.clear_console_errors()
    fed_row = f"#hosts-table tr[data-host-id='{plane['fed_host']}'] [data-field=throughput]"
    try:
        for pick in (lambda: page.click(fed_row), lambda: page.select("#range-select", "3600")):
            front.delay_s = 1.0  # the server slow: each refresh is out for a second
            page.wait_for("window.live.running", 10, what="a refresh in flight")
            pick()
            front.delay_s = 0.0
            wait_for_refreshes(page, 2)
            assert page_errors(page) == [], page_errors(page)
    finally:
        front.delay_s = 0.0
    assert page.evaluate("document.getElementById('host-name').textContent") == "trainer-fed"
    page.wait_for(has_points("throughput"), what="the fed host's throughput over the hour")


# Counts the page's requests, as the page's own fetch makes them, and the most in flight at once.
COUNT_REQUESTS = """(() => {
  if (window.requests) { Object.assign(window.requests, {made: 0, most: 0}); return true; }
  const real = window.fetch;
  const requests = window.requests = {made: 0, inFlight: 0, most: 0};
  window.fetch = (...args) => {
    requests.made += 1;
    requests.inFlight += 1;
    requests.most = Math.max(requests.most, requests.inFlight);
    const done = () => { requests.inFlight -= 1; };
    return real(...args).finally(done);
  };
  return true;
})()"""
LIVE_STATUS = "document.querySelector('[data-live-status]').textContent"
#: The longest wait between retries while the control plane is away, in this test.
TEST_BACKOFF_MS = 2000


def test_a_control_plane_that_goes_away_is_reconnected_to_quietly_and_the_page_recovers(
    page, plane, front
):
    """The web server restarts under a page left open (a deploy, a crash): its connections are
    reset and new ones refused for a while, then it answers again. The page says it is
    reconnecting and that its figures are stale, retries with a bounded backoff, one request a
    retry, never more than one refresh's requests at once, reports nothing as an error of its
    own, and is live again by itself once the server is back. It used to put the engine's
    "Failed to fetch" (each engine's words) in the console as an error, and sent a whole
    refresh's eight requests at the server at each retry."""
    open_job_through(page, plane, front)
    page.clear_console_errors()
    with short_refresh_period(page):
        page.evaluate(f"(() => {{ window.live.maxBackoffMs = {TEST_BACKOFF_MS}; return true; }})()")
        page.evaluate(COUNT_REQUESTS)
        front.go_away()
        try:
            gone = time.monotonic()
            status = page.wait_for(
                f"(t => t.startsWith('Reconnecting since') && t)({LIVE_STATUS})",
                10,
                what="the page saying it is reconnecting",
            )
            assert "retrying in" in status and "data from" in status, status
            assert page.evaluate("document.body.classList.contains('stale')")
            assert page.evaluate(
                "document.querySelector('[data-live]').classList.contains('failing')"
            )
            time.sleep(max(0.0, AWAY_S - (time.monotonic() - gone)))
            away = page.evaluate("window.requests")
        finally:
            front.come_back()
        print(f"{page.engine}: {away['made']} requests in {AWAY_S} s away, {away['most']} at once")
        # The first failed refresh's requests, then one probe a retry: 0.5, 1, 2, 2 s apart in
        # 3 s, so at most 4 or 5 retries (a whole refresh each, before: 8 requests a retry).
        assert away["made"] <= REQUESTS_PER_REFRESH + 6, away
        assert away["most"] <= REQUESTS_PER_REFRESH, away
        page.wait_for(
            f"{LIVE_STATUS}.startsWith('Live')",
            TEST_BACKOFF_MS / 1000 + 15,
            what="the page live again by itself",
        )
        assert not page.evaluate("document.body.classList.contains('stale')")
        wait_for_refreshes(page, 1)
    assert page_errors(page) == [], f"{page.engine}: {page_errors(page)}"
    # The browser's own line for each request that had no answer: those of the refresh in
    # flight as the server went, and those made while it was away.
    network = browser_network_errors(page)
    assert len(network) <= REQUESTS_PER_REFRESH + away["made"], (away, network)
    page.clear_console_errors()


# One endpoint of the job page failing, as the page's own fetch sees it: window.oneFails.mode
# 'fails' answers 500 to every request whose address holds window.oneFails.part, 'hangs' never
# answers it (until the page's deadline aborts it, as a real request ends), 'off' passes it on.
ONE_ENDPOINT_FAILS = """((part) => {
  if (window.oneFails) { Object.assign(window.oneFails, {part, mode: 'fails', asked: 0}); return true; }
  const real = window.fetch;
  const one = window.oneFails = {real, part, mode: 'fails', asked: 0};
  window.fetch = (url, options = {}) => {
    if (one.mode === 'off' || !String(url).includes(one.part)) return real(url, options);
    one.asked += 1;
    if (one.mode === 'hangs') {
      return new Promise((_, reject) => {
        if (options.signal) options.signal.addEventListener('abort', () => {
          reject(new DOMException('The operation was aborted.', 'AbortError'));
        });
      });
    }
    return Promise.resolve(new Response('{"detail": "the decisions query failed"}',
      {status: 500, headers: {'Content-Type': 'application/json'}}));
  };
  return true;
})(PART)"""
DECISIONS_STALE = (
    "(c => c.classList.contains('stale') && c.querySelector('.section-status').textContent)"
    "(document.getElementById('decisions-table').closest('.card'))"
)


def test_an_endpoint_that_fails_or_hangs_leaves_the_rest_of_the_job_page_live(page, plane):
    """The decisions endpoint answering 500, or not at all: the whole job page stopped
    refreshing (every chart, the hosts, the alerts), the top saying "Refresh failed". Now the
    decisions' card says since when it is stale and is asked again with a backoff, while the rest
    of the page stays live; back, it is refreshed again by itself."""
    open_job(page, plane)
    page.clear_console_errors()
    timeout = page.evaluate("window.InTune.requestTimeoutMs")
    with short_refresh_period(page):
        page.evaluate(
            f"(() => {{ window.live.maxBackoffMs = {TEST_BACKOFF_MS};"
            " window.InTune.requestTimeoutMs = 1000; return true; })()"
        )
        page.evaluate(ONE_ENDPOINT_FAILS.replace("PART", repr("/decisions/")))
        try:
            for mode in ("fails", "hangs"):
                page.evaluate(f"(() => {{ window.oneFails.mode = {mode!r}; return true; }})()")
                status = page.wait_for(DECISIONS_STALE, 10, what=f"the decisions stale ({mode})")
                assert "retrying in" in status, status
                asked = page.evaluate("window.oneFails.asked")
                before = page.evaluate(REFRESHED_AT)
                wait_for_refreshes(page, 3, timeout=10)
                assert page.evaluate(f"{REFRESHED_AT}") > before
                assert page.evaluate(LIVE_STATUS).startswith("Live"), page.evaluate(LIVE_STATUS)
                assert not page.evaluate("document.body.classList.contains('stale')")
                throughput_card = "document.querySelector('[data-chart=throughput]')"
                assert not page.evaluate(f"{throughput_card}.classList.contains('stale')")
                # Three refreshes of 250 ms: the decisions asked at most twice more (backoff).
                assert page.evaluate("window.oneFails.asked") - asked <= 2
                page.evaluate("(() => { window.oneFails.mode = 'off'; return true; })()")
                page.wait_for(f"!{DECISIONS_STALE}", TEST_BACKOFF_MS / 1000 + 10,
                              what="the decisions refreshed again")  # fmt: skip
        finally:
            page.evaluate(
                "(() => { if (window.oneFails) window.fetch = window.oneFails.real;"
                f" window.InTune.requestTimeoutMs = {int(timeout)}; return true; }})()"
            )
    # Told once a run of failures, as a warning: nothing in the console as an error.
    assert page_errors(page) == [], f"{page.engine}: {page_errors(page)}"
    page.clear_console_errors()


# --- in Chromium --------------------------------------------------------------------------------
@chromium_only
def test_an_invalid_override_is_refused_with_the_reason_on_the_page(page, plane):
    open_job(page, plane, fresh=True)  # a form no test before has touched
    page.type_into("input[data-stage=read]", "50")
    assert "over the budget" in page.evaluate(
        "document.getElementById('override-total').textContent"
    )
    page.type_into("input[name=reason]", "trying far too many readers")
    page.click("#override-submit")
    message = page.wait_for(
        "(n => n.classList.contains('error') && n.textContent)"
        "(document.getElementById('override-message'))",
        what="the refusal",
    )
    # 8 CPUs and a slot for each of the 3 stages.
    assert "Refused" in message and "the host budget is 11 CPU slots (8 CPUs)" in message, message
    shoot(page, "override-refused")
    # Chromium logs the answer of 400 it was given, and nothing else.
    unexpected = [e for e in page.console_errors() if "status of 400 (Bad Request)" not in e]
    assert unexpected == []
    page.clear_console_errors()  # the 400, checked above: a test after it may keep the page


# The page shows a sample at its next live refresh (every second); the "within two seconds"
# of the dashboard's target is a speed figure, and the brief keeps speed targets out of timed
# tests: on the slower host of 2026-11-29 22:04 the sample came in 2.65 s and failed the
# suite. The test now bounds a hang (a refresh that never comes) and prints the figure.
SAMPLE_SHOWN_BOUND_S = 10.0


@chromium_only
def test_a_sample_reaching_the_server_shows_on_the_page_at_a_live_refresh(page, plane):
    set_viewport(page, LAPTOP)
    page.goto("about:blank")  # from the job page, #host-N alone would not load the page again
    page.goto(f"{plane['job_url']}#host-{plane['fed_host']}")
    page.wait_for(has_points("throughput"), what="the fed host's throughput")
    ts = time.time()
    post_samples(
        plane["stack"],
        plane["fed_host"],
        plane["fed_token"],
        [protocol_sample(1000, ts, throughput=2500.0)],
    )
    landed = time.monotonic()
    page.wait_for(
        f"{LAST_TS} >= {int(ts * 1000)}", SAMPLE_SHOWN_BOUND_S, what="the sample on the page"
    )
    print(f"a sample reached the page {time.monotonic() - landed:.2f} s after the server had it")
    assert page.console_errors() == []


@chromium_only
def test_an_operator_starts_tuning_from_the_form_and_sees_the_decisions_arrive(page, plane):
    stack = plane["stack"]
    job_id, host_id, token = stack.register_job_and_host(
        plane["operator"]["token"],
        {"name": "dlrm-tuned-from-the-form", "stages": [{"name": s} for s in STAGES],
         "decision_interval_s": 1},
        {"name": "trainer-form", "cpus": 8, "memory_mb": 16384},
    )  # fmt: skip
    agent = SimulatedAgent(stack.url, host_id, token, STAGES, hz=2.0)
    agent.start()
    try:
        open_job(page, plane | {"job_url": f"{stack.url}/jobs/{job_id}/", "host": host_id})
        page.select("#tuning-form select[name=tuner]", "intune")
        page.click("#start-tuning")
        page.wait_for(
            "document.getElementById('tuning-message').textContent.includes('Started')",
            what="the session's start",
        )
        page.wait_for(
            "!!document.querySelector('#decisions-table tbody tr[data-step]')"
            " || document.getElementById('session-summary').textContent.includes('failed')",
            60,
            what="the first decision",
        )
        summary = page.evaluate("document.getElementById('session-summary').textContent")
        if "failed" in summary:
            pytest.fail(
                f"the tuning session failed on the control plane, not in the dashboard: {summary}"
            )
        page.wait_for(
            "document.getElementById('session-summary').textContent.includes('running')",
            what="the session running",
        )
        assert points(page, "reward") >= 1
        assert page.console_errors() == []
    finally:
        # The worker would go on deciding every second for the module's other tests.
        with stack.client(plane["operator"]["token"]) as api:
            api.delete(f"/api/v1/jobs/{job_id}/tuning/")
        agent.stop()


@chromium_only
def test_a_chart_exports_its_data_as_csv_and_json(page, plane):
    open_job(page, plane)
    page.wait_for(has_points("throughput"), what="the throughput chart's points")
    csv_text = page.download("[data-chart-id=chart-throughput][data-export=csv]").read_text()
    header, first = csv_text.splitlines()[:2]
    assert header == "series,time,samples/s"
    assert first.startswith("end-to-end throughput,") and float(first.split(",")[2]) >= 0
    exported = json.loads(page.download("[data-chart-id=chart-idle][data-export=json]").read_text())
    assert [s["name"] for s in exported["series"]] == ["compute", "waiting for input"]
    assert exported["y"] == "% of wall time" and len(exported["series"][0]["x"]) > 0
    assert page.console_errors() == []


@chromium_only
def test_a_viewer_sees_the_charts_but_no_controls(page, plane):
    viewer = page.another_person(*LAPTOP)  # cookies of its own
    try:
        log_in(viewer, plane, "viewer")
        viewer.goto(plane["job_url"])
        viewer.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")
        assert viewer.evaluate("document.querySelectorAll('#override-form').length") == 0
        assert viewer.evaluate("document.querySelectorAll('#tuning-form').length") == 0
        viewer.wait_for(has_points("throughput"), what="the throughput chart's points")
        shoot(viewer, "job-viewer")
        assert viewer.console_errors() == []
    finally:
        viewer.close()


@chromium_only
def test_two_hosts_compare_on_one_chart(page, plane):
    set_viewport(page, LAPTOP)
    page.goto(
        f"{plane['url']}/compare/?mode=hosts&a={plane['host']}&b={plane['fed_host']}"
        "&metric=throughput"
    )
    page.wait_for(
        "(document.getElementById('chart-compare').data || [])"
        ".filter(t => t.x.length > 0).length === 2",
        what="both hosts on the chart",
    )
    names = page.evaluate("document.getElementById('chart-compare').data.map(t => t.name)")
    assert names == ["A: dlrm-engines / trainer-engines", "B: dlrm-engines / trainer-fed"]
    page.select("#compare-mode", "sessions")
    page.wait_for(
        "document.getElementById('chart-compare').layout.xaxis.title.text === 'decision step'",
        what="the sessions' comparison",
    )
    shoot(page, "compare-laptop")
    assert page.console_errors() == []


@chromium_only
def test_fused_stages_are_drawn_and_overridden_under_their_joined_names(page, plane):
    fused = ["read+parse", "transform+collate", "prefetch"]
    stack = plane["stack"]
    job_id, host_id, token = stack.register_job_and_host(
        plane["operator"]["token"],
        {"name": "dlrm-fused", "stages": [{"name": s} for s in fused]},
        {"name": "trainer-fused", "cpus": 4, "memory_mb": 8192},
    )
    now = time.time()
    post_samples(
        stack,
        host_id,
        token,
        [protocol_sample(i + 1, now - 30 + i, stages=fused) for i in range(30)],
    )
    open_job(page, plane | {"job_url": f"{stack.url}/jobs/{job_id}/", "host": host_id})
    page.wait_for(
        "document.getElementById('chart-stages').data"
        ".some(t => (t.name || '').includes('read+parse'))",
        what="the fused stage on the stages chart",
    )
    page.type_into('input[data-stage="read+parse"]', "3")
    page.type_into("input[name=reason]", "parse is the bottleneck")
    page.click("#override-submit")
    page.wait_for(
        "document.getElementById('override-message').textContent.includes('Override sent')",
        what="the override's acknowledgement",
    )
    with stack.client(plane["operator"]["token"]) as api:
        state = api.get(f"/api/v1/hosts/{host_id}/").json()
    assert state["allocation"]["workers"]["read+parse"] == 3
    shoot(page, "fused-stages")
    assert page.console_errors() == []


#: Rank 1 is slower and waits longer for input; its parse stage has more workers.
RANKS = [
    {"rate": 700.0, "idle": 0.05, "workers": {s: 1 for s in STAGES} | {"parse": 1}},
    {"rate": 450.0, "idle": 0.40, "workers": {s: 1 for s in STAGES} | {"parse": 3}},
]


def two_rank_sample(seq: int, ts: float) -> dict:
    """One sample of a host of two ranks: its stages summed over the ranks, each rank's trainer
    listed, its workers split unevenly as the host agent splits them by need."""
    return {
        "seq": seq,
        "ts": ts,
        "allocation_version": 1,
        "host": {"cpus": 2.0, "cpu_percent": 70.0, "memory_used_mb": 2048.0,
                 "memory_limit_mb": 8192.0, "worker_budget": 12, "ranks": 2},
        "trainer": {"throughput": sum(r["rate"] for r in RANKS), "idle_fraction": 0.2,
                    "step_ms": 8.0, "wait_ms": 2.0, "device": "cpu"},
        "stages": [
            {"name": name, "workers": sum(r["workers"][name] for r in RANKS),
             "items_per_s": 1150.0, "busy_fraction": 0.5, "cpu_percent": 60.0,
             "runqueue_percent": 5.0, "rss_mb": 100.0}
            for name in STAGES
        ],
        "ranks": [
            {"rank": rank, "throughput": r["rate"], "idle_fraction": r["idle"], "step_ms": 8.0,
             "wait_ms": 2.0 + rank, "workers": r["workers"]}
            for rank, r in enumerate(RANKS)
        ],
    }  # fmt: skip


@chromium_only
def test_a_host_with_two_ranks_shows_each_rank_and_highlights_the_slowest(page, plane):
    stack = plane["stack"]
    job_id, host_id, token = stack.register_job_and_host(
        plane["operator"]["token"],
        {"name": "ddp-dashboard", "stages": [{"name": s} for s in STAGES], "tuner": "intune"},
        {"name": "ddp-host", "cpus": 2, "memory_mb": 8192, "ranks": 2},
    )
    now = time.time()
    post_samples(stack, host_id, token, [two_rank_sample(i + 1, now - 30 + i) for i in range(30)])
    with stack.client(plane["operator"]["token"]) as api:
        answer = api.get(f"/api/v1/hosts/{host_id}/metrics/", params={"since": now - 60})
    assert answer.status_code == 200, answer.text
    metrics = answer.json()
    assert metrics["slowest_rank"] == 1
    assert metrics["rank_workers"]["1"]["parse"] == 3

    open_job(page, plane | {"job_url": f"{stack.url}/jobs/{job_id}/", "host": host_id})
    page.wait_for(
        "!!document.querySelector('#table-ranks tbody tr.slowest')", what="the slowest rank's row"
    )
    visible = page.evaluate(
        "(n => { const r = n.getBoundingClientRect();"
        " return r.width > 0 && r.height > 0 && getComputedStyle(n).visibility !== 'hidden'; })"
        "(document.querySelector('[data-chart=\"ranks\"]'))"
    )
    assert visible, "the per-rank card shows on a host of two ranks"
    # The chart draws one line per rank, the slowest named and thicker.
    names = page.evaluate(
        "document.getElementById('chart-ranks').data.map(t => [t.name, t.line.width])"
    )
    assert names == [["rank 0", 1.5], ["rank 1 (slowest)", 3]], names
    assert page.evaluate("document.querySelectorAll('#table-ranks tbody tr').length") == 2
    slowest = "document.querySelectorAll('#table-ranks tbody tr.slowest')"
    assert page.evaluate(f"{slowest}.length") == 1
    assert page.evaluate(f"{slowest}[0].dataset.rank") == "1"
    text = page.evaluate(f"{slowest}[0].innerText").lower()  # the header cells are in capitals
    assert "slowest" in text and "450" in text and "40.0 %" in text, text
    assert "parse 3" in text, text
    fast_row = "document.querySelector(\"#table-ranks tbody tr[data-rank='0']\")"
    fast = page.evaluate(f"{fast_row}.innerText")
    assert "700" in fast and "5.0 %" in fast and "parse 1" in fast, fast
    # The highlight is visible, not only a class name.
    colour = page.evaluate(f"getComputedStyle({slowest}[0]).backgroundColor")
    plain = page.evaluate(f"getComputedStyle({fast_row}).backgroundColor")
    assert colour != plain, (colour, plain)
    assert "Rank 1 is the slowest" in page.evaluate(
        "document.getElementById('note-ranks').innerText"
    )
    shoot(page, "ranks-laptop")
    assert page.console_errors() == []


@chromium_only
def test_a_job_deleted_while_its_page_is_open_is_said_to_be_gone_and_no_longer_asked_for(
    page, plane
):
    """Every request of a job's page answers 404 once the job is deleted: the page said "Refresh
    failed ... Not found." and asked again every 15 s for as long as it stayed open."""
    stack = plane["stack"]
    job_id, host_id, token = job_with_ten_samples(plane, "dlrm-deleted", "trainer-deleted")
    open_job(page, plane | {"job_url": f"{stack.url}/jobs/{job_id}/", "host": host_id})
    page.clear_console_errors()
    with short_refresh_period(page):
        with stack.client(plane["operator"]["token"]) as api:
            assert api.delete(f"/api/v1/jobs/{job_id}/").status_code == 204
        page.wait_for(
            f"{LIVE_STATUS}.startsWith('Deleted')", 10, what="the page saying the job is gone"
        )
        page.evaluate(COUNT_REQUESTS)
        time.sleep(NO_REFRESH_S * 2)
        assert page.evaluate("window.requests.made") == 0, "the page went on asking"
    assert page.evaluate("document.querySelector('[data-live-toggle]').disabled")
    assert page.evaluate("document.body.classList.contains('stale')")
    assert page_errors(page) == [], page_errors(page)
    page.clear_console_errors()  # Chromium's line for each 404, checked as the browser's


@chromium_only
def test_a_host_deleted_while_it_is_compared_is_said_to_be_gone_and_no_longer_asked_for(
    page, plane
):
    """A compared host's requests answer 404 once it is deleted (with its job): the comparison
    said "Refresh failed ... Not found." and asked again for as long as it stayed open."""
    stack = plane["stack"]
    job_id, host_id, token = job_with_ten_samples(plane, "dlrm-compared", "trainer-compared")
    set_viewport(page, LAPTOP)
    page.goto(f"{plane['url']}/compare/?mode=hosts&a={host_id}&b={plane['host']}&metric=throughput")
    page.wait_for(
        "(document.getElementById('chart-compare').data || [])"
        ".filter(t => t.x.length > 0).length === 2",
        what="both hosts on the chart",
    )
    page.clear_console_errors()
    with short_refresh_period(page):
        with stack.client(plane["operator"]["token"]) as api:
            assert api.delete(f"/api/v1/jobs/{job_id}/").status_code == 204
        status = page.wait_for(
            f"(t => t.startsWith('Deleted') && t)({LIVE_STATUS})",
            10,
            what="the page saying the host is gone",
        )
        assert "dlrm-compared / trainer-compared" in status, status
        page.evaluate(COUNT_REQUESTS)
        time.sleep(NO_REFRESH_S * 2)
        assert page.evaluate("window.requests.made") == 0, "the page went on asking"
    assert page.evaluate("document.querySelector('[data-live-toggle]').disabled")
    assert page_errors(page) == [], page_errors(page)
    page.clear_console_errors()  # Chromium's line for each 404, checked as the browser's


@chromium_only
def test_a_job_deleted_while_the_job_list_is_open_is_shown_as_deleted(page, plane):
    """The job list showed a deleted job's last figures ("running", its throughput, its
    sparkline) for as long as it stayed open: its row was simply no longer updated."""
    stack = plane["stack"]
    job_id, host_id, token = job_with_ten_samples(
        plane, "dlrm-deleted-from-the-list", "trainer-listed"
    )
    set_viewport(page, LAPTOP)
    page.goto(f"{stack.url}/")
    row = f"document.querySelector(\"tr[data-job-id='{job_id}']\")"
    page.wait_for(
        f"(r => !!r && r.querySelector('[data-field=throughput]').textContent.includes('/s'))({row})",
        what="the job's throughput in the list",
    )
    with stack.client(plane["operator"]["token"]) as api:
        assert api.delete(f"/api/v1/jobs/{job_id}/").status_code == 204
    page.wait_for(
        f"{row}.querySelector('[data-field=status]').textContent === 'deleted'",
        10,
        what="the row saying the job was deleted",
    )
    assert page.evaluate(f"{row}.querySelector('[data-field=throughput]').textContent") == "–"
    assert page.evaluate(f"{row}.querySelector('.sparkline').dataset.points") == "0"
    # The other jobs are left as they are.
    still_listed = (
        f"document.querySelector(\"tr[data-job-id='{plane['job']}'] [data-field=status]\")"
        ".textContent !== 'deleted'"
    )
    assert page.evaluate(still_listed)
    assert page.console_errors() == []


FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]"


@chromium_only
def test_each_host_row_is_one_tab_stop_that_picks_the_host_and_a_click_on_the_row_does_too(
    page, plane
):
    """Each host's row was a tab stop (tabindex) with no handler, beside its button: two tab
    stops a host, one doing nothing (1,000 before the charts on a job of 500 hosts), and the
    row's aria-label ("show host …") hid its cells from screen readers."""
    open_job(page, plane)
    stops = page.evaluate(
        f"[...document.querySelectorAll('#hosts-table tbody tr')].map(r =>"
        f" [r.querySelectorAll({FOCUSABLE!r}).length + (r.matches('[tabindex]') ? 1 : 0),"
        " r.hasAttribute('aria-label')])"
    )
    assert stops and all(s == [1, False] for s in stops), stops
    fed_row = f"#hosts-table tr[data-host-id='{plane['fed_host']}'] [data-field=throughput]"
    page.click(fed_row)
    page.wait_for(
        f"location.hash === '#host-{plane['fed_host']}'"
        " && document.getElementById('host-name').textContent === 'trainer-fed'",
        what="the fed host picked by a click on its row",
    )
    page.click(f"#hosts-table tr[data-host-id='{plane['host']}'] [data-field=idle]")
    page.wait_for(f"location.hash === '#host-{plane['host']}'", what="the agent's host again")
    wait_for_refreshes(page, 1)  # a refresh out at a click ends before the console is read
    assert page.console_errors() == []


# Ends the page's session as the Log out button in another tab does.
LOG_OUT = """(async () => {
  const csrf = decodeURIComponent((document.cookie.match(/(?:^|;\\s*)csrftoken=([^;]+)/) || [])[1] || "");
  const answer = await fetch("/accounts/logout/", {method: "POST", headers: {"X-CSRFToken": csrf},
    credentials: "same-origin"});
  return answer.ok;
})()"""


@chromium_only
def test_a_page_whose_session_ended_stops_refreshing_and_links_to_the_login(page, plane):
    """Logged out in another tab (or the session expired), every refresh answers 401: the page
    said "Refresh failed ...: Authentication credentials were not provided." and asked again
    every 15 s for as long as it was open. It now says so once, stops, and links to the login,
    which brings the person back to the page."""
    open_job(page, plane)
    page.clear_console_errors()
    try:
        with short_refresh_period(page):
            assert page.evaluate(LOG_OUT)
            page.wait_for(f"{LIVE_STATUS}.startsWith('Logged out')", 10, what="the page saying so")
            page.evaluate(COUNT_REQUESTS)
            time.sleep(NO_REFRESH_S * 2)
            assert page.evaluate("window.requests.made") == 0, "the page went on asking"
        link = page.evaluate("document.querySelector('[data-live-status] a[data-login]').href")
        assert link.endswith(
            f"/accounts/login/?next=%2Fjobs%2F{plane['job']}%2F%23host-{plane['host']}"
        ), link
        assert page_errors(page) == [], page_errors(page)
    finally:
        page.clear_console_errors()  # Chromium's line for each 401, the browser's
        log_in(page, plane, "operator")  # for the tests after this one


# A job's name is free text (a host's is letters, digits, '_', '.' and '-').
HOSTILE_JOB_NAME = '<a href="https://example.com/">R&D</a> <team> & co'


@chromium_only
def test_a_job_named_in_html_shows_its_name_as_typed_on_the_charts_and_puts_no_link_there(
    page, plane
):
    """Plotly reads a trace's name as HTML of its own: the comparison chart's legend made a link
    that opens example.com of a job named '<a href="https://example.com/">…</a>', for everyone
    who compares its hosts, and "<team>" vanished from the name."""
    stack = plane["stack"]
    job_id, host_id, token = job_with_ten_samples(plane, HOSTILE_JOB_NAME, "trainer-hostile")
    set_viewport(page, LAPTOP)
    page.goto(f"{stack.url}/compare/?mode=hosts&a={host_id}&b={plane['host']}&metric=throughput")
    page.wait_for(
        "(document.getElementById('chart-compare').data || [])"
        ".filter(t => t.x.length > 0).length === 2",
        what="both hosts on the chart",
    )
    label = f"A: {HOSTILE_JOB_NAME} / trainer-hostile"
    legend = page.evaluate(
        "[...document.querySelectorAll('#chart-compare .legendtext')].map(n => n.textContent)"
    )
    assert label in legend, legend
    assert page.evaluate("document.querySelectorAll('#chart-compare .legend a').length") == 0
    exported = page.evaluate("InTune.chartRows('chart-compare').map(r => r.series)")
    assert label in exported, sorted(set(exported))
    assert page.console_errors() == []


# --- generated job shapes ----------------------------------------------------------------------
# A job's name is free text: letters of any script, HTML's own characters, a right-to-left mark,
# an emoji, Plotly's template marks.
JOB_NAME_CHARACTERS = "aZ09 <>&\"'/%{}#é中ع\u202e🙂-_."
STAGE_NAME = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,10}\Z")
# Extreme but valid figures: the protocol's bounds (webapp/ingestion/validation.py) and zeros.
RATES = st.sampled_from([0.0, 1e-9, 0.5, 900.0, 1e6, 1e12])
VIEWPORTS = st.sampled_from([(320, 640), PHONE, (768, 1024), LAPTOP, (2560, 1440)])


@st.composite
def job_shapes(draw):
    stages = draw(st.lists(STAGE_NAME, min_size=1, max_size=12, unique=True))
    if len(stages) >= 2 and draw(st.booleans()):
        stages = [f"{stages[0]}+{stages[1]}", *stages[2:]]  # a fused layout
    name = draw(st.text(JOB_NAME_CHARACTERS, min_size=1, max_size=40).filter(str.strip))
    hosts = draw(st.integers(0, 4))
    return {
        "name": name,
        "stages": stages,
        "hosts": [
            {"cpus": draw(st.sampled_from([1, 2, 8, 96, 100000])),
             "memory_mb": draw(st.sampled_from([256, 16384, 1e9])),
             "samples": draw(st.integers(0, 30)), "rate": draw(RATES),
             "idle": draw(st.sampled_from([0.0, 0.5, 1.0]))}
            for _ in range(hosts)
        ],
        "viewport": draw(VIEWPORTS),
    }  # fmt: skip


def shaped_sample(seq: int, ts: float, host: dict, stages: list[str]) -> dict:
    sample = protocol_sample(seq, ts, throughput=host["rate"], stages=stages)
    sample["host"] |= {
        "cpus": float(host["cpus"]),
        "cpu_percent": 100.0,
        "memory_used_mb": host["memory_mb"],
        "memory_limit_mb": host["memory_mb"],
    }
    sample["trainer"]["idle_fraction"] = host["idle"]
    return sample  # fmt: skip


SHAPES = 8
SHAPE_NUMBERS = itertools.count(1)


@chromium_only
@settings(
    max_examples=SHAPES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=job_shapes())
@example(shape={"name": "no hosts", "stages": ["read"], "hosts": [], "viewport": LAPTOP})
def test_generated_job_shapes_load_draw_and_fit_on_the_screen(page, plane, shape):
    """Jobs of 0 to 4 hosts and 1 to 12 stages (fused or not), names in any script and in HTML,
    figures from 0 to the protocol's bounds, at widths from 320 px to 2560: the page loads
    without an error of its own, refreshes, draws its charts and does not scroll sideways; a
    job of no hosts says it has none."""
    print(shape)
    stack = plane["stack"]
    operator = plane["operator"]["token"]
    name = f"{shape['name']} {next(SHAPE_NUMBERS)}"  # a job's name is unique
    with stack.client(operator) as api:
        job = api.post(
            "/api/v1/jobs/", json={"name": name, "stages": [{"name": s} for s in shape["stages"]]}
        )
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
    try:
        now = time.time()
        with stack.client(operator) as api:
            for i, host in enumerate(shape["hosts"]):
                made = api.post(
                    f"/api/v1/jobs/{job_id}/hosts/",
                    json={"name": f"h{i}", "cpus": host["cpus"], "memory_mb": host["memory_mb"]},
                )
                assert made.status_code == 201, made.text
                samples = [
                    shaped_sample(n + 1, now - host["samples"] + n, host, shape["stages"])
                    for n in range(host["samples"])
                ]
                if samples:
                    post_samples(stack, made.json()["id"], made.json()["agent_token"], samples)
        set_viewport(page, shape["viewport"])
        page.goto(f"{stack.url}/jobs/{job_id}/")
        if shape["hosts"]:
            page.wait_for(f"{REFRESHED_AT} > 0", what="the page's first live refresh")
            for chart in ("throughput", "allocation", "cpu", "memory"):
                page.wait_for(
                    f"!!document.getElementById('chart-{chart}').data", what=f"the {chart} chart"
                )
            if shape["hosts"][0]["samples"]:
                page.wait_for(has_points("throughput"), what="the throughput chart's points")
        else:
            # Nothing refreshes a job page of no hosts: it said "Live" all the same.
            status = page.evaluate(LIVE_STATUS)
            assert status.startswith("No hosts yet"), status
        sideways = "document.documentElement.scrollWidth - window.innerWidth"
        try:
            page.wait_for(f"{sideways} <= 0", 5)
        except TimeoutError:
            pytest.fail(f"the page scrolls sideways by {page.evaluate(sideways)} px: {shape}")
        assert page_errors(page) == [], (page_errors(page), shape)
    finally:
        with stack.client(operator) as api:
            api.delete(f"/api/v1/jobs/{job_id}/")


# The control plane as a page sees it while it restarts behind a proxy: the host's metrics hang
# (accepted, never answered) and every other request fails at once with 503. In-page, over the
# page's own fetch, so that a request answers the instant the page asks; a hung request ends only
# when the page aborts it, as a real one does. window.away counts the requests in flight.
CONTROL_PLANE_AWAY = """(() => {
  const real = window.fetch;
  const away = window.away = { real, on: true, inFlight: 0, most: 0, metrics: 0 };
  window.fetch = (url, options = {}) => {
    if (!away.on) return real(url, options);
    away.inFlight += 1;
    away.most = Math.max(away.most, away.inFlight);
    const done = () => { away.inFlight -= 1; };
    if (String(url).includes('/metrics/')) {
      away.metrics += 1;
      return new Promise((_, reject) => {
        if (options.signal) options.signal.addEventListener('abort', () => {
          done(); reject(new DOMException('The operation was aborted.', 'AbortError'));
        });
      });
    }
    return new Promise((resolve) => setTimeout(() => {
      done();
      resolve(new Response('{"detail": "control plane restarting"}',
        { status: 503, headers: { 'Content-Type': 'application/json' } }));
    }, 20));
  };
  return true;
})()"""
REQUESTS_PER_REFRESH = (
    8  # the job page's most: metrics, overview, allocations, hosts, alerts, 3 slow
)
AWAY_S = 3.0


@chromium_only
def test_a_control_plane_that_hangs_or_fails_is_retried_with_backoff_and_the_page_resumes(
    page, plane
):
    """An operator's wall screen stays open through restarts and network drops. A refresh that
    failed fast on one request while another hung used to start the next one over it every
    period (Promise.all rejects at the first failure), so requests in flight grew without bound,
    a hung request had no deadline, and a failing page retried every second for hours."""
    open_job(page, plane)
    timeout = page.evaluate("window.InTune.requestTimeoutMs || 20000")
    with short_refresh_period(page):
        page.evaluate("(() => { window.InTune.requestTimeoutMs = 500; return true; })()")
        page.evaluate(CONTROL_PLANE_AWAY)
        time.sleep(AWAY_S)
        away = page.evaluate("window.away")
        status = page.evaluate("document.querySelector('[data-live-status]').textContent")
        failing = page.evaluate(
            "document.querySelector('[data-live]').classList.contains('failing')"
        )
        assert away["most"] <= REQUESTS_PER_REFRESH, (
            f"{away['most']} requests in flight at once: refreshes piled up on the hung one"
        )
        # 250 ms period, 500 ms deadline, then 0.5, 1 and 2 s of backoff: at most 4 in 3 s
        # (without backoff or deadline, one every period: 12).
        assert away["metrics"] <= 4, f"{away['metrics']} refreshes in {AWAY_S} s: no backoff"
        # The hung metrics request ends at its deadline (no answer: reconnecting), the retries'
        # probes are answered 503 (the refresh failed).
        assert failing and status.startswith(("Reconnecting since", "Refresh failed since")), status
        assert "retrying in" in status, status

        # Back, with the page's own deadline: 0.5 s is too short for a busy test machine.
        page.evaluate(
            f"(() => {{ window.away.on = false; window.InTune.requestTimeoutMs = {int(timeout)};"
            " window.dispatchEvent(new Event('online')); return true; })()"
        )
        wait_for_refreshes(page, 1, timeout=5)  # at once: online was heard during the last try
        page.wait_for(
            "document.querySelector('[data-live-status]').textContent.startsWith('Live')",
            5,
            what="the page saying it is live again",
        )
    assert len(page.console_errors()) <= 1, page.console_errors()  # one line, not one a refresh
    page.evaluate("(() => { window.fetch = window.away.real; return true; })()")
    page.clear_console_errors()  # checked above; the next test starts without them


# A rack of a fleet falls silent: 500 alerts, rendered as the live refresh renders them, into a
# container laid out as the page's. The figures of the container at once, then with the rest open.
MANY_ALERTS = """(() => {
  const box = document.createElement('div');
  box.className = 'alerts';
  document.querySelector('main, body').prepend(box);
  const alerts = Array.from({length: 500}, (_, i) => ({host: i, kind: i < 490 ? 'silent' : 'idle_high',
    severity: i < 490 ? 'critical' : 'warning', message: `agent on trainer-${i} silent for 3 min`}));
  window.InTune.renderAlerts(box, alerts);
  window.InTune.renderAlerts(box, alerts);  // the next refresh, with the same alerts
  const closed = {nodes: box.getElementsByTagName('*').length, height: box.getBoundingClientRect().height,
    summary: (box.querySelector('summary') || {}).textContent};
  const details = box.querySelector('details');
  if (details) { details.open = true; window.InTune.renderAlerts(box, alerts); }
  const opened = box.querySelectorAll('.alert').length;
  box.remove();
  return {closed, opened};
})()"""


@chromium_only
def test_hundreds_of_alerts_are_counted_under_the_first_five_not_listed_above_the_charts(
    page, plane
):
    """A wall screen must show the charts when a rack falls silent: 500 alerts listed one by one
    took 22,000 px above them (measured on a job of 500 hosts, docs/benchmarks.md)."""
    open_job(page, plane)
    figures = page.evaluate(MANY_ALERTS)
    closed = figures["closed"]
    assert closed["nodes"] <= 8, f"{closed['nodes']} elements for 500 alerts"
    assert closed["height"] < 400, f"the alerts take {closed['height']:.0f} px"
    assert closed["summary"] == "495 more alerts: 485 agent silent, 10 waiting for input"
    assert figures["opened"] == 500, "opened, the summary lists every alert"
    assert page.console_errors() == []


# The job's host table as a job of 500 hosts fills it: its first row cloned until it has 500.
FIVE_HUNDRED_HOSTS = """(() => {
  const body = document.querySelector('#hosts-table tbody');
  const first = body.rows[0];
  const added = [];
  while (body.rows.length < 500) { const row = first.cloneNode(true); row.dataset.clone = '1'; body.append(row); added.push(row); }
  const figures = {table: body.closest('section').getBoundingClientRect().height,
    charts: document.getElementById('host-panel').getBoundingClientRect().top + window.scrollY,
    viewport: window.innerHeight};
  added.forEach((row) => row.remove());
  return figures;
})()"""


@chromium_only
def test_the_host_table_of_a_large_job_scrolls_in_its_card_and_leaves_the_charts_on_screen(
    page, plane
):
    """On a job of 500 hosts the table of hosts pushed the chosen host's charts 27,000 px down
    the page; on a wall screen they must be on the first screen."""
    open_job(page, plane)
    figures = page.evaluate(FIVE_HUNDRED_HOSTS)
    assert figures["table"] < figures["viewport"] / 2, figures
    assert figures["charts"] < figures["viewport"], figures


@chromium_only
def test_a_person_in_germany_on_india_time_reads_numbers_and_times_in_their_own_terms(page, plane):
    """Dates were in the browser's locale and rates in en-US: "1,027 samples/s" beside
    "29. Nov., 13:00", which a German reader takes for one sample a second and a bit."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    person = page.another_person(*LAPTOP, locale="de-DE", timezone_id="Asia/Kolkata")
    try:
        # The formats are the dashboard's script's: loaded into the login page, no login needed.
        person.goto(f"{plane['url']}/accounts/login/")
        person.evaluate(
            "(() => { const s = document.createElement('script');"
            " s.src = '/static/dashboard/common.js'; document.head.append(s); return true; })()"
        )
        person.wait_for("!!window.InTune", what="the dashboard's script")
        shown = person.evaluate(
            "({rate: InTune.fmt.rate(1027), big: InTune.fmt.rate(2345678), pct: InTune.fmt.pct(0.3),"
            " num: InTune.fmt.num(-0.0571, 3), separators: InTune.layout('t').separators,"
            " time: InTune.fmt.time(Date.UTC(2026, 10, 29, 7, 30) / 1000)})"
        )
        assert shown == {
            "rate": "1.027 samples/s",
            "big": "2,35 M samples/s",
            "pct": "30,0 %",
            "num": "-0,057",
            "separators": ",.",
            "time": datetime(2026, 11, 29, 7, 30, tzinfo=ZoneInfo("UTC"))
            .astimezone(ZoneInfo("Asia/Kolkata"))
            .strftime("%H:%M:%S"),
        }, shown
        assert person.console_errors() == []
    finally:
        person.close()


@chromium_only
def test_a_refresh_leaves_the_host_table_cells_that_did_not_change_alone(page, plane):
    """Every cell of every host's row was rewritten each refresh, and each write makes the browser
    lay the table out again: on a job of 500 hosts most of them read the same. Over two refreshes
    only the cells whose text changed (a figure, the state when a host falls silent) are written."""
    open_job(page, plane)
    page.evaluate("""(() => {
      const cells = [...document.querySelectorAll('#hosts-table td[data-field]')];
      window.cellsBefore = cells.map((c) => c.innerHTML);
      window.cellsWritten = new Set();
      new MutationObserver((records) => { for (const r of records) {
        const node = r.target.nodeType === 1 ? r.target : r.target.parentNode;
        const cell = node.closest('td[data-field]');
        if (cell) window.cellsWritten.add(cells.indexOf(cell));
      } }).observe(document.getElementById('hosts-table'),
        {subtree: true, childList: true, characterData: true, attributes: true});
      return true;
    })()""")
    with short_refresh_period(page):
        wait_for_refreshes(page, 2)
    written, changed, cells = page.evaluate("""(() => {
      const cells = [...document.querySelectorAll('#hosts-table td[data-field]')];
      const changed = cells.map((c, i) => i).filter((i) => cells[i].innerHTML !== window.cellsBefore[i]);
      return [[...window.cellsWritten].sort(), changed, cells.length];
    })()""")
    assert cells >= 5 * 2, cells  # two hosts' rows, five cells each
    assert set(written) <= set(changed), f"cells {written} written, only {changed} changed"
