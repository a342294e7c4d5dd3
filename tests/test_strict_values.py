"""Every value read is a value (issue 43, items 1-4): a grader's number counts only when the whole cell or JSON value
is a number in a form the task's own values use; what the parser saw is shown; a grader that failed quietly fails;
an error outcome carries no score.

The graders are real bash scripts in a tiny task (tests/tinytask.py) that write what the agent's workspace holds
(`cell.txt` into the `Your Method` cell, `value.json` as the summary's `score`), run by `grade_workspace` or by
`labkube run` with the scripted oracle; nothing of labkube's is faked.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import labkube
from tinytask import make_tiny_task

from labkube.tasks import load_task
from labkube.tasks.grading import GradeOutcome, error_lines, grade_workspace

RUN_ID = "tiny-task--oracle--s0"

CELL_GRADER = """#!/usr/bin/env bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 - "$ROOT" <<'PY'
import pathlib, sys
root = pathlib.Path(sys.argv[1])
cell = (root / "cell.txt").read_text().rstrip("\\n")
md = root / "task_description.md"
row = cell if cell.startswith("|") else f"| Your Method | {cell} |"
md.write_text(md.read_text().replace("| Your Method | -- |", row))
PY
"""

JSON_GRADER = """#!/usr/bin/env bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
echo "{\\"score\\": $(cat "$ROOT/value.json")}" > "$ROOT/grading/results.json"
"""


def description(header: str, baseline: str) -> str:
    return f"""# Tiny task

Make the score as large as you can.

## Baseline results

