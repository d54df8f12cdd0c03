"""The shape of the code: no import cycle between the package's modules, and short functions in the engine.

Imports are read from the source (module level and inside functions: a lazy import that closes a cycle is still a
cycle). ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "asyncfl_jax")
MAX_ENGINE_FUNCTION_LINES = 100


def _modules() -> dict[str, str]:
    """Module name -> file path of every module of the package."""
    found = {}
    root = os.path.dirname(PACKAGE)
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package modules ``module`` imports (anywhere in its source)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in modules else base)
    return {m for m in out if m in modules and m != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycle_in_the_package():
    modules = _modules()
    # A module's own parent packages run first whatever it imports; an edge to them is not a dependency.
    graph = {m: _imports(m, p, modules) - _parents(m) for m, p in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_functions_are_short():
    engine = os.path.join(PACKAGE, "engine")
    long = []
    for name in sorted(os.listdir(engine)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(engine, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_ENGINE_FUNCTION_LINES:
                        long.append(f"{name}:{node.name} ({lines} lines)")
    assert long == []
