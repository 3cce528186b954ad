"""With ``num_workers=0`` torch loads in the training process: ``worker_init_fn`` is never
called and ``get_worker_info()`` is ``None``. Our stages still run in worker processes, but
they show the user torch's behaviour. Before, a ``worker_init_fn`` ran in each of them (one
that raises failed a batch torch delivers; found by the generated parity test: a map-style
dataset, ``num_workers=0``, a ``worker_init_fn`` that raises)."""

import torch
import torch.utils.data as tud

from agents.torch import DataLoader


def refuse(worker_id: int) -> None:
    raise OSError(f"worker {worker_id} cannot start")


class SaysWhere(tud.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return torch.tensor([i, tud.get_worker_info() is None])


def test_with_no_workers_the_loader_calls_no_worker_init_fn_and_sets_no_worker_info(same_epoch):
    for dataset_kind in ("map", "iterable"):
        dataset = SaysWhere() if dataset_kind == "map" else Stream()
        loader = DataLoader(dataset, batch_size=2, num_workers=0, worker_init_fn=refuse)
        try:
            same_epoch(
                list(loader), list(tud.DataLoader(dataset, batch_size=2, worker_init_fn=refuse))
            )
        finally:
            loader.close()


class Stream(tud.IterableDataset):
    def __iter__(self):
        for i in range(5):
            yield torch.tensor([i, tud.get_worker_info() is None])
