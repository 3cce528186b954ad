"""A training script that ends mid-epoch, for the test of an exit while intune-run's attach
connects to a control plane that drops packets (argv: the control plane's port, "tuned" or
"torch"). Under intune-run it first waits (bounded) until this process's attach is connecting
to that port, so that the script ends while the connect is under way; it prints ``END <time>``
as it returns."""

import sys
import time

import psutil
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def connecting(port: int) -> bool:
    return any(
        c.status == psutil.CONN_SYN_SENT and c.raddr and c.raddr.port == port
        for c in psutil.Process().net_connections(kind="tcp")
    )


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    loader = DataLoader(Rows(), batch_size=2, num_workers=1)
    batches = iter(loader)
    next(batches)  # the first iteration: intune-run attaches the loader now
    if mode == "tuned":
        deadline = time.monotonic() + 30
        while not connecting(port):
            if time.monotonic() > deadline:
                sys.exit("the attach never connected to the control plane within 30 s")
            time.sleep(0.02)
    time.sleep(0.2)
    print("END", time.time(), flush=True)


main()
