"""Find import circles between the files of src/rlvr; print them; exit 1 when there is one.

Every `import` and `from ... import` of an `rlvr` module is an arrow from the importing file to
the imported one (`from rlvr.pipelines import stages` points at `stages.py`, `from
rlvr.pipelines.stages import X` too; relative imports are resolved). Arrows are of three kinds,
and all three count:

- `module`: run when the file is imported (at the top level, or in a class body, a `try` or an
  `if` there);
- `function`: inside a function, run when it is called (a deferred import is still a
  dependency: it only hides the circle from the interpreter);
- `type-checking`: under `if TYPE_CHECKING:` (never run, but still a dependency of the design).

An arrow only points at the named file: importing `rlvr.a.b` also runs `rlvr/a/__init__.py`,
but that is not an arrow to the package; `from rlvr.a import name` is one when `name` is not a
module of its own. `importlib.import_module` with a computed name is not seen.

A circle is a set of files that reach one another through arrows (a strongly connected
component of more than one file, or a file that imports itself). Each is printed with one of
its shortest cycles, every arrow labelled with its kind and line. The last line counts the
circles of all arrows together and, separately, the circles that remain when only the
`module` arrows, and only the `module` and `function` arrows, are kept. The exit status is 1
when the count over all arrows is not 0.

Usage (from the repository root): python scripts/check_cycles.py [SRC_DIR]  (default src/rlvr)
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

KINDS = ("module", "function", "type-checking")


def module_names(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `src` (a package's `__init__.py`
    is the package's name)."""
    names = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an `if` test is `TYPE_CHECKING` or `typing.TYPE_CHECKING`."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(node: ast.AST, kind: str) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under `node`, with its kind (`KINDS`)."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append((child, kind))
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _imports(child, "type-checking" if kind == "type-checking" else "function")
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            found += _imports(ast.Module(body=child.body, type_ignores=[]), "type-checking")
            found += _imports(ast.Module(body=child.orelse, type_ignores=[]), kind)
        else:
            found += _imports(child, kind)
    return found


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, names: dict[str, Path]
) -> list[str]:
    """The modules of `names` an import statement imports: `import a.b` names `a.b`; `from a
    import b` names the module `a.b` when there is one, else `a` (b is a's member); relative
    imports are resolved against `module`. A name outside `names` falls back to its nearest
    enclosing module there (or is dropped)."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        wanted = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
            for alias in node.names
        ]
    found = []
    for name in wanted:
        while name and name not in names:
            name = name.rpartition(".")[0]
        if name and name not in found:
            found.append(name)
    return found


def import_arrows(src: Path) -> list[tuple[str, str, str, int]]:
    """(importer, imported, kind, line) for every import of one file of `src` by another."""
    names = module_names(src)
    arrows = []
    for module, path in names.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, kind in _imports(tree, "module"):
            for name in _targets(node, module, path.name == "__init__.py", names):
                arrows.append((module, name, kind, node.lineno))
    return arrows


def circles(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, or with a self-arrow
    (Tarjan's algorithm), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(nodes) + 100))
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found)


def shortest_cycle(start: str, members: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from `start` back to itself inside `members` (breadth first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges.get(v, ()) & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if v != start else [start, start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    return [start]


def report(src: Path) -> int:
    """Print the circles of `src`'s imports and their counts; return the count over all arrows."""
    arrows = import_arrows(src)
    nodes = list(module_names(src))
    labels: dict[tuple[str, str], list[str]] = {}
    for a, b, kind, line in arrows:
        labels.setdefault((a, b), []).append(f"{kind} :{line}")
    counts = {}
    for kept in (KINDS[:1], KINDS[:2], KINDS):
        edges: dict[str, set[str]] = {}
        for a, b, kind, _ in arrows:
            if kind in kept:
                edges.setdefault(a, set()).add(b)
        counts[kept] = circles(nodes, edges)
    for component in counts[KINDS]:
        edges = {}
        for a, b, _, _ in arrows:
            edges.setdefault(a, set()).add(b)
        cycle = shortest_cycle(component[0], set(component), edges)
        files = f"{len(component)} file{'s' if len(component) > 1 else ''}"
        print(f"circle of {files}: {', '.join(component)}")
        for a, b in zip(cycle, cycle[1:]):
            print(f"  {a} -> {b} ({', '.join(labels[(a, b)])})")
    total = len(counts[KINDS])
    print(
        f"import circles: {total} over all {len(arrows)} imports between {len(nodes)} files "
        f"({len(counts[KINDS[:1]])} with module-level imports only, "
        f"{len(counts[KINDS[:2]])} with module- and function-level ones)"
    )
    return total


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "src/rlvr"
    sys.exit(1 if report(root) else 0)
