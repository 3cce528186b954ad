"""The library API: a training script attaches the agent in a few lines, and can expose the
agent's measurements to Prometheus."""

import httpx
import pytest

from agents import attach


def test_attach_in_five_lines_reports_the_pipeline(control_plane, pipeline, consumer, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    agent = attach(pipeline, url=control_plane.url, host_id=host.id, token=host.token,
                   interval_s=0.2, batch_seconds=0.3)  # fmt: skip
    wait_for(lambda: len(host.samples) >= 3, what="samples to arrive")
    agent.stop()
    sample = host.samples[max(host.samples)]
    assert [s["name"] for s in sample["stages"]] == ["parse", "transform"]
    assert sample["trainer"]["throughput"] > 0, "consumer_stats() saw the consumer take items"
    assert sample["allocation_version"] == 1


def test_attach_without_an_identity_says_what_is_missing(pipeline, monkeypatch):
    for name in ("INTUNE_URL", "INTUNE_HOST_ID", "INTUNE_AGENT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="attach\\(\\) needs url, host_id, token"):
        attach(pipeline)


def test_attach_reads_its_identity_from_the_environment(control_plane, pipeline, monkeypatch):
    host = control_plane.add_host(["parse", "transform"])
    monkeypatch.setenv("INTUNE_URL", control_plane.url)
    monkeypatch.setenv("INTUNE_HOST_ID", str(host.id))
    monkeypatch.setenv("INTUNE_AGENT_TOKEN", host.token)
    agent = attach(pipeline, poll_wait_s=1.0)
    assert (agent.config.url, agent.config.host_id) == (control_plane.url, host.id)
    agent.stop()


def test_prometheus_exposes_stage_and_trainer_gauges(control_plane, pipeline, consumer, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    agent = attach(pipeline, url=control_plane.url, host_id=host.id, token=host.token,
                   interval_s=0.2, prometheus_port=0)  # fmt: skip
    try:
        wait_for(lambda: agent.applied_version == 1, what="the default allocation")
        wait_for(lambda: len(agent.buffer) >= 2, what="two samples")
        text = httpx.get(f"http://127.0.0.1:{agent.prometheus.port}/metrics").text
    finally:
        agent.stop()
    assert 'intune_stage_workers{stage="parse"} 1.0' in text
    assert "intune_trainer_idle_fraction" in text
    assert 'intune_stage_runqueue_percent{stage="parse"}' in text
    assert "intune_allocation_version 1.0" in text
