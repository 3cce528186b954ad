"""``python -m benchmarks.online_tuning --tuners ...`` runs the whole system (web, worker, beat,
the real agent) once per tuner and writes every figure: a tiny run on the counting example
pipeline (the figures themselves are measured on DLRM, docs/benchmarks.md). Its scoring is
checked on curves with known answers, and a tuner the control plane does not know is refused
before anything starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.online_tuning import area_below, ranked, score, score_run, set_best_accepted

ROOT = Path(__file__).resolve().parents[2]


# Minutes of the whole stack twice over: in `make soak`, to keep `make test` under 15 minutes
# on 2 cores; the scoring and the refusal below run in `make test`.
@pytest.mark.soak
def test_a_tiny_shootout_of_two_tuners_writes_every_figure(tmp_path, redis_url):
    out = tmp_path / "shootout.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.online_tuning", "--tuners", "intune,static",
         "--pipeline", "agents.pipeline.examples:counting", "--seconds", "6",
         "--warmup-seconds", "0", "--seconds-per-allocation", "0.2", "--settle", "0.1",
         "--interval", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    normal = result["reference"]["normal"]
    # counting: 3 stages on this host's CPUs + 3 slots, each at least one worker.
    assert len(normal["table"]) >= 4 and normal["throughput"] > 0
    # The reference is the best mean of the fastest allocations measured again (not the
    # luckiest single window).
    confirmed = [r for r in normal["table"] if "confirmed_mean" in r]
    assert len(confirmed) == 3
    assert normal["throughput"] == max(r["confirmed_mean"] for r in confirmed)
    assert [r["tuner"] for r in result["runs"]] == ["intune", "static"]
    for run in result["runs"]:
        assert run["agent_survived"] and run["ooms"] == 0
        assert run["decisions"] >= 1 and run["allocation_changes"] >= 0
        assert run["session"]["status"] != "failed", run["session"]["error"]
        assert run["session"]["steps"] == run["decisions"]
        assert sum(1 for p in run["trajectory"] if 0 <= p["t"] < 6) >= 3
        figures = run["score"]
        assert 0 < figures["final_of_best"] < 3 and 0 < figures["mean_of_best"] < 3
        assert figures["seconds_to_95"] is None or 0 <= figures["seconds_to_95"] < 6
        assert 0 <= figures["samples_lost"] <= normal["throughput"] * 6
    static = result["runs"][1]
    assert static["allocation_changes"] == 0  # static keeps one worker per stage
    assert static["final_allocation"] == {"s0": 1, "s1": 1, "s2": 1}
    assert set(result["tuners"]) == {"intune", "static"}
    for summary in result["tuners"].values():
        assert {"final_of_best", "seconds_to_95", "samples_lost", "allocation_changes", "ooms"} <= (
            summary.keys()
        )
    assert result["ratios"]["static"] == pytest.approx(
        result["tuners"]["intune"]["final_throughput"]
        / result["tuners"]["static"]["final_throughput"]
    )
    assert result["machine"]["cpus"] >= 1 and result["seconds"] == 6
    assert "intune" in done.stdout and "static" in done.stdout  # the table on the terminal
    for run in result["runs"]:
        assert len(run["load_average"]["before"]) == 3
        assert [d["step"] for d in run["decision_log"]] == list(range(run["decisions"]))
        assert all(d["t"] is not None and -5 < d["t"] < 30 for d in run["decision_log"])
    table = out.with_suffix(".md").read_text()
    assert table.count("| intune |") == 1 and "| static | **" in table
    assert "plotly" in out.with_suffix(".html").read_text()[:2000].lower()


def test_an_unknown_tuner_is_refused_naming_the_known_ones():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.online_tuning", "--tuners", "intune,autotune"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown tuner 'autotune'" in done.stderr and "hillclimb" in done.stderr


CURVE = [{"t": float(t), "throughput": v} for t, v in enumerate([0, 50, 100, 100, 100, 100])]


def test_the_figures_of_a_curve_with_known_answers():
    assert area_below(CURVE, 100, 0, 6) == 150  # 100 lost in second 0, 50 in second 1
    figures = score(CURVE, 100, 0, 6)
    assert figures["final_of_best"] == 1.0
    # 3 s means: 0, 25, 50, 83.3, 100 -> first at 95% at t=4
    assert figures["seconds_to_95"] == 4
    assert figures["samples_lost_of_best"] == pytest.approx(150 / 600)


def test_events_are_scored_against_each_condition_best():
    trajectory = [{"t": float(t), "throughput": 100.0 if t < 4 else 40.0} for t in range(8)]
    result = {
        "seconds": 8,
        "trajectory": trajectory,
        "events": [{"t": 4.0, "condition": "one_cpu", "what": "CPUs cut to one"}],
    }
    reference = {"normal": {"throughput": 100.0}, "one_cpu": {"throughput": 50.0}}
    figures = score_run(result, reference)
    assert figures["final_of_best"] == 1.0
    assert figures["event_final_of_best"]["one_cpu"] == pytest.approx(0.8)
    assert figures["recovery_seconds"]["one_cpu"] is None  # 40 never reaches 95% of 50
    assert figures["samples_lost"] == pytest.approx(4 * 10)


def _budget_client(most_fetch: int) -> httpx.Client:
    """A control plane whose budget refuses more than ``most_fetch`` fetch threads (a 400, as
    the override API answers), and fails on any allocation with 5 decoders."""

    def handler(request: httpx.Request) -> httpx.Response:
        workers = json.loads(request.content)["workers"]
        if workers.get("decode") == 5:
            return httpx.Response(500, text="boom")
        if workers["fetch"] > most_fetch:
            return httpx.Response(400, json={"workers": [f"fetch: at most {most_fetch}"]})
        return httpx.Response(200, json={"workers": workers})

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://plane")


REFERENCE = {
    "allocation": {"fetch": 48, "decode": 1},
    "throughput": 900.0,
    "table": [
        {"allocation": {"fetch": 8, "decode": 2}, "throughput": 700.0},
        {"allocation": {"fetch": 48, "decode": 1}, "throughput": 900.0},
        {"allocation": {"fetch": 16, "decode": 1}, "throughput": 800.0},
        {"allocation": {"fetch": 2, "decode": 1}, "throughput": 300.0},
    ],
}


def test_fixed_best_runs_the_next_best_allocation_the_budget_accepts():
    assert ranked(REFERENCE)[:3] == [
        {"fetch": 48, "decode": 1}, {"fetch": 16, "decode": 1}, {"fetch": 8, "decode": 2}
    ]  # fmt: skip
    with _budget_client(most_fetch=12) as api:
        chosen, refused = set_best_accepted(
            lambda w: api.put("/override/", json={"workers": w}), ranked(REFERENCE)
        )
    assert chosen == {"fetch": 8, "decode": 2}
    assert [r["allocation"]["fetch"] for r in refused] == [48, 16]
    assert "at most 12" in refused[0]["why"]
    with _budget_client(most_fetch=64) as api:  # the best itself when it is accepted
        chosen, refused = set_best_accepted(
            lambda w: api.put("/override/", json={"workers": w}), ranked(REFERENCE)
        )
    assert chosen == {"fetch": 48, "decode": 1} and refused == []


def test_fixed_best_says_what_to_do_when_the_budget_refuses_everything():
    with _budget_client(most_fetch=1) as api, pytest.raises(RuntimeError, match="--fixed-best"):
        set_best_accepted(lambda w: api.put("/override/", json={"workers": w}), ranked(REFERENCE))
    with _budget_client(most_fetch=64) as api, pytest.raises(httpx.HTTPStatusError):
        set_best_accepted(  # other errors are not refusals: they stop the run
            lambda w: api.put("/override/", json={"workers": w}), [{"fetch": 1, "decode": 5}]
        )


def _fresh_host(measured_after: int) -> tuple[httpx.Client, list[dict]]:
    """A control plane whose budget counts every worker at a CPU slot (at most 2 fetch threads)
    until the agent's measurements arrive, at the ``measured_after``-th request; then it accepts
    anything. Returns the client and the allocations asked, in order."""
    asked: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        workers = json.loads(request.content)["workers"]
        asked.append(workers)
        if len(asked) < measured_after and workers["fetch"] > 2:
            return httpx.Response(400, json={"workers": ["fetch: at most 2 until measured"]})
        return httpx.Response(200, json={"workers": workers})

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://plane"), asked


def test_fixed_best_asks_again_while_the_agents_first_measurements_reach_the_budget():
    api, asked = _fresh_host(measured_after=3)
    with api:
        chosen, refused = set_best_accepted(
            lambda w: api.put("/override/", json={"workers": w}),
            ranked(REFERENCE),
            patience_s=1.0,
            retry_s=0.05,
        )
    assert chosen == {"fetch": 48, "decode": 1} and refused == []
    assert asked == [{"fetch": 48, "decode": 1}] * 3
    # Without patience the same control plane gives the best's place to the next best it takes.
    api, asked = _fresh_host(measured_after=3)
    with api:
        chosen, refused = set_best_accepted(
            lambda w: api.put("/override/", json={"workers": w}), ranked(REFERENCE)
        )
    assert chosen == {"fetch": 8, "decode": 2}
    assert [r["allocation"]["fetch"] for r in refused] == [48, 16]


def test_the_reference_is_the_best_confirmed_mean_not_the_luckiest_window(monkeypatch):
    # A pipeline whose second allocation had one lucky window in the sweep: measured again,
    # alternately with the others, it is slower than the first, which becomes the reference.
    from benchmarks import online_tuning

    windows = {1: iter([100.0, 101.0, 99.0]), 2: iter([150.0, 80.0, 82.0]), 3: iter([50.0])}
    order = []

    class FakePipeline:
        stage_names = ["fetch", "pack"]
        stages = []

        def start(self):
            return self

        def __iter__(self):
            return iter(())

        def apply(self, allocation):
            order.append(allocation["fetch"])

        def consumer_stats(self):
            # Called at the start of a window (ignored) and at its end (the window's figure).
            self.reads = getattr(self, "reads", 0) + 1
            if self.reads % 2:
                return {"throughput": -1.0}
            return {"throughput": next(windows[order[-1]])}

        def metrics(self):
            return []

        def stop(self):
            pass

    monkeypatch.setattr(online_tuning, "build", lambda spec, **options: FakePipeline())
    monkeypatch.setattr(online_tuning, "factory_options", lambda spec, fuse: {})
    monkeypatch.setattr(online_tuning.time, "sleep", lambda s: None)
    monkeypatch.setattr(
        "benchmarks.io_budget.candidates",
        lambda cpus: [{"fetch": n, "pack": 1} for n in (1, 2, 3)],
    )
    allocation, throughput, table = online_tuning.exhaustive(
        0, 0, "x:y", "io", confirm_top=2, confirm_rounds=2
    )
    assert allocation == {"fetch": 1, "pack": 1} and throughput == pytest.approx(100.0)
    assert order == [1, 2, 3, 2, 1, 1, 2]  # the sweep, then the two fastest alternately
    assert table[1]["confirmed"] == [80.0, 82.0] and "confirmed" not in table[2]
    assert ranked({"allocation": allocation, "table": table})[:2] == [
        {"fetch": 1, "pack": 1}, {"fetch": 2, "pack": 1}
    ]  # fmt: skip


def test_rounds_alternate_the_order_of_the_tuners():
    from benchmarks.online_tuning import run_order

    order = run_order(["intune", "prior", "static"], 3)
    assert order == [
        (0, "intune"), (0, "prior"), (0, "static"),
        (1, "static"), (1, "prior"), (1, "intune"),
        (2, "intune"), (2, "prior"), (2, "static"),
    ]  # fmt: skip
    # Over an even number of rounds every tuner runs, on average, at the same place in the order.
    places = {}
    for index, (round_, name) in enumerate(run_order(["a", "b", "c", "d"], 4)):
        places.setdefault(name, []).append(index - 4 * round_)
    assert len({sum(p) for p in places.values()}) == 1


def _run(tuner, round_, final, status="running", steps=20, **extra):
    return {
        "tuner": tuner,
        "round": round_,
        "final_allocation": {"read": 1, "parse": 2},
        "trajectory": [{"t": float(t), "throughput": final} for t in range(4)],
        "session": {
            "status": status,
            "steps": steps,
            "error": "boom" if status == "failed" else "",
        },
        "load_average": {"before": [3.5, 2, 1], "after": [7.25, 3, 1]},
        "allocation_changes": 2,
        "ooms": 0,
        "agent_survived": True,
        "score": {
            "final_throughput": final,
            "final_of_best": final / 100,
            "mean_of_best": final / 110,
            "seconds_to_95": 3.0 if final >= 95 else None,
            "samples_lost": 10.0,
            "samples_lost_of_best": 0.1,
        },
        **extra,
    }


def _figures(runs, tuners, **extra):
    from benchmarks.online_tuning import round_ratios, summarise

    return {
        "date": "2026-11-23",
        "command": "python -m benchmarks.online_tuning --rounds 2",
        "pipeline": "dlrm",
        "fuse": None,
        "rounds": 2,
        "events": False,
        "reference": {"normal": {"allocation": {"read": 1, "parse": 2}, "throughput": 100.0}},
        "runs": runs,
        "tuners": summarise(runs, tuners),
        "ratios_by_round": round_ratios(runs),
        **extra,
    }


def test_the_ratios_are_taken_round_by_round_and_the_table_shows_their_spread():
    from benchmarks.online_tuning import markdown, round_ratios

    runs = [
        _run("intune", 1, 90.0), _run("prior", 1, 100.0),
        _run("prior", 2, 80.0, status="failed", steps=3), _run("intune", 2, 96.0),
    ]  # fmt: skip
    by_round = round_ratios(runs)
    assert by_round == {"prior": [pytest.approx(0.9), pytest.approx(1.2)]}
    table = markdown(_figures(runs, ["intune", "prior"]))
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert len(rows) == 4 and all(row.count("|") == 10 for row in rows)
    prior = next(row for row in rows if row.startswith("| prior"))
    assert "**1.05 (0.90-1.20)**" in prior  # the median and the rounds' range
    assert "failed at step 3" in prior and "to the end" in prior
    assert "0.900" in prior  # final / best: the median of 1.0 and 0.8
    assert "3 (1x never)" in prior  # reached in one round of two
    assert "load average (1 min) 3.5 to 7.2" in table
    assert "best measured 100 samples/s at read 1, parse 2" in table


def test_an_override_run_and_events_have_their_own_cells():
    from benchmarks.online_tuning import markdown

    recovery = {"one_cpu": 4.0, "cotenant": None, "low_memory": 2.0}
    event_final = {"one_cpu": 0.97, "cotenant": 0.5, "low_memory": 1.1}
    runs = [
        _run("intune", 1, 97.0), _run("best-fixed", 1, 99.0, fixed_allocation={"read": 1}),
    ]  # fmt: skip
    for run in runs:
        run["score"] |= {"recovery_seconds": recovery, "event_final_of_best": event_final}
    reference = {
        "normal": {"allocation": {"read": 1, "parse": 2}, "throughput": 100.0},
        **{c: {"allocation": {"read": 1, "parse": 1}, "throughput": 50.0} for c in recovery},
    }
    table = markdown(_figures(runs, ["intune", "best-fixed"], events=True, reference=reference))
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert all(row.count("|") == 13 for row in rows)
    fixed = next(row for row in rows if row.startswith("| best-fixed"))
    assert "none (an override)" in fixed and "| 4 (0.97) | never (0.50) | 2 (1.10) |" in fixed
    assert "Bests of the conditions: one_cpu 50 at read 1, parse 1" in table


def test_the_figure_inlines_plotly_and_draws_every_run(tmp_path):
    from benchmarks.online_tuning import figure_html

    runs = [_run("intune", 1, 90.0), _run("prior", 1, 100.0)]
    runs[0]["tuner"] = "intune</script><b>"  # data cannot close the page's script
    figures = _figures(runs, ["intune</script><b>", "prior"])
    assert figure_html(figures, tmp_path / "missing.js") is None
    plotly = tmp_path / "plotly.min.js"
    plotly.write_text("window.Plotly = {newPlot() {}};")
    page = figure_html(figures, plotly)
    assert "window.Plotly = {newPlot() {}};" in page
    assert page.count("</script>") == 2 and "prior r1" in page
    data = json.loads(page.split("const figure = ")[1].split("; Plotly.newPlot")[0])
    assert [t["name"] for t in data["traces"]] == ["intune</script><b> r1", "prior r1"]
    assert data["traces"][1]["y"] == [100.0] * 4


def test_the_decisions_are_logged_with_the_second_of_the_run():
    from benchmarks.online_tuning import decision_log

    started = 1_700_000_000.0
    log = decision_log(
        [
            {"step": 2, "created_at": "2023-11-14T22:13:24.500000Z", "workers": {"read": 2},
             "action": "read+1", "info": {"explored": False, "learn_steps": 3}, "reward": 0.1},
            {"step": 1, "created_at": "2023-11-14T22:13:22+00:00", "workers": {"read": 1},
             "action": "hold", "info": {}},
        ],
        started,
    )  # fmt: skip
    assert [(d["step"], d["t"], d["action"]) for d in log] == [(1, 2.0, "hold"), (2, 4.5, "read+1")]
    assert log[1]["explored"] is False and log[0]["explored"] is None
    assert (log[1]["learn_steps"], log[1]["reward"]) == (3, 0.1) and log[0]["learn_steps"] is None


def test_with_events_each_conditions_best_is_measured_after_the_runs(monkeypatch):
    # The issue asks for the seconds back to 95% of "the new best, measured afterwards under the
    # same conditions": the tuners run first, then each condition's sweep, then the scoring.
    import argparse
    import contextlib

    from benchmarks import online_tuning

    happened = []

    def exhaustive(seconds, settle, spec, which, *, label="", memory_mb=None, **options):
        happened.append(("sweep", label.strip() or "normal", memory_mb))
        table = [{"allocation": {"s": 2}, "throughput": 100.0, "rss_mb_per_worker": {"s": 10.0}}]
        return {"s": 2}, 100.0 if not label else 50.0, table

    def online(seconds, interval, spec, tuner, *, run, events=None, **options):
        happened.append(("run", run, events))
        events_at = [] if run == "warmup" else [
            {"t": 5.0, "condition": "one_cpu", "what": ""},
            {"t": 10.0, "condition": "cotenant", "what": ""},
            {"t": 15.0, "condition": "low_memory", "what": ""},
        ]  # fmt: skip
        return {
            "tuner": tuner, "run": run, "seconds": seconds, "events": events_at,
            "trajectory": [{"t": float(t), "throughput": 100.0 if t < 5 else 50.0}
                           for t in range(int(seconds))],
            "allocation_changes": 0, "ooms": 0, "agent_survived": True, "session": None,
            "final_allocation": {"s": 2},
        }  # fmt: skip

    class Stack:
        def __init__(self, directory, beat):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            happened.append(("stack closed",))

        def create_user(self, name, role):
            return {"token": "t"}

    monkeypatch.setattr(online_tuning, "exhaustive", exhaustive)
    monkeypatch.setattr(online_tuning, "online", online)
    monkeypatch.setattr(online_tuning, "LiveStack", Stack)
    monkeypatch.setattr(online_tuning, "CoTenant", contextlib.nullcontext)
    args = argparse.Namespace(
        events=True, seconds_per_allocation=1, settle=0, pipeline="x:y", allocations="all",
        fuse=None, warmup_seconds=4, interval=1, fixed_best=False, rounds=1, tuning_seconds=20,
    )  # fmt: skip
    figures = online_tuning.shootout(args, ["intune", "static"])
    kinds = [h[0] if h[0] != "sweep" else f"sweep {h[1]}" for h in happened]
    assert kinds[:5] == ["sweep normal", "run", "run", "run", "stack closed"]
    assert [k.split(" ")[1] for k in kinds[5:]] == ["on", "beside", "within"]
    memory_mb = figures["reference"]["low_memory"]["memory_mb"]
    assert happened[2][2] == {"memory_mb": memory_mb, "memory_mb_per_worker": {"s": 10.0}}
    assert happened[-1][2] == memory_mb
    for run in figures["runs"]:
        assert run["score"]["final_of_best"] == 1.0
        # Each phase's 3 s mean reaches its condition's best (50) at its third sample.
        assert run["score"]["recovery_seconds"] == {"one_cpu": 2.0, "cotenant": 2.0,
                                                    "low_memory": 2.0}  # fmt: skip


def test_the_lowered_memory_budget_leaves_the_workers_the_reference_budget_above_the_hosts_use():
    from benchmarks.online_tuning import lowered_host_memory

    per_worker = {"read": 100.0, "parse": 250.0}
    # The host uses 5,000 MB now, 600 of them the running workers (read 1, parse 2); the workers
    # are to have 450 MB: the budget is 5,000 - 600 + 450 = 4,850 MB, below what is used.
    assert lowered_host_memory(5000.0, {"read": 1, "parse": 2}, 450.0, per_worker) == 4850.0
    # One worker each needs 350 MB: 100 MB of headroom left under the new budget.
    assert lowered_host_memory(5000.0, {"read": 1, "parse": 1}, 450.0, per_worker) == 5100.0
    assert lowered_host_memory(5000.0, {"other": 3}, 450.0, per_worker) == 5450.0
