"""A training script under ``intune-run`` that ends while its loader's attach is still
connecting to a control plane whose address drops packets (a firewall's DROP rule, a route to
nowhere) exits as promptly as under torch alone. Before, the exit cut the attach's requests
under way but not its connect, and waited out the connect's 5 s timeout: 6.80 and 7.75 s from
the script's end to its exit against torch's 2.02 and 2.31 s at load 17 (the exit's stop of
the attach 4.75 s; 0.01 to 0.06 s with the cut)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.dropping_tcp import DroppingAddress

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("dropping_plane_script.py")
PROMPT_S = 1.0  # what the exit may add to torch's, on a loaded 2-core machine
ATTEMPTS = 2
BOUND_S = 90.0


@pytest.fixture
def dropping():
    address = DroppingAddress()
    yield address
    address.close()


def exit_delay(command: list[str], env: dict[str, str]) -> float:
    """Run the script; the seconds from its ``END`` line to its process's exit."""
    proc = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=BOUND_S
    )
    exited = time.time()
    assert proc.returncode == 0, f"{command} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    end = next(line for line in proc.stdout.splitlines() if line.startswith("END "))
    return exited - float(end.split()[1])


@pytest.mark.slow
def test_the_exit_cuts_an_attach_connecting_to_an_address_that_drops_packets(dropping):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "INTUNE_URL": dropping.url,
        "INTUNE_HOST_ID": "1",
        "INTUNE_AGENT_TOKEN": "ia_dropped",
    }
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "INTUNE_RANK_SOCKET"):
        env.pop(name, None)
    port = str(dropping.port)
    intune_run = [sys.executable, "-c", "from agents.autorun import main; main()", "--"]
    runs = []
    # A second pair when the first is off: at load 17 to 20 on 2 cores, intune-run's exit past
    # the cut attach (its loader's own stop) ran 1.0 to 1.8 s behind torch's now and then
    # (torch's own 2.0 to 2.6 s); the connect's hold, 4.7 s, is there in every pair.
    for _ in range(ATTEMPTS):
        torch_alone = exit_delay([sys.executable, str(SCRIPT), port, "torch"], env)
        tuned = exit_delay([*intune_run, sys.executable, str(SCRIPT), port, "tuned"], env)
        runs.append(f"{tuned:.2f} s under intune-run, {torch_alone:.2f} s under torch alone")
        if tuned < torch_alone + PROMPT_S:
            return
    raise AssertionError(
        f"the exit took {'; '.join(runs)}: it waited for the attach's connect to an address "
        "that drops packets"
    )
