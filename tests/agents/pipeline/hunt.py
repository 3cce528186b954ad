"""A hang hunter: generated pipelines under generated sequences of what a training host does
to them, each case in a forked child under a hard bound, stacks dumped on a hang.

What it combines that the stress suites do not: SIGSTOP then SIGCONT of a worker or of the
launcher, bursts of resizes, relayouts, SIGKILLs of workers and of the launcher, a stop()
from another thread, a consumer that leaves early, all in one sequence.

    nice -n 5 .venv/bin/python -m tests.agents.pipeline.hunt --cases 50 [--seed N]

Each case runs in a child forked from this driver; the child dumps every thread's stack
(``faulthandler``) and exits if it passes ``CASE_BOUND_S``; the driver then prints each of
the child's processes' kernel wait channels. A case that fails is printed with the seed that
reproduces it (``--replay SEED``). The tally goes to ``var/hunt-pipeline.json``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from agents.pipeline import (
    LayoutBusy,
    Pipeline,
    PipelineStopped,
    Stage,
    StageFailed,
    shm,
)

CASE_BOUND_S = 60.0
ITEM_BOUND_S = 25.0
SIZES = [8, 1024, 70_000, 300_000, 3_000_000]
_CASE_PID = [0]  # the process running the case (a thread stage's function runs there)


def _stage_fn(name: str, size: int, behaviour: str, ms: float, raise_at: int):
    def fn(item):
        i, _ = item
        if behaviour == "raise" and i == raise_at:
            raise ValueError(f"{name} refuses item {i}")
        if behaviour == "exit" and i == raise_at and os.getpid() != _CASE_PID[0]:
            os._exit(7)  # a process worker dies on this item, every time
        if behaviour == "slow_once" and i == raise_at:
            time.sleep(2.0)
        if behaviour == "sleep":
            time.sleep(ms / 1000.0)
        elif behaviour == "spin":
            end = time.perf_counter() + ms / 1000.0
            while time.perf_counter() < end:
                pass
        return i, bytes(size)

    return fn


def generate(rng: random.Random) -> dict:
    """One case: the pipeline's shape and its operations."""
    n = rng.randint(1, 5)
    items = rng.randint(0, 120)
    stages = []
    for k in range(n):
        behaviour = rng.choice(
            ["none", "sleep", "spin", "raise", "none", "sleep", "exit", "slow_once"]
        )
        stages.append(
            {
                "name": f"s{k}",
                "kind": rng.choice(["process", "process", "thread"]),
                "size": rng.choice(SIZES),
                "behaviour": behaviour,
                "ms": rng.choice([0.0, 0.5, 2.0, 10.0]),
                "raise_at": rng.randint(0, max(items - 1, 0)) if behaviour != "none" else -1,
                "ordered": rng.random() < 0.8,
                "shm_min_bytes": rng.choice([1, 64 * 1024, 64 * 1024]),
            }
        )
    names = [s["name"] for s in stages]
    ops = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.choice(
            [
                "apply", "burst", "relayout", "kill", "stopcont", "kill_launcher",
                "stop_launcher", "consume", "consume", "sleep", "sigint_during",
            ]
        )  # fmt: skip
        if kind == "apply":
            ops.append(["apply", {rng.choice(names): rng.randint(1, 4)}])
        elif kind == "burst":
            ops.append(
                [
                    "burst",
                    [{rng.choice(names): rng.randint(1, 4)} for _ in range(rng.randint(3, 12))],
                ]
            )
        elif kind == "relayout" and n > 1:
            cuts = [rng.random() < 0.5 for _ in range(n - 1)]
            ops.append(["relayout", _groups(names, cuts)])
        elif kind in ("kill", "stopcont"):
            ops.append([kind, rng.randrange(n), rng.choice([0.05, 0.3, 1.0])])
        elif kind in ("kill_launcher", "stop_launcher"):
            ops.append([kind, rng.choice([0.05, 0.3, 1.5])])
        elif kind == "consume":
            ops.append(["consume", rng.randint(0, 30)])
        elif kind == "sigint_during":
            what = rng.choice(["burst", "relayout", "consume"])
            ops.append(["sigint_during", what, rng.choice([0.0, 0.005, 0.02, 0.1])])
        else:
            ops.append(["sleep", rng.choice([0.01, 0.1, 0.5])])
    end = rng.choice(["all", "all", "all", "leave", "stop_thread", "stop_thread_now"])
    layout = None
    if n > 1 and rng.random() < 0.4:
        layout = _groups(names, [rng.random() < 0.5 for _ in range(n - 1)])
    return {
        "stages": stages,
        "items": items,
        "queue_size": rng.randint(1, 8),
        "layout": layout,
        "ops": ops,
        "end": end,
        "max_item_retries": 2
        if any(s["behaviour"] == "exit" for s in stages)
        else rng.choice([2, 50]),
    }


