"""The referee is the one the campaign started with: a run is graded only from the pristine task its campaign pinned,
and only from what this grading wrote.

Through `labkube run` of a tiny task with the oracle (a scripted plan) where a run's outcome is at stake: a grader
changed after the campaign started, a resumed campaign, a shipped `results.json`, a pre-filled `Your Method` row. The
graders are the tasks' own `grade.sh`, run as shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import labkube
from tinytask import DESCRIPTION, make_tiny_task

from labkube.tasks import load_task
from labkube.tasks.grading import grade_workspace
from labkube.tasks.manifest import MANIFEST_FILE, manifest_of, pristine_changes, task_files

RUN_ID = "tiny-task--oracle--s0"
WRITE = {"tool": "bash", "args": {"command": "echo 7 > result.txt"}}
# The agent's first step waits (at most a minute) for the test to say it may go on: the campaign has started.
WAIT_FOR_GO = {"tool": "bash", "args": {"command": "for i in $(seq 600); do [ -f go ] && break; sleep 0.1; done"}}
# What a hostile hand appends to the pristine grader: a score of its choosing, whatever the agent did.
PLANTED_SCORE = '\necho \'{"score": 99}\' > "$TASK_DIR/grading/results.json"\n'
# A grader that ran cleanly and wrote nothing.
SILENT_GRADER = "#!/usr/bin/env bash\necho graded\n"


def report_rows(out: Path) -> tuple[list[dict], list[dict]]:
    rows = labkube("report", str(out), "--format", "json", cwd=out.parent)
    by_scaffold = labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=out.parent)
    assert rows.returncode == 0 and by_scaffold.returncode == 0, rows.stderr + by_scaffold.stderr
    return json.loads(rows.stdout), json.loads(by_scaffold.stdout)


def run(task: Path, out: Path) -> subprocess.CompletedProcess:
    return labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=out.parent)


def assert_never_scored(out: Path, said: str) -> None:
    """The run's outcome is an error naming grading/grade.sh, it has no score, and no report averages it."""
    (row,), (aggregate,) = report_rows(out)
    assert row["outcome"] == "setup_error" and row["status"] == "Failed", said
    assert "the pristine task changed since the campaign started: grading/grade.sh (sha256 differs)" in row["error"]
    assert "re-run the campaign from an intact copy of the task" in row["error"]
    assert row["score"] is None and row["beat_baseline"] is None and row["completion"] is None
    assert aggregate["errors"] == 1 and aggregate["finished"] == 0 and aggregate["mean_score"] is None
    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["score_curve"][-1]["task_changed"] is True and result["subtasks"][0]["raw"] is None


