"""Real libraries whose loaders subclass or rebuild torch's DataLoader, under ``intune-run``'s
patch (``agents.torch.auto``) and without it: the same training script, its batches compared
item for item. Each runs where its library is installed (the test extras pin torchdata and
pytorch-lightning) and is skipped elsewhere.

- torchdata 0.11 ``StatefulDataLoader`` (mid-epoch checkpoint and resume): it stays torch's,
  and resumes where it left off. Before, its import raised ``TypeError`` and, once that was
  fixed, the first iteration of any other loader raised ``AttributeError``.
- PyTorch Lightning 2.6 ``Trainer.fit`` with ``train_dataloader()`` and ``val_dataloader()``
  hooks: the batches of every training and validation step are torch's, and the loader tuned
  is the training one (the sanity check iterates the validation loader before the training
  loader is built; it was tuned for the whole run).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]

PATCH = textwrap.dedent(
    """
    import os, torch
    if os.environ.get("PATCH") == "1":
        from agents.torch import auto
        auto.patch()
    """
)

STATEFUL = textwrap.dedent(
    """
    import json, torch
    import torch.utils.data as tud
    from torchdata.stateful_dataloader import StatefulDataLoader

    class Squares(tud.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"x": torch.tensor([i * i]), "i": i}

    def make():
        return StatefulDataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2,
                                  generator=torch.Generator().manual_seed(7))

    ids = lambda batches: [b["i"].tolist() for b in batches]
    loader = make()
    it = iter(loader)
    first = [next(it)["i"].tolist() for _ in range(5)]
    state = loader.state_dict()
    rest = ids(it)
    resumed = make()
    resumed.load_state_dict(state)
    val = tud.DataLoader(Squares(), batch_size=16, num_workers=1)
    print(json.dumps({
        "first": first, "rest": rest, "resumed": ids(resumed), "epoch2": ids(loader),
        "val": ids(val), "isinstance": isinstance(loader, tud.DataLoader),
        "ours": "agents.torch.loader" in [c.__module__ for c in type(loader).__mro__],
    }))
    """
)

LIGHTNING = textwrap.dedent(
    """
    import json, torch
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"x": torch.tensor([float(i)]), "i": i}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)
            self.seen, self.val_seen = [], []

        def training_step(self, batch, k):
            self.seen.append(batch["i"].tolist())
            return self.lin(batch["x"]).pow(2).mean()

        def validation_step(self, batch, k):
            self.val_seen.append(batch["i"].tolist())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return DataLoader(Squares(64), batch_size=4, shuffle=True, num_workers=2,
                              persistent_workers=True)

        def val_dataloader(self):
            return DataLoader(Squares(16), batch_size=4, num_workers=1)

    pl.seed_everything(5)
    model = Model()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model)
    print(json.dumps({"seen": model.seen, "val": model.val_seen,
                      "weight": round(float(model.lin.weight.detach()), 6)}))
    """
)


def _run(script: str, tmp_path: Path, patch: bool) -> tuple[dict, str]:
    path = tmp_path / "train.py"
    path.write_text(PATCH + script)
    env = os.environ | {"PATCH": "1" if patch else "0", "PYTHONPATH": str(ROOT)}
    for name in ("INTUNE_URL", "INTUNE_HOST_ID", "INTUNE_AGENT_TOKEN"):
        env.pop(name, None)  # no control plane: the attach says which loader, and fails
    done = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=240,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]), done.stderr


def test_torchdatas_stateful_loader_stays_torchs_and_resumes_where_it_left_off(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    torchs, _ = _run(STATEFUL, tmp_path, patch=False)
    ours, log = _run(STATEFUL, tmp_path, patch=True)
    assert ours == torchs
    assert ours["resumed"] == ours["rest"] and len(ours["first"] + ours["rest"]) == 16
    assert not ours["ours"] and ours["isinstance"]
    assert "StatefulDataLoader is not tuned (_get_iterator, __iter__" in log


def test_lightnings_fit_gives_torchs_batches_and_its_training_loader_is_the_one_tuned(tmp_path):
    pytest.importorskip("pytorch_lightning")
    torchs, _ = _run(LIGHTNING, tmp_path, patch=False)
    ours, log = _run(LIGHTNING, tmp_path, patch=True)
    assert ours == torchs
    assert len(ours["seen"]) == 32 and len(ours["val"]) == 2 + 4 * 2  # sanity check, 2 epochs
    # The validation loader (#0, 4 batches) first, then the training loader.
    assert "moving the tuning to DataLoader #1 (16 batches" in log, log[-3000:]
