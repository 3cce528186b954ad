"""The dashboard in a real headless Chromium over a working session: JS heap, DOM nodes, Plotly
points held, requests in flight, main-thread time in long tasks, every ``--every`` seconds for
``--minutes``, against a running control plane (``--url``) and a job already filled (e.g. by
``python -m benchmarks.dashboard.fleet``). ``--period-ms`` shortens the page's live refresh
(its ``window.live.periodMs``) to put an hour's refreshes into minutes.

.venv/bin/python -m benchmarks.dashboard.browser --url http://127.0.0.1:8000 --user ops \\
    --password ... --path /jobs/7/ --period-ms 200 --minutes 3 [--locale de-DE --timezone Asia/Kolkata]

Needs Playwright's Python package and Debian's /usr/bin/chromium (no downloaded browser).
"""

import argparse
import json
import time

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]  # fmt: skip

# Counts fetches started and ended, and main-thread long tasks, from the page's first script.
INSTRUMENT = """(() => {
  const f = window.__bench = { started: 0, done: 0, longMs: 0, longestMs: 0 };
  const fetch = window.fetch;
  window.fetch = function (...args) { f.started++; return fetch.apply(this, args).finally(() => f.done++); };
  new PerformanceObserver((list) => { for (const e of list.getEntries()) {
    f.longMs += e.duration; f.longestMs = Math.max(f.longestMs, e.duration); } })
    .observe({ entryTypes: ["longtask"] });
})()"""
FIGURES = """() => ({
  dom: document.getElementsByTagName('*').length,
  points: [...document.querySelectorAll('.js-plotly-plot')]
    .reduce((n, g) => n + (g.data || []).reduce((m, t) => m + ((t.x || []).length), 0), 0),
  fetches: window.__bench.started, in_flight: window.__bench.started - window.__bench.done,
  long_task_ms: Math.round(window.__bench.longMs), longest_task_ms: Math.round(window.__bench.longestMs),
  status: (document.querySelector('[data-live-status]') || {}).textContent,
})"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard.browser")
    parser.add_argument(
        "--url", required=True, help="the control plane, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--path", default="/", help="the page: / or /jobs/N/ (default /)")
    parser.add_argument("--period-ms", type=int, default=None, help="the live refresh's period")
    parser.add_argument("--minutes", type=float, default=3)
    parser.add_argument("--every", type=float, default=30, help="seconds between figures")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--locale", default=None)
    parser.add_argument("--timezone", default=None)
    options = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(
            viewport={"width": options.width, "height": options.height},
            locale=options.locale,
            timezone_id=options.timezone,
        )
        context.add_init_script(INSTRUMENT)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{options.url}/accounts/login/")
        page.fill("input[name=username]", options.user)
        page.fill("input[name=password]", options.password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{options.url}/")
        cdp = context.new_cdp_session(page)
        started = time.time()
        page.goto(options.url + options.path)
        page.wait_for_function(
            "(document.querySelector('[data-live-status]') || {textContent: ''})"
            ".textContent.includes('Live ·')",
            timeout=120_000,
        )
        print(f"first refresh drawn {time.time() - started:.1f} s after the page was asked for")
        if options.period_ms:
            page.evaluate(
                f"() => {{ if (window.live) window.live.periodMs = {options.period_ms}; }}"
            )
        end = time.time() + options.minutes * 60
        while True:
            cdp.send("HeapProfiler.collectGarbage")
            heap = cdp.send("Runtime.getHeapUsage")["usedSize"] / 1e6
            figures = page.evaluate(FIGURES)
            print(f"t={time.time() - started:5.0f} s heap={heap:.1f} MB {json.dumps(figures)}")
            if time.time() >= end:
                break
            time.sleep(min(options.every, max(0.0, end - time.time())))
        print(f"console errors: {len(errors)}", *errors[:5], sep="\n  ")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
