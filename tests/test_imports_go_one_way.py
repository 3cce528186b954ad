"""The layers import one way: no module imports itself through others, the Django apps depend on
each other in one direction, agents/ and tuner/ stay free of the web app (docs/architecture.md).

Imports are read from the source with ``ast``, wherever they are written (a function-level import
is an import too), so a cycle cannot hide inside a function.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGES = ("agents", "tuner", "webapp")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """Each import of ``module`` as (the module named, the names taken from it): ``import a.b``
    is ``("a.b", [])``, ``from .c import d`` in ``pkg.m`` is ``("pkg.c", ["d"])``."""
    depth = len(module.split(".")) + (path.name == "__init__.py")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")[: depth - node.level] if node.level else []
            named = ".".join(base + ([node.module] if node.module else []))
            found.append((named, [alias.name for alias in node.names]))
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports. ``from pkg import submodule`` depends on
    the submodule, not on ``pkg``; a module's own ancestor packages, which Python initialises
    first whatever the module says, are not counted."""
    modules = module_names(root, packages)
    graph = {}
    for module, path in modules.items():
        deps = set()
        for named, taken in imported_names(module, path):
            submodules = {f"{named}.{name}" for name in taken} & set(modules)
            deps |= submodules
            if named in modules and len(submodules) < len(taken) or not taken:
                deps.add(named)
        graph[module] = {
            dep for dep in deps & set(modules) if dep != module and not module.startswith(dep + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def app_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Django app -> the apps its modules import (an app is a folder of webapp/ with apps.py)."""
    apps = {p.parent.name for p in (ROOT / "webapp").glob("*/apps.py")}

    def app_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "webapp" and parts[1] in apps else None

    edges: dict[str, set[str]] = {app: set() for app in apps}
    for module, deps in graph.items():
        source = app_of(module)
        for dep in deps:
            target = app_of(dep)
            if source and target and target != source:
                edges[source].add(target)
    return edges


def external_imports(package: str) -> dict[str, set[str]]:
    """Module of ``package`` -> the top-level names it imports."""
    return {
        module: {named.split(".")[0] for named, _ in imported_names(module, path)}
        for module, path in module_names(ROOT, (package,)).items()
    }


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph(ROOT, RUNTIME_PACKAGES)) == []


def test_the_django_apps_depend_on_each_other_one_way():
    apps = app_graph(import_graph(ROOT, ("webapp",)))
    assert cycles(apps) == [], apps
    # The order the data flows in: jobs at the bottom, the dashboard reads everything.
    assert apps["jobs"] == set()
    assert apps["ingestion"] <= {"jobs"}
    assert apps["tuning"] <= {"jobs", "ingestion"}


def test_agents_import_neither_django_nor_the_web_app_nor_the_tuner():
    for module, names in external_imports("agents").items():
        assert not names & {"django", "rest_framework", "celery", "webapp", "tuner"}, module


def test_the_tuner_imports_neither_django_nor_the_web_app():
    for module, names in external_imports("tuner").items():
        assert not names & {"django", "rest_framework", "celery", "webapp"}, module


def test_runtime_code_imports_no_benchmark_or_test():
    for package in RUNTIME_PACKAGES:
        for module, names in external_imports(package).items():
            assert not names & {"benchmarks", "tests"}, module


# What a web process and a management command import before their first request or command: the
# gunicorn settings, the worker class and the ASGI app; the Celery app with its tasks (the web
# app sends them); Django set up (as ``manage.py shell`` and ``intune_user`` are).
SERVICE_IMPORTS = r"""
import importlib.util, json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
spec = importlib.util.spec_from_file_location("gunicorn_conf", "webapp/gunicorn_conf.py")
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import webapp.stack.web_worker
import webapp.asgi
from webapp import celery_app
celery_app.loader.import_default_modules()
import tuner
tuner.TUNER_NAMES, tuner.DEFAULT_POLICY, tuner.Observation
# A job's tuner and options are checked as the API checks them (its validate(), without the
# database): the options a tuner takes, and those it refuses.
from rest_framework.exceptions import ValidationError
from webapp.jobs.api.serializers import JobSerializer
job = {"stages": [{"name": "read"}, {"name": "parse"}], "tuner": "intune",
       "tuning_options": {"online_epsilon": 0.1}}
JobSerializer().validate(job)
try:
    JobSerializer().validate({**job, "tuner": "lp"})
    raise AssertionError("lp took online_epsilon")
except ValidationError as exc:
    assert "takes no options" in str(exc.detail), exc.detail
before_worker = sorted(m for m in sys.modules if m == "torch" or m.startswith("tuner"))
from celery.signals import worker_init
worker_init.send(sender=None)
print(json.dumps([before_worker, "torch" in sys.modules]))
"""


def test_a_web_process_and_a_command_start_without_importing_torch_and_a_worker_with_it():
    """torch is a second and a half of CPU to import on the CI's cores; only a tuning step needs
    it (tuner.make_tuner, dumps, loads import it on first use), not a web process's start nor
    the check of a job it is sent (it made the tuner, loading torch and the shipped policy). A
    Celery worker imports it as it starts, so that no tuning step imports it mid-transaction."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="webapp.settings")
    done = subprocess.run(
        [sys.executable, "-c", SERVICE_IMPORTS], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported, worker_imported_torch = json.loads(done.stdout.strip().splitlines()[-1])
    assert "tuner" in imported  # the web app did import the tuner package, only not torch
    assert "torch" not in imported, imported
    assert "tuner.control" not in imported, imported
    assert worker_imported_torch


def test_a_tuner_name_that_needs_torch_imports_it_on_first_use():
    code = (
        "import sys, tuner; before = 'torch' in sys.modules; tuner.make_tuner; "
        "print(before, 'torch' in sys.modules, tuner.make_tuner is tuner.control.make_tuner)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("from pkg import a\n")  # imports, is not imported
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]
