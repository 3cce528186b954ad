"""``intune-run -- python train.py`` where ``train.py`` is a PyTorch Lightning script, not a
line of it changed, against a live control plane: an operator's override resizes the workers
of the training loader (built by the ``train_dataloader()`` hook after the sanity check has
iterated the validation loader), and every epoch still holds every training sample once.
Skipped where pytorch-lightning is not installed (the test extras pin it)."""

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.processes import under_intune_run, wait_showing_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            time.sleep(0.002)
            return {"x": torch.tensor([float(i)]), "i": i}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)
            self.seen = []

        def training_step(self, batch, k):
            self.seen += batch["i"].tolist()
            return self.lin(batch["x"]).pow(2).mean()

        def validation_step(self, batch, k):
            pass

        def on_train_epoch_end(self):
            assert sorted(self.seen) == list(range(200)), sorted(self.seen)[:20]
            self.seen = []
            loader = self.trainer.train_dataloader
            print(json.dumps({"train": loader.allocation}), flush=True)
            if os.path.exists(sys.argv[1]) or time.monotonic() > deadline:
                self.trainer.should_stop = True

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

        def train_dataloader(self):
            return DataLoader(Squares(200), batch_size=4, shuffle=True, num_workers=1)

        def val_dataloader(self):
            return DataLoader(Squares(20), batch_size=4, num_workers=1)

    deadline = time.monotonic() + float(sys.argv[2])
    trainer = pl.Trainer(max_epochs=10_000, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, check_val_every_n_epoch=5)
    trainer.fit(Model())
    print(json.dumps({"done": True}), flush=True)
    """
)


def _intune_run() -> list[str]:
    installed = Path(sys.executable).parent / "intune-run"
    if installed.exists():
        return [str(installed)]
    return [sys.executable, "-c", "from agents.autorun import main; main()"]


def test_an_override_resizes_the_training_loader_of_a_lightning_script(
    live_control_plane, tmp_path
):
    pytest.importorskip("pytorch_lightning")
    plane = live_control_plane
    job_id, host_id, token = plane.register(["fetch+collate"], cpus=2, worker_budget=4)
    (tmp_path / "train.py").write_text(SCRIPT)
    stop = tmp_path / "stop"
    with under_intune_run(
        [*_intune_run(), "--", sys.executable, str(tmp_path / "train.py"), str(stop), "150"],
        plane, host_id, token, tmp_path, ROOT, stop,
    ) as (run, log_path):  # fmt: skip
        with plane.stack.client(plane.api_token) as api:

            def workers():
                metrics = api.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 60}
                ).json()
                return metrics["stages"].get("fetch+collate", {}).get("workers") or None

            def moved():
                return "tuning DataLoader #1 (50 batches" in log_path.read_text() or None

            wait_showing_log(moved, 90, log_path, "the training loader tuned")
            wait_showing_log(workers, 60, log_path, "the script's samples")
            put = api.put(
                f"/api/v1/hosts/{host_id}/override/",
                json={"workers": {"fetch+collate": 3}, "reason": "intune-run Lightning test"},
            )
            assert put.status_code in (200, 201), put.text

            def resized():
                lines = [line for line in log_path.read_text().splitlines() if line[:1] == "{"]
                return any(json.loads(line).get("train") == {"fetch+collate": 3} for line in lines)

            wait_showing_log(resized, 60, log_path, "the training loader at 3 workers")
    text = log_path.read_text()
    assert '{"done": true}' in text, text[-3000:]
    assert "moving the tuning to DataLoader #1 (50 batches" in text
