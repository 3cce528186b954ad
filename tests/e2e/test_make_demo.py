"""`make demo` (python -m webapp.stack.demo): serves the page, the agent's metrics appear within
30 s, and Ctrl-C (SIGINT) stops every child, leaving no process behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.live_stack import FreshDatabase, free_port
from webapp.stack.supervisor import wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_the_system_and_ctrl_c_stops_every_process(tmp_path, redis_url):
    database = FreshDatabase(tmp_path)
    port = free_port()
    env = dict(os.environ) | {
        "DATABASE_URL": database.create(),
        "INTUNE_DEMO_PASSWORD": "demo-pass-for-test",
        "INTUNE_REDIS_PREFIX": f"intune-demo-test-{port}",
        "PYTHONUNBUFFERED": "1",
    }
    log = open(tmp_path / "demo.out", "w+")
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webapp.stack.demo",
            "--port",
            str(port),
            "--var-dir",
            str(tmp_path / "var"),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: "InTune is running" in (tmp_path / "demo.out").read_text(),
            120,
            what="the demo to start",
        )
        printed = (tmp_path / "demo.out").read_text()
        assert f"{url}/" in printed
        assert "Log in as demo with password demo-pass-for-test" in printed
        children = psutil.Process(demo.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for expected in ("gunicorn", "worker", "beat", "agents"):
            assert expected in names, f"no {expected} process among the demo's children"

        with httpx.Client(base_url=url, timeout=30, follow_redirects=True) as browser:
            assert browser.get("/").url.path == "/accounts/login/"
            csrf = browser.cookies["csrftoken"]
            home = browser.post(
                "/accounts/login/",
                data={
                    "username": "demo",
                    "password": "demo-pass-for-test",
                    "csrfmiddlewaretoken": csrf,
                },
                headers={"Referer": f"{url}/accounts/login/"},
            )
            assert home.status_code == 200 and "dlrm-demo" in home.text
            job_id = int(re.search(r"/jobs/(\d+)/", home.text).group(1))
            host_id = browser.get(f"/api/v1/jobs/{job_id}/hosts/").json()["results"][0]["id"]
            started = time.monotonic()

            def metrics():
                series = browser.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 300}
                ).json()
                return series["series"]["ts"]

            wait_until(metrics, 30, interval=1, what="the demo agent's metrics")
            print(f"metrics appeared {time.monotonic() - started:.1f} s after the page was served")
            sessions = browser.get(f"/api/v1/jobs/{job_id}/tuning/").json()
            assert sessions and sessions[0]["status"] in ("running", "pretraining")
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
        database.drop(wait=False)  # the session waits for it at its end (tests/conftest.py)
    assert demo.returncode == 0, (tmp_path / "demo.out").read_text()[-3000:]
    survivors = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, f"left behind: {[c.cmdline() for c in survivors]}"
