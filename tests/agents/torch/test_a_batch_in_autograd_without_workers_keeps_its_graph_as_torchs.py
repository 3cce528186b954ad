"""With ``num_workers=0``, a dataset whose items are tensors in autograd (rows of an
``nn.Parameter`` the dataset holds, a learned augmentation) gives batches in its graph, as
torch's single-process loader fetches and collates in the training process: ``backward()``
reaches the dataset's parameters.

Ours runs the loader in a worker process even with ``num_workers=0`` (so that it can be
resized live), and such a batch came pickled: a tensor that ``requires_grad`` but has no
``grad_fn``, a new leaf, so the loss's gradient never reached the dataset's parameter (its
``grad`` stayed ``None``): training that silently learned nothing there (found by
``/tmp`` probes of tensor kinds, 2026-11-30). Now the worker sends such a batch's indices
back and the training process fetches and collates it, as torch's does.

Cases are generated (hypothesis): dataset size, ``batch_size`` (``None``: no auto-batching),
items as rows, as a dict holding a row beside plain values, or as rows only some of which are
in autograd; and a ``collate_fn`` that puts the batch in autograd (a learned scale) where the
samples are not.
"""

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader


class Rows(tud.Dataset):
    """Rows of a parameter the dataset holds; ``form``: how each item holds its row."""

    def __init__(self, n: int, form: str) -> None:
        self.weight = torch.nn.Parameter(torch.arange(3.0 * n).view(n, 3))
        self.n, self.form = n, form

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        row = self.weight[i] * 2.0
        if self.form == "dict":
            return {"x": row, "i": i, "name": f"row-{i}"}
        if self.form == "some" and i % 2:
            return row.detach()
        return row


class Scaled:
    """A ``collate_fn`` whose batch is in autograd though its samples are not."""

    def __init__(self) -> None:
        self.scale = torch.nn.Parameter(torch.tensor(3.0))

    def __call__(self, batch):
        return tud.default_collate(batch) * self.scale


def _tensor(batch):
    return batch["x"] if isinstance(batch, dict) else batch


def _epoch(loader, parameter: torch.nn.Parameter) -> list:
    """Each batch's values and whether it is in the graph; then the parameter's gradient
    from the whole epoch's loss."""
    parameter.grad = None
    seen, loss = [], 0.0
    for batch in loader:
        tensor = _tensor(batch)
        seen.append((tensor.tolist(), tensor.requires_grad, tensor.grad_fn is not None))
        if tensor.requires_grad:
            loss = loss + tensor.sum()
    if isinstance(loss, torch.Tensor):
        loss.backward()
    grad = None if parameter.grad is None else parameter.grad.tolist()
    return seen + [("grad", grad)]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n=st.integers(0, 7),
    batch_size=st.sampled_from([None, 1, 2, 3]),
    form=st.sampled_from(["row", "dict", "some", "collate"]),
)
def test_backward_reaches_the_datasets_parameters_as_with_torchs_loader(n, batch_size, form):
    dataset = Rows(n, "some" if form == "collate" else form)
    kwargs = {"batch_size": batch_size}
    parameter = dataset.weight
    if form == "collate":
        dataset = tud.TensorDataset(torch.arange(2.0 * n).view(n, 2))
        collate = Scaled()
        kwargs["collate_fn"] = lambda batch: collate([row for (row,) in batch])
        parameter = collate.scale
        if batch_size is None:
            kwargs["collate_fn"] = lambda item: item[0] * collate.scale
    expected = _epoch(tud.DataLoader(dataset, **kwargs), parameter)
    ours = DataLoader(dataset, num_workers=0, **kwargs)
    try:
        assert _epoch(ours, parameter) == expected
        assert _epoch(ours, parameter) == expected  # the next epoch alike
    finally:
        ours.close()
