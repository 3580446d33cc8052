"""The installed package's imports point one way and close no circle.

Every ``import`` of a kvscope module counts, at module level or inside a function
(a lazy import is still a dependency: it only moves when the cost is paid), except
those under ``if TYPE_CHECKING``. Layers, top to bottom: app -> profiler -> engine ->
kernels, and db below app and profiler (it may read engine's event contract, never
the other way).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

LAYERS = ("app", "profiler", "db", "engine", "kernels")
# What each layer may import besides itself.
ALLOWED = {
    "app": {"profiler", "db", "engine", "kernels"},
    "profiler": {"db", "engine", "kernels"},
    "db": {"engine"},
    "engine": {"kernels"},
    "kernels": set(),
}


def _modules() -> dict[str, Path]:
    out = {}
    for layer in LAYERS:
        spec = importlib.util.find_spec(f"kvscope.{layer}")
        (folder,) = spec.submodule_search_locations
        for path in Path(folder).rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("kvscope", layer, *parts))] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kvscope modules ``name`` imports (a name imported from a package counts as
    its submodule where there is one)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != name:
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_graph_is_read_from_every_installed_module() -> None:
    assert len(MODULES) > 150
    assert "kvscope.engine.engine" in GRAPH["kvscope.app.run_job"]
    assert "kvscope.engine.loader" in GRAPH["kvscope.engine.engine"]


def test_cycle_finder_finds_a_planted_circle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(planted) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_from_a_higher_layer(layer: str) -> None:
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if name.split(".")[1] == layer
        for target in targets
        if target.split(".")[1] not in ALLOWED[layer] | {layer}
    )
    assert not wrong
