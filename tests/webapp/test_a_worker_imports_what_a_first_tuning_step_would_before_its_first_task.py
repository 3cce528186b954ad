"""A Celery worker imports, as it starts, what the first tuning step would otherwise import inside
its 30 s soft time limit: torch, the tuner, and what torch's first optimizer pulls in
(``torch._dynamo``, some 800 modules). The killed-worker test's fresh worker once passed its
limit importing them at load 14."""

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
from webapp.celery import import_the_tuner_before_the_first_task
before = set(sys.modules)
import_the_tuner_before_the_first_task()
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith(("torch", "tuner")))))
"""


def test_the_workers_start_imports_the_tuner_and_the_optimizers_lazy_modules():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "tuner.control" in imported
    assert "torch._dynamo" in imported  # what the first Adam of a step would import
