"""A hang hunter for multi-rank jobs as users run them: ``intune-run -- torchrun
--nproc-per-node N`` over an unchanged script (``rank_job.py``), every process real.

Each generated case (2 to 4 ranks, 0 to 3 workers, persistent or not, map-style under a
``DistributedSampler`` or an ``IterableDataset``; one rank, the one that hosts the agent or
another, leaves early, raises, calls ``sys.exit``, is SIGKILLed or runs slower; ``--max-restarts
1``; the control plane up, absent, down at start, going away mid-run, or accepting and never
answering) runs twice: under plain ``torchrun`` and under ``intune-run``. The tuned run must
exit with torch's exit code, within ``SLACK_S`` of the plain run, leave no process of the job
behind (found by a mark in their environment), no listener on the ranks' socket, and every rank
that finished a tuned loader must have reached the host agent (after a restart too). A job past
``BOUND_S`` gets SIGUSR1 (every thread's stack, ``faulthandler``) and is killed.

    nice -n 10 .venv/bin/python -m tests.agents.torch.rank_hunt --cases 20 [--seed N | --replay N]

``--mixed``: jobs whose ranks differ, and faults from outside (:func:`generate_mixed`).

Tally in ``var/hunt-ranks.json``; each job's output in ``var/rank-hunt/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from agents.daemon.ranks import default_address
from tests.support.ports import free_port
from tests.support.standin_control_plane import StandinControlPlane

ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).with_name("rank_job.py")
BOUND_S = 120.0  # a job still running then hangs
SLACK_S = 20.0  # what intune-run may add to torch's own run on this loaded 2-core machine
# gloo failing to connect the restarted ranks (seed 2000, without intune-run): not ours.
FLAKE = "Gloo connectFullMesh failed"
GRACE_S = 5.0  # for the job's processes to end once torchrun has
MARK = "RANK_HUNT_MARK"
_DONE = re.compile(r"rank \d+ \(restart \d+, pid \d+\) done: \d+ rows, reached=(?:True|False|None)")
ACTIONS = ["none", "return", "raise", "exit", "sigkill", "slow"]
PLANES = ["up", "absent", "down_at_start", "goes_away", "silent"]


def generate(rng: random.Random) -> dict:
    """One job: its ranks, loader, fault and control plane."""
    ranks = rng.choice([2, 2, 3, 4])
    restarts = rng.random() < 0.2
    action = rng.choice(["raise", "exit", "sigkill"] if restarts else ACTIONS)
    epochs = rng.randint(1, 3)
    dataset = rng.choice(["map", "map", "iterable"])
    # Mostly loaders that are tuned (an IterableDataset's with 2 or more workers stays torch's).
    workers = rng.choice([0, 1, 2, 2, 3] if dataset == "map" else [0, 1, 1, 1, 2])
    return {
        "ranks": ranks,
        "num_workers": workers,
        "persistent": rng.random() < 0.5,
        "dataset": dataset,
        # A validation loader iterated first (Lightning's sanity check): the tuning moves.
        "val_first": rng.random() < 0.3,
        "epochs": epochs,
        "at": [rng.randrange(epochs), rng.randrange(5)],
        "action": action,
        "actor": rng.choice(["host", "host", "other"]),
        "max_restarts": 1 if restarts else 0,
        "at_restart": 0,
        "plane": rng.choice(PLANES),
        "seed": rng.randrange(1000),
    }


def generate_mixed(rng: random.Random) -> dict:
    """One job whose ranks differ (``--mixed``): each rank its own dataset, workers and
    persistence, or no loader at all, or more loaders first; ranks that start seconds apart,
    pinned to one CPU each, more ranks than CPUs; gloo barriers between epochs; and faults
    from outside: SIGTERM to torchrun, or SIGKILL to one rank's process (the host agent's or
    another's, while the host's ranks may be moving), with or without ``--max-restarts 1``."""
    ranks = rng.choice([2, 3, 4, 5])
    per_rank = {}
    for rank in range(ranks):
        dataset = rng.choice(["map", "map", "iterable"])
        mine = {
            "dataset": dataset,
            "num_workers": rng.choice([0, 1, 2, 3] if dataset == "map" else [0, 1, 1, 2]),
            "persistent": rng.random() < 0.5,
        }
        if rng.random() < 0.15:
            mine["no_loader"] = True
        if rng.random() < 0.25:
            mine["loaders"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            mine["delay_s"] = rng.choice([1.0, 3.0, 6.0])
        per_rank[str(rank)] = mine
    affinity = rng.random() < 0.3
    for mine in per_rank.values():
        mine["affinity"] = affinity
    restarts = rng.random() < 0.25
    fault = rng.choice(["none", "none", "sigterm_torchrun", "sigkill_rank"])
    return {
        "ranks": ranks,
        "num_workers": 1,
        "persistent": False,
        "dataset": "map",
        "per_rank": per_rank,
        "val_first": False,
        "epochs": rng.randint(1, 3),
        "at": [0, 0],
        "action": "none",
        "actor": "host",
        "max_restarts": 1 if restarts else 0,
        "at_restart": 0,
        "barrier_epochs": rng.random() < 0.6,
        "plane": rng.choice(["up", "up", "absent", "silent", "goes_away"]),
        "fault": fault,
        "fault_rank": rng.randrange(ranks),
        "fault_after_s": rng.choice([3.0, 6.0, 10.0, 15.0]),
        "seed": rng.randrange(1000),
    }


def _rank_process(mark: str, rank: int) -> int | None:
    """The training process of local rank ``rank`` of the job (not one of its loader's)."""
    for pid in _marked(mark):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if env.get(b"LOCAL_RANK") == str(rank).encode() and "torch.distributed.run" in _cmdline(
            ppid
        ):
            return pid
    return None


def _fault(case: dict, proc: subprocess.Popen, mark: str) -> None:
    """The case's fault from outside, ``fault_after_s`` after every rank's process started.

    Counted from the ranks' start, not the job's: intune-run starts torchrun a few seconds
    later on this loaded machine, so a fault at a fixed time from the job's start landed
    before torchrun's signal handlers (exit -15 against torch's 1, seeds 5103, 5113) or
    before the rank existed (no SIGKILL at all, seed 5112) in one run of the pair only."""
    if case.get("fault", "none") == "none":
        return
    deadline = time.monotonic() + BOUND_S / 2
    while any(_rank_process(mark, rank) is None for rank in range(case["ranks"])):
        if proc.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.1)
    time.sleep(case["fault_after_s"])
    if proc.poll() is not None:
        return
    if case["fault"] == "sigterm_torchrun":
        print(f"    SIGTERM to torchrun ({proc.pid})", flush=True)
        proc.send_signal(signal.SIGTERM)
    else:
        pid = _rank_process(mark, case["fault_rank"])
        if pid is not None:
            print(f"    SIGKILL to rank {case['fault_rank']} ({pid})", flush=True)
            os.kill(pid, signal.SIGKILL)


