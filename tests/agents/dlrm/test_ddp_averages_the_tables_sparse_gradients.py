"""The DDP entry averages the embedding tables' sparse gradients over the ranks itself
(agents.dlrm.ddp.reduce_sparse_gradients), with dense all-gathers, instead of through gloo's
sparse all-reduce (which corrupted a rank's heap under CPU load): the result is what DDP's
average would be, the mean of the ranks' dense gradients, also when the ranks touched
different rows and different numbers of them."""

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agents.dlrm.ddp import reduce_sparse_gradients

pytestmark = pytest.mark.timeout(120)


def _rank(rank: int, world: int, store_path: str, out: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        tables = [torch.nn.EmbeddingBag(50, 4, mode="sum", sparse=True) for _ in range(3)]
        # Rank 0 looks up 6 rows a table, rank 1 only 2, some rows on both ranks.
        lookups = [torch.tensor([1, 2, 2, 7, 9, 49]), torch.tensor([2, 30])][rank]
        loss = sum(
            (t((lookups + k) % 50, torch.tensor([0])) ** 2).sum() for k, t in enumerate(tables)
        )
        loss.backward()
        mine = torch.stack([t.weight.grad.to_dense() for t in tables])
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        expected = torch.stack(every).mean(0)
        reduce_sparse_gradients([t.weight for t in tables])
        got = torch.stack([t.weight.grad.to_dense() for t in tables])
        result = {
            "sparse": all(t.weight.grad.is_sparse for t in tables),
            "max_error": float((got - expected).abs().max()),
            "rows_differ": bool((every[0] != every[1]).any()),
        }
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_two_ranks_get_the_mean_of_their_gradients(tmp_path):
    out = str(tmp_path / "result")
    mp.start_processes(
        _rank, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="spawn", join=True
    )
    for rank in (0, 1):
        result = json.loads((tmp_path / f"result.{rank}").read_text())
        assert result["rows_differ"], "the ranks' gradients differ, so the average says something"
        assert result["sparse"], "the tables keep sparse gradients for the optimiser"
        assert result["max_error"] < 1e-6, result
