"""``intune-run`` on a training script whose loader streams an ``IterableDataset`` with several
workers (each reads its share by its worker id, as streaming datasets shard): the loader stays
torch's own and loads what torch loads, every item once an epoch; it is observed, so the
control plane shows it (stage ``read+collate`` at ``num_workers`` workers, their CPU, the
trainer's samples/s and waiting); an operator's override to another number of workers is
refused with the reason, and training goes on. Before, such a loader sent nothing at all: the
job showed no host data. Every part real (web server, Celery worker, Redis, the database, the
script's torch workers, the agent); every wait bounded."""

import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.processes import json_lines, under_intune_run, wait_showing_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
INTUNE_RUN = str(Path(sys.executable).parent / "intune-run")
ITEMS = 3000

SCRIPT = textwrap.dedent(
    f"""
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Shards(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            me, every = (info.id, info.num_workers) if info else (0, 1)
            for i in range(me, {ITEMS}, every):
                x = torch.full((8,), float(i))
                for _ in range(20):
                    x = x.sin() + x.cos()  # a parse's CPU
                yield {{"i": i, "x": x}}

    train = DataLoader(Shards(), batch_size=16, num_workers=2)
    print(json.dumps({{
        "train": [c.__module__ + "." + c.__name__ for c in type(train).__mro__],
        "isinstance": isinstance(train, DataLoader),
    }}), flush=True)
    deadline = time.monotonic() + float(sys.argv[2])
    epochs = 0
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        seen = sorted(i for batch in train for i in batch["i"].tolist())
        assert seen == list(range({ITEMS})), seen[:20]
        epochs += 1
        time.sleep(0.05)
    print(json.dumps({{"epochs": epochs}}), flush=True)
    """
)


def test_a_stream_read_by_several_workers_is_observed_and_keeps_its_workers(
    live_control_plane, tmp_path
):
    plane = live_control_plane
    job_id, host_id, token = plane.register(["read+collate"], cpus=2, worker_budget=4)
    (tmp_path / "train.py").write_text(SCRIPT)
    stop = tmp_path / "stop"
    with under_intune_run(
        [INTUNE_RUN, "--", sys.executable, str(tmp_path / "train.py"), str(stop), "150"],
        plane, host_id, token, tmp_path, ROOT, stop,
    ) as (run, log_path):  # fmt: skip
        with plane.stack.client(plane.api_token) as api:

            def metrics():
                return api.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 60}
                ).json()

            def reading():
                shown = metrics()
                stage = shown["stages"].get("read+collate", {})
                cpu = [c for c in stage.get("cpu_percent") or [] if c]
                rates = [r for r in shown["series"].get("throughput") or [] if r]
                return (stage, shown) if stage.get("workers") and cpu and rates else None

            stage, shown = wait_showing_log(reading, 90, log_path, "the stream's figures")
            assert set(stage["workers"]) == {2}, stage["workers"]
            assert max(shown["series"]["throughput"]) > 0
            put = api.put(
                f"/api/v1/hosts/{host_id}/override/",
                json={"workers": {"read+collate": 1}, "reason": "observed-stream test"},
            )
            assert put.status_code in (200, 201), put.text

            def refused():
                allocation = api.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]
                return allocation if allocation["status"] == "refused" else None

            allocation = wait_showing_log(refused, 60, log_path, "the override's refusal")
            assert "keeps its num_workers=2 workers" in allocation["refusal_reason"]
    lines = json_lines(log_path)
    shown, done = lines[0], lines[-1]
    assert "agents.torch.observed.DataLoader" not in shown["train"]  # named as torch's
    assert shown["train"][0] == "torch.utils.data.dataloader.DataLoader"
    assert "torch.utils.data.dataloader.DataLoader" in shown["train"][1:]  # torch's, as its base
    assert shown["isinstance"] and done["epochs"] >= 1
    assert "observing DataLoader #0 (unsized, stages read+collate)" in log_path.read_text()
