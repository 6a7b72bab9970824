"""The gates package imports without a loop: gates/terms.py, the terms that the registry, the
spec and the verdict share, imports nothing of gates, and no chain of imports (those inside
functions included) leads from a module of gates back to itself."""

from __future__ import annotations

import ast
from pathlib import Path

import gates
from gates.metrics import MODULE_PREFIX

GATES = Path(gates.__file__).parent
MODULES = {"gates"} | {f"gates.{p.stem}" for p in GATES.glob("*.py") if p.stem != "__init__"}


def imports_of_gates(path: Path) -> set[str]:
    """The modules of gates that `path` imports anywhere in it, at its top or in a function."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path.name}: a relative import"
            # `from gates import stats` imports the module gates.stats
            named |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return named & MODULES


def import_graph() -> dict[str, set[str]]:
    """Each module of gates -> the modules of gates it imports. gates/metrics.py imports every
    metrics_* module by name as it loads, which no import statement shows: added here."""
    graph: dict[str, set[str]] = {}
    for path in GATES.glob("*.py"):
        name = "gates" if path.stem == "__init__" else f"gates.{path.stem}"
        graph[name] = imports_of_gates(path)
    graph["gates.metrics"] |= {m for m in MODULES if m.startswith(f"gates.{MODULE_PREFIX}")}
    return graph


def a_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """One chain of imports that comes back to where it started, if the graph has any."""
    done: set[str] = set()

    def visit(module: str, chain: list[str]) -> list[str] | None:
        if module in chain:
            return [*chain[chain.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*chain, module])
            if found is not None:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found is not None:
            return found
    return None


def test_the_terms_import_nothing_of_gates() -> None:
    assert imports_of_gates(GATES / "terms.py") == set()


def test_no_chain_of_imports_in_gates_comes_back_to_where_it_started() -> None:
    loop = a_loop(import_graph())
    assert loop is None, "import loop: " + " -> ".join(loop or [])


def test_the_loop_finder_finds_a_loop() -> None:
    assert a_loop({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert a_loop({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
