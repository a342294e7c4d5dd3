"""Every run ends in exactly one outcome, and a failure never reads as a result (issue #23, item 1).

Through the CLI, as a user meets them: a grader that crashes, a grader that runs cleanly but writes no value,
a periodic grading that fails while the run goes on. The grader is the task's own `grade.sh`, run as shipped.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from cli_helpers import labkube
from tinytask import make_tiny_task

WRITE = {"tool": "bash", "args": {"command": "echo 7 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "notes.txt"}}

# A grader that fails the way real ones do: a missing module, a traceback on stderr, exit 3.
CRASHING_GRADER = """#!/usr/bin/env bash
echo "loading the predictions" >&2
echo "Traceback (most recent call last):" >&2
echo "ModuleNotFoundError: No module named 'sklearn'" >&2
exit 3
"""


def run(task: Path, out: Path, *extra: str) -> tuple[int, str, list[dict]]:
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), *extra, cwd=out.parent)
    report = labkube("report", str(out), "--format", "json", cwd=out.parent)
    assert report.returncode == 0, report.stderr
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report.stdout)


def test_a_grader_that_crashes_is_a_grader_error_in_every_report_and_exits_1(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    (task / "grading" / "grade.sh").write_text(CRASHING_GRADER)
    out = tmp_path / "c"
    code, said, (row,) = run(task, out)

    assert code == 1, said
    assert f"run {row['run_id']} grader_error: grader exited 3:" in said
    assert row["status"] == "Failed" and row["outcome"] == "grader_error"
    assert "ModuleNotFoundError: No module named 'sklearn'" in row["error"]
    assert row["score"] is None and row["beat_baseline"] is None and row["completion"] is None

    result = json.loads((out / "runs" / row["run_id"] / "result.json").read_text())
    assert result["outcome"] == "grader_error" and "exited 3" in result["error"]

    by_scaffold = json.loads(labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=tmp_path).stdout)
    assert by_scaffold[0]["errors"] == 1 and by_scaffold[0]["finished"] == 0
    assert by_scaffold[0]["mean_score"] is None and by_scaffold[0]["mean_completion"] is None

    table = csv.DictReader(io.StringIO(labkube("report", str(out), "--format", "csv", cwd=tmp_path).stdout))
    (csv_row,) = list(table)
    assert csv_row["outcome"] == "grader_error" and "No module named 'sklearn'" in csv_row["error"]

    html_file = tmp_path / "r.html"
    assert labkube("report", str(out), "--format", "html", "--out", str(html_file), cwd=tmp_path).returncode == 0
    html = html_file.read_text()
    assert "grader_error" in html and "No module named &#39;sklearn&#39;" in html

    status = labkube("status", str(out), cwd=tmp_path)
    assert "grader_error" in status.stdout and "sklearn" in status.stdout

    text = labkube("report", str(out), cwd=tmp_path).stdout
    assert "grader_error" in text and "sklearn" in text


def test_a_clean_grading_with_no_value_names_the_subtask_and_what_the_grader_printed(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [READ])  # never writes result.txt: the grader prints "score None"
    out = tmp_path / "c"
    code, said, (row,) = run(task, out)

    assert code == 0, said  # a grading that gave no value is a measurement of the agent, not an error
    assert row["status"] == "Finished" and row["outcome"] == "no_value"
    assert row["score"] is None and row["beat_baseline"] is None
    assert row["message"].startswith("the grader gave no value for subtask score;")
    assert "score None" in row["message"]
    assert row["error"] is None

    aggregate = json.loads(labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=tmp_path).stdout)
    assert aggregate[0]["errors"] == 0 and aggregate[0]["finished"] == 1
    assert aggregate[0]["mean_score"] is None and aggregate[0]["beat_baseline"] == 0


def test_a_failing_periodic_grading_shows_in_the_curve_and_the_run_goes_on(tmp_path: Path) -> None:
    # The grader fails until the agent's result exists; the run is graded after every step.
    grader = (
        "#!/usr/bin/env bash\n"
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        '[ -f "$ROOT/result.txt" ] || { echo "no result.txt yet" >&2; exit 4; }\n'
        'echo "{\\"score\\": $(cat "$ROOT/result.txt")}" > "$ROOT/grading/results.json"\n'
    )
    task = make_tiny_task(tmp_path, [READ, READ, WRITE])
    (task / "grading" / "grade.sh").write_text(grader)
    out = tmp_path / "c"
    code, said, (row,) = run(task, out, "--grade-interval", "0.001")

    assert code == 0, said
    assert row["outcome"] == "scored" and row["score"] is not None
    curve = json.loads((out / "runs" / row["run_id"] / "result.json").read_text())["score_curve"]
    failed = [g for g in curve if g["error"]]
    assert failed and all(g["error"] == "grader exited 4: no result.txt yet" for g in failed)
    assert curve[-1]["error"] is None and curve[-1]["score"] == row["score"]
    transcript = (out / "runs" / row["run_id"] / "transcript.jsonl").read_text().splitlines()
    steps_after_a_failed_grading = [
        json.loads(line) for line in transcript[next(i for i, line in enumerate(transcript) if "exited 4" in line) :]
    ]
    assert any(e["type"] == "tool_call" for e in steps_after_a_failed_grading)


def test_status_says_the_last_grading_failed_while_the_run_goes_on(tmp_path: Path) -> None:
    from tinytask import make_run_dir

    from labkube.agent.checkpoint import Checkpoint
    from labkube.agent.harness.entrypoint import write_status
    from labkube.result import Grade
    from labkube.run_spec import RunPhase, RunStatus
    from labkube.store import RunDir, read_model

    rd = RunDir(make_run_dir(tmp_path, make_tiny_task(tmp_path, [READ])))
    ckpt = Checkpoint(score_curve=[Grade(at_seconds=1.0, error="grader exited 4: no result.txt yet")])
    write_status(rd, rd.spec(), ckpt, RunPhase.running)
    status = read_model(rd.status_json, RunStatus)
    assert status is not None and status.phase is RunPhase.running
    assert status.message == "last grading failed (the run goes on): grader exited 4: no result.txt yet"


def test_a_judge_that_cannot_be_reached_is_a_judge_error_left_out_of_pass_at_k(tmp_path: Path) -> None:
    """ARE's soft judge on an endpoint that refuses connections (nothing listens on port 9): the real world
    process, the real ARE judge through LiteLLM; the agent is a replay whose email words differ from the
    oracle's, so the soft check has to ask the model."""
    send = {
        "recipients": ["dana.whitfield@northwind.example"],
        "cc": ["marco.bianchi@northwind.example"],
        "subject": "Q3 budget final",
        "content": "Reworded.",
    }
    calls = [("EmailClientV2__send_email", send), ("AgentUserInterface__send_message_to_user", {"content": "Sent."})]
    plan = tmp_path / "plan.jsonl"
    plan.write_text(
        "".join(
            json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) + "\n"
            for n, a in calls
        )
    )
    out = tmp_path / "c"
    judge = "openai-compatible:http://127.0.0.1:9/v1#judge"
    proc = labkube(
        "run", "gaia2/execution_budget_email", "--model", f"replay:{plan}", "--seeds", "2", "--judge-model", judge,
        "--out", str(out), cwd=tmp_path,
    )  # fmt: skip

    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if " judge_error: " in line]
    assert len(lines) == 2 and all("ARE's judge failed:" in x and "Connection error" in x for x in lines), proc.stderr
    rows = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert [r["outcome"] for r in rows] == ["judge_error", "judge_error"]
    assert all(r["score"] is None and r["status"] == "Failed" for r in rows)
    verdict = json.loads((out / "runs" / rows[0]["run_id"] / "result.json").read_text())["details"]["gaia2"]
    assert verdict["soft_checks"].startswith("failed") and "Connection error" in verdict["exception"]

    table = labkube("report", str(out), cwd=tmp_path).stdout
    (execution,) = [line for line in table.splitlines() if line.startswith("│ execution")]
    cells = [c.strip() for c in execution.strip("│").split("│")]
    assert cells[3] == "unknown" and cells[-1] == "2"  # pass@1 unknown, 2 attempts excluded: not two failures
