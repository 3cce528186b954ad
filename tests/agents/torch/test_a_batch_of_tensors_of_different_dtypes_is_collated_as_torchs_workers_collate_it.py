"""A batch of tensors of different dtypes is collated as torch's workers collate it: into a
batch of the first tensor's dtype, or torch's TypeError where the others cannot be cast to it.

torch's ``default_collate`` stacks differently in a worker (into an ``out`` tensor of the
first item's dtype, in shared memory) and in the training process (``torch.stack``, which
promotes). Ours hid ``get_worker_info()`` from torch's collate so that it stacks in the
worker's own memory, which made it promote: int32 then float64 came as a float64 batch where
torch's workers raise "TypeError: torch.cat(): input types can't be cast to the desired
output type Int" (the parity hunter's seed 6039), and float32 then float64 came as float64
where torch's batch is float32. With ``num_workers=0`` both promote.
"""

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader

ORDERS = {
    "int32 then float64": [torch.int32, torch.float64],
    "float32 then float64": [torch.float32, torch.float64],
    "float64 then int32": [torch.float64, torch.int32],
    "int64 then bool": [torch.int64, torch.bool],
}


class Mixed(tud.Dataset):
    def __init__(self, dtypes):
        self.dtypes = dtypes

    def __len__(self):
        return 2 * len(self.dtypes)

    def __getitem__(self, i):
        return torch.tensor([i % 2, 1], dtype=self.dtypes[i % len(self.dtypes)])


def outcomes(loader) -> list:
    out = []
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return out
        except Exception as exc:  # noqa: BLE001 - compared with torch's
            out.append(type(exc).__name__)
            continue
        out.append((str(batch.dtype), batch.tolist()))


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("order", list(ORDERS))
def test_a_mixed_batch_has_torchs_dtype_or_torchs_error(order, num_workers):
    args = dict(batch_size=len(ORDERS[order]), num_workers=num_workers)
    expected = outcomes(tud.DataLoader(Mixed(ORDERS[order]), **args))
    ours = DataLoader(Mixed(ORDERS[order]), **args)
    try:
        assert outcomes(ours) == expected
    finally:
        ours.close()