def _marked(mark: str) -> list[int]:
    """The processes whose environment carries ``mark`` (the job's, whatever their group)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(entry))
        except OSError:
            pass
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def _listening(address: str) -> bool:
    name = "@" + address[1:] if address.startswith("\0") else address
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == name for line in f.readlines()[1:] if len(line.split()) > 7)


def run_job(case: dict, tuned: bool, plane_url: str, host, log: Path) -> dict:
    """Run the job once; its exit code, seconds, and what it left."""
    mark = uuid.uuid4().hex
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "RANK_JOB": json.dumps(case),
            MARK: mark,
            "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1",
        }
    )
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(case["ranks"]), "--max-restarts", str(case["max_restarts"]),
        "--monitor-interval", "0.2", str(JOB),
    ]  # fmt: skip
    if tuned:
        env.update(
            {"INTUNE_URL": plane_url, "INTUNE_HOST_ID": str(host[0]), "INTUNE_AGENT_TOKEN": host[1]}
        )
        # intune-run's console script (pyproject.toml), from this tree
        command = [sys.executable, "-c", "from agents.autorun import main; main()", "--", *torchrun]
    else:
        command = torchrun
    shm_before = set(os.listdir("/dev/shm"))
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )
        threading.Thread(target=_fault, args=(case, proc, mark), daemon=True).start()
        try:
            rc = proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            rc = None
            for pid in _marked(mark):
                os.kill(pid, signal.SIGUSR1)
            time.sleep(3.0)
    took = time.monotonic() - start
    ended = time.monotonic()
    deadline = ended + GRACE_S
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    linger = time.monotonic() - ended  # how long the job's processes outlived torchrun
    left = [(pid, _cmdline(pid)) for pid in _marked(mark)]
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc is None:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    text = log.read_text(errors="replace")
    # Segments made during the run and still there (another user's run may make some too:
    # those named after a pid of this job's are the job's).
    pids = {str(pid) for pid in _pids_in(text)}
    shm = [n for n in set(os.listdir("/dev/shm")) - shm_before if pids & set(n.split("-"))]
    return {
        "rc": rc,
        "took": round(took, 1),
        "linger": round(linger, 2),
        "left": left,
        "text": text,
        "shm": shm,
    }


def _pids_in(text: str) -> set[int]:
    """The pids a job's output names (torchrun's and the agent's lines)."""
    return {int(m) for m in re.findall(r"pid[: ]+(\d+)", text)}


