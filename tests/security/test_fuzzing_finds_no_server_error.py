"""Property-based fuzzing of the whole API from its own OpenAPI schema (schemathesis), without
credentials, as an operator and as an agent: no 5xx, no answer outside the schema, no invalid
input accepted, no operation open without its credentials; and where the schema can say all the
rules (registering a job or a host), every request it allows is accepted."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import live_plane
from .fuzzing import fuzz

pytestmark = pytest.mark.slow

AGENT_PATHS = r"^/api/v1/hosts/\{host_id\}/(metrics|allocation)/$"
# The schema allows what the server does: an allocation long-poll's wait up to this limit. At
# the default (60 s) every generated long-poll could hold a minute.
SHORT_POLLS = {"INTUNE_LONG_POLL_MAX_WAIT_S": "2"}


def run_all(plane, workdir, max_examples: int, seed: int) -> list[dict]:
    url = plane.stack.url
    common = {"schema_token": plane.viewer, "max_examples": max_examples, "seed": seed}

    def with_credentials() -> list[dict]:
        # In turn: the operator's stateful phase deletes the jobs and hosts it finds, the
        # agent's host among them.
        return [
            # Revoking the token mid-run would turn the rest into 401s: revocation has its own
            # test.
            fuzz(url, workdir, name="operator",
                 headers={"Authorization": f"Token {plane.operator}"},
                 exclude_paths=["/api/v1/auth/token/"], **common),
            fuzz(url, workdir, name="agent",
                 headers={"Authorization": f"Agent {plane.agent_token}"},
                 include_path_regex=AGENT_PATHS, parameters={"host_id": plane.host_id}, **common),
        ]  # fmt: skip

    # The anonymous run changes nothing (every answer is a 401): it runs beside the others.
    with ThreadPoolExecutor(2) as pool:
        anonymous = pool.submit(fuzz, url, workdir, name="anonymous", **common)
        others = with_credentials()
        return [anonymous.result(), *others]


def assert_clean(runs: list[dict]) -> None:
    for run in runs:
        assert run["cases"] > 0 and run["operations"] > 0, run["output"]
        assert not run["failures"] and not run["errors"], f"{run['name']}:\n{run['output']}"
        assert run["exit_code"] == 0, run["output"]
    print({run["name"]: f"{run['cases']} cases on {run['operations']} operations" for run in runs})


@pytest.fixture(scope="module")
def plane(tmp_path_factory, redis_url):
    """One stack for the module's runs, each of which leaves it answering as before: the
    coverage phase first (it deletes nothing the others use), then the stateful fuzzing, which
    deletes the jobs and hosts it finds."""
    with live_plane(tmp_path_factory.mktemp("fuzzed"), SHORT_POLLS) as plane:
        yield plane


@pytest.fixture(scope="module")
def covered(plane):
    """The stack with a job without hosts (id, job_id) for the operations on one."""
    with plane.stack.client(plane.operator) as api:
        job_id = api.get(f"/api/v1/hosts/{plane.host_id}/").json()["job"]
        hostless = api.post(
            "/api/v1/jobs/", json={"name": "hostless", "stages": [{"name": "read"}]}
        ).json()["id"]
    return plane, {"id": hostless, "job_id": job_id, "host_id": plane.host_id}


def test_the_coverage_phase_finds_no_error_and_a_schema_as_strict_as_the_validation(
    covered, tmp_path
):
    """schemathesis's coverage phase: each field's boundaries and each rule of the schema broken
    one at a time, deterministically (about 3,500 requests)."""
    plane, ids = covered
    url = plane.stack.url
    # One worker: with two, hypothesis (6.170, on CPython 3.11) now and then fails inside itself
    # ("Runtime Error: AST constructor recursion depth mismatch": two threads describe a lambda
    # with Python's ast module at once). That is an error of the tool, not a finding; one worker
    # never meets it and runs the same cases.
    common = {"schema_token": plane.viewer, "phases": "coverage", "workers": 1}
    # The three runs at once, each its own process (the coverage phase deletes nothing the
    # others use: DELETE of the job is left out below, and a job with hosts keeps its stages).
    with ThreadPoolExecutor(3) as pool:
        runs = [
            pool.submit(fuzz, url, tmp_path, name="coverage-anonymous", **common),
            pool.submit(fuzz, url, tmp_path, name="coverage-operator",
             headers={"Authorization": f"Token {plane.operator}"},
             exclude_paths=["/api/v1/auth/token/"],
             # Deleting the job the other cases work on would turn them into 404s.
             exclude_operations=["DELETE /api/v1/jobs/{id}/"], parameters=ids,
             # What else refuses a valid-looking request depends on stored data: the stages of
             # a job with hosts, the hosts of another job, an override's stage names.
             accept_valid=["POST /api/v1/jobs/", "POST /api/v1/jobs/{job_id}/hosts/"], **common),
            pool.submit(fuzz, url, tmp_path, name="coverage-agent",
                 headers={"Authorization": f"Agent {plane.agent_token}"},
                 include_path_regex=AGENT_PATHS, parameters={"host_id": plane.host_id}, **common),
        ]  # fmt: skip
        runs = [run.result() for run in runs]
    assert_clean(runs)
    assert all(run["phases"]["coverage"] == "success" for run in runs), runs


# make test runs the coverage phase (each boundary and rule, deterministic); the random and
# stateful phases run here, a few hundred requests, and by the thousand below, under make soak.
@pytest.mark.soak
def test_the_api_survives_a_few_hundred_fuzzed_requests(plane, tmp_path):
    assert_clean(run_all(plane, tmp_path, max_examples=8, seed=11))


@pytest.mark.soak
def test_the_api_survives_thousands_of_fuzzed_requests(plane, tmp_path):
    assert_clean(run_all(plane, tmp_path, max_examples=100, seed=12))