def _groups(names: list[str], cuts: list[bool]) -> list[str]:
    groups, current = [], [names[0]]
    for name, cut in zip(names[1:], cuts, strict=True):
        if cut:
            groups.append("+".join(current))
            current = []
        current.append(name)
    return [*groups, "+".join(current)]


def _in_layout(pipeline: Pipeline, allocation: dict[str, int]) -> dict[str, int]:
    group_of = {unit: group for group in pipeline.stage_names for unit in group.split("+")}
    result: dict[str, int] = {}
    for unit, count in allocation.items():
        group = group_of.get(unit, unit)
        result[group] = max(result.get(group, 1), count)
    return result


def _workers(pipeline: Pipeline, stage: int) -> list:
    pools = list(pipeline._pools)
    if not pools:
        return []
    pools = [pools[stage % len(pools)], *(p for run in pipeline._draining for p in run)]
    return [w for pool in pools for w in pool.active + pool.retiring if w.pid and not w.ended]


def _later(seconds: float, fn, *args) -> None:
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()


def _signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def run_case(case: dict, log: list) -> None:
    """Run one case in this process; raise on a wrong result (a hang is the bound's)."""
    _CASE_PID[0] = os.getpid()
    stages = [
        Stage(
            s["name"],
            _stage_fn(s["name"], s["size"], s["behaviour"], s["ms"], s["raise_at"]),
            kind=s["kind"],
            ordered=s["ordered"],
            max_workers=4,
            shm_min_bytes=s["shm_min_bytes"],
        )
        for s in case["stages"]
    ]
    items = case["items"]
    pipeline = Pipeline(
        lambda: ((i, b"x") for i in range(items)),
        stages,
        queue_size=case["queue_size"],
        name="hunt",
        layout=case["layout"],
        max_item_retries=case["max_item_retries"],
        item_timeout_s=ITEM_BOUND_S,
    )
    pipeline.start()
    received: list[int] = []
    error: list[BaseException] = []
    iterator = iter(pipeline)
    done = False
    stopped_by_thread = False

    def take(count: int) -> None:
        nonlocal done
        for _ in range(count):
            if done:
                return
            try:
                item = next(iterator)
            except StopIteration:
                done = True
                return
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001
                error.append(exc)
                done = True
                return
            received.append(item[0])

    for op in case["ops"]:
        log.append(op[0])
        kind = op[0]
        if kind == "apply":
            pipeline.apply(_in_layout(pipeline, op[1]))
        elif kind == "burst":
            for allocation in op[1]:
                pipeline.apply(_in_layout(pipeline, allocation))
        elif kind == "relayout":
            try:
                pipeline.relayout(op[1], timeout_s=1.0)
            except LayoutBusy:
                pass
        elif kind == "kill":
            workers = _workers(pipeline, op[1])
            if workers:
                random.choice(workers).signal(signal.SIGKILL)
        elif kind == "stopcont":
            workers = _workers(pipeline, op[1])
            if workers:
                w = random.choice(workers)
                _signal_pid(w.pid, signal.SIGSTOP)
                _later(op[2], _signal_pid, w.pid, signal.SIGCONT)
        elif kind == "kill_launcher":
            if pipeline._zygote is not None:
                _signal_pid(pipeline._zygote.pid, signal.SIGKILL)
        elif kind == "stop_launcher":
            if pipeline._zygote is not None:
                pid = pipeline._zygote.pid
                _signal_pid(pid, signal.SIGSTOP)
                _later(op[1], _signal_pid, pid, signal.SIGCONT)
        elif kind == "consume":
            take(op[1])
        elif kind == "sleep":
            time.sleep(op[1])
        elif kind == "sigint_during":
            # Ctrl-C lands in an operation: the pipeline must stay whole.
            try:
                _later(op[2], _signal_pid, os.getpid(), signal.SIGINT)
                if op[1] == "burst":
                    for count in (4, 1, 3, 1, 4, 2):
                        pipeline.apply({pipeline.stage_names[0]: count})
                elif op[1] == "relayout" and len(stages) > 1:
                    for groups in (None, "+".join(s.name for s in stages), None):
                        try:
                            pipeline.relayout(groups, timeout_s=0.3)
                        except LayoutBusy:
                            pass
                else:
                    take(5)
                time.sleep(0.2)
            except KeyboardInterrupt:
                log.append("interrupted")
    end = case["end"]
    if end in ("stop_thread", "stop_thread_now"):
        stopped_by_thread = True
        _later(0.0 if end == "stop_thread_now" else 0.2, pipeline.stop)
        take(items + 1)
        began = time.monotonic()
        pipeline.stop()
        log.append(f"stop {time.monotonic() - began:.2f}s")
    elif end == "leave":
        pipeline.stop()
    else:
        take(items + 1)
        began = time.monotonic()
        pipeline.stop()
        log.append(f"stop {time.monotonic() - began:.2f}s")
    time.sleep(0.3)  # the launcher sweeps after it leaves
    left = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(pipeline._prefix)]
    assert not left, f"shared-memory files left: {left}"
    # Every item once; in order when every stage is ordered.
    assert len(received) == len(set(received)), f"an item came twice: {received}"
    ordered = all(s["ordered"] for s in case["stages"])
    if ordered:
        assert received == list(range(len(received))), f"out of order: {received}"
    if end == "leave":
        return
    raises = [s["raise_at"] for s in case["stages"] if s["behaviour"] == "raise"]
    if stopped_by_thread:
        if error:
            assert isinstance(error[0], (PipelineStopped, StageFailed)), repr(error[0])
        return
    exits = [s["raise_at"] for s in case["stages"] if s["behaviour"] == "exit"]
    if exits and min(exits) < items:
        # A process worker dies on that item every time (a thread stage's does not): its
        # failure, or every item where the stage ran in this process.
        if error:
            assert isinstance(error[0], StageFailed), repr(error[0])
            return
    if raises and min(raises) < items:
        assert error and isinstance(error[0], StageFailed), f"expected StageFailed: {error!r}"
        if ordered:
            assert received == list(range(min(raises))), received
        return
    assert not error, f"unexpected error: {''.join(traceback.format_exception(error[0]))}"
    assert sorted(received) == list(range(items)), (
        f"{items - len(set(received))} item(s) lost: got {len(received)} of {items}"
    )


