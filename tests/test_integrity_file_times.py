"""When a log was written comes from the run-end record (`workspace-files.json`), not from the file's mtime: copying
a campaign with `cp -r` (which gives every file a new mtime) changes no verdict on re-audit."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cli_helpers import labkube
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.integrity.evidence import WORKSPACE_FILES, WorkspaceFiles, read_tool_calls
from labkube.integrity.rules import SLACK

WRITE_RESULT = {"tool": "bash", "args": {"command": 'python3 -c "print(4.5)" > result.txt'}}
TRAIN_TO_LOG = {"tool": "bash", "args": {"command": "mkdir -p logs && python3 -c \"print('acc 0.5')\" > logs/a.log"}}
BACKDATE_LOG = {"tool": "bash", "args": {"command": "touch -d '2001-01-01 00:00:00 UTC' logs/a.log"}}


async def finished_run(campaign: Path, steps: list[dict]) -> Path:
    task = make_tiny_task(campaign.parent / f"{campaign.name}-task", steps)
    run_dir = make_run_dir(campaign, task)
    await run_agent(run_dir)
    return run_dir


def verdict(run_dir: Path) -> tuple[str, list[str]]:
    report = json.loads((run_dir / "integrity.json").read_text())
    return report["verdict"], sorted(f"{v['check']}:{v['file']}" for v in report["violations"])


def reaudit(run_dir: Path) -> tuple[str, list[str]]:
    proc = labkube("audit", str(run_dir), cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    return verdict(run_dir)


async def test_copying_a_campaign_with_cp_r_changes_no_verdict(tmp_path: Path) -> None:
    campaign = tmp_path / "campaign"
    honest = await finished_run(campaign, [TRAIN_TO_LOG, WRITE_RESULT])
    # a log a process wrote, dated to when no command ran: the record keeps that date through the copy
    backdated = await finished_run(tmp_path / "other" / "campaign", [TRAIN_TO_LOG, BACKDATE_LOG, WRITE_RESULT])
    (campaign / "runs" / "backdated").parent.mkdir(exist_ok=True)
    subprocess.run(["cp", "-r", str(backdated), str(campaign / "runs" / "backdated")], check=True)
    before = {"honest": verdict(honest), "backdated": verdict(backdated)}
    assert before["honest"] == ("PASS", [])
    assert before["backdated"] == ("SUSPICIOUS", ["unexplained_outputs:logs/a.log"])

    time.sleep(SLACK.total_seconds() + 0.5)  # a copy made later than the audit's slack after the last command
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(campaign), str(copy)], check=True)  # real cp -r: every file gets a new mtime
    copied_log = copy / "runs" / honest.name / "workspace" / "logs" / "a.log"
    assert datetime.fromtimestamp(copied_log.stat().st_mtime, UTC) > json_finished_at(honest) + SLACK
    after = {"honest": reaudit(copy / "runs" / honest.name), "backdated": reaudit(copy / "runs" / "backdated")}
    assert after == before


def json_finished_at(run_dir: Path) -> datetime:
    return datetime.fromisoformat(json.loads((run_dir / "result.json").read_text())["finished_at"])


async def test_record_holds_each_changed_files_content_id_and_time(tmp_path: Path) -> None:
    run_dir = await finished_run(tmp_path / "campaign", [TRAIN_TO_LOG, WRITE_RESULT])
    record = WorkspaceFiles.model_validate_json((run_dir / WORKSPACE_FILES).read_text())
    assert set(record.files) == {"logs/a.log", "result.txt"}
    blob = subprocess.run(
        ["git", "hash-object", str(run_dir / "workspace" / "logs" / "a.log")], capture_output=True, text=True
    ).stdout.strip()
    assert record.files["logs/a.log"].blob == blob


async def test_a_log_changed_after_the_run_ended_needs_review(tmp_path: Path) -> None:
    run_dir = await finished_run(tmp_path / "campaign", [TRAIN_TO_LOG, WRITE_RESULT])
    (run_dir / "workspace" / "logs" / "a.log").write_text("acc 0.99\n")
    assert reaudit(run_dir) == ("NEEDS_REVIEW", ["unexplained_outputs:logs/a.log"])


async def test_a_run_without_a_record_ignores_file_times_later_than_its_end(tmp_path: Path) -> None:
    """Runs finished before the record existed: a file time after the run's end is a copy's, not evidence."""
    run_dir = await finished_run(tmp_path / "campaign", [TRAIN_TO_LOG, WRITE_RESULT])
    (run_dir / WORKSPACE_FILES).unlink()
    later = json_finished_at(run_dir) + timedelta(minutes=5)
    subprocess.run(["touch", "-d", later.isoformat(), str(run_dir / "workspace" / "logs" / "a.log")], check=True)
    assert reaudit(run_dir) == ("PASS", [])
    backdated = await finished_run(tmp_path / "b" / "campaign", [TRAIN_TO_LOG, BACKDATE_LOG, WRITE_RESULT])
    (backdated / WORKSPACE_FILES).unlink()
    assert reaudit(backdated) == ("SUSPICIOUS", ["unexplained_outputs:logs/a.log"])


def test_a_cli_agents_calls_span_from_when_they_started(tmp_path: Path) -> None:
    """Vendor CLI transcripts (cli_events.tool_line) say when a call started, not how long it took."""
    ended = datetime(2025, 1, 1, 12, 0, 10, tzinfo=UTC)
    started = ended - timedelta(seconds=8)
    line = {"type": "tool_call", "step": 1, "ts": ended.isoformat(), "started": started.isoformat(), "tool": "bash"}
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text(json.dumps({**line, "args": {"command": "python3 train.py"}, "ok": True}) + "\n")
    (call,) = read_tool_calls(transcript)
    assert (call.started, call.ended) == (started, ended)


async def test_the_agents_audit_from_what_it_holds_is_the_audit_from_the_files(tmp_path: Path) -> None:
    """The agent audits with its spec, its result and its run-end record in hand (GAIA grades nothing in the
    workspace, so the record's changes are the audit's); `labkube audit` reads each from the run's files. Both say
    the same of a run whose workspace changed."""
    from test_gaia_family import ROWS, dataset, run_question

    d = dataset(tmp_path, ROWS, {"nums.txt": "1000\n250\n"})
    result, run_dir = await run_question(tmp_path, d, "q1", "FINAL ANSWER: 1250")
    record = WorkspaceFiles.model_validate_json((run_dir / WORKSPACE_FILES).read_text())
    assert set(record.files) == {"x"}
    by_agent = json.loads((run_dir / "integrity.json").read_text())
    assert result.integrity_verdict == by_agent["verdict"]
    assert json.loads((run_dir / "result.json").read_text())["integrity_verdict"] == by_agent["verdict"]
    reaudit(run_dir)
    by_files = json.loads((run_dir / "integrity.json").read_text())
    for report in (by_agent, by_files):
        report.pop("audited_at")
    assert by_agent == by_files
