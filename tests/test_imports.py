"""The package's modules import each other without a cycle.

Every import counts, wherever it stands (module level, inside a function,
under TYPE_CHECKING): a function-level import that closes a cycle works
today only because of the order modules happen to load in.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Optional, Set

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxlake"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, pathlib.Path]:
    """The package's modules by name: its Python files and the compiled
    modules its stubs (.pyi) describe."""
    found = {module_name(p): p for p in PACKAGE.rglob("*.pyi")}
    found.update({module_name(p): p for p in PACKAGE.rglob("*.py")})
    return found


def imports(name: str, path: pathlib.Path,
            known: Set[str]) -> Set[str]:
    """The package's modules that module `name` imports. `from P import X`
    is an import of P.X when that is a module, else of P."""
    if path.suffix == ".pyi":
        return set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of `graph` (its modules in order, the first repeated at
    the end), or None when it is acyclic."""
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def import_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {name: imports(name, path, set(known))
            for name, path in known.items()}


def test_the_graph_sees_imports_of_every_form() -> None:
    graph = import_graph()
    # module level, `from package import module`
    assert "jaxlake._src.bench.replay" in graph["jaxlake._src.bench.suite"]
    # the compiled module, through its stub, imported inside a function
    assert "jaxlake._core" in graph["jaxlake._src.bench.replay"]
    # `from package import name`: an import of the package
    assert "jaxlake._src.errors" in graph["jaxlake"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == \
        ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
