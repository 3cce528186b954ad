"""When the control plane is away longer than the buffer holds, the agent drops the oldest
samples, keeps training, and reports exactly how many it dropped. A batch the control plane
refuses as invalid (400) is not resent forever: the agent drops only what the error names
(one sample, or its allocation report) or else the batch, and reports what it dropped."""

import math
import time

from agents.daemon.agent import Agent, AgentConfig
from agents.daemon.sample import stage_fields, trainer_fields


def test_overflow_drops_the_oldest_and_reports_the_count(
    control_plane, pipeline, consumer, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.1,
        batch_seconds=0.3, buffer_samples=5, backoff_initial_s=0.1, backoff_max_s=0.5,
        first_seq=1,
    )  # fmt: skip
    agent = Agent(pipeline, config).start()
    wait_for(lambda: len(host.samples) >= 3, what="the first samples")
    control_plane.stop()
    time.sleep(1.5)  # about 15 samples into a buffer of 5
    control_plane.start()
    wait_for(lambda: host.dropped_reported > 0 and len(agent.buffer) <= 1, what="the report")
    agent.stop()
    taken = agent.last_seq
    assert agent.buffer.dropped_total >= 8
    assert host.dropped_reported == agent.buffer.dropped_total
    assert len(host.samples) + host.dropped_reported == taken, "every sample stored or counted"
    missing = sorted(set(range(1, taken + 1)) - set(host.samples))
    assert missing == list(range(missing[0], missing[-1] + 1)), "one run of the oldest dropped"


def test_a_batch_refused_without_naming_a_sample_is_dropped_and_reported(
    control_plane, pipeline, consumer, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.1,
        batch_seconds=0.3, backoff_initial_s=0.05, backoff_max_s=0.1, first_seq=1,
    )  # fmt: skip
    with Agent(pipeline, config) as agent:
        wait_for(lambda: host.samples, what="the first samples")
        control_plane.fail_next_metrics = [(400, "body: not what the protocol says")]
        wait_for(lambda: host.dropped_reported > 0, what="the refused batch to be reported")
    assert agent.buffer.dropped_total == host.dropped_reported
    missing = sorted(set(range(1, agent.last_seq + 1)) - set(host.samples))
    assert len(missing) == host.dropped_reported, "nothing else is missing"
    assert missing == list(range(missing[0], missing[-1] + 1)), "the refused batch, whole"


def test_measurements_are_made_valid_before_they_can_spoil_a_batch():
    stage = stage_fields(
        {"name": "parse", "workers": 2, "items_per_s": math.nan, "busy_fraction": 1.03,
         "in_queue": 3, "out_queue": 0, "queue_capacity": 8, "cpu_percent": math.inf,
         "runqueue_percent": -2.0, "rss_mb": 120.0, "extra": "ignored"}
    )  # fmt: skip
    assert stage == {
        "name": "parse", "workers": 2, "in_queue": 3, "out_queue": 0, "queue_capacity": 8,
        "items_per_s": 0.0, "busy_fraction": 1.0, "cpu_percent": 0.0, "runqueue_percent": 0.0,
        "rss_mb": 120.0,
    }  # fmt: skip
    trainer = trainer_fields({"throughput": 10.0, "idle_fraction": -0.01, "device": "cuda"})
    assert trainer["idle_fraction"] == 0.0 and trainer["step_ms"] == 0.0
    assert trainer["device"] == "cuda"


def test_a_backlog_too_big_for_one_body_goes_in_several_batches(
    control_plane, pipeline, consumer, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.05,
        batch_seconds=1.0, max_batch_bytes=4000, first_seq=1,
    )  # fmt: skip
    with Agent(pipeline, config) as agent:
        wait_for(lambda: agent.last_seq >= 15, what="a backlog of samples")
    assert len(host.samples) == agent.last_seq, "every sample arrived"
    assert max(host.batch_bytes) <= 4000
    assert host.batches >= sum(host.batch_bytes) / 4000


def test_a_refused_sample_is_dropped_alone(control_plane, pipeline, consumer, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.1,
        batch_seconds=0.5, first_seq=1,
    )  # fmt: skip
    with Agent(pipeline, config) as agent:
        wait_for(lambda: host.samples, what="the first samples")
        control_plane.fail_next_metrics = [(400, "samples[1].stages[0].busy_fraction: <= 1")]
        wait_for(lambda: host.dropped_reported == 1, what="the one sample to be reported")
        stored_then = len(host.samples)
        wait_for(lambda: len(host.samples) > stored_then, what="the rest to be stored")
    missing = sorted(set(range(1, agent.last_seq + 1)) - set(host.samples))
    assert len(missing) == 1 and host.dropped_reported == 1
    assert missing[0] - 1 in host.samples and missing[0] + 1 in host.samples


def test_a_refused_allocation_report_costs_no_samples(control_plane, pipeline, consumer, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.1,
        batch_seconds=0.5, first_seq=1,
    )  # fmt: skip
    with Agent(pipeline, config) as agent:
        wait_for(lambda: host.samples, what="the first samples")
        reports_before = len(host.statuses)
        control_plane.fail_next_metrics = [
            (400, "allocation_status.applied_version 9 was never published (newest is 1)")
        ]
        wait_for(lambda: len(host.statuses) > reports_before + 2, what="more batches")
    assert host.dropped_reported == 0
    assert len(host.samples) == agent.last_seq, "no sample was lost to the refused report"
    assert host.statuses[reports_before] == {}, "that batch was resent without the report"
