"""attach() says at once when the host's job names other stages than the pipeline.

Before, it started an agent whose every sample the control plane refused (an error in the
log each second, no tuning, training going on as if tuned); intune-agent already exited
with both lists. A team that moved to agents.torch.DataLoader meets it first: the loader's
stages are ``fetch+collate`` and its transforms, not the names they had in mind.
"""

import pytest
import torch
from torch.utils.data import TensorDataset

from agents import attach
from agents.torch import DataLoader


def test_attach_raises_naming_both_lists_of_stages(control_plane, pipeline):
    host = control_plane.add_host(["read", "parse"])
    with pytest.raises(ValueError, match="job has the stages read, parse, and this pipeline "
                                         "has parse, transform"):  # fmt: skip
        attach(pipeline, url=control_plane.url, host_id=host.id, token=host.token)
    assert not host.samples, "no agent was started"


def test_a_dataloader_attaches_under_the_stage_names_it_prints(control_plane, wait_for):
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=1)
    wrong = control_plane.add_host(["fetch", "collate"])
    with pytest.raises(ValueError, match="loader.stage_names"):
        attach(loader, url=control_plane.url, host_id=wrong.id, token=wrong.token)
    host = control_plane.add_host(loader.stage_names)
    agent = attach(loader, url=control_plane.url, host_id=host.id, token=host.token,
                   interval_s=0.2, batch_seconds=0.3)  # fmt: skip
    try:
        for _ in range(3):
            list(loader)
        wait_for(lambda: host.samples, what="a sample to arrive")
        assert [s["name"] for s in host.samples[max(host.samples)]["stages"]] == ["fetch+collate"]
    finally:
        agent.stop()
        loader.close()


def test_a_control_plane_that_cannot_be_reached_is_no_reason_to_refuse(pipeline):
    agent = attach(pipeline, url="http://127.0.0.1:9", host_id=1, token="ia_x", poll_wait_s=1.0)
    agent.stop()