| Method | {header} |
| :--- | ---: |
| Baseline | {baseline} |
| Your Method | -- |
"""


# The task's own values: fractions (a SOTA of 0.842), percentages (its column says `%`), or decimal commas.
FRACTIONS = ("Score ↑", "0.700", 0.70, 0.842)
PERCENT = ("Score (%) ↑", "70.0", 70.0, 84.2)
DECIMAL_COMMAS = ("Score ↑", "0,700", 0.70, 0.842)


def scale_task(root: Path, scale: tuple[str, str, float, float], grader: str, **labkube_yaml: Any) -> Path:
    header, listed, baseline, sota = scale
    subtask = {"id": "score", "metric": "Score", "direction": "higher", "baseline": baseline, "sota": sota}
    subtask |= {"json_key": "score", "table": 0, "column": header}
    task = make_tiny_task(root, [], **{"subtasks": [subtask], **labkube_yaml})
    (task / "task_description.md").write_text(description(header, listed))
    (task / "grading" / "grade.sh").write_text(grader)
    return task


def grade(tmp_path: Path, task: Path, **workspace_files: str) -> GradeOutcome:
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    for name, text in workspace_files.items():
        (workspace / name.replace("_", ".")).write_text(text)
    return grade_workspace(load_task(str(task)), workspace, tmp_path / "scratch", sandboxed=True)


# -- item 1: a number is a number -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "raw"),
    [
        ("71.3%", 0.713),  # a percentage against fractions: converted, the unit is explicit
        ("71.3 %", 0.713),
        ("0.71 ± 0.02", 0.71),
        ("0.71 +/- 0.02", 0.71),
        ("1e-3", 0.001),
        ("**0.713**", 0.713),
        ("\u22120.0500", -0.05),  # U+2212: the sign is kept
    ],
)
def test_a_cell_that_is_a_number_is_read_on_the_tasks_scale(tmp_path: Path, cell: str, raw: float) -> None:
    outcome = grade(tmp_path, scale_task(tmp_path, FRACTIONS, CELL_GRADER), cell_txt=cell)
    assert outcome.error is None
    assert outcome.subtasks[0].raw == pytest.approx(raw)


@pytest.mark.parametrize(
    ("cell", "said"),
    [
        ("failed on seed 2", "held `failed on seed 2`, which is not a number"),
        ("0,7130", "`0,7130` has a decimal comma, and the task's own values do not use them"),
        ("n/a", "held `n/a`, no number"),
        ("—", "held `—`, no number"),
        ("~0.71", "held `~0.71`, which is not a number"),
        ("71.3", "71.3 with no unit, where the task's values are fractions (baseline 0.7, SOTA 0.842): that is "
         "84.7x SOTA; if it is a percentage, write 71.3%"),
    ],
)  # fmt: skip
def test_a_cell_that_is_not_a_number_is_no_value_naming_the_cell(tmp_path: Path, cell: str, said: str) -> None:
    outcome = grade(tmp_path, scale_task(tmp_path, FRACTIONS, CELL_GRADER), cell_txt=cell)

    assert outcome.error is None and outcome.score is None and outcome.subtasks[0].raw is None
    assert outcome.note is not None
    assert outcome.note.startswith("the grader gave no value for subtask score; task_description.md table 0 (line 7), ")
    assert said in outcome.note


@pytest.mark.parametrize(
    ("value", "raw", "said"),
    [
        ('"71.3%"', 0.713, None),
        ('"0.71 ± 0.02"', 0.71, None),
        ("0.713", 0.713, None),
        ('"failed: 3 of 3 seeds crashed"', None, "held `failed: 3 of 3 seeds crashed`, which is not a number"),
        ("true", None, "held true, which is not a number"),
        ('"0.5 0.7"', None, "2 numbers where one was expected"),
        ("71.3", None, "if it is a percentage, write 71.3%"),
    ],
)
def test_a_summary_value_counts_only_when_it_is_one_number(
    tmp_path: Path, value: str, raw: float | None, said: str | None
) -> None:
    outcome = grade(tmp_path, scale_task(tmp_path, FRACTIONS, JSON_GRADER), value_json=value)
    assert outcome.error is None
    assert outcome.subtasks[0].raw == (pytest.approx(raw) if raw is not None else None)
    if said is not None:
        assert outcome.note is not None and "grading/results.json `score`: " in outcome.note and said in outcome.note


def test_percentages_and_their_absence_against_a_column_the_task_writes_in_percent(tmp_path: Path) -> None:
    task = scale_task(tmp_path, PERCENT, CELL_GRADER)
    assert grade(tmp_path / "a", task, cell_txt="71.3%").subtasks[0].raw == pytest.approx(71.3)
    assert grade(tmp_path / "b", task, cell_txt="71.3").subtasks[0].raw == pytest.approx(71.3)
    fraction = grade(tmp_path / "c", task, cell_txt="0.713")
    assert fraction.subtasks[0].raw is None and fraction.note is not None
    assert "0.713 with no unit, where the task writes this column in percent (baseline 70, SOTA 84.2)" in fraction.note


def test_decimal_commas_are_read_only_where_the_tasks_own_values_use_them(tmp_path: Path) -> None:
    task = scale_task(tmp_path, DECIMAL_COMMAS, CELL_GRADER)
    assert grade(tmp_path, task, cell_txt="0,7130").subtasks[0].raw == pytest.approx(0.713)


def test_a_fraction_of_sota_outside_0_to_10x_is_flagged_and_never_averaged(tmp_path: Path) -> None:
    """The tiny task's SOTA is 10: the agent's 150 is 15x it. `labkube run` through `report` (every format) and
    `analyze`."""
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 150 > result.txt"}}])
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["outcome"] == "no_value" and result["score"] is None and result["beat_baseline"] is None
    assert result["flagged_score"] == pytest.approx(15.0)
    assert result["subtasks"][0]["raw"] == 150.0 and "15x SOTA (10)" in result["subtasks"][0]["implausible"]
    assert "the value of subtask score is flagged: 150 is 15x SOTA (10)" in result["message"]
    (aggregate,) = json.loads(labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=tmp_path).stdout)
    assert aggregate["flagged"] == 1 and aggregate["mean_score"] is None and aggregate["beat_baseline"] == 0
    table = labkube("report", str(out), cwd=tmp_path).stdout
    run_table = table.split("Per task, model and scaffold")[0]
    assert "15.000" in run_table and "implausible" in run_table  # the score cell (its words may fold)
    html = tmp_path / "r.html"
    assert labkube("report", str(out), "--format", "html", "--out", str(html), cwd=tmp_path).returncode == 0
    assert "15.000 implausible" in html.read_text()
    analysis = tmp_path / "a.json"
    assert labkube("analyze", str(out), "--format", "json", "--out", str(analysis), cwd=tmp_path).returncode == 0
    (group,) = json.loads(analysis.read_text())["groups"]
    assert group["mean"] is None and group["no_value"] == 1


# -- item 2: a grader that failed quietly ----------------------------------------------------------------------

TRACEBACK = """echo "Traceback (most recent call last):" >&2
echo '  File "grade.py", line 12, in <module>' >&2
echo "KeyError: 'avg_acc'" >&2
"""


def two_subtask_task(root: Path, grader: str) -> Path:
    subtasks = [
        {"id": "score", "metric": "Score", "direction": "higher", "baseline": 1.0, "sota": 10.0, "json_key": "score"},
        {"id": "extra", "metric": "Extra", "direction": "higher", "baseline": 1.0, "sota": 10.0, "json_key": "extra"},
    ]
    task = make_tiny_task(root, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}], subtasks=subtasks)
    (task / "grading" / "grade.sh").write_text(grader)
    return task


def test_a_traceback_with_exit_0_and_no_value_is_a_grader_error(tmp_path: Path) -> None:
    task = two_subtask_task(tmp_path, f"#!/usr/bin/env bash\n{TRACEBACK}exit 0\n")
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    (row,) = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert row["outcome"] == "grader_error" and row["score"] is None and row["completion"] is None
    assert row["error"].startswith(
        "grader exited 0 but its output shows an error and it gave no value: Traceback (most recent call last): | "
        "KeyError: 'avg_acc'"
    )


def test_a_traceback_beside_a_value_is_a_warning_in_status_and_every_report(tmp_path: Path) -> None:
    grader = (
        "#!/usr/bin/env bash\n"
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        'echo "{\\"score\\": $(cat "$ROOT/result.txt")}" > "$ROOT/grading/results.json"\n'
        f"{TRACEBACK}"
    )
    task = two_subtask_task(tmp_path, grader)
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = "the grader exited 0 but its output shows an error: Traceback (most recent call last): | KeyError"
    (row,) = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert row["outcome"] == "scored" and row["score"] == pytest.approx(0.7) and row["completion"] == 0.5
    assert warning in row["message"]
    (csv_row,) = csv.DictReader(io.StringIO(labkube("report", str(out), "--format", "csv", cwd=tmp_path).stdout))
    assert warning in csv_row["message"]
    assert "KeyError" in labkube("report", str(out), cwd=tmp_path).stdout
    assert "KeyError" in labkube("status", str(out), cwd=tmp_path).stdout
    html = tmp_path / "r.html"
    assert labkube("report", str(out), "--format", "html", "--out", str(html), cwd=tmp_path).returncode == 0
    assert "its output shows an error" in html.read_text()


@pytest.mark.parametrize(
    ("printed", "found"),
    [
        ("Traceback (most recent call last):\n  File x\nValueError: bad",
         ["Traceback (most recent call last):", "ValueError: bad"]),
        ("ERROR:root:no predictions", ["ERROR:root:no predictions"]),
        ("Error: no predictions found\nException: boom", ["Error: no predictions found", "Exception: boom"]),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory", ["torch.cuda.OutOfMemoryError: CUDA out of memory"]),
        ("Error: 0.14\nMean Squared Error: 0.2\nerror rate 0.1\n0 errors", []),  # metrics, not failures
        ("Exception ignored in: <function _Writer.__del__>", []),  # Python's note at exit
        ("UserWarning: deprecated", []),
    ],
)  # fmt: skip
def test_what_counts_as_an_error_line(printed: str, found: list[str]) -> None:
    assert error_lines(printed) == found


# -- item 3: nothing the parser saw is hidden -------------------------------------------------------------------


def test_a_your_method_row_with_an_extra_cell_is_no_value_with_the_parsers_warning(tmp_path: Path) -> None:
    task = scale_task(tmp_path, FRACTIONS, CELL_GRADER)
    outcome = grade(tmp_path, task, cell_txt="| Your Method | 0.75 | 0.80 |")
    assert outcome.score is None and outcome.note is not None
    assert "table 0 (line 7): row at line 10 has 3 cells, header has 2" in outcome.note
    assert "it printed: (nothing)" in outcome.note


def test_an_extra_empty_cell_is_read_with_a_warning(tmp_path: Path) -> None:
    outcome = grade(tmp_path, scale_task(tmp_path, FRACTIONS, CELL_GRADER), cell_txt="| Your Method | 0.75 | |")
    assert outcome.subtasks[0].raw == 0.75
    assert outcome.warnings == [
        "task_description.md as graded: table 0 (line 7): row at line 10 has 3 cells, header has 2; read without its "
        "empty extra cells"
    ]


def test_duplicate_your_method_rows(tmp_path: Path) -> None:
    task = scale_task(tmp_path, FRACTIONS, CELL_GRADER)
    agree = grade(tmp_path / "a", task, cell_txt="| Your Method | -- |\n| Your Method | 0.75 |")
    assert agree.subtasks[0].raw == 0.75
    assert agree.warnings == [
        "task_description.md table 0 (line 7), column `Score ↑`: 2 `Your Method` rows where the task has one; read the "
        "one value they hold"
    ]
    differ = grade(tmp_path / "b", task, cell_txt="| Your Method | 0.70 |\n| Your Method | 0.75 |")
    assert differ.subtasks[0].raw is None and differ.note is not None
    assert "with different values (`0.70`, `0.75`): which one is this grading's is unclear" in differ.note


def test_a_table_the_card_names_but_the_file_lacks_shows_in_tasks_show_and_the_grading(tmp_path: Path) -> None:
    subtasks = [
        {"id": "score", "metric": "Score", "direction": "higher", "baseline": 1.0, "sota": 10.0, "json_key": "score"},
        {"id": "other", "metric": "Other", "direction": "higher", "table": 3, "column": "Other ↑"},
    ]
    task = make_tiny_task(tmp_path, [], subtasks=subtasks)
    (task / "grading" / "grade.sh").write_text(JSON_GRADER + CELL_GRADER.removeprefix("#!/usr/bin/env bash\n"))
    shown = labkube("tasks", "show", str(task), cwd=tmp_path)
    assert "subtask other reads table 3, but task_description.md has 1 table(s)" in shown.stdout.replace("\n", " ")
    outcome = grade(tmp_path, task, value_json="7", cell_txt="7")
    assert outcome.subtasks[0].raw == 7.0
    assert "task_description.md as graded has no table 3 (it has 1)" in outcome.warnings


# -- item 4: an error outcome carries no score ------------------------------------------------------------------


def test_values_written_before_the_grader_failed_are_kept_apart_and_no_report_shows_a_score(tmp_path: Path) -> None:
    grader = (
        "#!/usr/bin/env bash\n"
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        'echo "{\\"score\\": $(cat "$ROOT/result.txt")}" > "$ROOT/grading/results.json"\n'
        "echo 'writing the plots failed' >&2\nexit 1\n"
    )
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    (task / "grading" / "grade.sh").write_text(grader)
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["outcome"] == "grader_error"
    assert [result[k] for k in ("score", "beat_baseline", "completion", "flagged_score")] == [None] * 4
    assert result["subtasks"] == [{"id": "score", "raw": None, "fraction_of_sota": None, "gap_closed": None,
                                   "beat_baseline": None, "implausible": None}]  # fmt: skip
    (kept,) = result["values_before_error"]
    assert kept["raw"] == 7.0 and kept["fraction_of_sota"] == pytest.approx(0.7) and kept["beat_baseline"] is True
    last = result["score_curve"][-1]
    assert last["score"] is None and last["values_before_error"][0]["raw"] == 7.0
    table = labkube("report", str(out), cwd=tmp_path).stdout
    rows = [line for line in table.split("Per task, model and scaffold")[0].splitlines() if line.startswith("│")]
    assert rows and not any(" yes " in line for line in rows) and any(" unknown " in line for line in rows)


def test_a_result_written_before_the_rule_reads_without_its_score(tmp_path: Path) -> None:
    """result.json files of earlier versions kept a score beside an error outcome; reports read them without it."""
    from labkube.result import RunResult

    old = {
        "run_id": RUN_ID, "task": "tiny-task", "model": "oracle", "seed": 0, "status": "Failed",
        "outcome": "world_error", "error": "the Gaia2 world failed", "score": 0.0, "beat_baseline": False,
        "completion": 0.0, "primary_scores": {"g": 0.0},
        "subtasks": [{"id": "passed", "raw": 0.0, "fraction_of_sota": 0.0, "gap_closed": 0.0, "beat_baseline": False}],
    }  # fmt: skip
    result = RunResult.model_validate(old)
    assert (result.score, result.beat_baseline, result.completion, result.primary_scores) == (
        None,
        None,
        None,
        {"g": None},
    )
    assert result.subtasks[0].raw is None and result.values_before_error[0].raw == 0.0


def test_a_grader_whose_background_child_holds_its_output_says_so(tmp_path: Path) -> None:
    """Unsandboxed (`--sandbox none`), the grader's child outlives it and holds its stdout until the time-out; in the
    grader's own sandbox the child dies with it and the grading is clean."""
    grader = (
        "#!/usr/bin/env bash\n"
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        'echo "{\\"score\\": $(cat "$ROOT/result.txt")}" > "$ROOT/grading/results.json"\n'
        "sleep 300 &\n"
        "echo graded\n"
    )
    task = make_tiny_task(
        tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}], grading={"timeout_s": 4,
        "summary": "grading/results.json"}
    )  # fmt: skip
    (task / "grading" / "grade.sh").write_text(grader)

    started = time.monotonic()
    sandboxed = grade(tmp_path / "sandboxed", task, result_txt="7")
    assert sandboxed.error is None and sandboxed.subtasks[0].raw == 7.0
    assert time.monotonic() - started < 4

    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--sandbox", "none", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["outcome"] == "grader_error"
    assert result["error"].startswith("grader exited 0, but a process it left running (pid ")
    assert "`sleep 300`) kept its output open until the time-out (4s); killed after 4s: graded" in result["error"]
    pid = result["error"].split("(pid ", 1)[1].split(" ", 1)[0]
    assert not running(pid)  # killed with the grader's session, not left behind


