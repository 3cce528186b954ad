"""The wheel installed alone (no extra) into a fresh venv is a working agent: ``intune-agent``
runs a pipeline and streams it to a control plane, and neither Django nor torch (nor fsspec)
came with it (nor pyarrow).

Trainer images are built by teams that accept no web stack in them (README, "Installing").
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.standin_control_plane import StandinControlPlane
from webapp.stack.supervisor import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What only the control plane or the DLRM workload needs.
NOT_FOR_AGENTS = ["django", "rest_framework", "celery", "gunicorn", "psycopg", "redis", "torch"]
NOT_FOR_AGENTS += ["uvicorn", "uvicorn_worker", "httptools", "uvloop", "orjson"]  # the web server
NOT_FOR_AGENTS += ["fsspec", "s3fs", "botocore", "moto"]  # object stores: the s3 extra
NOT_FOR_AGENTS += ["pyarrow"]  # Parquet data: the parquet extra


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed without extras; its dependencies from the index
    (or pip's cache) as a trainer host would get them."""
    work = tmp_path_factory.mktemp("agent-install")
    built = subprocess.run(
        [ROOT / "scripts" / "build-wheel", work / "dist"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheel = built.stdout.strip()
    venv = work / "venv"
    # Without pip of its own, installed into by this pip (pip --python runs itself under the
    # venv's interpreter), without byte-compiling what it installs (Python compiles what is
    # imported). The venv with its own pip (ensurepip) took 15 s and the install by that pip,
    # compiling every file, 25 s at load 11 to 14; 0.1 s and 6 s this way. The same packages.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
         "--no-compile", "--disable-pip-version-check", wheel],
        env=clean_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    yield venv
    shutil.rmtree(work, ignore_errors=True)


def clean_env() -> dict:
    """This environment without what would let the venv import the repository's copy."""
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")
    }


def in_venv(venv: Path, *argv, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([venv / "bin" / argv[0], *argv[1:]], cwd=venv, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_neither_django_nor_torch_is_installed(agent_venv):
    for module in NOT_FOR_AGENTS:
        result = in_venv(agent_venv, "python", "-c", f"import {module}")
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, module
    where = in_venv(agent_venv, "python", "-c", "import agents; print(agents.__file__)")
    assert where.stdout.startswith(str(agent_venv)), "the agent must come from the wheel"


def test_intune_agent_help_runs(agent_venv):
    result = in_venv(agent_venv, "intune-agent", "--help")
    assert result.returncode == 0, result.stderr
    assert "--pipeline" in result.stdout and "--url" in result.stdout


def test_the_dlrm_pipeline_asks_for_its_extra(agent_venv):
    result = in_venv(agent_venv, "intune-agent", "--pipeline", "dlrm", "--url", "http://127.0.0.1:9",
                     "--host-id", "1", "--token", "ia_x", "--seconds", "1")  # fmt: skip
    assert result.returncode != 0
    assert "pip install 'intune[dlrm]'" in result.stderr


def test_a_pipeline_streams_to_the_stand_in_and_applies_its_allocation(agent_venv):
    wanted = {"s0": 1, "s1": 2, "s2": 1}
    with StandinControlPlane() as plane:
        host = plane.add_host(list(wanted))
        version = plane.publish(host.id, wanted, source="policy")

        def applied_and_measured() -> bool:
            with plane.changed:
                samples = list(host.samples.values())
                reported = any(s.get("applied_version") == version for s in host.statuses)
            measured = [{st["name"]: st["workers"] for st in s["stages"]} for s in samples]
            flowing = any(st["items_per_s"] > 0 for s in samples for st in s["stages"])
            return reported and wanted in measured and flowing

        agent = subprocess.Popen(
            [agent_venv / "bin" / "intune-agent", "--pipeline", "agents.pipeline.examples:counting",
             "--url", plane.url, "--host-id", str(host.id), "--token", host.token,
             "--interval", "0.2", "--batch-seconds", "0.5", "--seconds", "60"],
            cwd=agent_venv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            wait_until(
                applied_and_measured,
                timeout=60,
                what="the agent's samples under the published allocation, and its report",
            )
        finally:
            agent.terminate()
            output = agent.communicate(timeout=30)[0]
        assert agent.returncode == 0, output


def test_intune_run_ships_its_hook_and_leaves_a_process_without_torch_alone(agent_venv):
    assert "--loader" in in_venv(agent_venv, "intune-run", "--help").stdout
    probe = "import sys; print('agents.autorun' in sys.modules, 'torch' in sys.modules)"
    result = in_venv(agent_venv, "intune-run", "--url", "http://127.0.0.1:9", "--host-id", "1",
                     "--token", "ia_x", "--", str(agent_venv / "bin" / "python"), "-c", probe)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The wheel's sitecustomize ran (its hook waits for torch), and torch was not imported.
    assert result.stdout.split() == ["True", "False"], result.stdout + result.stderr