class _Silent:
    """A control plane that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def stop(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def run_case(case: dict, seed: int, out: Path) -> tuple[bool, list[str], dict]:
    """Both runs of one case; whether it passed, what failed, and the figures."""
    plain = run_job(case, False, "", None, out / f"{seed}-plain.log")
    plane_kind = case["plane"]
    silent = standin = None
    timers: list[threading.Timer] = []
    if plane_kind == "silent":
        silent = _Silent()
        url, host = silent.url, (1, "ia_silent")
    elif plane_kind == "absent":
        url, host = f"http://127.0.0.1:{free_port()}", (1, "ia_absent")
    else:
        standin = StandinControlPlane()
        stored = standin.add_host([])
        url, host = standin.url, (stored.id, stored.token)
        if plane_kind == "down_at_start":
            timers.append(threading.Timer(4.0, standin.start))
        else:
            standin.start()
            if plane_kind == "goes_away":
                timers.append(threading.Timer(4.0, standin.stop))
    for timer in timers:
        timer.start()
    try:
        tuned = run_job(case, True, url, host, out / f"{seed}-tuned.log")
    finally:
        for timer in timers:
            timer.cancel()
        if standin is not None:
            standin.stop()
        if silent is not None:
            silent.stop()
    problems = []
    if tuned["rc"] is None:
        problems.append(f"hang: still running after {BOUND_S:.0f} s")
    elif tuned["rc"] != plain["rc"] and FLAKE in plain["text"] + tuned["text"]:
        # torch's own: gloo's rendezvous after a restart, seen under plain torchrun too.
        figures_note = f"exit codes {tuned['rc']} and torch's {plain['rc']}: {FLAKE}"
        print("    (not counted)", figures_note, flush=True)
    elif tuned["rc"] != plain["rc"]:
        problems.append(f"exit code {tuned['rc']}, torch's {plain['rc']}")
    if tuned["rc"] is not None and tuned["took"] > plain["took"] + SLACK_S:
        problems.append(f"took {tuned['took']} s, torch's {plain['took']} s")
    if tuned["left"]:
        problems.append(f"left running: {tuned['left']}")
    if tuned["shm"]:
        problems.append(f"left in /dev/shm: {tuned['shm']}")
    if plain["left"]:
        problems.append(f"(torch's own run left: {plain['left']})")
    if _listening(default_address(url, host[0])):
        problems.append("the ranks' socket still has a listener")
    served = case["num_workers"] == 1 or (case["num_workers"] > 1 and case["dataset"] == "map")
    served = served and "per_rank" not in case  # mixed ranks: some are refused by design
    # Found in the text, not by line: two ranks' prints can share one line of the job's
    # output (seed 5009 under torch alone: "reached=Nonerank 3 ... done:").
    done = _DONE.findall(tuned["text"])
    plain_done = _DONE.findall(plain["text"])
    # Where a rank fails, torchrun's teardown races the other ranks' ends: not compared.
    failing = case["action"] in ("raise", "exit", "sigkill") or case.get("fault", "none") != "none"
    if not failing and len(done) != len(plain_done):
        problems.append(f"{len(done)} rank(s) finished, {len(plain_done)} under torch alone")
    if served and any("reached=False" in line for line in done):
        problems.append(f"a rank never reached the host agent: {done}")
    figures = {
        "plain": (plain["rc"], plain["took"], plain["linger"]),
        "tuned": (tuned["rc"], tuned["took"], tuned["linger"]),
    }
    return not problems, problems, figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--replay", type=int, default=None)
    parser.add_argument("--mixed", action="store_true", help="ranks that differ (generate_mixed)")
    args = parser.parse_args()
    out = ROOT / "var" / "rank-hunt"
    out.mkdir(parents=True, exist_ok=True)
    tally = {"cases": 0, "ok": 0, "fail": 0, "found": []}
    seeds = [args.replay] if args.replay is not None else [args.seed + k for k in range(args.cases)]
    for seed in seeds:
        case = (generate_mixed if args.mixed else generate)(random.Random(seed))
        ok, problems, figures = run_case(case, seed, out)
        tally["cases"] += 1
        tally["ok" if ok else "fail"] += 1
        print(f"seed {seed}: {'ok' if ok else 'FAIL'} {figures} {json.dumps(case)}", flush=True)
        if not ok:
            tally["found"].append({"seed": seed, "problems": problems, "case": case})
            print("   ", "\n    ".join(problems), flush=True)
        (ROOT / "var" / "hunt-ranks.json").write_text(json.dumps(tally, indent=1) + "\n")
    print(json.dumps({k: v for k, v in tally.items() if k != "found"}))


if __name__ == "__main__":
    main()
