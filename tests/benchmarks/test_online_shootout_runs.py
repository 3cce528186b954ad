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
    assert normal["throughput"] == max(r["throughput"] for r in normal["table"])
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