def test_a_grader_appended_to_after_the_campaign_started_fails_the_run_naming_it(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WAIT_FOR_GO, WRITE])
    out = tmp_path / "c"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    argv = [sys.executable, "-P", "-m", "labkube", "run", str(task), "--model", "oracle", "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workspace = out / "runs" / RUN_ID / "workspace"
    deadline = time.monotonic() + 120
    while not (out / "runs" / RUN_ID / "transcript.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
        time.sleep(0.1)
    with (task / "grading" / "grade.sh").open("a") as grader:
        grader.write(PLANTED_SCORE)
    (workspace / "go").write_text("")
    said, _ = proc.communicate(timeout=300)

    assert proc.returncode == 1, said
    assert f"run {RUN_ID} setup_error: the pristine task changed" in said
    assert_never_scored(out, said)


def test_a_resumed_campaign_checks_against_the_task_as_it_first_started(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    out = tmp_path / "c"
    first = run(task, out)
    assert first.returncode == 0, first.stdout + first.stderr
    pinned = json.loads((out / "runs" / RUN_ID / "run.json").read_text())["task_digest"]
    files = task_files(load_task(str(task)))
    assert files is not None and pinned == manifest_of(files).digest

    unfinished = out / "runs" / RUN_ID
    for name in ("result.json", "checkpoint.json", "status.json", "transcript.jsonl", "conversation.jsonl"):
        (unfinished / name).unlink()
    shutil.rmtree(unfinished / "workspace")
    with (task / "grading" / "grade.sh").open("a") as grader:
        grader.write(PLANTED_SCORE)
    again = run(task, out)  # the same command: the campaign resumes, and keeps the digest it pinned first

    assert again.returncode == 1, again.stdout + again.stderr
    assert json.loads((unfinished / "run.json").read_text())["task_digest"] == pinned
    assert_never_scored(out, again.stdout + again.stderr)


def test_a_results_json_shipped_with_the_task_is_no_value_when_the_grader_writes_nothing(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    (task / "grading" / "grade.sh").write_text(SILENT_GRADER)
    (task / "grading" / "results.json").write_text(json.dumps({"score": 9.5}))
    out = tmp_path / "c"
    proc = run(task, out)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,), (aggregate,) = report_rows(out)
    assert row["outcome"] == "no_value" and row["score"] is None and row["beat_baseline"] is None
    assert row["message"].startswith(
        "grading/results.json was shipped with the task and this grading did not rewrite it; ignored; "
        "the grader gave no value for subtask score"
    )
    assert aggregate["mean_score"] is None


def test_a_grader_that_rewrites_the_shipped_summary_is_scored_from_what_it_wrote(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])  # its grader writes grading/results.json from the agent's result.txt
    (task / "grading" / "results.json").write_text(json.dumps({"score": 9.5}))
    out = tmp_path / "c"
    proc = run(task, out)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,), _ = report_rows(out)
    assert row["outcome"] == "scored"
    result = json.loads((out / "runs" / RUN_ID / "result.json").read_text())
    assert result["subtasks"][0]["raw"] == 7.0 and result["score_curve"][-1]["note"] is None


def test_a_summary_rewritten_with_the_very_content_it_shipped_with_still_counts(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    shipped = task / "grading" / "results.json"
    shipped.write_text(json.dumps({"score": 7.0}))  # what the grader will write for result.txt = 7
    an_hour_ago = time.time() - 3600
    os.utime(shipped, (an_hour_ago, an_hour_ago))
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "result.txt").write_text("7\n")

    outcome = grade_workspace(load_task(str(task)), workspace, tmp_path / "scratch")

    assert outcome.error is None and outcome.note is None
    assert outcome.subtasks[0].raw == 7.0


def test_a_filled_your_method_row_shipped_with_the_task_is_no_value_when_the_grader_writes_nothing(
    tmp_path: Path,
) -> None:
    task = make_tiny_task(tmp_path, [WRITE], grading={"timeout_s": 30})  # no JSON summary: the table is the result
    (task / "task_description.md").write_text(DESCRIPTION.replace("| Your Method | -- |", "| Your Method | 9.5 |"))
    (task / "grading" / "grade.sh").write_text(SILENT_GRADER)
    out = tmp_path / "c"
    proc = run(task, out)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,), _ = report_rows(out)
    assert row["outcome"] == "no_value" and row["score"] is None
    assert row["message"].startswith(
        "task_description.md was shipped with the task with a filled Your Method row and this grading did not "
        "rewrite it; its values ignored"
    )


def test_the_final_check_names_every_file_that_changed_appeared_or_vanished(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    card = load_task(str(task))
    files = task_files(card)
    assert files is not None
    pinned = manifest_of(files)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MANIFEST_FILE).write_text(pinned.model_dump_json())
    (task / "notes.txt").write_text("rewritten\n")
    (task / "oracle" / "plan.yaml").unlink()
    (task / "data.csv").write_text("1,2\n")
    (task / "grading" / "grade.sh").chmod(0o755)

    # Every grading checks what the grader is built from; the final one every file.
    every_grading = pristine_changes(card, pinned.digest, run_dir, whole=False)
    final = pristine_changes(card, pinned.digest, run_dir, whole=True)

    assert every_grading is not None and "grading/grade.sh (mode 100644 -> 100755)" in every_grading
    assert "notes.txt" not in every_grading
    assert final is not None
    assert final.startswith(
        "the pristine task changed since the campaign started: data.csv (appeared), grading/grade.sh (mode 100644 "
        "-> 100755), notes.txt (sha256 differs), oracle/plan.yaml (vanished); re-run the campaign"
    )
