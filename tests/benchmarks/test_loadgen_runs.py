"""The load generator's options work against a real server: either HTTP client, in step across
processes, its own CPU reported; the long-poll memory command measures held long-polls."""

import json

import psutil
import pytest

from benchmarks import loadgen, long_poll_memory

pytestmark = pytest.mark.slow


# make test runs the default client (httpx); make soak the other too, and the memory command.
@pytest.mark.parametrize(
    "client",
    [c if c == "httpx" else pytest.param(c, marks=pytest.mark.soak) for c in loadgen.CLIENTS],
)
def test_a_few_agents_in_step_lose_nothing_with_either_client(live_stack, client):
    person = live_stack.create_user(f"load-{client}", role="operator")
    web = psutil.Process(live_stack.group.children["web"].pid)
    figures = loadgen.run(
        live_stack.url,
        person["token"],
        agents=6,
        stages=8,
        seconds=4,
        processes=0,
        batch_seconds=2,
        shape="in-step",
        long_poll_wait=2,
        client=client,
        server_processes=lambda: [web, *web.children(recursive=True)],
    )
    stored = live_stack.stored_samples(figures["job_id"])
    assert figures["errors"] == 0, figures["first_errors"]
    assert figures["long_poll_errors"] == 0, figures["first_long_poll_errors"]
    assert figures["client"] == client
    assert figures["processes"] == 2  # 6 agents: the default's least
    # 6 agents, a batch of 2 samples every 2 s for 4 s: 2 batches each at least.
    assert figures["samples_sent"] >= 6 * 2 * 2
    assert figures["samples_acknowledged"] == figures["samples_sent"] == stored
    # Batches and the long-polls that returned (each waits 2 s): more than the batches alone.
    assert figures["requests"] > figures["samples_sent"] // 2
    assert figures["generator_cpu_s"] > 0 and figures["generator_cpu_ms_per_request"] > 0
    assert figures["server_cpu_s"] > 0
    assert len(figures["load_average"]) == 3


def test_an_unknown_client_is_refused():
    with pytest.raises(ValueError, match="client must be one of"):
        loadgen.agent_client("requests", "http://127.0.0.1:1", None)


@pytest.mark.soak
def test_the_memory_command_holds_each_step_and_reports_bytes_per_long_poll(
    redis_url, tmp_path, capsys
):
    out = tmp_path / "memory.json"
    assert long_poll_memory.main(["--steps", "0,20,40", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert [row["held"] for row in figures["steps"]] == [0, 20, 40]
    # Every step's long-polls were held by the web workers at the moment their USS was read.
    assert [row["connections"] for row in figures["steps"]] == [0, 20, 40]
    assert all(row["uss_bytes"] > 0 for row in figures["steps"])
    assert figures["holder_errors"] == 0, figures["first_holder_errors"]
    assert isinstance(figures["bytes_per_held_long_poll"], int)
