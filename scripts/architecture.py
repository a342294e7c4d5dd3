"""The rooms of labkube, what each may import, and the checks that hold the code to them.

One place for the rules: tests/test_architecture.py checks them, and `--write-docs` writes the rules table and
the room diagram of docs/architecture.md (between `<!-- architecture:NAME -->` and `<!-- /architecture -->`) from
these rules and the code's real imports, so the picture a reader sees is the one the code has.

    python scripts/architecture.py               # the room graph, rule breaks, import cycles, modules past 800 lines
    python scripts/architecture.py --write-docs  # and rewrite the marked blocks of docs/architecture.md

Which imports count (read from the source with `ast`; nothing is imported):
- room rules: every import of a labkube module, at module level, under `if TYPE_CHECKING:` or inside a function.
  A lazy import is still a dependency; deferring it only hides it from the import-time graph.
- import cycles: imports that run when a module is imported (module level, including under `if`/`try`; not under
  `if TYPE_CHECKING:`). There must be none. Imports inside functions are left out of that graph, since they run
  after every module involved has loaded, but the cycles they close are printed (`lazy cycle`) and listed in
  docs/architecture.md as work left.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Room:
    name: str
    what: str
    may_import: tuple[str, ...]


# Bottom to top. A room may import only the rooms it names (and itself); the spine imports none.
ROOMS = (
    Room("spine", "labkube/: schemas, results store, report rows, metrics registry", ()),
    Room("tasks", "tasks/: task families, graders, Gaia2 worlds, bundled tasks", ("spine",)),
    Room("agent", "agent/: rg-agent, third-party scaffolds, the metering gateway", ("spine", "tasks")),
    Room("integrity", "integrity/: the audit of a finished run", ("spine", "tasks", "agent")),
    Room(
        "harness",
        "agent/harness/: `labkube agent`, a whole run in its sandbox: agent, grading, audit",
        ("spine", "tasks", "agent", "integrity"),
    ),
    Room(
        "operator",
        "operator/: campaign driver, supervisors, sandbox backends, Kubernetes operator",
        ("spine", "tasks", "agent", "integrity", "harness"),
    ),
    Room(
        "results",
        "results/: the read side: reports, views, pass@k, analyze, export",
        ("spine", "tasks", "agent", "integrity"),
    ),
    Room(
        "cli",
        "the command line: labkube/cli.py and a module per command family (labkube/*_cli.py, results/*_cli.py)",
        ("spine", "tasks", "agent", "integrity", "harness", "operator", "results"),
    ),
)
# Imports that break a room rule on purpose, each with why and what removes it. The test fails when one of them
# is no longer in the code (drop it here then), so the list cannot go stale.
EXCEPTIONS: dict[tuple[str, str], str] = {}

ROOM = {room.name: room for room in ROOMS}
WRITE_SIDE = ("tasks", "agent", "integrity", "harness", "operator")
READ_SIDE = ("results",)

# The command line's modules: labkube/cli.py, which assembles them, its checks (cli_checks.py), one module per command
# family (labkube/*_cli.py, or results/*_cli.py beside the read side they show); the other modules of a folder are its
# room. labkube/__main__.py is `python -m labkube`.
CLI_MODULE = re.compile(r"^labkube\.(__main__|cli|cli_\w+|\w+_cli|results\.\w+_cli)$")


def package_dirs() -> dict[str, Path]:
    """labkube's packages and their folders, as pyproject.toml maps them (`labkube.agent` -> agent/, ...)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {name: REPO / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def module_files() -> dict[str, Path]:
    """Every labkube module and its file (bundled task data left out: it is not labkube's code)."""
    modules: dict[str, Path] = {}
    for package, folder in package_dirs().items():  # no mapped folder lies inside another
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if "bundled" in rel.parts or "__pycache__" in rel.parts:
                continue
            parts = [*rel.parent.parts, path.stem] if path.stem != "__init__" else list(rel.parent.parts)
            modules[".".join([package, *parts])] = path
    return modules


# A sub-package that is a room of its own, above the folder it lives in: the harness runs the agent and the audit.
SUBPACKAGE_ROOMS = {"labkube.agent.harness": "harness"}


