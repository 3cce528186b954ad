"""A training script under ``intune-run`` that ends (raises, returns, ``sys.exit``) while its
loader's attach still reads the job's stages from a control plane that accepts and never
answers exits at once, as under torch alone, and no attach thread runs on into the
interpreter's teardown. Before, the exit waited for that read's 5 s bound (7.55 s from a raise
to the exit against 1.44 s under torch alone, docs/reliability.md), then started an agent only
to stop it."""

import os
import time

import pytest
import torch

from agents.torch import DataLoader, auto
from tests.support.stalling_tcp import StallingServer

PROMPT_S = 1.0  # what the exit may add to torch's, on a loaded 2-core machine


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


@pytest.fixture
def silent(monkeypatch):
    server = StallingServer()
    monkeypatch.setenv("INTUNE_URL", f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv("INTUNE_HOST_ID", "1")
    monkeypatch.setenv("INTUNE_AGENT_TOKEN", "ia_silent")
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.close()


def test_the_exit_cuts_an_attach_waiting_on_a_silent_control_plane(silent):
    tuned = auto._Tuned()
    tuned.index = 0  # the first loader built: attached as it is built, as --loader 0 does
    loader = DataLoader(Rows(), batch_size=2, num_workers=1)
    tuned.built(loader)
    deadline = time.monotonic() + 10
    while not silent.accepted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert silent.accepted, "the attach never asked the control plane for the job's stages"
    time.sleep(0.2)  # its request written: the attach now waits for an answer
    (attach,) = tuned.attaching
    assert attach.is_alive()

    start = time.monotonic()
    tuned.stop()  # what the interpreter's exit runs (atexit)
    took = time.monotonic() - start

    assert took < PROMPT_S, f"the exit waited {took:.2f} s for the attach"
    assert not attach.is_alive(), "an attach thread would run on into the teardown"
    assert tuned.agent is None, "an agent was started while the process exited"
    assert os.getpid() == tuned.pid
