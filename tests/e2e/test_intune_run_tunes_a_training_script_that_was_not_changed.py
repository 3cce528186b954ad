"""``intune-run -- python train.py`` tunes a training script written for torch's DataLoader,
not a line of it changed: every part real (the web server, a Celery worker, Redis, the
database, the script's loader workers and the agent it starts).

The script imports ``from torch.utils.data import DataLoader`` as any script does. Its
training loader (workers) becomes ``agents.torch.DataLoader`` and reports to the control
plane, an operator's override resizes its workers live, and every epoch's batches are still
torch's; its evaluation loader (``num_workers=0``) stays torch's own, loading in the script's
process; a ``sitecustomize`` the environment had still runs; a Python process of the command
that never imports torch never imports it. Every wait is bounded.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.processes import json_lines, under_intune_run, wait_showing_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
INTUNE_RUN = str(Path(sys.executable).parent / "intune-run")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 200

        def __getitem__(self, i):
            time.sleep(0.002)
            return {"x": torch.tensor([i * i]), "i": i}

    train = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=1)
    val = DataLoader(Squares(), batch_size=50, num_workers=0)
    print(json.dumps({
        "train": [c.__module__ + "." + c.__name__ for c in type(train).__mro__],
        "val": type(val).__module__ + "." + type(val).__qualname__,
        "isinstance": [isinstance(x, DataLoader) for x in (train, val)],
        "same_name": DataLoader is torch.utils.data.DataLoader,
        "site": os.environ.get("USER_SITE_RAN"),
    }), flush=True)
    deadline = time.monotonic() + float(sys.argv[2])
    epochs = 0
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        seen = sorted(i for batch in train for i in batch["i"].tolist())
        assert seen == list(range(200)), seen[:20]
        assert sum(int(b["x"].sum()) for b in val) == sum(i * i for i in range(200))
        epochs += 1
    print(json.dumps({"epochs": epochs}), flush=True)
    """
)

USER_SITECUSTOMIZE = "import os\nos.environ['USER_SITE_RAN'] = 'yes'\n"


def test_an_unchanged_script_is_tuned_and_keeps_its_batches(live_control_plane, tmp_path):
    plane = live_control_plane
    job_id, host_id, token = plane.register(["fetch+collate"], cpus=2, worker_budget=4)
    (tmp_path / "train.py").write_text(SCRIPT)
    user_site = tmp_path / "user-site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    stop = tmp_path / "stop"
    with under_intune_run(
        [INTUNE_RUN, "--", sys.executable, str(tmp_path / "train.py"), str(stop), "150"],
        plane, host_id, token, tmp_path, f"{user_site}{os.pathsep}{ROOT}", stop,
    ) as (run, log_path):  # fmt: skip
        with plane.stack.client(plane.api_token) as api:

            def reported():
                metrics = api.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 60}
                ).json()
                workers = metrics["stages"].get("fetch+collate", {}).get("workers")
                return workers or None

            wait_showing_log(reported, 90, log_path, "the script's samples")
            put = api.put(
                f"/api/v1/hosts/{host_id}/override/",
                json={"workers": {"fetch+collate": 3}, "reason": "intune-run test"},
            )
            assert put.status_code in (200, 201), put.text

            def resized():
                workers = reported()
                return workers if workers and workers[-1] == 3 else None

            wait_showing_log(resized, 60, log_path, "the loader at 3 workers")
            allocation = api.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]
            assert allocation["status"] == "applied", allocation
    lines = json_lines(log_path)
    shown, done = lines[0], lines[-1]
    assert "agents.torch.loader.DataLoader" in shown["train"]
    assert "torch.utils.data.dataloader.DataLoader" in shown["train"]  # torch's, as its base
    assert shown["val"] == "torch.utils.data.dataloader.DataLoader"  # torch's own
    assert shown["isinstance"] == [True, True] and shown["same_name"]
    assert shown["site"] == "yes"  # the environment's sitecustomize ran after ours
    assert done["epochs"] >= 1
    assert "tuning DataLoader #0 (50 batches, stages fetch+collate)" in log_path.read_text()


