"""/metrics on the real server: gunicorn with several worker processes and a Celery worker.

Batches posted by an agent land on whichever web process accepts the connection, a decision is
taken by the Celery worker process, and a scrape, answered by any one web process, shows them all.
"""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

pytestmark = pytest.mark.slow

STAGES = ["read", "parse"]
WEB_PROCESSES = 3


def sample(seq: int) -> dict:
    return {
        "seq": seq,
        "ts": time.time(),
        "allocation_version": 1,
        "host": {"cpus": 4.0, "cpu_percent": 50.0, "per_cpu_percent": [50.0],
                 "memory_used_mb": 1024.0, "memory_limit_mb": 8192.0, "worker_budget": 6},
        "trainer": {"throughput": 100.0, "idle_fraction": 0.2, "step_ms": 5.0, "wait_ms": 1.0,
                    "device": "cpu"},
        "stages": [
            {"name": name, "workers": 1, "items_per_s": 100.0, "busy_fraction": 0.5,
             "in_queue": 0, "out_queue": 1, "queue_capacity": 8, "cpu_percent": 50.0,
             "rss_mb": 50.0}
            for name in STAGES
        ],
    }  # fmt: skip


def values(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def batches_by_process(directory) -> dict[int, float]:
    """Each web process's own count of stored batches, read from its file in the shared
    directory (``counter_<pid>.db``)."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        pid = int(re.search(r"_(\d+)\.db$", path.name).group(1))
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            if json.loads(key)[1] == "intune_ingested_batches_total":
                counts[pid] = counts.get(pid, 0) + value
    return counts


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url):
    with LiveStack(
        tmp_path_factory.mktemp("prometheus"), extra_env={"WEB_CONCURRENCY": str(WEB_PROCESSES)}
    ) as stack:
        yield stack


def test_a_scrape_shows_the_counts_of_every_web_process_and_of_the_celery_worker(stack):
    operator = stack.create_user("prom-operator", role="operator")
    viewer = stack.create_user("prom-viewer", role="viewer")
    job_id, host_id, agent_token = stack.register_job_and_host(
        operator["token"],
        {"name": "prom", "stages": [{"name": s} for s in STAGES], "tuner": "static",
         "decision_interval_s": 1},
        {"name": "prom-host", "cpus": 4, "memory_mb": 8192},
    )  # fmt: skip
    directory = stack.directory / next(
        p.name for p in stack.directory.iterdir() if p.name.startswith("prometheus-")
    )

    def scrape() -> dict:
        with httpx.Client(base_url=stack.url, timeout=10) as fresh:  # any web process answers
            response = fresh.get("/metrics", headers={"Authorization": f"Bearer {viewer['token']}"})
        assert response.status_code == 200, response.text
        return values(response.text)

    assert httpx.get(f"{stack.url}/metrics", timeout=10).status_code == 401
    with stack.client(operator["token"]) as api:
        assert api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).status_code == 201

    # Each batch on a connection of its own, several at once, until more than one web process
    # has stored some: the kernel, not the test, chooses which process accepts a connection.
    seq = iter(range(1, 10_000))
    posted = 0

    def post_one(_):
        with httpx.Client(base_url=stack.url, timeout=30) as fresh:
            return fresh.post(
                f"/api/v1/hosts/{host_id}/metrics/",
                headers={"Authorization": f"Agent {agent_token}"},
                json={"samples": [sample(next(seq))],
                      "allocation_status": {"applied_version": 1, "refused": []}},
            ).status_code  # fmt: skip

    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(6) as pool:
        while True:
            assert set(pool.map(post_one, range(6))) == {200}
            posted += 6
            spread = [n for n in batches_by_process(directory).values() if n > 0]
            if len(spread) >= 2 and posted >= 12:
                break
            assert time.monotonic() < deadline, f"every batch went to one process: {spread}"
            time.sleep(0.3)  # and the samples span the decision interval

    # The Celery worker decides on the fresh samples, in its own process.
    def decided() -> dict | None:
        scraped = scrape()
        return scraped if scraped.get(("intune_decisions_total", ()), 0) >= 1 else None

    scraped = wait_until(decided, 60, interval=0.5, what="a decision counted in /metrics")
    assert scraped[("intune_decision_seconds_count", ())] >= 1
    assert 0 < scraped[("intune_decision_seconds_sum", ())] < 30
    assert scraped[("intune_tuning_sessions", (("state", "running"),))] == 1
    assert scraped[("intune_redis_up", ())] == 1
    assert ("intune_celery_queue_length", (("queue", stack.env["INTUNE_REDIS_PREFIX"]),)) in scraped

    # Whichever process answers, it counts every process's batches and samples.
    for _ in range(2 * WEB_PROCESSES):
        scraped = scrape()
        assert scraped[("intune_ingested_batches_total", ())] == posted
        assert scraped[("intune_ingested_samples_total", ())] == posted
        assert scraped[("intune_ingestion_seconds_count", ())] == posted
    assert sum(batches_by_process(directory).values()) == posted
