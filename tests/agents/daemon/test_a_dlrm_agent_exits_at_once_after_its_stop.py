"""``intune-agent --pipeline dlrm`` exits as soon as its stop is done on SIGTERM: its last batch
of samples is sent, its workers and their shared memory are gone, and then the process ends
without spending seconds tearing down the interpreter that torch and the model filled.

Before the fix (``agents.__main__.leave``) the process went on for 0.4 to 1.6 s after its agent
had stopped (2 cores shared with other work; 0.3 to 0.4 s of CPU) in the interpreter's last
garbage collections; a training host that restarts and pre-empts its agents waited on that every
time. This test failed then on the CPU spent after the stop (0.32, 0.37, 0.43 s against 0.15 s).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from agents.dlrm.schema import STAGE_NAMES
from agents.pipeline.shm import SHM_DIR

ROOT = Path(__file__).parents[3]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# CPU seconds the agent's process (its threads, not its workers) may spend between logging
# that its agent has stopped and its end: the pipeline's stop and leaving. The interpreter's
# teardown alone spent 0.3 s and more of CPU; CPU time, unlike wall time, does not grow when
# other processes share the cores.
TAIL_CPU_S = 0.15
# Wall time from that line to the end: the pipeline's stop has a bound of its own (its workers'
# 2 s, and about a second); a hang would be far past this. 0.07 s on 2 quiet cores.
TAIL_WALL_S = 4.0


def _state_and_cpu(pid: int) -> tuple[str, float]:
    """The process's state (``Z`` once it has exited, not yet reaped) and the CPU seconds its
    threads have used (not its children's: the worker processes' run would count)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # state, utime + stime


def _shared_files_of(pids: set[int]) -> list[str]:
    """The pipeline files in shared memory made by these processes (``intune-<pipeline>-<pid>-
    <n>``; other tests' and agents' pipelines on this host have files there too)."""
    return [
        path
        for path in glob.glob(f"{SHM_DIR}/intune-*-*-*")
        if Path(path).name.split("-")[2].isdigit() and int(Path(path).name.split("-")[2]) in pids
    ]


def test_a_dlrm_agent_sends_its_last_samples_and_exits_at_once_on_sigterm(
    control_plane, tmp_path, wait_for
):
    host = control_plane.add_host(list(STAGE_NAMES))
    # --no-train: the trainer's step in progress, which the agent lets end, would count in the
    # CPU measured after the stop; the teardown was as slow without it (torch, the pipeline).
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents", "--url", control_plane.url, "--host-id", str(host.id),
         "--token", host.token, "--pipeline", "dlrm", "--no-train", "--state-dir",
         str(tmp_path), "--interval", "0.2", "--batch-seconds", "0.5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines: list[str] = []
    stopped = threading.Event()
    marks: dict[str, float] = {}

    def read() -> None:
        for line in agent.stdout:
            lines.append(line)
            if "agent stopped" in line and not stopped.is_set():
                marks["wall"] = time.monotonic()
                marks["cpu"] = _state_and_cpu(agent.pid)[1]  # it is not reaped before this
                stopped.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(host.samples) >= 5, timeout=60, what="samples from the agent")
        family = psutil.Process(agent.pid).children(recursive=True)
        assert family, "the agent had started no pipeline worker to check"
        pids = {agent.pid, *(p.pid for p in family)}
        assert _shared_files_of(pids), "the agent's workers had no batch in shared memory to check"
        signalled = time.time()
        agent.send_signal(signal.SIGTERM)
        assert stopped.wait(15), "the agent did not log that it stopped:\n" + "".join(lines)
        # Seen exited but left unreaped, so its CPU time can still be read.
        deadline = time.monotonic() + 15
        while (state := _state_and_cpu(agent.pid))[0] != "Z":
            assert time.monotonic() < deadline, "the agent did not exit within 15 s of its stop"
            time.sleep(0.005)
        ended = time.monotonic()
        agent.wait(5)
    finally:
        if agent.returncode is None:
            agent.kill()
            agent.wait(10)
    reader.join(5)
    output = "".join(lines)
    assert agent.returncode == 0, output
    assert "0 samples were still buffered" in output, output
    # The last batch went out: the agent held nothing unsent, and no sample is missing between
    # the first and the last, taken in the last moments before the signal.
    seqs = sorted(host.samples)
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "a sample is missing"
    assert max(s["ts"] for s in host.samples.values()) >= signalled - 2.0
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family),
        timeout=5,
        what="the agent's worker processes to end",
    )
    assert not _shared_files_of(pids), "the pipeline left shared memory behind"
    tail_wall = ended - marks["wall"]
    assert tail_wall < TAIL_WALL_S, f"the agent exited {tail_wall:.2f} s after it had stopped"
    tail_cpu = state[1] - marks["cpu"]
    assert tail_cpu < TAIL_CPU_S, (
        f"the agent spent {tail_cpu:.2f} s of CPU after it had stopped, before it exited"
    )
