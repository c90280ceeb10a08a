#!/usr/bin/env python3
"""Check that the modules of ``scripts/`` import each other without a cycle.

    python scripts/check_imports.py            # exit status 1 on an import-time cycle
    python scripts/check_imports.py --strict   # deferred imports (inside functions) count too
    python scripts/check_imports.py -v         # also print every edge
    python scripts/check_imports.py --needs bench_torch   # the files a module needs, one a line

The modules: every ``scripts/*.py`` and every module of a package folder under ``scripts/``
(one with an ``__init__.py``: ``export/``, ``attention_bundles/``, ``parity/``, ``bench/``,
``reference/``), named as they are imported with ``scripts/`` on ``sys.path`` (``export_models``,
``export.common``, ``reference.mid_blocks``).
Their imports are read with ``ast`` (nothing is imported or run): ``import a.b``, ``from a import
b`` (the module ``a.b`` where it is one, else ``a``) and relative imports (``from .ldm import x``);
importing a package's submodule from outside the package also imports the package's
``__init__``. Imports of anything outside ``scripts/`` are ignored.

An import at module level (also under ``if`` / ``try`` / a class body) runs when the module is
imported: a cycle of those is an error (a module would see the other half-initialized). An
import inside a function runs only when it is called (a *deferred* import, used to break a
cycle on purpose): cycles through one are listed as notes, and are errors with ``--strict``.

``--needs MODULE`` prints, instead, the file (relative to ``scripts/``) of every local module that
``MODULE`` imports, directly or through others, deferred imports included, and its own: what a copy
of ``scripts/`` must hold for it to run (``scripts/gpu_kit.sh build --dry-run`` checks the kit's).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


def local_modules(root: Path) -> dict:
    """Module name -> file, for ``root/*.py`` and the packages directly under ``root``."""
    mods = {p.stem: p for p in sorted(root.glob("*.py"))}
    for init in sorted(root.glob("*/__init__.py")):
        pkg = init.parent.name
        mods[pkg] = init
        for p in sorted(init.parent.glob("*.py")):
            if p.name != "__init__.py":
                mods[f"{pkg}.{p.stem}"] = p
    return mods


def _walk_imports(tree: ast.AST):
    """Yield ``(node, deferred)`` for every Import / ImportFrom; deferred: inside a function."""
    stack = [(tree, False)]
    while stack:
        node, deferred = stack.pop()
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, deferred
            stack.append((child, inner))


def _package_of(name: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    if path.name == "__init__.py":
        return name
    return name.rpartition(".")[0]


def imports_of(name: str, path: Path, mods: dict):
    """``(target module, deferred, line)`` for each import of a local module by ``name``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node, deferred in _walk_imports(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                pkg = _package_of(name, path)
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = ".".join(p for p in (pkg, base) if p)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for t in targets:
            # "import a.b.c": the longest local prefix
            parts = t.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            if not parts:
                continue
            target = ".".join(parts)
            out.append((target, deferred, node.lineno))
            # a submodule imported from outside its package runs the package's __init__ first
            pkg = target.rpartition(".")[0]
            if pkg and pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                out.append((pkg, deferred, node.lineno))
    return out


def cycles(graph: dict) -> list:
    """The strongly connected components with a cycle (Tarjan), each as a sorted list."""
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    sys.setrecursionlimit(max(1000, 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph: dict, comp: list) -> list:
    """A shortest cycle through the component's first module (breadth-first), as a path."""
    start, members = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]  # start ... v start
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def needed(every: dict, start: str) -> list:
    """``start`` and every module it reaches in the import graph ``every``, sorted."""
    seen, todo = {start}, [start]
    while todo:
        for w in every.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return sorted(seen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strict", action="store_true", help="a cycle through a deferred import is an error too")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every edge")
    ap.add_argument("--needs", metavar="MODULE", help="print the files MODULE needs (itself included) and stop")
    args = ap.parse_args(argv)
    mods = local_modules(SCRIPTS)
    if args.needs is not None and args.needs not in mods:
        ap.error(f"--needs {args.needs}: no such module under scripts/")
    eager, every, where = {m: set() for m in mods}, {m: set() for m in mods}, {}
    for name, path in mods.items():
        for target, deferred, line in imports_of(name, path, mods):
            if target == name:
                continue
            every[name].add(target)
            if not deferred:
                eager[name].add(target)
            at = f"{path.relative_to(SCRIPTS)}:{line}" + (" (deferred)" if deferred else "")
            if at not in where.setdefault((name, target), []):
                where[(name, target)].append(at)
    if args.needs is not None:
        for m in needed(every, args.needs):
            print(mods[m].relative_to(SCRIPTS))
        return 0
    if args.verbose:
        for (a, b), at in sorted(where.items()):
            print(f"{a} -> {b}  [{', '.join(at)}]")
    bad = 0
    for comp in cycles(eager):
        path = one_cycle(eager, comp)
        print(f"error: import-time cycle among {', '.join(comp)}: {' -> '.join(path)}")
        bad += 1
    eager_sets = [set(c) for c in cycles(eager)]
    for comp in cycles(every):
        if set(comp) in eager_sets:
            continue
        path = one_cycle(every, comp)
        edges = "; ".join(f"{a} -> {b} at {', '.join(where[(a, b)])}" for a, b in zip(path, path[1:]))
        print(f"{'error' if args.strict else 'note'}: cycle through a deferred import: {edges}")
        bad += args.strict
    n_edges = sum(len(v) for v in every.values())
    print(f"{len(mods)} modules, {n_edges} local imports: "
          + ("no cycle" if not bad else f"{bad} cycle(s)") + ("" if args.strict else " at import time"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
