"""Tune an existing torch input pipeline without rewriting it: change one import.

    from agents.torch import DataLoader     # was: from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=4,
                        transforms=[decode, augment])   # optional: one stage per step
    agent = agents.attach(loader)                       # InTune resizes its stages live
    for epoch in range(epochs):
        for batch in loader:
            train_step(batch)

Inside this package ``import torch`` is the real torch (imports are absolute).
"""

from agents.torch.loader import DataLoader
from agents.torch.stateful import StatefulDataLoader

__all__ = ["DataLoader", "StatefulDataLoader"]