def wchans(pid: int) -> str:
    """The kernel wait channel of ``pid``'s threads and of its children's, for a hang's report."""
    lines = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/wchan") as f:
                    wchan = f.read()
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{p}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                lines.append(f"pid {p} tid {tid} {comm} {state} {wchan}")
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return "\n".join(lines)


def run_forked(fn, arg, bound_s: float, log_path: Path) -> tuple[str, float, str]:
    """Run ``fn(arg, log)`` in a forked child: ("ok" | "fail" | "hang", seconds, report)."""
    read_fd, write_fd = os.pipe()
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            with open(log_path, "w") as out:
                faulthandler.dump_traceback_later(bound_s, exit=True, file=out)
                log: list = []
                try:
                    fn(arg, log)
                    message = "ok " + " ".join(map(str, log))
                except BaseException:  # noqa: BLE001
                    code = 3
                    message = " ".join(map(str, log)) + "\n" + traceback.format_exc()
                faulthandler.cancel_dump_traceback_later()
            os.write(write_fd, message.encode()[-60000:])
        finally:
            os._exit(code)
    os.close(write_fd)
    report = b""
    status = None
    deadline = began + bound_s + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > began + bound_s - 1 and status is None:
            pass
        time.sleep(0.05)
    else:
        kernel = wchans(pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "hang", time.monotonic() - began, kernel + "\n" + log_path.read_text()[-20000:]
    took = time.monotonic() - began
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        report += chunk
    os.close(read_fd)
    code = os.waitstatus_to_exitcode(status)
    text = report.decode(errors="replace")
    if code == 0:
        return "ok", took, text
    if code == 1 and not text:  # faulthandler's exit: the bound passed
        return "hang", took, log_path.read_text()[-20000:]
    return "fail", took, text + log_path.read_text()[-5000:]


def hunt(generate, run_case, bound_s: float, name: str) -> None:
    """The hunters' command line: ``--cases N`` generated cases from ``--seed S`` (or
    ``--replay SEED``), each run forked under ``bound_s``; every case that failed or hung is
    printed with its report, and the tally is kept in ``var/hunt-{name}.json``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--replay", type=int, default=None)
    args = parser.parse_args()
    out = Path(__file__).resolve().parents[3] / "var"
    out.mkdir(exist_ok=True)
    tally = {"cases": 0, "ok": 0, "fail": 0, "hang": 0, "longest_s": 0.0, "found": []}
    seeds = [args.replay] if args.replay is not None else [args.seed + k for k in range(args.cases)]
    for seed in seeds:
        case = generate(random.Random(seed))
        outcome, took, report = run_forked(
            run_case, case, bound_s, out / f"hunt-{name}-case-{os.getpid()}.log"
        )
        tally["cases"] += 1
        tally[outcome] += 1
        tally["longest_s"] = max(tally["longest_s"], round(took, 2))
        print(
            f"seed {seed}: {outcome} in {took:.1f}s",
            report.splitlines()[0][:200] if outcome == "ok" and report else "",
            flush=True,
        )
        if outcome != "ok":
            tally["found"].append({"seed": seed, "outcome": outcome, "case": case})
            print(json.dumps(case), "\n", report[-8000:], flush=True)
        (out / f"hunt-{name}.json").write_text(json.dumps(tally, indent=1) + "\n")
    print(json.dumps({k: v for k, v in tally.items() if k != "found"}))


def main() -> None:
    hunt(generate, run_case, CASE_BOUND_S, "pipeline")


if __name__ == "__main__":
    sys.exit(main())
