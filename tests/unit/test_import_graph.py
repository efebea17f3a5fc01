"""The import graph: no cycles anywhere, and services never import development-only code.

Every import counts, module-level or inside a function: a lazy import still ties two rooms
together. Services are ``broker`` outside ``broker.cli``, ``broker.__main__`` and
``broker.dev``, and ``spark_jobs`` outside its demo, measure and quickstart modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "spark_jobs", "schemas")
DEV_ONLY = ("broker.dev", "broker.bench")
SPARK_ONLY = ("pyspark",)
TEST_ONLY = ("pytest", "hypothesis", "testcontainers")
NOT_SERVICES = ("broker.cli", "broker.__main__", "broker.dev", "spark_jobs.demo", "spark_jobs.measure",
                "spark_jobs.quickstart", "broker.bench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _imports(path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """Every module ``path`` imports -> the first line it does so (project modules resolved
    to the deepest one that exists; third-party modules by their full name)."""
    is_package = path.name == "__init__.py"
    own = _module_name(path)
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = own.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            while name not in modules and "." in name and name.split(".")[0] in PACKAGES:
                name = name.rsplit(".", 1)[0]
            if name != own:
                out.setdefault(name, node.lineno)
    return out


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_project() -> None:
    graph = _graph()
    # If these fail, the walker is broken and the tests below would pass vacuously.
    assert "broker.acker.service" in graph and "broker.kafka_io" in graph["broker.acker.service"]
    assert "broker.dev.kafka_local" in graph["broker.cli.development"]
    assert "pyspark.sql" in graph["spark_jobs.session"]


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_cycle() -> None:
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def _violations(forbidden: tuple[str, ...], services: tuple[str, ...]) -> list[str]:
    bad = []
    for module, imported in _graph().items():
        if not _within(module, services) or _within(module, NOT_SERVICES):
            continue
        for name, line in imported.items():
            if _within(name, forbidden):
                bad.append(f"{module}:{line} imports {name}")
    return bad


def test_services_import_no_development_only_module() -> None:
    assert _violations(DEV_ONLY, ("broker", "spark_jobs")) == []


@pytest.mark.parametrize("forbidden", [SPARK_ONLY, TEST_ONLY])
def test_broker_services_run_without_spark_and_test_packages(forbidden: tuple[str, ...]) -> None:
    """A service image installs without the ``spark`` and ``test`` extras."""
    assert _violations(forbidden, ("broker",)) == []


def test_no_two_classes_of_broker_share_a_name() -> None:
    """A class name says one thing in ``broker/``: a reader who meets ``Changelog`` knows
    which one it is."""
    where: dict[str, list[str]] = {}
    for name, path in _modules().items():
        if not name.startswith("broker"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert {n: m for n, m in where.items() if len(m) > 1} == {}


def test_every_package_is_shipped() -> None:
    """pyproject.toml lists the packages a wheel holds: a room added to ``broker/`` must be
    among them, or an installed broker cannot import it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module_name(p.parent / "__init__.py") for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")}
    assert found - listed == set()
