"""A host with two local ranks on the job page, in a real headless Chromium against a live stack
(web server, Celery worker, Redis, database): the page draws each rank's samples/s, lists each
rank's samples/s, time waiting for input and workers, and highlights the slowest rank, which
DDP waits for. The host's samples are posted in the agent protocol, so the test knows which
rank is slower; the workers are split unevenly as the host agent splits them by need.
"""

import os
import time
from pathlib import Path

import pytest

from agents.dlrm.schema import STAGE_NAMES as STAGES
from webapp.stack.supervisor import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"

if not Path(CHROMIUM).exists():
    if os.getenv("CI"):
        pytest.fail(f"{CHROMIUM} is missing on CI: install Debian's chromium", pytrace=False)
    pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium", allow_module_level=True)

#: Rank 1 is slower and waits longer for input; its parse stage has more workers.
RANKS = [
    {"rate": 700.0, "idle": 0.05, "workers": {s: 1 for s in STAGES} | {"parse": 1}},
    {"rate": 450.0, "idle": 0.40, "workers": {s: 1 for s in STAGES} | {"parse": 3}},
]


def two_rank_sample(seq: int, ts: float) -> dict:
    """One sample of the host: its stages summed over the ranks, each rank's trainer listed."""
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


def test_a_host_with_two_ranks_shows_each_rank_and_highlights_the_slowest(live_stack):
    from playwright.sync_api import sync_playwright

    operator = live_stack.create_user("ranks-viewer", role="operator")
    job_id, host_id, token = live_stack.register_job_and_host(
        operator["token"],
        {"name": "ddp-dashboard", "stages": [{"name": s} for s in STAGES], "tuner": "intune"},
        {"name": "ddp-host", "cpus": 2, "memory_mb": 8192, "ranks": 2},
    )
    now = time.time()
    with live_stack.client() as client:
        answer = client.post(
            f"/api/v1/hosts/{host_id}/metrics/",
            json={"samples": [two_rank_sample(i + 1, now - 30 + i) for i in range(30)]},
            headers={"Authorization": f"Agent {token}"},
        )
        assert answer.status_code == 200, answer.text
    with live_stack.client(operator["token"]) as api:
        metrics = wait_until(
            lambda: api.get(f"/api/v1/hosts/{host_id}/metrics/", params={"since": now - 60}).json(),
            10,
            what="the metrics answer",
        )
    assert metrics["slowest_rank"] == 1
    assert metrics["rank_workers"]["1"]["parse"] == 3

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(viewport={"width": 1280, "height": 900})
            context.set_default_timeout(30_000)
            page = context.new_page()
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{live_stack.url}/accounts/login/")
            page.fill("input[name=username]", "ranks-viewer")
            page.fill("input[name=password]", operator["password"])
            page.click("button[type=submit]")
            page.wait_for_url(f"{live_stack.url}/")
            page.goto(f"{live_stack.url}/jobs/{job_id}/")
            page.wait_for_selector("#table-ranks tbody tr.slowest")
            card = page.locator('[data-chart="ranks"]')
            assert card.is_visible(), "the per-rank card shows on a host of two ranks"
            # The chart draws one line per rank, the slowest named and thicker.
            names = page.evaluate(
                "document.getElementById('chart-ranks').data.map(t => [t.name, t.line.width])"
            )
            assert names == [["rank 0", 1.5], ["rank 1 (slowest)", 3]], names
            rows = page.locator("#table-ranks tbody tr")
            assert rows.count() == 2
            slowest = page.locator("#table-ranks tbody tr.slowest")
            assert slowest.count() == 1
            assert slowest.get_attribute("data-rank") == "1"
            text = slowest.inner_text().lower()  # the header cells are set in capitals
            assert "slowest" in text and "450" in text and "40.0 %" in text, text
            assert "parse 3" in text, text
            fast = page.locator("#table-ranks tbody tr[data-rank='0']").inner_text()
            assert "700" in fast and "5.0 %" in fast and "parse 1" in fast, fast
            # The highlight is visible, not only a class name.
            colour = slowest.evaluate("row => getComputedStyle(row).backgroundColor")
            plain = page.locator("#table-ranks tbody tr[data-rank='0']").evaluate(
                "row => getComputedStyle(row).backgroundColor"
            )
            assert colour != plain, (colour, plain)
            assert "Rank 1 is the slowest" in page.inner_text("#note-ranks")
            page.screenshot(path=str(ARTIFACTS / "ranks-laptop.png"), full_page=True)
            assert errors == []
        finally:
            chromium.close()