def _run(*argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    # This checkout's agents (an installed copy of another checkout would answer otherwise).
    env = {"PYTHONPATH": str(ROOT)} | env
    return subprocess.run(
        [INTUNE_RUN, *argv], env=os.environ | env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


IDENTITY = {"INTUNE_URL": "http://127.0.0.1:9", "INTUNE_HOST_ID": "1", "INTUNE_AGENT_TOKEN": "ia_x"}


def test_a_process_of_the_command_that_never_imports_torch_stays_light():
    done = _run(
        sys.executable, "-c",
        "import sys; print(sorted(m for m in ('torch', 'agents.torch') if m in sys.modules))",
        **IDENTITY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        ([], IDENTITY, "give the training command"),
        (["--loader", "train", "true"], IDENTITY, "--loader must be 'largest' or a number"),
        (["no-such-command-here"], IDENTITY, "no such command on PATH"),
        (["true"], {"INTUNE_URL": "", "INTUNE_HOST_ID": "", "INTUNE_AGENT_TOKEN": ""},
         "the agent needs to know who it is"),
    ],
)  # fmt: skip
def test_a_bad_command_line_is_refused_before_anything_runs(argv, env, says, tmp_path):
    done = _run(*argv, **env, HOME=str(tmp_path))  # no saved identity in ~/.intune-agent
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr


def test_a_control_plane_away_at_registration_runs_the_command_untuned(tmp_path):
    marker = tmp_path / "ran"
    done = _run(
        "--url", "http://127.0.0.1:9", "--job", "7", "--api-token", "tok", "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')",
        HOME=str(tmp_path), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    assert "running" in done.stderr and "untuned" in done.stderr


CHOICE = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader
    from agents.torch import auto

    small = DataLoader(list(range(8)), batch_size=4, num_workers=1)     # #0: 2 batches
    large = DataLoader(list(range(80)), batch_size=4, num_workers=1)    # #1: 20 batches
    other = DataLoader(list(range(40)), batch_size=4, num_workers=1)    # #2: 10 batches
    for loader in (small, large, other):   # the small one first, as a sanity check would
        assert [int(x) for b in loader for x in b] == list(loader.dataset)
    # The attach runs in a thread of its own: the script ends once it has, bounded (it slept a
    # fixed 2 s; the exit cancels an attach under way).
    deadline = time.monotonic() + 30
    for thread in list(auto._tuned.attaching):
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in auto._tuned.attaching), "the attach did not end"
    """
)


@pytest.mark.parametrize(
    ("choice", "tuned"), [("largest", "#1 (20 batches"), ("2", "#2 (10 batches")]
)
def test_the_loader_tuned_is_the_largest_or_the_one_named(choice, tuned, tmp_path):
    (tmp_path / "choice.py").write_text(CHOICE)
    done = _run("--loader", choice, "--", sys.executable, str(tmp_path / "choice.py"), **IDENTITY)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("intune-run: tuning DataLoader") == 1, done.stderr
    assert f"tuning DataLoader {tuned}" in done.stderr


def test_a_script_that_attaches_its_own_loader_is_left_to_it(tmp_path):
    script = (
        CHOICE.replace(
            "for loader in", "import agents\nagent = agents.attach(small)\nfor loader in"
        )
        + "agent.stop()\n"
    )
    (tmp_path / "own.py").write_text(script)
    done = _run("--", sys.executable, str(tmp_path / "own.py"), **IDENTITY)
    assert done.returncode == 0, done.stderr
    assert "intune-run: tuning DataLoader" not in done.stderr
    assert "the script attaches its own pipeline" in done.stderr


# Lightning builds the training loader from its train_dataloader() hook after the sanity
# check has iterated the validation loader: the one tuned first is the only one built then.
BUILT_LATE = textwrap.dedent(
    """
    from torch.utils.data import DataLoader

    val = DataLoader(list(range(8)), batch_size=4, num_workers=1)       # #0: 2 batches
    assert [int(x) for b in val for x in b] == list(range(8))            # the sanity check
    train = DataLoader(list(range(80)), batch_size=4, num_workers=1)    # #1: 20 batches
    for epoch in range(2):
        assert [int(x) for b in train for x in b] == list(range(80))
        assert [int(x) for b in val for x in b] == list(range(8))
    """
)

# accelerate's prepare() and Lightning's distributed sampler build a copy of the script's
# loader, which the script may still hold: the original is never iterated.
REBUILT = textwrap.dedent(
    """
    from torch.utils.data import DataLoader

    original = DataLoader(list(range(80)), batch_size=4, num_workers=1)  # #0: 20 batches
    copy = DataLoader(list(range(0, 80, 2)), batch_size=4, num_workers=1)  # #1: this rank's 10
    val = DataLoader(list(range(8)), batch_size=4, num_workers=1)        # #2: 2 batches
    for epoch in range(3):
        assert [int(x) for b in copy for x in b] == list(range(0, 80, 2))
        assert [int(x) for b in val for x in b] == list(range(8))
    """
)


@pytest.mark.parametrize(
    ("script", "first", "then"),
    [(BUILT_LATE, "#0 (2 batches", "#1 (20 batches"), (REBUILT, "#0 (20 batches", "#1 (10 batches")],
    ids=["a larger loader built later", "a loader never iterated"],
)  # fmt: skip
def test_the_tuning_moves_to_the_training_loader_that_runs(script, first, then, tmp_path):
    (tmp_path / "train.py").write_text(script)
    done = _run("--", sys.executable, str(tmp_path / "train.py"), timeout=150, **IDENTITY)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    tuned = [line for line in lines if "intune-run: tuning DataLoader" in line]
    chose = [line for line in lines if "intune-run: tuning" in line or "intune-run: moving" in line]
    # The first attach may be overtaken by the move before it says it tunes.
    assert tuned and then in tuned[-1] and all(first in line for line in tuned[:-1]), done.stderr
    assert f"moving the tuning to DataLoader {then}" in done.stderr
    assert all(first in line or then in line for line in chose), done.stderr
