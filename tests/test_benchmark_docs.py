"""Benchmark figures in the docs are written by the benchmarks (`--write-docs`, benchmarks/docs_block.py): each
marked block is replaced whole with the script's table and a line naming the command, the machine and the commit;
every marked block in docs/ is one a benchmark script writes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from docs_block import DocsBlockError, block_pattern, commit, markdown_table, write_block  # noqa: E402

DOC = """# A doc

Before.

<!-- benchmark:demo -->
| old | figures |
|---|---|
| 1 | 2 |
<!-- /benchmark -->

After.
"""


def test_the_block_is_replaced_with_the_table_and_where_it_came_from(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)
    write_block(doc, "demo", markdown_table(("runs", "seconds"), [("2", "0.50")], (True, True)), "python bench.py")
    text = doc.read_text()
    assert text.startswith("# A doc\n\nBefore.\n\n<!-- benchmark:demo -->\n| runs | seconds |\n| ---: | ---: |\n")
    assert "| 2 | 0.50 |\n\nWritten by `python bench.py` on " in text
    assert f", at commit {commit()}, " in text and "CPUs" in text
    # the load it ran under, at start and end (shared machines): a number each, or "unknown", never 0 invented
    assert re.search(r"; 1-minute load average (\d+\.\d\d|unknown) at start, (\d+\.\d\d|unknown) at end\.\n", text)
    assert "old" not in text and text.endswith("<!-- /benchmark -->\n\nAfter.\n")


def test_a_doc_without_the_block_is_a_one_line_error(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# no block\n")
    with pytest.raises(DocsBlockError, match=r"no single `<!-- benchmark:demo -->`"):
        write_block(doc, "demo", "| a |", "python bench.py")
    assert doc.read_text() == "# no block\n"


def test_every_marked_block_in_the_docs_is_written_by_a_benchmark() -> None:
    scripts = "\n".join(p.read_text() for p in (REPO / "benchmarks").glob("*.py"))
    found = []
    for doc in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]:
        text = doc.read_text()
        for name in re.findall(r"<!-- benchmark:(\S+) -->", text):
            found.append(name)
            assert block_pattern(name).search(text), f"{doc.name}: block {name} is not closed"
            written = name.split("-")[0]
            assert f'"{written}' in scripts, f"{doc.name}: no script in benchmarks/ writes the block {name}"
            block = block_pattern(name).search(text).group(2)  # type: ignore[union-attr]
            # the machine and commit the figures came from, or where hand-typed figures stand until the next run
            provenance = r"Written by `python benchmarks/.+` on .+ CPUs.*, at commit \w+|Typed by hand at commit \w{7}"
            assert re.search(provenance, block), f"{doc.name}: block {name} does not say where its figures came from"
    assert {"analyze_scale", "export_scale", "operator_scale-1000"} <= set(found)


def test_analyze_scale_writes_its_table(tmp_path: Path) -> None:
    doc = tmp_path / "analyze.md"
    doc.write_text(DOC.replace("benchmark:demo", "benchmark:analyze_scale"))
    argv = [sys.executable, str(REPO / "benchmarks" / "analyze_scale.py"), "--runs", "2", "--steps", "20,40"]
    proc = subprocess.run([*argv, "--many", "0", "--write-docs", "--doc", str(doc)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    block = block_pattern("analyze_scale").search(doc.read_text()).group(2)  # type: ignore[union-attr]
    rows = [line.split(" | ") for line in block.splitlines() if re.match(r"\| \d", line)]
    assert [(r[0], r[1]) for r in rows] == [("| 2", "20"), ("| 2", "40")], block
    assert "Written by `python benchmarks/analyze_scale.py --runs 2 --steps 20,40 --many 0` on " in block
