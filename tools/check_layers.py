#!/usr/bin/env python3
"""The house's import rules, checked: no import cycle, and no import from a lower floor to a higher one.

    python tools/check_layers.py            # checks src/txl against LAYERS below; exit status 1 on a problem
    python tools/check_layers.py ROOT --layers "top > middle,other > bottom" --forbid other_package
    python tools/check_layers.py recipes --name txl_recipes --layers "classify,datasets,export,plot,serve,summarize" --forbid txl_studies

Every import counts, those inside functions included (they run too), and so do
``importlib.import_module("a.b")`` and ``__import__("a.b")`` with a literal name, and ``from pkg import
NAME`` of a name the package's ``__init__`` loads lazily (its ``_LAZY`` dict: name -> module). A
module's floor is the first
part of its name below the package: ``txl/model/attention.py`` is on ``model``, ``txl/runtime.py`` on
``runtime``. A module on no listed floor is a problem as well: a new subpackage must be given its place
here (docs/architecture.md). The recipes (``txl_recipes``) and the studies (``txl_studies``) sit above
the whole library, the studies above the recipes: a library module that imports either, or a recipe that
imports a study, is a problem too (``--forbid``). ``.ci/run`` runs this before the tests;
tests/test_layers.py runs it too.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# top > ... > bottom; a floor may import its own and any floor below it, never one above
LAYERS = ("cli,__main__ > analysis > evaluation,training,generation,classification,convert > segments > model,data"
          " > kernels > config,runtime,fileio,errors,distributed")
FORBIDDEN = "txl_recipes,txl_studies"  # packages above the library, which it must never import


def package_modules(root: Path, name: str | None = None) -> dict[str, Path]:
    """Every module of the package at ``root``, imported as ``name`` (default: the folder's name), by dotted
    name (``txl.model.attention``; a package by its folder's name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([name or root.name, *parts])] = path
    return found


def lazy_names(root: Path) -> dict[str, str]:
    """The names the package's ``__init__`` at ``root`` loads on first use: its module-level dict
    ``_LAZY`` of name -> module (``{}`` without one)."""
    init = root / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8"), str(init)).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal module name of ``importlib.import_module("a.b")``, ``import_module("a.b")`` or
    ``__import__("a.b")``; None for anything else."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return node.args[0].value if called in ("import_module", "__import__") else None


def import_targets(name: str, path: Path, lazy: dict[str, str] | None = None) -> list[str]:
    """Every name module ``name`` (file ``path``) imports, relative imports resolved; ``from a.b import c``
    gives both ``a.b`` and ``a.b.c``; ``from pkg import NAME`` of a name in ``lazy`` (the package's
    :func:`lazy_names`) gives the module that defines it too."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = name.split(".")[0]
    targets: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets += [base] + [f"{base}.{alias.name}" for alias in node.names]
            if base == package and lazy:
                targets += [lazy[alias.name] for alias in node.names if alias.name in lazy]
        elif (dynamic := _dynamic_import(node)) is not None:
            targets.append(dynamic)
    return targets


def imported(name: str, path: Path, known: set[str], lazy: dict[str, str] | None = None) -> set[str]:
    """The package's modules that module ``name`` (file ``path``) imports, relative imports resolved;
    ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``; ``lazy``: as
    in :func:`import_targets`."""
    edges = set()
    for target in import_targets(name, path, lazy):
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):  # a package's __init__ is no edge
            edges.add(target)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def problems(root: Path, layers: str, forbidden: str = "", name: str | None = None) -> tuple[list[str], int, int]:
    """Every cycle, upward import, module on no floor of the package at ``root`` and import of a package
    named in ``forbidden`` (comma-separated), one line each; with the numbers of modules and of imports
    between them. ``name``: the package's import name, as in :func:`package_modules`."""
    modules = package_modules(root, name)
    banned = {name.strip() for name in forbidden.split(",") if name.strip()}
    lazy = lazy_names(root)
    graph = {name: imported(name, path, set(modules), lazy) for name, path in modules.items()}
    rank = {floor.strip(): i for i, level in enumerate(layers.split(">")) for floor in level.split(",") if floor.strip()}

    def floor_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None  # the package's own __init__ sits above every floor

    found = ["cycle: " + " <-> ".join(c) for c in cycles(graph)]
    for module, path in sorted(modules.items()):
        outside = {t for t in import_targets(module, path) if t.split(".")[0] in banned}
        for target in sorted(t for t in outside if not any(t.startswith(o + ".") for o in outside)):
            found.append(f"outward: {module} -> {target} (the package never imports {target.split('.')[0]})")
    for module in sorted(graph):
        floor = floor_of(module)
        if floor is not None and floor not in rank:
            found.append(f"no floor: {module} ({floor!r} is not in the layers; give it its place in LAYERS)")
            continue
        for dep in sorted(graph[module]):
            dep_floor = floor_of(dep)
            if floor is not None and dep_floor in rank and rank[dep_floor] < rank[floor]:
                found.append(f"upward: {module} -> {dep} ({floor} imports {dep_floor}, a higher floor)")
    return found, len(modules), sum(map(len, graph.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(ROOT / "src" / "txl"), help="the package's folder")
    parser.add_argument("--layers", default=LAYERS, help="top > ... > bottom; the floors of one level by commas")
    parser.add_argument("--forbid", default=FORBIDDEN, help="packages it must never import, by commas")
    parser.add_argument("--name", help="the package's import name (default: its folder's name)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not (root / "__init__.py").is_file():
        print(f"check_layers: {root} is not a package folder (no __init__.py)", file=sys.stderr)
        return 2
    found, n_modules, n_imports = problems(root, args.layers, args.forbid, args.name)
    for line in found:
        print(line)
    print(f"{n_modules} modules, {n_imports} imports between them: "
          f"{'no cycle, no upward or outward import, every module on a floor' if not found else f'{len(found)} problem(s)'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
