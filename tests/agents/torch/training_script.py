"""A training loop over ``agents.torch.DataLoader`` for the signal tests: it prints
``training`` once it has taken a few batches, then trains until a signal ends it.

Usage: ``python training_script.py NUM_WORKERS PERSISTENT``."""

from __future__ import annotations

import sys

import torch

from agents.torch import DataLoader


def main() -> int:
    workers, persistent = int(sys.argv[1]), sys.argv[2] == "1"
    dataset = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    loader = DataLoader(
        dataset, batch_size=64, shuffle=True, num_workers=workers, persistent_workers=persistent
    )
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    while True:
        epoch = iter(loader)
        print("prefix", loader.pipeline._prefix, flush=True)  # each epoch's pipeline has its own
        for x, y in epoch:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == 5:
                print("training", flush=True)


if __name__ == "__main__":
    sys.exit(main())
