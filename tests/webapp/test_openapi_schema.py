"""The OpenAPI schema is complete (no view drf-spectacular had to guess) and names every path
other tools rely on."""

import io

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command

from tuner import TUNER_NAMES
from webapp.jobs.names import HOST_NAME, STAGE_NAME

CONTRACT_PATHS = [
    "/api/v1/auth/token/",
    "/api/v1/jobs/",
    "/api/v1/jobs/{id}/",
    "/api/v1/jobs/{job_id}/hosts/",
    "/api/v1/hosts/{host_id}/metrics/",
    "/api/v1/hosts/{host_id}/allocation/",
    "/api/v1/hosts/{host_id}/decisions/",
    "/api/v1/jobs/{job_id}/tuning/",
    "/api/v1/hosts/{host_id}/override/",
]


@pytest.fixture(scope="module")
def schema():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    return yaml.safe_load(out.getvalue())


def test_the_schema_validates_without_warnings(schema):
    assert schema["openapi"].startswith("3.")


@pytest.mark.parametrize("path", CONTRACT_PATHS)
def test_the_contract_paths_are_documented(schema, path):
    assert path in schema["paths"]


def test_the_schema_and_docs_are_served(client):
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200


def test_the_schema_states_the_rules_of_a_job(schema):
    job = schema["components"]["schemas"]["JobRequest"]
    assert set(job["required"]) == {"name", "stages"}
    stages = job["properties"]["stages"]
    assert (stages["minItems"], stages["maxItems"], stages["uniqueItems"]) == (1, 16, True)
    stage = schema["components"]["schemas"]["StageRequest"]
    assert stage["required"] == ["name"]
    assert stage["properties"]["name"]["pattern"] == STAGE_NAME
    assert schema["components"]["schemas"]["TunerEnum"]["enum"] == list(TUNER_NAMES)
    options = job["properties"]["tuning_options"]
    assert options["additionalProperties"] is False and "online_epsilon" in options["properties"]
    assert "policy" not in options["properties"], "a client must not name a file to read"


def test_the_schema_states_the_rules_of_a_host_and_of_a_metrics_batch(schema):
    host = schema["components"]["schemas"]["HostRequest"]
    assert set(host["required"]) == {"name", "cpus", "memory_mb"}
    assert host["properties"]["name"]["pattern"] == HOST_NAME
    assert host["properties"]["cpus"]["minimum"] == 0.01
    batch = schema["components"]["schemas"]["MetricsBatchRequest"]
    sample = batch["properties"]["samples"]["items"]
    assert set(sample["required"]) == {"seq", "ts", "host", "trainer", "stages"}
    stage = sample["properties"]["stages"]["items"]
    assert stage["properties"]["busy_fraction"] == {
        "type": "number",
        "minimum": 0.0,
        "maximum": 1.0,
    }
    poll = schema["paths"]["/api/v1/hosts/{host_id}/allocation/"]["get"]["parameters"]
    wait = next(p for p in poll if p["name"] == "wait")["schema"]
    assert (wait["minimum"], wait["maximum"]) == (0, settings.INTUNE["LONG_POLL_MAX_WAIT_S"])
