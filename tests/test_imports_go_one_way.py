"""The layers import one way: no module imports itself through others, the Django apps depend on
each other in one direction, agents/ and tuner/ stay free of the web app (docs/architecture.md).

Imports are read from the source with ``ast``, wherever they are written (a function-level import
is an import too), so a cycle cannot hide inside a function.
"""

import ast
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


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("from pkg import a\n")  # imports, is not imported
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]
