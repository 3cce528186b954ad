"""``tuner.finetune`` and the other names the package exports are what ``tuner.control`` defines,
whichever module was imported first.

The package loads ``tuner.control`` lazily (so a web process does not import torch). A submodule
with the same name as an exported function shadowed the function once the worker had imported
``tuner.control`` at its start: ``tuner.finetune`` was the module ``tuner/finetune.py`` and the
twin-pretraining step failed with "'module' object is not callable". Each order is run in a fresh
interpreter, because an import cannot be undone in this one.
"""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tuner

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import importlib, json, sys, types
for first in sys.argv[1:]:
    importlib.import_module(first)
import tuner
print(json.dumps({name: isinstance(getattr(tuner, name), types.ModuleType) for name in tuner.__all__}))
"""


def test_no_submodule_is_named_like_an_exported_name():
    submodules = {info.name for info in pkgutil.iter_modules(tuner.__path__)}
    assert not submodules & set(tuner.__all__)


# The two orders that differ: the package's names looked up first, and tuner.control imported
# first (as a Celery worker does at its start).
@pytest.mark.parametrize("first", [[], ["tuner.control"]])
def test_every_exported_name_is_a_function_or_class_not_a_module(first):
    result = subprocess.run(
        [sys.executable, "-c", CHECK, *first], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    is_module = json.loads(result.stdout)
    assert set(is_module) == set(tuner.__all__)
    assert not [name for name, module in is_module.items() if module]
