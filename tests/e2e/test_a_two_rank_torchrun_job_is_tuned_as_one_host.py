"""A 2-rank DDP job (torchrun --nproc-per-node 2, gloo, CPU) training the DLRM model is tuned as
one host, with every part real: the web server, a Celery worker, Redis, the database, torchrun's
two training processes, their pipelines and the one host agent one of them runs.

The host is registered once with its two ranks, both ranks report through the one agent, a
tuning session decides, both ranks apply the decision, and at no sample do the ranks' workers
together exceed the host's budget.

It runs in `make test`, beside the rest of the suite on 2 cores. It once failed there (two
clean-clone CI runs, passing alone): the suite's load kept the DLRM stages' workers off the
CPUs, they read as workers that wait on I/O, and the tuner gave them more workers than the host
had slots. The stages now report their run-queue delay and the budget counts it as CPU
(agents/pipeline/schedstat.py, agents.budget.cpu_per_busy_worker). Every wait is bounded; the
whole run is bounded by the timeout below.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agents.budget import AGENT_WAITING_TOLERANCE, WorkerCpuMeter
from agents.dlrm.schema import STAGE_NAMES as DLRM_STAGES
from webapp.stack.supervisor import wait_until

# 48 to 88 s alone on this 2-core machine, 58 to 203 s beside two busy loops (load 4 to 18).
# The waits below add up to 210 s at most, and the live stack (this module's own) starts within
# the same limit. Back in `make test` after the two causes of its failures beside two busy loops
# were found: the ranks' shares moved at once, so one rank grew before the other shrank (14
# workers on 12 slots; the host agent now moves them shrink first, tests/agents/daemon/
# test_host_moves_rank_shares_shrink_first.py), and gloo's sparse all-reduce of the embedding
# gradients on its worker thread, where the ranks died in native code (SIGSEGV, SIGABRT; the DDP
# entry now averages those gradients itself, agents.dlrm.ddp.reduce_sparse_gradients).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
# A trainer idle less than this while every decision held: the trainers were the bottleneck.
TRAINER_BOUND_IDLE = 0.10
# That many decisions, every one a hold of trainers that bound, say the policy holds rightly: the
# test goes on with the override then, instead of waiting out the 60 s for a move that does not
# come (on a quiet machine it did, every time: 40 s of the test's 70).
HOLDS_ENOUGH = 5

ROOT = Path(__file__).resolve().parents[2]


def test_a_two_rank_ddp_job_is_registered_tuned_and_kept_within_the_host_budget(
    live_stack, tmp_path
):
    person = live_stack.create_user("ranks-operator", role="operator")
    job_id, host_id, agent_token = live_stack.register_job_and_host(
        person["token"],
        {
            "name": "ddp-dlrm",
            "stages": [{"name": s} for s in DLRM_STAGES],
            "tuner": "intune",
            "decision_interval_s": 2,
        },
        {"name": "ddp-host", "cpus": 2, "memory_mb": 8192, "ranks": 2},
    )
    stop_file = tmp_path / "stop"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = os.environ | {
        "INTUNE_URL": live_stack.url,
        "INTUNE_HOST_ID": str(host_id),
        "INTUNE_AGENT_TOKEN": agent_token,
        "INTUNE_RANK_SOCKET": f"@intune-e2e-{uuid.uuid4().hex}",
        "PYTHONPATH": str(ROOT),
    }
    log_path = tmp_path / "torchrun.log"
    with open(log_path, "w") as log_file:
        ranks = subprocess.Popen(
            [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "agents.dlrm.ddp",
             "--seconds", "240", "--stop-file", str(stop_file), "--batch-size", "256",
             "--rows", "8192", "--report", str(tmp_path)],
            env=env, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with live_stack.client(person["token"]) as api:

            def both_ranks_reported():
                metrics = api.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 120}
                ).json()
                return metrics if len(metrics["ranks"]) == 2 else None

            # Two ranks import torch, build their data and join gloo: slow while the suite runs.
            wait_until(both_ranks_reported, 100, interval=1, what="samples of both ranks")
            assert api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).status_code == 201

            def policy_allocation_applied():
                state = api.get(f"/api/v1/hosts/{host_id}/").json()
                allocation = state["allocation"]
                if allocation["source"] == "policy" and allocation["status"] == "applied":
                    return state
                return None

            def trainer_bound_holds(decisions) -> bool:
                idle = [d["observation"]["trainer_idle_fraction"] for d in decisions]
                holds = all(d["action"] == "hold" for d in decisions)
                return bool(decisions) and holds and max(idle) <= TRAINER_BOUND_IDLE

            def applied_or_rightly_held():
                state = policy_allocation_applied()
                if state is not None:
                    return state
                decisions = api.get(f"/api/v1/hosts/{host_id}/decisions/").json()["results"]
                if len(decisions) >= HOLDS_ENOUGH and trainer_bound_holds(decisions):
                    return {"held": decisions}
                return None

            def explain() -> str:
                return (
                    f"The host: {api.get(f'/api/v1/hosts/{host_id}/').text[:1500]}\n"
                    f"Its decisions: {api.get(f'/api/v1/hosts/{host_id}/decisions/').text[:1500]}"
                    f"\nThe tuning: {api.get(f'/api/v1/jobs/{job_id}/tuning/').text[:1000]}\n"
                    f"The ranks' log: {log_path.read_text()[-3000:]}"
                )

            held = None
            try:
                # A decision every 2 s; the Celery worker and both ranks share 2 cores.
                state = wait_until(
                    applied_or_rightly_held,
                    60,
                    interval=1,
                    what=f"a policy allocation applied, or {HOLDS_ENOUGH} holds of busy trainers",
                )
                held = state.get("held")
            except TimeoutError as exc:
                # The policy holds, rightly, where the trainers and not the pipelines are the
                # bottleneck: on a quiet machine the ranks' DLRM steps can take longer than
                # their pipelines' batches (a clean-clone CI at load 3: trainer idle 4%, every
                # queue full, ten holds). Then every decision must have been a hold of a busy
                # trainer, and an operator's override takes the decision's path to both ranks
                # instead (the same publish, split across the ranks and budget).
                held = api.get(f"/api/v1/hosts/{host_id}/decisions/").json()["results"]
                if not trainer_bound_holds(held):
                    raise AssertionError(f"{exc}. {explain()}") from exc
            if held is not None:
                idle = [d["observation"]["trainer_idle_fraction"] for d in held]
                print(f"{len(held)} holds, the trainers idle at most {max(idle):.0%}: override")
                put = api.put(
                    f"/api/v1/hosts/{host_id}/override/",
                    json={
                        "workers": dict.fromkeys(DLRM_STAGES, 1) | {"parse": 2},
                        "reason": "the trainers are the bottleneck",
                    },
                )
                assert put.status_code in (200, 201), put.text
                version = put.json()["version"]

                def override_applied():
                    state = api.get(f"/api/v1/hosts/{host_id}/").json()
                    allocation = state["allocation"]
                    applied = allocation["status"] == "applied"
                    return state if applied and allocation["version"] == version else None

                try:
                    state = wait_until(override_applied, 60, interval=1, what="the override")
                except TimeoutError as again:
                    raise AssertionError(f"{again}. {explain()}") from again
            chosen = state["allocation"]["workers"]
            assert chosen != dict.fromkeys(DLRM_STAGES, 1), "the decision changed the allocation"
            hosts = api.get(f"/api/v1/jobs/{job_id}/hosts/").json()
            assert len(hosts["results"] if isinstance(hosts, dict) else hosts) == 1
            assert state["ranks"] == 2 and state["budget"]["ranks"] == 2
            budget = state["worker_budget"]
            assert budget == 2 + 2 * len(DLRM_STAGES)

            def samples_show_both_ranks_running_it():
                stages = api.get(
                    f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 5}
                ).json()["stages"]
                return all(
                    stages[name]["workers"] and stages[name]["workers"][-1] == 2 * count
                    for name, count in chosen.items()
                )

            wait_until(
                samples_show_both_ranks_running_it, 20, interval=1, what="both ranks' workers"
            )
            metrics = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 300}
            ).json()
            # What the control plane measured each worker to cost, to say in a failure.
            measured = api.get(f"/api/v1/hosts/{host_id}/").json()["budget"]["stages"]
            # The session decides every 2 s, so stop it and take the allocation in force last:
            # a decision newer than `chosen` may have reached the ranks meanwhile.
            assert api.delete(f"/api/v1/jobs/{job_id}/tuning/").status_code == 200

            def last_allocation_applied():
                allocation = api.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]
                return allocation["workers"] if allocation["status"] == "applied" else None

            final = wait_until(
                last_allocation_applied, 30, interval=1, what="the last allocation applied"
            )
        stop_file.touch()
        assert ranks.wait(timeout=30) == 0, log_path.read_text()[-4000:]
    finally:
        if ranks.poll() is None:
            ranks.kill()
            ranks.wait(10)
    # The ranks' workers together never took more than the host's CPU slots, counted as the
    # budget counts them (agents.budget): a worker of a stage that computes takes a slot, one of
    # a stage whose workers wait the CPU it was measured to use. That measure moves: a decision
    # fits the cost measured when it was made, and the next samples may measure the stage busier
    # (two runs failed here: 14 workers decided with a waiting prefetch stage at 0.32 a worker,
    # 11.3 slots of 12, and measured computing later). So each stage counts at the least it was
    # measured to cost over the run (the samples replayed through the control plane's own
    # agents.budget.WorkerCpuMeter), with the agent's tolerance: a stage never seen waiting
    # counts a whole slot a worker, and ranks running more than they were given still fail.
    meter, cheapest = WorkerCpuMeter(), dict.fromkeys(DLRM_STAGES, 1.0)
    stage_workers = {name: metrics["stages"][name]["workers"] for name in DLRM_STAGES}
    samples = len(stage_workers[DLRM_STAGES[0]])
    host_cpu = metrics["series"]["cpu_percent"]
    for i in range(samples):
        meter.update(
            [
                {"name": name}
                | {
                    key: metrics["stages"][name][key][i] or 0
                    for key in ("workers", "busy_fraction", "cpu_percent", "runqueue_percent")
                }
                for name in DLRM_STAGES
            ],
            host_cpu[i] if len(host_cpu) == samples else None,
        )
        for name, cost in meter.worker_cpu().items():
            cheapest[name] = min(cheapest[name], cost)

    def slots(i: int) -> float:
        computing = sum(stage_workers[n][i] for n in DLRM_STAGES if cheapest[n] >= 1.0)
        waits = sum(stage_workers[n][i] * cheapest[n] for n in DLRM_STAGES if cheapest[n] < 1.0)
        return computing + waits / (1.0 + AGENT_WAITING_TOLERANCE)

    taken = [slots(i) for i in range(samples)]
    over = [
        {
            name: {
                key: metrics["stages"][name][key][i]
                for key in ("workers", "busy_fraction", "cpu_percent", "runqueue_percent")
            }
            for name in DLRM_STAGES
        }
        for i in range(samples)
        if taken[i] > budget + 1e-9
    ]
    assert taken and max(taken) <= budget + 1e-9, (
        f"the ranks' workers took {max(taken):.2f} slots of the host's {budget}: "
        f"{over[:3]}; each worker's cost at the least: {cheapest}; measured after the "
        f"decision: {measured}; decided: {chosen}"
    )
    assert metrics["slowest_rank"] in (0, 1)
    # Each rank runs its share of the host's workers: split by the ranks' measured need
    # (agents.budget.split_across_ranks), the chosen allocation each when they measure alike.
    reports = [json.loads((tmp_path / f"report-rank{r}.json").read_text()) for r in (0, 1)]
    finals = [r["final_allocation"] for r in reports]
    for name, count in final.items():
        assert finals[0][name] >= 1 and finals[1][name] >= 1, finals
        assert finals[0][name] + finals[1][name] == 2 * count, ("both ranks applied it", finals)
    shares = metrics["rank_workers"]
    assert sorted(shares) == ["0", "1"], shares
    shared = sum(
        count if cheapest[name] >= 1.0 else count * cheapest[name] / (1.0 + AGENT_WAITING_TOLERANCE)
        for share in shares.values()
        for name, count in share.items()
    )
    assert shared <= budget + 1e-9, (shares, budget, cheapest)
    assert sum(r["hosted_agent"] for r in reports) == 1, "one agent for the host"
    assert reports[0]["steps"] == reports[1]["steps"] > 0, "DDP kept the ranks in step"
