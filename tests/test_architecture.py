"""The import rules of docs/architecture.md, checked on the code's real imports (scripts/architecture.py holds the
rules; this test and the doc's diagram read them from there).

Fails when the spine imports a room above it, when the write side (tasks, agent, integrity, operator) imports the
read side (results), when any room imports one its rule does not name, when an import cycle runs at import time,
or when docs/architecture.md's generated blocks no longer match the code."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import architecture  # noqa: E402


@pytest.fixture(scope="module")
def imports() -> list[architecture.Import]:
    return architecture.all_imports()


def test_the_code_keeps_the_room_rules_and_has_no_import_cycle(imports: list[architecture.Import]) -> None:
    found = architecture.problems(imports)
    assert not found, "\n".join(["docs/architecture.md says what each room may import:", *found])


def test_the_walk_sees_every_room_and_the_imports_between_them(imports: list[architecture.Import]) -> None:
    # A walk that found nothing would pass the test above; these imports are known to be there.
    modules = architecture.module_files()
    assert {architecture.room_of(m) for m in modules} == {r.name for r in architecture.ROOMS}
    found = {(i.source, i.target, i.kind) for i in imports}
    assert ("labkube.operator.telemetry", "labkube.report", "module") in found
    assert ("labkube.cli", "labkube.results.analysis_cli", "module") in found
    assert ("labkube.agents_cli", "labkube.agent.harness.sandbox_process", "function") in found
    assert ("labkube.agent.harness.entrypoint", "labkube.integrity", "function") in found
    assert architecture.room_of("labkube.agent.harness.entrypoint") == "harness"
    assert architecture.room_of("labkube.agent.rg.loop") == "agent"
    assert ("labkube.results.analysis", "labkube.results.analysis_figures", "module") in found


def probe(tmp_path: Path, module: str, source: str) -> list[architecture.Import]:
    """The imports the walk reads from `source` as if it were `module` (a file outside the tree)."""
    path = tmp_path / f"{module.rpartition('.')[2]}.py"
    path.write_text(source)
    return architecture.imports_of(module, path, architecture.module_files())


@pytest.mark.parametrize(
    ("module", "source", "why"),
    [
        ("labkube.store", "from labkube.operator import driver\n", "the spine imports a room above it"),
        ("labkube.metrics", "def f():\n    from labkube.results import views\n", "the spine imports a room above it"),
        ("labkube.operator.telemetry", "import labkube.results.views\n", "the write side imports the read side"),
        (
            "labkube.integrity.rules",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labkube.results.views import x\n",
            "the write side imports the read side",
        ),
        ("labkube.tasks.grading", "from labkube.agent.rg import loop\n", "tasks may import only spine"),
        (
            "labkube.results.views",
            "from labkube.operator.driver import x\n",
            "results may import only spine, tasks, agent, integrity",
        ),
        ("labkube.agent.rg.loop", "from labkube.cli import main\n", "agent may import only spine, tasks"),
        (
            "labkube.agent.scaffolds.cli_agents",
            "def f():\n    from labkube.agent.harness.entrypoint import x\n",
            "agent may import only spine, tasks",
        ),
        (
            "labkube.integrity.audit",
            "from labkube.agent.harness import sandbox_process\n",
            "integrity may import only spine, tasks, agent",
        ),
    ],
)
def test_a_bad_import_breaks_a_rule(tmp_path: Path, module: str, source: str, why: str) -> None:
    (broken,) = architecture.rule_breaks(probe(tmp_path, module, source))
    assert broken.startswith(f"{module}:") and broken.endswith(f": {why}"), broken


def test_imports_inside_functions_count_for_the_rules_but_not_for_cycles(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import labkube.report\n"
        "if TYPE_CHECKING:\n    from labkube.result import RunResult\n"
        "try:\n    from labkube import store\nexcept ImportError:\n    store = None\n"
        "class C:\n    from labkube import budgets\n"
        "def f():\n    from labkube.results import views\n"
    )
    kinds = {i.target: i.kind for i in probe(tmp_path, "labkube.results.passk", source)}
    assert kinds == {
        "labkube.report": "module",
        "labkube.result": "type",
        "labkube.store": "module",
        "labkube.budgets": "module",
        "labkube.results.views": "function",
    }
    back = architecture.Import("labkube.results.views", "labkube.results.passk", 1, "module")
    lazy = architecture.Import("labkube.results.passk", "labkube.results.views", 2, "function")
    assert architecture.import_cycles([back, lazy]) == []
    assert architecture.lazy_cycles([back, lazy]) == [["labkube.results.passk", "labkube.results.views"]]
    eager = architecture.Import("labkube.results.passk", "labkube.results.views", 2, "module")
    assert architecture.import_cycles([back, eager]) == [["labkube.results.passk", "labkube.results.views"]]
    typed = architecture.Import("labkube.results.passk", "labkube.results.views", 2, "type")
    assert architecture.import_cycles([back, typed]) == []


def test_an_import_cycle_is_a_problem(imports: list[architecture.Import]) -> None:
    cycle = [
        architecture.Import("labkube.results.analysis_figures", "labkube.results.analysis", 8, "module"),
        architecture.Import("labkube.results.analysis", "labkube.results.analysis_figures", 42, "module"),
    ]
    assert architecture.problems([*imports, *cycle])[-1] == (
        "import cycle among labkube.results.analysis, labkube.results.analysis_figures"
    )


def test_an_exception_no_longer_in_the_code_must_be_dropped(
    imports: list[architecture.Import], monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = ("labkube.agent.rg.loop", "labkube.integrity.audit")  # an import the code does not have
    monkeypatch.setitem(architecture.EXCEPTIONS, pair, "a test's exception")
    assert architecture.problems(imports) == [f"{pair[0]} no longer imports {pair[1]}: drop its entry from EXCEPTIONS"]


def test_the_docs_blocks_are_what_the_code_says_now(imports: list[architecture.Import]) -> None:
    text = architecture.DOC.read_text()
    for name in architecture.doc_blocks(imports):
        assert f"<!-- architecture:{name} -->" in text, f"docs/architecture.md has no `{name}` block"
    assert architecture.render_doc(text, imports) == text, "run: python scripts/architecture.py --write-docs"


def test_every_package_opens_with_what_it_is_for() -> None:
    for package, path in architecture.module_files().items():
        if path.name != "__init__.py":
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert len(docstring.split()) >= 8, f"{path.relative_to(REPO)}: open with a paragraph on what {package} is for"