def room_of(module: str) -> str:
    if CLI_MODULE.match(module):
        return "cli"
    for package, room in SUBPACKAGE_ROOMS.items():
        if module == package or module.startswith(package + "."):
            return room
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in {r.name for r in ROOMS}:
        return parts[1]
    return "spine"


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    kind: str  # "module" (runs on import), "function" (runs when called) or "type" (under TYPE_CHECKING: never)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, kind
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(child, "type" if kind == "type" else "function")
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), "type")
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), kind)
        else:
            yield from _walk(child, kind)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The labkube modules `module` imports, each resolved to the module it names (`from pkg import mod` is
    `pkg.mod` when that is a module, else `pkg`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node, kind in _walk(ast.parse(path.read_text(), str(path)), "module"):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
        for name in dict.fromkeys(names):
            while name and name not in modules:  # the deepest labkube module the name goes through, if any
                name = name.rpartition(".")[0]
            if name and name != module:
                found.append(Import(module, name, node.lineno, kind))
    return found


def all_imports() -> list[Import]:
    modules = module_files()
    return [imp for module, path in modules.items() for imp in imports_of(module, path, modules)]


def allowed(src: str, dst: str) -> bool:
    return dst == src or dst in ROOM[src].may_import


def rule_breaks(imports: list[Import]) -> list[str]:
    """Every import that goes where its room may not (the EXCEPTIONS aside), with the rule it breaks."""
    breaks = []
    for imp in imports:
        src, dst = room_of(imp.source), room_of(imp.target)
        if allowed(src, dst) or (imp.source, imp.target) in EXCEPTIONS:
            continue
        if src == "spine":
            why = "the spine imports a room above it"
        elif src in WRITE_SIDE and dst in READ_SIDE:
            why = "the write side imports the read side"
        else:
            why = f"{src} may import only {', '.join(ROOM[src].may_import)}"
        breaks.append(f"{imp.source}:{imp.line} imports {imp.target} ({imp.kind} level): {why}")
    return breaks


def stale_exceptions(imports: list[Import]) -> list[str]:
    present = {(imp.source, imp.target) for imp in imports}
    gone = [pair for pair in EXCEPTIONS if pair not in present]
    return [f"{src} no longer imports {dst}: drop its entry from EXCEPTIONS" for src, dst in gone]


def import_cycles(imports: list[Import], kinds: tuple[str, ...] = ("module",)) -> list[list[str]]:
    """The import cycles among labkube's modules over the imports of `kinds`, one per strongly connected
    component (its modules, sorted)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.kind in kinds:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the module graph is a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def lazy_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles that only imports inside functions close (they do not break an import; they are coupling)."""
    at_import = {frozenset(c) for c in import_cycles(imports)}
    return [c for c in import_cycles(imports, ("module", "function")) if frozenset(c) not in at_import]


def problems(imports: list[Import]) -> list[str]:
    """What the import-rule test fails on: rule breaks, stale exceptions and cycles at import time."""
    cycles = [f"import cycle among {', '.join(c)}" for c in import_cycles(imports)]
    return rule_breaks(imports) + stale_exceptions(imports) + cycles


def room_edges(imports: list[Import]) -> dict[tuple[str, str], int]:
    """Imports between rooms, counted: (from, to) -> how many module-to-module imports."""
    edges: dict[tuple[str, str], int] = {}
    for imp in imports:
        src, dst = room_of(imp.source), room_of(imp.target)
        if src != dst:
            edges[(src, dst)] = edges.get((src, dst), 0) + 1
    return edges


def mermaid(imports: list[Import]) -> str:
    """The room graph as a Mermaid flowchart, lower rooms at the bottom: a solid arrow where a room's modules
    import another room's as the rules allow, a dotted one labelled "exception" where only EXCEPTIONS do. Arrows
    carry no counts, so the block changes only when a new pair of rooms starts (or stops) importing."""
    order = [r.name for r in ROOMS]
    exception_only: dict[tuple[str, str], bool] = {}
    for imp in imports:
        pair = (room_of(imp.source), room_of(imp.target))
        if pair[0] != pair[1]:
            exception_only[pair] = exception_only.get(pair, True) and not allowed(*pair)
    lines = ["```mermaid", "flowchart BT"]
    for room in ROOMS:
        lines.append(f'    {room.name}["<b>{room.name}</b><br/>{room.what}"]')
    for (src, dst), exception in sorted(
        exception_only.items(), key=lambda e: (order.index(e[0][0]), order.index(e[0][1]))
    ):
        lines.append(f"    {src} -. exception .-> {dst}" if exception else f"    {src} --> {dst}")
    lines.append("```")
    return "\n".join(lines)


def exceptions_list() -> str:
    listed = [f"- `{src}` imports `{dst}`: {why}." for (src, dst), why in EXCEPTIONS.items()]
    return "\n".join(listed) or "None: every import keeps the rules."


def long_modules(limit: int = 800) -> list[tuple[str, int]]:
    """Modules past `limit` lines, longest first."""
    sizes = [(module, len(path.read_text().splitlines())) for module, path in module_files().items()]
    return sorted(((m, n) for m, n in sizes if n > limit), key=lambda mn: -mn[1])


def rules_table() -> str:
    rows = ["| room | what | may import |", "| --- | --- | --- |"]
    for room in ROOMS:
        rows.append(f"| {room.name} | {room.what} | {', '.join(room.may_import) or 'nothing of labkube'} |")
    return "\n".join(rows)


DOC = REPO / "docs" / "architecture.md"
BLOCK = re.compile(r"(<!-- architecture:(\w+) -->\n)(.*?)(<!-- /architecture -->)", re.S)


def doc_blocks(imports: list[Import]) -> dict[str, str]:
    return {"rules": rules_table(), "rooms": mermaid(imports), "exceptions": exceptions_list()}


def render_doc(text: str, imports: list[Import]) -> str:
    """`text` with every marked block replaced by what the code says now."""
    blocks = doc_blocks(imports)

    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in blocks:
            raise SystemExit(f"{DOC}: unknown block `architecture:{name}`; known: {', '.join(blocks)}")
        return f"{match.group(1)}{blocks[name]}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite the marked blocks of {DOC.name}")
    args = parser.parse_args()
    imports = all_imports()
    for (src, dst), count in sorted(room_edges(imports).items()):
        print(f"{src} -> {dst}: {count} imports")
    found = problems(imports)
    for line in found:
        print(line)
    for cycle in lazy_cycles(imports):
        print(f"lazy cycle (imports inside functions close it) among {', '.join(cycle)}")
    for module, lines in long_modules():
        print(f"{lines:5d} lines: {module_files()[module].relative_to(REPO)}")
    if args.write_docs:
        DOC.write_text(render_doc(DOC.read_text(), imports))
        print(f"written: {DOC.relative_to(REPO)}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
