"""Print the import circles among the project's own packages (engine/, ui/, viz/); exit 1 if there is one.

Every `import` and `from … import` counts, those under `if TYPE_CHECKING:` and inside functions too: a circle a
reader must follow is a circle, whether Python meets it at start-up or not.

    python scripts/import_circles.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "ui", "viz")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports (`from ui import views` names ui.views; `import ui.views` too)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module_name(path):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted.

    A package's `__init__` that re-exports its modules is not a circle with them (importing `engine.x` runs
    `engine/__init__` first anyway), so edges from a module to its own package are left out."""
    edges = {m: {n for n in targets if not m.startswith(n + ".")} for m, targets in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


if __name__ == "__main__":
    found = circles(graph())
    for component in found:
        print(" ↔ ".join(component))
    sys.exit(1 if found else 0)
