"""Generated multi-rank jobs (``intune-run -- torchrun --nproc-per-node 2..4`` over an unchanged
script; a rank, the one hosting the agent or another, leaving early, raising, calling
``sys.exit``, SIGKILLed or slower; ``--max-restarts 1``; the control plane up, absent, down at
start, going away or silent) end as under torch alone: the same exit code, within
``rank_hunt.SLACK_S`` of torch's time, nothing of the job left running or listening, and every
rank that finished a tuned loader reached the host agent.

Each case runs two real torchrun jobs (15 to 40 s together on the 2-core machine), so this is
``make soak`` only (``INTUNE_RANK_HUNT_CASES=N``, ``INTUNE_RANK_HUNT_SEED=S``); the hunter
itself is ``python -m tests.agents.torch.rank_hunt``. The fork that held the ranks' socket,
found by it, has its own fast test
(``tests/agents/daemon/test_a_process_forked_by_the_hosting_rank_never_holds_the_ranks_socket.py``).
"""

import os
import random

import pytest

from tests.agents.torch.rank_hunt import ROOT, generate, run_case

CASES = int(os.environ.get("INTUNE_RANK_HUNT_CASES", "6"))
SEED = int(os.environ.get("INTUNE_RANK_HUNT_SEED", "3000"))

# Found by the hunter: the tuning moved from a validation loader to the training loader, whose
# persistent workers' launcher held the ranks' socket; no rank reached a host agent again.
MOVED_WITH_PERSISTENT_WORKERS = {
    "ranks": 2, "num_workers": 2, "persistent": True, "dataset": "map", "val_first": True,
    "val_pause_s": 2.0, "epochs": 3, "at": [0, 0], "action": "none", "actor": "host",
    "max_restarts": 0, "at_restart": 0, "plane": "up", "seed": 1,
}  # fmt: skip

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600 + 120 * CASES)]


@pytest.mark.parametrize(
    "seed, case",
    [(None, MOVED_WITH_PERSISTENT_WORKERS)]
    + [(SEED + k, generate(random.Random(SEED + k))) for k in range(CASES)],
)
def test_a_generated_rank_job_under_intune_run_ends_as_under_torch(seed, case):
    out = ROOT / "var" / "rank-hunt"
    out.mkdir(parents=True, exist_ok=True)
    ok, problems, figures = run_case(case, seed if seed is not None else 0, out)
    assert ok, f"seed {seed}: {problems} {figures}"
