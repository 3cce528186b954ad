"""A training script that ends in one of the ways scripts end, for the exit hunter
(``tests/agents/torch/exit_hunt.py``): run once with torch's DataLoader and once with ours
(``agents.torch.DataLoader``, or torch's name under ``intune-run``), whose endings must match.

``EXIT_CASE`` (JSON) says how: the loader (``dataset`` map or iterable, ``item`` a tensor,
many tensors, numpy arrays or a dict, ``num_workers``, ``persistent``, ``pin_memory``,
``prefetch_factor``, ``hold`` where the script keeps it: a local, a global, a reference
cycle, an object with ``__del__``; ``two`` a second loader alive beside it; ``subclass`` a
library's subclass with a ``__del__`` of its own), and ``end``, what
it does at batch ``at`` of epoch ``epoch``. ``EXIT_LOADER`` is ``torch`` or ``ours``. Just
before it ends it writes the time to ``EXIT_MARK`` (the hunter times the exit from there).
"""

import gc
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.utils.data as tud

CASE = json.loads(os.environ["EXIT_CASE"])
if os.environ.get("EXIT_LOADER") == "ours" and os.environ.get("INTUNE_AUTO") != "1":
    from agents.torch import DataLoader
else:
    from torch.utils.data import DataLoader  # under intune-run: ours, in torch's place

ROWS = CASE.get("rows", 48)


def item(i: int):
    kind = CASE["item"]
    if kind == "tensor":
        return torch.full((4,), float(i))
    if kind == "many":
        return [torch.full((2,), float(i)) for _ in range(50)]
    if kind == "numpy":
        return np.full((3,), i, dtype=np.float32), i
    return {"x": torch.tensor([float(i)]), "id": i, "name": f"row{i}"}


class Rows(tud.Dataset):
    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        time.sleep(CASE.get("item_s", 0.002))
        if CASE["end"] == "worker_error" and i == CASE.get("bad", 9):
            raise ValueError(f"row {i} is bad")
        return item(i)


class Stream(tud.IterableDataset):
    def __iter__(self):
        info = tud.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for i in range(worker, ROWS, workers):
            yield Rows()[i]


class Holder:
    """A loader held by an object with ``__del__`` (the script's own cleanup)."""

    def __init__(self, loader):
        self.loader = loader

    def __del__(self):
        self.loader = None


class Closing(DataLoader):
    """A library's loader subclass with a clean-up of its own that never calls
    ``super().__del__()`` (mosaicml-streaming's ``StreamingDataLoader``)."""

    def __del__(self):
        self.closed = True


def make_loader():
    workers = CASE["num_workers"]
    kwargs = {}
    if workers > 0:
        kwargs["persistent_workers"] = CASE["persistent"]
        if CASE.get("prefetch_factor"):
            kwargs["prefetch_factor"] = CASE["prefetch_factor"]
    dataset = Rows() if CASE["dataset"] == "map" else Stream()
    return (Closing if CASE.get("subclass") else DataLoader)(
        dataset,
        batch_size=4,
        shuffle=CASE["dataset"] == "map",
        num_workers=workers,
        pin_memory=CASE.get("pin_memory", False),
        **kwargs,
    )


def mark() -> None:
    with open(os.environ["EXIT_MARK"], "w") as f:
        f.write(repr(time.time()))


def end_here(b: int):
    """What the script does at its ending batch; returns ``"return"`` or ``"break"``."""
    how = CASE["end"]
    mark()
    if how in ("return", "return_after", "no_grad", "generator", "thread_exit"):
        return "return"
    if how == "break":
        return "break"
    if how == "sys_exit":
        sys.exit(CASE.get("code", 3))
    if how in ("raise", "worker_error"):
        raise RuntimeError(f"the script fails at batch {b}")
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the KeyboardInterrupt comes first
    if how == "sigint_group":
        os.killpg(0, signal.SIGINT)
        time.sleep(5)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if how == "os_exit":
        os._exit(CASE.get("code", 3))
    if how == "other_thread":
        return "return"  # while another thread still iterates (started below)
    raise AssertionError(how)


G = {}  # a loader held in a global


def loop(loader):
    for epoch in range(CASE.get("epochs", 1)):
        for b, _batch in enumerate(loader):
            if CASE["end"] == "return_after":
                continue
            if (epoch, b) == (CASE.get("epoch", 0), CASE["at"]):
                with torch.no_grad() if CASE["end"] == "no_grad" else _nothing():
                    if end_here(b) == "return":
                        return
                break
            time.sleep(CASE.get("step_s", 0.02))
        else:
            continue
        return  # after the break
    if CASE["end"] == "return_after":
        end_here(-1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def batches(loader):
    yield from loader


def main() -> int:
    # One shuffle for both runs (ours draws torch's order under one seed): which batch holds
    # the bad row, or comes before the ending, is then the same (seeds 3021, 3023 differed).
    torch.manual_seed(CASE.get("torch_seed", 0))
    if CASE["end"] == "sigterm" and CASE.get("handler"):
        # A handler of the script's own: SystemExit(143), as many training scripts do.
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    loader = make_loader()
    hold = CASE.get("hold", "local")
    if hold == "global":
        G["loader"] = loader
    elif hold == "cycle":
        cycle = {"loader": loader}
        cycle["self"] = cycle
    elif hold == "del":
        holder = Holder(loader)
        holder.me = holder
    other = make_loader() if CASE.get("two") else None
    if other is not None:
        next(iter(other))  # a second loader alive, mid-epoch
    if CASE["end"] == "other_thread":

        def iterate():
            for _ in other or make_loader():
                time.sleep(0.05)

        threading.Thread(target=iterate, daemon=True).start()
    if CASE["end"] == "thread_exit":
        thread = threading.Thread(target=sys.exit, args=(4,))
        thread.start()
        thread.join()
    if CASE["end"] == "generator":
        it = batches(loader)
        for b, _ in enumerate(it):
            if b == CASE["at"]:
                mark()
                return 0
        return 0
    loop(loader)
    del loader
    gc.collect() if hold in ("cycle", "del") and CASE.get("collect") else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
