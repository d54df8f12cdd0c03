"""The shape of the code: no import cycle between the package's modules, no function over 100 lines in the package,
and engine options that the front doors do not name (so that adding one touches two package files).

Imports are read from the source (module level and inside functions: a lazy import that closes a cycle is still a
cycle). ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "asyncfl_jax")
MAX_FUNCTION_LINES = 100
MAX_ENGINE_FUNCTION_LINES = MAX_FUNCTION_LINES  # the earlier name (the rule covered the engine only)


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


def _long_functions(path: str, limit: int) -> list[str]:
    """``name (N lines)`` of every function or method in the file at ``path`` longer than ``limit`` lines (its
    docstring and decorators' lines included: from ``def`` to its last line)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_in_the_package_is_longer_than_100_lines():
    """Every function of ``asyncfl_jax/`` (the engine, the command line, the configuration, the data loaders, the
    reproduction modules...) fits in 100 lines: a longer one is split into named steps."""
    long = [f"{os.path.relpath(path, PACKAGE)}:{entry}" for path in sorted(_modules().values())
            for entry in _long_functions(path, MAX_FUNCTION_LINES)]
    assert long == []


def test_the_length_rule_finds_a_long_function(tmp_path):
    path = tmp_path / "long.py"
    path.write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 100 + "    return x\n")
    assert _long_functions(str(path), MAX_FUNCTION_LINES) == ["long (102 lines)"]
