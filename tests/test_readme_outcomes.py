"""The README's outcomes table says what `result.json` holds (issue 43, item 6): its `score`, `beat_baseline` and
`completion` columns are read here and checked against real runs of each kind (scored, no value, grader error)
through `labkube run`, and against what `report` and `analyze` count over seeds; docs/analyze.md says the same of
a run with no value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import labkube
from tinytask import make_tiny_task

ROOT = Path(__file__).parent.parent
RUN_ID = "tiny-task--oracle--s0"
WRITE = {"tool": "bash", "args": {"command": "echo 7 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "notes.txt"}}
CRASHING_GRADER = "#!/usr/bin/env bash\necho 'ModuleNotFoundError: No module named sklearn' >&2\nexit 3\n"


def outcomes_table() -> dict[str, dict[str, str]]:
    """The README's outcomes table: each row by its first outcome, as {column: cell}."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| outcome | meaning |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(header), line
        rows[cells[0].split(",")[0].strip("` ")] = dict(zip(header, cells, strict=True))
    return rows


def expect(cell: str, value: object, fraction_of_sota: float | None) -> None:
    """`value` is what the README's `cell` says it is."""
    if cell.startswith("`null`"):
        assert value is None, cell
    elif cell.startswith("`true` or `false`"):
        assert isinstance(value, bool), cell
    elif cell.startswith("the headline's fraction of SOTA"):
        assert value == pytest.approx(fraction_of_sota), cell
    elif cell.startswith("the fraction of subtasks with a value"):
        assert isinstance(value, float) and 0.0 <= value <= 1.0, cell
        if "(`0.0` when none)" in cell and fraction_of_sota is None:
            assert value == 0.0, cell
    else:
        raise AssertionError(f"the README's cell {cell!r} says something this test does not read")


@pytest.mark.parametrize(
    ("outcome", "steps", "grader"),
    [("scored", [WRITE], None), ("no_value", [READ], None), ("grader_error", [WRITE], CRASHING_GRADER)],
)
def test_the_readme_outcomes_table_says_what_result_json_holds(
    tmp_path: Path, outcome: str, steps: list[dict], grader: str | None
) -> None:
    row = outcomes_table()[outcome]
    task = make_tiny_task(tmp_path, steps)
    if grader is not None:
        (task / "grading" / "grade.sh").write_text(grader)
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == (1 if outcome.endswith("_error") else 0), proc.stdout + proc.stderr

    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["outcome"] == outcome
    fraction = result["subtasks"][0]["fraction_of_sota"]
    for column in ("`score`", "`beat_baseline`", "`completion`"):
        expect(row[column], result[column.strip("`")], fraction)

    (aggregate,) = json.loads(labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=tmp_path).stdout)
    over_seeds = row["in statistics over seeds"]
    if over_seeds.startswith("counted as a run"):
        assert aggregate["finished"] == 1 and aggregate["mean_score"] is None
        assert "counts as not beating the baseline (`beat baseline` 0/1" in over_seeds
        assert aggregate["beat_baseline"] == 0
    elif over_seeds.startswith("left out"):
        assert aggregate["finished"] == 0 and aggregate["errors"] == 1
    else:
        assert over_seeds == "counted" and aggregate["finished"] == 1 and aggregate["mean_score"] is not None


def test_analyze_counts_a_run_with_no_value_as_the_readme_and_its_own_docs_say(tmp_path: Path) -> None:
    docs = " ".join((ROOT / "docs" / "analyze.md").read_text().split())
    assert (
        'Its own `beat_baseline` is null ("unknown"), and it counts as not passing in the beat-baseline count' in docs
    )
    assert "Its completion is the fraction of subtasks its grading gave a value (0.0 when none)" in docs
    assert "counts as not beating the baseline" in outcomes_table()["no_value"]["in statistics over seeds"]

    out = tmp_path / "c"
    assert (
        labkube(
            "run", str(make_tiny_task(tmp_path, [READ])), "--model", "oracle", "--out", str(out), cwd=tmp_path
        ).returncode
        == 0
    )
    analysis = tmp_path / "a.json"
    assert labkube("analyze", str(out), "--format", "json", "--out", str(analysis), cwd=tmp_path).returncode == 0
    (group,) = json.loads(analysis.read_text())["groups"]
    assert (group["runs"], group["no_value"], group["beat_baseline"], group["completion_rate"]) == (1, 1, 0, 0.0)
    assert group["mean"] is None and group["pass_k"][0]["pass_at_k"] == 0.0
