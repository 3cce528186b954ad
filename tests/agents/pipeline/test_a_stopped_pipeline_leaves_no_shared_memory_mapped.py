"""A stopped pipeline's shared-memory files, unlinked, are not kept mapped by the process that
consumed them: a mapping holds a deleted file's pages, so a loader that starts a pipeline per
epoch held the batches of every past epoch in RAM (up to 64 files), after ``close()`` too; and
a running pipeline's consumer keeps none of a retired worker's files (a live resize)."""

import time

import numpy as np
import torch

from agents.pipeline import Pipeline, Stage
from agents.torch import DataLoader


def mapped_shm_files(prefix: str = "intune-", deleted: bool = False) -> list[str]:
    """The /dev/shm files of pipelines this process maps (only those unlinked: ``deleted``)."""
    with open("/proc/self/maps") as maps:
        return [
            line.split()[5]
            for line in maps
            if f"/dev/shm/{prefix}" in line and (not deleted or line.rstrip().endswith("(deleted)"))
        ]


def make_batch(i: int) -> np.ndarray:
    return np.full(300_000, i, dtype=np.float64)  # 2.4 MB: a pooled shared file


def test_a_stopped_pipeline_leaves_none_of_its_files_mapped():
    pipeline = Pipeline(range(20), [Stage("make", make_batch, workers=2)])
    with pipeline:
        sums = [int(batch[0]) for batch in pipeline]
        assert mapped_shm_files(pipeline._prefix), "the test needs batches through pooled files"
    assert sums == list(range(20))
    assert mapped_shm_files(pipeline._prefix) == []


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2**19,), float(i))  # 2 MB a sample


def test_a_loaders_past_epochs_leave_no_shared_memory_mapped():
    loader = DataLoader(Rows(), batch_size=2, num_workers=2)
    prefixes = []
    try:
        for _ in range(3):
            epoch = iter(loader)
            prefixes.append(loader.pipeline._prefix)  # each epoch's pipeline has its own
            assert sum(1 for _ in epoch) == 8
        assert [path for prefix in prefixes for path in mapped_shm_files(prefix)] == []
    finally:
        loader.close()


def test_a_resized_pipeline_keeps_none_of_its_retired_workers_files_mapped():
    pipeline = Pipeline(range(300), [Stage("make", make_batch, workers=4)], queue_size=8)
    with pipeline:
        items = iter(pipeline)
        assert [int(next(items)[0]) for _ in range(40)] == list(range(40))
        pipeline.apply({"make": 1})
        time.sleep(1.0)  # the three retired workers leave, and unlink their files
        held = None
        for i in range(40, 300):
            assert int(next(items)[0]) == i
            held = mapped_shm_files(pipeline._prefix, deleted=True)
            if not held and i >= 60:
                break
        assert held == [], "the retired workers' files are still mapped"
