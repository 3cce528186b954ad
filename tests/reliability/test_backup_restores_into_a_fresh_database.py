"""The README's backup and restore (dumpdata, then migrate and loaddata into an empty database)
brings back every job, host, allocation, sample, person and token, and the restored control
plane accepts the agents' existing tokens."""

import json
import subprocess
import sys

import pytest

from tests.support.live_stack import ROOT

from .conftest import register
from .pipelines import STAGES

pytestmark = pytest.mark.slow

COUNT = """
import json
from django.apps import apps
print(json.dumps({m._meta.label: m.objects.count() for m in apps.get_models()
                  if m._meta.app_label in ("jobs", "ingestion", "tuning", "auth", "authtoken")}))
"""


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_backup_restores_everything_into_a_fresh_database(fault_stack, tmp_path):
    stack = fault_stack
    host = register(stack)
    sample = {
        "seq": 1, "ts": 1.7e9, "host": {"cpus": 4.0, "cpu_percent": 10.0, "memory_used_mb": 1.0,
                                         "memory_limit_mb": 8192.0},
        "trainer": {"throughput": 1.0, "idle_fraction": 0.1},
        "stages": [{"name": s, "workers": 1, "items_per_s": 1.0, "busy_fraction": 0.5} for s in STAGES],
    }  # fmt: skip
    with stack.client() as agent:
        headers = {"Authorization": f"Agent {host.token}"}
        for seq in range(1, 11):
            agent.post(
                f"/api/v1/hosts/{host.host_id}/metrics/",
                headers=headers,
                json={"samples": [sample | {"seq": seq, "ts": 1.7e9 + seq}]},
            ).raise_for_status()
    with stack.client(host.api_token) as api:
        api.put(
            f"/api/v1/hosts/{host.host_id}/override/",
            json={"workers": {"s0": 2, "s1": 1, "s2": 1}, "reason": "backup test"},
        ).raise_for_status()

    backup = tmp_path / "backup.json.gz"
    stack.manage("dumpdata", "--natural-foreign", "--exclude", "contenttypes", "--exclude",
                 "auth.permission", "-o", str(backup))  # fmt: skip
    before = json.loads(stack.manage("shell", "-c", COUNT).strip().splitlines()[-1])

    fresh = stack.env | {"DATABASE_URL": f"sqlite:///{tmp_path / 'restored.sqlite3'}"}
    manage(fresh, "migrate", "--noinput")
    manage(fresh, "loaddata", str(backup))
    after = json.loads(manage(fresh, "shell", "-c", COUNT).strip().splitlines()[-1])
    assert after == before
    assert before["ingestion.HostSample"] >= 10 and before["jobs.Allocation"] >= 2

    # The restored database knows the agent's token (by its hash) and the person's API token.
    check = (
        "from webapp.jobs.models import Host, hash_agent_token; "
        "from rest_framework.authtoken.models import Token; "
        f"h = Host.objects.get(pk={host.host_id}); "
        f"print(h.token_matches('{host.token}'), Token.objects.filter(key='{host.api_token}').exists(), "
        "h.allocations.order_by('-version').first().workers)"
    )
    assert manage(fresh, "shell", "-c", check).strip().splitlines()[-1] == (
        "True True {'s0': 2, 's1': 1, 's2': 1}"
    )
    print(
        f"restored {sum(after.values())} rows of {len(after)} models from {backup.stat().st_size} bytes"
    )
