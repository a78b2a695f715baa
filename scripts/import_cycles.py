"""Import graph of the recurvit package and its cycles (every import statement, function-local and
TYPE_CHECKING ones included, as a graph tool such as pydeps would draw it).

    python scripts/import_cycles.py            # prints each cycle; exit status 1 if there is one
    python scripts/import_cycles.py --dot      # the graph in Graphviz dot format
    python scripts/import_cycles.py --packages # also the cycles between top-level parts (train, analysis, ...)
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set

SRC = Path(__file__).resolve().parents[1] / "src"


def modules(src: Path = SRC) -> Dict[str, Path]:
    out = {}
    for p in sorted((src / "recurvit").rglob("*.py")):
        name = ".".join(p.relative_to(src).with_suffix("").parts)
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = p
    return out


def graph(src: Path = SRC) -> Dict[str, Set[str]]:
    """module -> the package modules it imports (anywhere in its code)."""
    mods = modules(src)
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: List[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m:
                    edges[m].add(t)
    return edges


def packages(edges: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The same graph between the package's top-level parts (recurvit.train, recurvit.analysis, ...),
    leaving out imports of the package root (its public re-exports)."""
    top = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    out: Dict[str, Set[str]] = {}
    for m, ts in edges.items():
        out.setdefault(top(m), set()).update(top(t) for t in ts if top(t) not in (top(m), "recurvit"))
    return out


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: List[str]) -> int:
    edges = graph()
    if "--dot" in argv:
        print("digraph recurvit {")
        for m, ts in sorted(edges.items()):
            for t in sorted(ts):
                print(f'  "{m}" -> "{t}";')
        print("}")
        return 0
    found = cycles(edges)
    for c in found:
        print("cycle:", " <-> ".join(c))
    if "--packages" in argv:  # for reading: parts that import each other (tasks <-> study is by design)
        for c in cycles(packages(edges)):
            print("package cycle:", " <-> ".join(c))
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
