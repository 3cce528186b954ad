"""Real libraries whose loaders subclass or rebuild torch's DataLoader, under ``intune-run``'s
patch (``agents.torch.auto``) and without it: the same training script, its batches compared
item for item. Each runs where its library is installed (the test extras pin torchdata and
pytorch-lightning) and is skipped elsewhere.

- torchdata 0.11 ``StatefulDataLoader`` (mid-epoch checkpoint and resume): over a map-style
  dataset ours is built in its place (``agents.torch.StatefulDataLoader``, tuned; still an
  instance of torchdata's class), gives torchdata's batches and resumes where it left off;
  over an ``IterableDataset`` it stays torchdata's own. Before, its import raised
  ``TypeError`` and, once that was fixed, the first iteration of any other loader raised
  ``AttributeError``; then it was kept torch's, untuned, whatever its dataset.
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

    class Stream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    stream = StatefulDataLoader(Stream(), batch_size=3, num_workers=1)
    sit = iter(stream)
    head = [next(sit).tolist()]
    stream_state = stream.state_dict()
    stream_again = StatefulDataLoader(Stream(), batch_size=3, num_workers=1)
    stream_again.load_state_dict(stream_state)
    mro = lambda x: [c.__module__ for c in type(x).__mro__]
    print(json.dumps({
        "first": first, "rest": rest, "resumed": ids(resumed), "epoch2": ids(loader),
        "val": ids(val), "isinstance": isinstance(loader, tud.DataLoader),
        "stateful": isinstance(loader, StatefulDataLoader),
        "ours": "agents.torch.loader" in mro(loader),
        "stream": head + [b.tolist() for b in stream_again],
        "stream_ours": "agents.torch.loader" in mro(stream),
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


def _run(script: str, tmp_path: Path, patch: bool, stateful: bool = False) -> tuple[dict, str]:
    path = tmp_path / "train.py"
    path.write_text(PATCH + script)
    env = os.environ | {"PATCH": "1" if patch else "0", "PYTHONPATH": str(ROOT)}
    env["INTUNE_AUTO_STATEFUL"] = "1" if stateful else "0"  # intune-run --tune-stateful
    for name in ("INTUNE_URL", "INTUNE_HOST_ID", "INTUNE_AGENT_TOKEN"):
        env.pop(name, None)  # no control plane: the attach says which loader, and fails
    done = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=240,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]), done.stderr


# The script's outcome without the patch (torchdata's and torch's own), run once for the tests
# that compare against it: a run is a new Python importing torch and the library.
_UNPATCHED: dict[str, dict] = {}


def _unpatched(script: str, tmp_path: Path) -> dict:
    if script not in _UNPATCHED:
        _UNPATCHED[script] = _run(script, tmp_path, patch=False)[0]
    return json.loads(json.dumps(_UNPATCHED[script]))  # a copy: a test pops from its own


def test_torchdatas_stateful_loader_is_ours_over_a_map_dataset_and_resumes_as_torchdatas(
    tmp_path,
):
    pytest.importorskip("torchdata.stateful_dataloader")
    torchs = _unpatched(STATEFUL, tmp_path)
    ours, log = _run(STATEFUL, tmp_path, patch=True, stateful=True)
    assert not torchs["ours"] and ours["ours"]  # tuned: ours in its place
    assert not ours["stream_ours"]  # an IterableDataset's: torchdata's own
    for result in (torchs, ours):
        result.pop("ours")
    assert ours == torchs
    assert ours["resumed"] == ours["rest"] and len(ours["first"] + ours["rest"]) == 16
    assert ours["stream"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert ours["isinstance"] and ours["stateful"]
    assert "StatefulDataLoader over a map-style dataset is tuned" in log
    assert "StatefulDataLoader is kept, not tuned (an IterableDataset" in log


def test_without_tune_stateful_torchdatas_stateful_loader_stays_torchdatas(tmp_path):
    """Its checkpoints then stay torchdata's, which a run without intune-run reads."""
    pytest.importorskip("torchdata.stateful_dataloader")
    torchs = _unpatched(STATEFUL, tmp_path)
    kept, log = _run(STATEFUL, tmp_path, patch=True)
    assert not kept["ours"] and not kept["stream_ours"]
    assert kept == torchs
    assert "StatefulDataLoader is kept, not tuned (its checkpoints stay torchdata's" in log


def test_lightnings_fit_gives_torchs_batches_and_its_training_loader_is_the_one_tuned(tmp_path):
    pytest.importorskip("pytorch_lightning")
    torchs, _ = _run(LIGHTNING, tmp_path, patch=False)
    ours, log = _run(LIGHTNING, tmp_path, patch=True)
    assert ours == torchs
    assert len(ours["seen"]) == 32 and len(ours["val"]) == 2 + 4 * 2  # sanity check, 2 epochs
    # The validation loader (#0, 4 batches) first, then the training loader.
    assert "moving the tuning to DataLoader #1 (16 batches" in log, log[-3000:]