def running(pid: str) -> bool:
    """Whether a process lives (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_grader_still_running_at_its_time_out_says_so(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [], grading={"timeout_s": 2, "summary": "grading/results.json"})
    (task / "grading" / "grade.sh").write_text("#!/usr/bin/env bash\necho 'training the probe'\nsleep 60\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outcome = grade_workspace(load_task(str(task)), workspace, tmp_path / "scratch")
    assert outcome.error == "grader timed out after 2s, still running: training the probe"


def test_status_shows_the_last_gradings_warnings_while_the_run_goes_on(tmp_path: Path) -> None:
    from tinytask import make_run_dir

    from labkube.agent.checkpoint import Checkpoint
    from labkube.agent.harness.entrypoint import write_status
    from labkube.result import Grade
    from labkube.run_spec import RunPhase, RunStatus
    from labkube.store import RunDir, read_model

    rd = RunDir(make_run_dir(tmp_path, make_tiny_task(tmp_path, [])))
    warning = "task_description.md as graded: table 0 (line 7): row at line 10 has 3 cells, header has 2"
    ckpt = Checkpoint(score_curve=[Grade(at_seconds=1.0, score=0.7, warnings=[warning])])
    write_status(rd, rd.spec(), ckpt, RunPhase.running)
    status = read_model(rd.status_json, RunStatus)
    assert status is not None and status.message == f"last grading: {warning}"
