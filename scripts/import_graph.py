#!/usr/bin/env python3
"""Print the shape of wdiff's import graph: modules, import levels, cycles
and the largest modules, read from the source (nothing is imported).

    python scripts/import_graph.py [PACKAGE_DIR]   # default: ./wdiff

A module's level is 1 when it imports no other module of the package, else
one more than the highest level among those it imports (a cycle counts as
one level). Imports inside functions count: they tie modules all the same.
The contract that keeps the layers in order is in pyproject.toml
(``lint-imports``); this script only describes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(pkg: Path, path: Path) -> str:
    parts = path.relative_to(pkg.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined_names(path: Path) -> set[str]:
    """The top-level names a module defines or imports."""
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def imports_of(pkg: Path, path: Path, modules: set[str], files: dict[str, Path]) -> set[str]:
    name = module_name(pkg, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import module` ties to the module alone; to pkg's
            # __init__ only for a name that __init__ defines (a compiled
            # submodule, such as codec._native, ties to nothing here)
            init = files.get(mod)
            is_pkg = init is not None and init.name == "__init__.py"
            targets = []
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in modules:
                    targets.append(sub)
                elif not is_pkg or a.name in defined_names(init):
                    targets.append(mod)
        else:
            continue
        for t in targets:
            while t and t not in modules:  # a name inside a module: the module itself
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def main() -> int:
    pkg = Path(sys.argv[1] if len(sys.argv) > 1 else "wdiff").resolve()
    files = {module_name(pkg, p): p for p in sorted(pkg.rglob("*.py"))}
    modules = set(files)
    graph = {m: imports_of(pkg, p, modules, files) for m, p in files.items()}
    comps = strongly_connected(graph)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    level: dict[int, int] = {}
    for i, c in enumerate(comps):  # Tarjan yields components in reverse topological order
        deps = {comp_of[d] for m in c for d in graph[m]} - {i}
        level[i] = 1 + max((level[d] for d in deps), default=0)
    lines = {m: sum(1 for _ in p.open(encoding="utf-8")) for m, p in files.items()}
    cycles = [c for c in comps if len(c) > 1]
    print(f"modules: {len(modules)}   imports: {sum(len(v) for v in graph.values())}   "
          f"levels: {max(level.values())}   cycles: {len(cycles)}")
    for c in cycles:
        print("  cycle: " + " <-> ".join(c))
    big = sorted(lines.items(), key=lambda kv: -kv[1])[:5]
    print("largest modules: " + ", ".join(f"{m} ({n} lines)" for m, n in big))
    rooms = {m: ".".join(m.split(".")[:2]) if m.count(".") >= 1 and (pkg / m.split(".")[1]).is_dir() else m for m in modules}
    room_graph: dict[str, set[str]] = {r: set() for r in rooms.values()}
    for m, deps in graph.items():
        room_graph[rooms[m]].update(rooms[d] for d in deps if rooms[d] != rooms[m])
    rcomps = strongly_connected(room_graph)
    rcomp_of = {r: i for i, c in enumerate(rcomps) for r in c}
    rlevel: dict[int, int] = {}
    for i, c in enumerate(rcomps):
        deps = {rcomp_of[d] for r in c for d in room_graph[r]} - {i}
        rlevel[i] = 1 + max((rlevel[d] for d in deps), default=0)
    rcycles = [c for c in rcomps if len(c) > 1]
    print(f"rooms (folders, and modules outside them): {len(room_graph)}   levels: {max(rlevel.values())}   "
          f"cycles: {len(rcycles)}" + "".join(f"\n  cycle: {' <-> '.join(c)}" for c in rcycles))
    print("modules by level, top down:")
    by_level: dict[int, list[str]] = {}
    for m in modules:
        by_level.setdefault(level[comp_of[m]], []).append(m)
    for lv in sorted(by_level, reverse=True):
        print(f"  level {lv:2d}: " + ", ".join(sorted(by_level[lv])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
