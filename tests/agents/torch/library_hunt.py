"""A library hunter: training scripts over the data libraries DLRM teams use
(``library_script.py``: webdataset, HuggingFace datasets, mosaicml-streaming, litdata), each
run with torch's DataLoader and with ours (under ``intune-run``, or ``agents.torch.DataLoader``
directly where the script builds the loader), must end alike (exit_hunt's comparison: exit
status, exception types and alarm lines of stderr, nothing left running, the exit at most
``exit_hunt.SLACK_S`` slower, no hang) and give the same batches, errors and warnings: in
order where torch's order is its own every run, as a multiset otherwise. Under ``intune-run``
with a stand-in control plane up, allocations are published while the script trains (1 to 3
workers each, every ``RESIZE_S``): the loader tuned must apply them and never hang.

Generated cases (library x workers x persistent x shuffle x an early break x a failing row x
the ending x the control plane)::

    nice -n 10 .venv/bin/python -m tests.agents.torch.library_hunt --cases 30 [--seed N | --replay N]
    [--libs webdataset,hf_map] [--site DIR]  # DIR: mosaicml-streaming's own dependencies

Each run's output in ``var/library-hunt/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import sys
import threading
from collections import Counter
from pathlib import Path

from tests.agents.torch import exit_hunt

ROOT = exit_hunt.ROOT
SCRIPT = Path(__file__).with_name("library_script.py")
OUT = ROOT / "var" / "library-hunt"
LIBS = {  # the hunter's name: the module it needs
    "webdataset": "webdataset",
    "wds_loader": "webdataset",
    "hf_map": "datasets",
    "hf_batched": "datasets",
    "hf_iter": "datasets",
    "mosaic": "streaming",
    "litdata": "litdata",
}
# The script builds torch's DataLoader itself: agents.torch.DataLoader can stand in directly.
DIRECT = {"webdataset", "hf_map", "hf_batched", "hf_iter"}
ITERABLE = {"webdataset", "wds_loader", "hf_iter", "mosaic"}  # litdata's is an IterableDataset too
ENDS = ["return", "return", "raise", "sigint", "sigint_group", "sigterm", "sys_exit"]
RESIZE_S = 0.4
_STAGES = re.compile(r"tuning DataLoader #\d+ \([^,]+, stages ([^)]*)\)")
_APPLIED = re.compile(r"applied allocation version (\d+)")


def generate(rng: random.Random, libs: list[str]) -> dict:
    """One script over one library."""
    lib = rng.choice(libs)
    epochs = rng.choice([1, 2, 3])
    planes = ["down", "up", "up"] + (["direct"] if lib in DIRECT else [])
    case = {
        "lib": lib,
        "num_workers": rng.choice([0, 1, 1, 2, 3]),
        "persistent": rng.random() < 0.5,
        "shuffle": rng.random() < 0.5,
        "epochs": epochs,
        "seed": rng.randrange(100),
        "bad": rng.choice([-1, -1, rng.randrange(48)]),
        "brk": [rng.randrange(epochs), rng.randrange(1, 12)] if rng.random() < 0.3 else None,
        "end": rng.choice(ENDS),
        "plane": rng.choice(planes),
    }
    case["at"] = None if case["end"] == "return" else [epochs - 1, rng.randrange(1, 10)]
    if case["plane"] == "up":
        case["item_s"] = 0.05  # epochs long enough for a few resizes
        case["epochs"] = max(2, epochs)
    return case


def records(path: Path) -> list[list]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except OSError:
        return []


def _by_epoch(recs: list[list], kind: str) -> dict[int, list]:
    out: dict[int, list] = {}
    for rec in recs:
        if rec[0] == kind:
            out.setdefault(rec[1], []).append(rec[2:])
    return out


def compare_records(
    case: dict, torch_recs: list, ours: list, torch_again: list | None
) -> list[str]:
    """What ours gave that torch's did not: batches (in order if torch's own order repeats,
    else as a multiset of rows), errors and warnings."""
    problems = []
    ordered = torch_again is None or torch_again == torch_recs
    theirs_b, ours_b = _by_epoch(torch_recs, "batch"), _by_epoch(ours, "batch")
    for epoch in sorted(set(theirs_b) | set(ours_b)):
        a, b = theirs_b.get(epoch, []), ours_b.get(epoch, [])
        if ordered and a != b:
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            problems.append(
                f"epoch {epoch}: batch {first} {b[first : first + 2]}, torch's {a[first : first + 2]} "
                f"({len(b)} batches, torch's {len(a)})"
            )
        elif not ordered:
            rows_a = Counter(r for batch in a for r in batch[0])
            rows_b = Counter(r for batch in b for r in batch[0])
            if rows_a != rows_b:
                problems.append(
                    f"epoch {epoch}: rows {sorted((rows_b - rows_a).elements())} more, "
                    f"{sorted((rows_a - rows_b).elements())} fewer than torch's"
                )
    for kind in ("error", "warning", "break"):
        a = Counter(json.dumps(r) for r in torch_recs if r[0] == kind and not _gc_warning(r))
        b = Counter(json.dumps(r) for r in ours if r[0] == kind and not _gc_warning(r))
        if a != b:
            problems.append(f"{kind}s {sorted(b.elements())}, torch's {sorted(a.elements())}")
    return problems


def _gc_warning(rec: list) -> bool:
    """A ResourceWarning of a file the library left open (webdataset's shard that an error
    in the user's transform abandoned): it comes when the collector runs, in whichever
    ``next()`` or thread that is (torch's num_workers=0 loop or ours' reader), not when the
    loader does something."""
    return rec[0] == "warning" and rec[2] == "ResourceWarning"


class Resizer:
    """Publishes allocations to a stand-in host while its script trains, once the script's
    log names the stages tuned."""

    def __init__(self, planes: exit_hunt.Planes, host_id: int, log: Path) -> None:
        self.planes, self.host_id, self.log = planes, host_id, log
        self.stop = threading.Event()
        self.published = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        stages = None
        k = 0
        while not self.stop.wait(RESIZE_S):
            if stages is None:
                try:
                    found = _STAGES.search(self.log.read_text(errors="replace"))
                except OSError:
                    continue
                if found is None:
                    continue
                stages = found.group(1).split(", ")
            k += 1
            # An IterableDataset's readers keep num_workers (1 here: with more its loader is
            # torch's), which the agent refuses to change: they stay at 1.
            workers = {
                s: 1 if "read" in s.split("+") else 1 + (k + i) % 3 for i, s in enumerate(stages)
            }
            self.planes.standin.publish(self.host_id, workers)
            self.published += 1

    def close(self) -> int:
        self.stop.set()
        self.thread.join(5)
        return self.published


def run_case(
    case: dict, seed: int, planes: exit_hunt.Planes, out: Path, site: str | None
) -> list[str]:
    """torch's run, ours, and torch's again when ours differs (is torch's order its own?)."""
    data = out / f"data-{case['lib']}"
    case = {
        **case,
        "data": str(data),
        "records": str(out / f"{seed}"),
        "site": site if case["lib"] == "mosaic" else None,
    }
    plane = None
    host = None
    if case["plane"] == "up":
        host = planes.standin.add_host([])
        plane = {
            "INTUNE_URL": planes.standin.url, "INTUNE_HOST_ID": str(host.id),
            "INTUNE_AGENT_TOKEN": host.token,
        }  # fmt: skip
    elif case["plane"] == "down":
        plane = planes.env("down", [])
    torch_log, ours_log = out / f"{seed}-torch.log", out / f"{seed}-ours.log"
    for _attempt in range(2):  # the timing compared again once, on a loaded machine
        torch_run = exit_hunt.run_script(case, "torch", plane, torch_log, script=SCRIPT)
        resizer = Resizer(planes, host.id, ours_log) if host is not None else None
        ours = exit_hunt.run_script(case, "ours", plane, ours_log, script=SCRIPT)
        published = resizer.close() if resizer is not None else 0
        problems = exit_hunt.compare(case, torch_run, ours)
        if not (problems and all(p.startswith("exit took") for p in problems)):
            break
    torch_recs = records(out / f"{seed}-torch.jsonl")
    ours_recs = records(out / f"{seed}-ours.jsonl")
    found = compare_records(case, torch_recs, ours_recs, None)
    if found:  # torch's own order may differ run to run: then rows as a multiset
        again = exit_hunt.run_script(
            case, "torch", plane, out / f"{seed}-torch2.log", script=SCRIPT
        )
        torch_again = records(out / f"{seed}-torch.jsonl")
        if again["rc"] == torch_run["rc"]:
            found = compare_records(case, torch_recs, ours_recs, torch_again)
    problems += found
    iterable = case["lib"] in ITERABLE or case["lib"] == "litdata"
    applied = _APPLIED.findall(ours_log.read_text(errors="replace"))
    tuned = "intune-run: tuning DataLoader" in ours_log.read_text(errors="replace")
    if published and tuned and not any(int(v) > 1 for v in applied) and not iterable:
        problems.append(f"{published} allocations published, none applied")
    print(
        f"seed {seed}: {case['lib']:<10} w={case['num_workers']} p={int(case['persistent'])} "
        f"s={int(case['shuffle'])} e={case['epochs']} bad={case['bad']} brk={case['brk']} "
        f"{case['end']}@{case['at']} {case['plane']:<6} rc {torch_run['rc']}/{ours['rc']} exit "
        f"{torch_run['exit_s']}/{ours['exit_s']} s tuned={int(tuned)} resized={len(applied)} "
        f" {'; '.join(problems) or 'ok'}",
        flush=True,
    )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=int, default=None)
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--site", default=None, help="mosaicml-streaming's dependencies")
    args = parser.parse_args()
    if args.site:
        sys.path.insert(0, args.site)
    libs = [lib for lib in args.libs.split(",") if importlib.util.find_spec(LIBS[lib])]
    if args.site:
        sys.path.remove(args.site)
    OUT.mkdir(parents=True, exist_ok=True)
    from tests.agents.torch import library_script

    for lib in libs:
        if not (OUT / f"data-{lib}").exists():
            if lib == "mosaic" and args.site:
                sys.path.insert(0, args.site)
            library_script.prepare(lib, str(OUT / f"data-{lib}"))
    planes = exit_hunt.Planes()
    failed = []
    try:
        seeds = (
            [args.replay] if args.replay is not None else range(args.seed, args.seed + args.cases)
        )
        for seed in seeds:
            case = generate(random.Random(seed), libs)
            if run_case(case, seed, planes, OUT, args.site):
                failed.append(seed)
    finally:
        planes.close()
    print(f"{len(failed)} of {len(seeds)} differ: {failed}")


if __name__ == "__main__":
    main()
