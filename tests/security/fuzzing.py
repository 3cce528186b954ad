"""Run schemathesis (its CLI, in a process of its own) against a live server's OpenAPI schema and
read back its JSON report: cases tried, failures, errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

# The checks that say "the server answered as its schema promises": no 5xx, only documented
# statuses, content types and bodies, invalid input refused, no operation open without its auth.
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "ignored_auth",
]
# A 413 (body too large) and a 414 (URL too long) refuse invalid data too.
REFUSALS = [400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 429]
ST = str(Path(sys.executable).with_name("st"))
ROOT = Path(__file__).resolve().parents[2]


def fuzz(
    url: str,
    workdir: Path,
    *,
    name: str,
    headers: dict[str, str] | None = None,
    include_path_regex: str | None = None,
    exclude_paths: list[str] = (),
    exclude_operations: list[str] = (),
    parameters: dict[str, object] | None = None,
    schema_token: str,
    phases: str = "examples,fuzzing,stateful",
    accept_valid: list[str] = (),
    max_examples: int = 25,
    workers: int = 2,
    seed: int = 7,
    timeout: float = 240,
) -> dict:
    """Fuzz the API at ``url``; returns the report's figures and the console output's tail.

    ``exclude_paths`` lists paths to leave out, ``exclude_operations`` operations
    ("DELETE /api/v1/jobs/{id}/"); ``parameters`` pins parameter values (e.g. the
    host id an agent token belongs to, so that its cases reach the handler). ``accept_valid``
    names operations ("POST /api/v1/jobs/") that must also accept every request their schema
    allows (schemathesis's positive_data_acceptance): there the schema is as strict as the
    validation. The schema is read with ``schema_token`` (it is served to people only) and
    saved, so an unauthenticated run fuzzes the same operations.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    schema = httpx.get(
        f"{url}/api/schema/",
        params={"format": "json"},
        headers={"Authorization": f"Token {schema_token}"},
    )
    schema.raise_for_status()
    schema_path = workdir / "openapi.json"
    schema_path.write_text(schema.text)
    config = [f"seed = {seed}", "request-timeout = 30", "warnings = false"]
    if parameters:
        config.append("[parameters]")
        config += [f"{key} = {json.dumps(value)}" for key, value in parameters.items()]
    # The checks are chosen here, not with --checks: the command line's list would override the
    # per-operation choice below.
    config += ["[checks]", "enabled = false"]
    config += [f"{check}.enabled = true" for check in CHECKS]
    config.append(f"negative_data_rejection.expected-statuses = {REFUSALS}")
    if accept_valid:
        config += [
            "[[operations]]",
            f"include-name = {json.dumps(list(accept_valid))}",
            "checks.positive_data_acceptance.enabled = true",
        ]
    config_path = workdir / f"{name}.toml"
    config_path.write_text("\n".join(config) + "\n")
    report = workdir / f"{name}.json"
    argv = [
        ST, "--config-file", str(config_path), "run", str(schema_path), "--url", url,
        "--phases", phases, "--max-examples", str(max_examples), "--workers", str(workers),
        "--no-color", "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    for header, value in (headers or {}).items():
        argv += ["--header", f"{header}: {value}"]
    if include_path_regex:
        argv += ["--include-path-regex", include_path_regex]
    for path in exclude_paths:
        argv += ["--exclude-path", path]
    for operation in exclude_operations:
        argv += ["--exclude-name", operation]
    # The hooks give valid job and host names a unique suffix (tests/security/fuzz_hooks.py).
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.security.fuzz_hooks", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    (workdir / f"{name}.txt").write_text(run.stdout + run.stderr)
    figures = json.loads(report.read_text()) if report.exists() else {}
    return {
        "name": name,
        "exit_code": run.returncode,
        "cases": figures.get("test_cases", {}).get("generated", 0),
        "operations": figures.get("operations", {}).get("tested", 0),
        "phases": {k: v["status"] for k, v in figures.get("phases", {}).items()},
        "failures": figures.get("failures", []),
        "errors": figures.get("errors", []),
        "output": run.stdout[-6000:] + run.stderr[-2000:],
    }
