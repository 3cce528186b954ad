"""agents.torch.DataLoader is tuned as a Pipeline is: live resizes, the agent, across epochs."""

import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.utils.data as tud

import agents
from agents import attach
from agents.pipeline import AllocationError
from agents.torch import DataLoader
from tests.support.standin_control_plane import StandinControlPlane


class Small(tud.Dataset):
    """Small tensors: the case where a retired worker's results must still arrive."""

    def __init__(self, n=2000, ms=0.0):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.full((4,), float(i))


def plus_one(batch):
    return batch + 1


def wait_for(condition, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("persistent", [False, True])
def test_resizing_every_few_batches_loses_and_repeats_nothing(same_epoch, persistent):
    dataset = Small(2000)
    # timeout: a batch lost in a resize fails the test at once rather than hanging it.
    loader = DataLoader(dataset, batch_size=5, num_workers=2, persistent_workers=persistent,
                        batch_transforms=[plus_one], timeout=30)  # fmt: skip
    expected = [b + 1 for b in tud.DataLoader(dataset, batch_size=5)]
    try:
        for _epoch in range(2):
            got = []
            for k, batch in enumerate(loader):
                got.append(batch)
                if k % 25 == 0:
                    loader.apply(
                        {"fetch+collate": 1 + (k // 25) % 4, "plus_one": 1 + (k // 25) % 2}
                    )
            same_epoch(got, expected)
    finally:
        loader.close()


def test_an_allocation_carries_over_to_the_next_epochs():
    loader = DataLoader(Small(40), batch_size=4, num_workers=1, batch_transforms=[plus_one])
    try:
        assert loader.allocation == {"fetch+collate": 1, "plus_one": 1}
        loader.apply({"plus_one": 3})  # before the first epoch
        batches = iter(loader)
        next(batches)
        assert loader.pipeline.allocation == {"fetch+collate": 1, "plus_one": 3}
        loader.apply({"fetch+collate": 2})
        list(batches)
        list(loader)
        assert loader.allocation == {"fetch+collate": 2, "plus_one": 3}
        assert [m["workers"] for m in loader.metrics()] == [2, 3]
    finally:
        loader.close()


def test_a_bad_allocation_is_refused_and_changes_nothing(datasets):
    loader = DataLoader(datasets.Squares(40), batch_size=4, num_workers=2, max_workers=3)
    with pytest.raises(AllocationError, match=r"unknown stage 'fetch'.*fetch\+collate"):
        loader.apply({"fetch": 2})
    with pytest.raises(AllocationError, match="max_workers is 3"):
        loader.apply({"fetch+collate": 4})
    assert loader.allocation == {"fetch+collate": 2}


def test_the_agent_reports_the_loader_and_its_allocations_apply_across_epochs():
    loader = DataLoader(
        Small(400, ms=0.2), batch_size=8, num_workers=1, batch_transforms=[plus_one]
    )
    stop = threading.Event()
    epochs = []

    def train():
        while not stop.is_set():
            epochs.append(sum(1 for _ in loader))

    with StandinControlPlane() as plane:
        host = plane.add_host(loader.stage_names)
        agent = attach(loader, url=plane.url, host_id=host.id, token=host.token,
                       interval_s=0.2, batch_seconds=0.3, poll_wait_s=1.0)  # fmt: skip
        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        try:
            wait_for(lambda: agent.applied_version == 1, what="the default allocation")
            plane.publish(host.id, {"fetch+collate": 2, "plus_one": 1})
            wait_for(lambda: agent.applied_version == 2, what="the new allocation")
            done = len(epochs)
            wait_for(lambda: len(epochs) >= done + 2, what="two more epochs")
            assert loader.pipeline.allocation == {"fetch+collate": 2, "plus_one": 1}
            wait_for(lambda: len(host.samples) >= 5, what="samples")
        finally:
            stop.set()
            trainer.join(10)  # it ends the epoch it is in
            agent.stop()
            loader.close()
    assert set(epochs) == {50}, "every epoch delivered every batch"
    sample = host.samples[max(host.samples)]
    assert [s["name"] for s in sample["stages"]] == ["fetch+collate", "plus_one"]
    # The newest sample may be the agent's last, taken once training had stopped (throughput 0).
    assert any(s["trainer"]["throughput"] > 0 for s in host.samples.values())
    assert [s["workers"] for s in sample["stages"]] == [2, 1]


def test_agents_exports_the_loader_without_importing_torch_on_import():
    code = (
        "import sys, agents; assert 'torch' not in sys.modules, 'import agents imported torch'; "
        "from agents.torch import DataLoader; assert agents.DataLoader is DataLoader"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert agents.DataLoader is DataLoader
