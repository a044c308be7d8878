"""Issue 25, item 7: the package's structure as docs/architecture.md draws it, checked on the source.

- No module imports a private name (`_x`) of another module.
- No import cycle between modules (imports inside functions included; `if TYPE_CHECKING:` blocks are not
  imports at run time and are left out). The search registry reaches its plug-ins, xrl's RL searches among
  them, through entry points declared in pyproject.toml, never by naming a module above it.
- Every import runs down the layers (or stays within one): a lower layer never imports a higher one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "xrl"

# Bottom to top; packages on one line form one layer (they may import each other, without cycles).
LAYERS = [
    {"xrl", "errors", "limits", "quiet", "atomic", "stats", "cache"},
    {"ir"},
    {"frontends", "rewrite", "features"},
    {"cost", "nn"},
    {"env"},
    {"search"},
    {"rl", "distributed"},
    {"policies", "serve", "sweeps"},
    {"api", "options", "deploy"},
    {"cli", "__main__"},
]
LEVEL = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# Upward imports on purpose, each with its reason (and a comment at the import saying so)
UPWARD: dict[tuple[str, str], str] = {}  # none: keep it so (higher layers register in tables lower ones read)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import of an xrl module, TYPE_CHECKING blocks left out."""
    out: list[tuple[str, list[str], int]] = []
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                if module.split(".")[0] == "xrl":
                    out.append((module, [a.name for a in child.names], child.lineno))
            elif isinstance(child, ast.Import):
                out.extend((a.name, [], child.lineno) for a in child.names if a.name.split(".")[0] == "xrl")
            walk(child)

    walk(ast.parse(path.read_text()))
    return out


@functools.cache
def edges() -> dict[str, set[str]]:
    """module -> the xrl modules it imports (`from xrl.a import b`, with xrl.a.b a module, goes to xrl.a.b)."""
    out: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, names, _ in imports(path):
            for n in names or [""]:
                target = f"{module}.{n}" if f"{module}.{n}" in MODULES else module
                if target in MODULES and target != name and not target.startswith(name + "."):
                    targets.add(target)  # a package importing its own submodules is how it re-exports them
        out[name] = targets
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "xrl"


def test_no_module_imports_a_private_name_of_another():
    private = [f"{name}:{line} imports {module}.{n}" for name, path in MODULES.items()
               for module, names, line in imports(path) for n in names
               if n.startswith("_") and not n.startswith("__") and f"{module}.{n}" not in MODULES]
    assert private == []


def test_no_import_cycles():
    graph, index, low, stack, on_stack, cycles = edges(), {}, {}, [], set(), []

    def strongly_connected(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongly_connected(w)
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongly_connected(v)
    assert cycles == []


def test_every_package_has_a_layer():
    assert {layer(m) for m in MODULES} <= set(LEVEL)


@pytest.mark.parametrize("package", sorted({layer(m) for m in MODULES}))
def test_imports_run_down_the_layers(package: str):
    upward = [f"{m} imports {t}" for m, targets in edges().items() if layer(m) == package
              for t in sorted(targets) if LEVEL[layer(t)] > LEVEL[package] and (m, t) not in UPWARD]
    assert upward == []
