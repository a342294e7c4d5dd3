"""Budgets end a run early with the matching reason, and the run is still graded."""

from __future__ import annotations

import json
from pathlib import Path

from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.budgets import Budgets, StopReason
from labkube.run_spec import RunPhase

WRITE_5 = {"tool": "bash", "args": {"command": "echo 5 > result.txt"}}


def transcript(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]


async def test_steps_budget_stops_run_and_still_grades(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5] + [{"tool": "read_file", "args": {"path": "notes.txt"}}] * 10)
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(steps=3))
    result = await run_agent(run_dir)
    assert result.stop_reason is StopReason.steps
    assert result.status is RunPhase.finished
    assert result.spend.steps == 3
    assert result.subtasks[0].raw == 5.0 and result.beat_baseline
    assert result.score == 0.5  # fraction of SOTA (10)


async def test_time_budget_stops_run_and_still_grades(tmp_path: Path) -> None:
    steps = [WRITE_5] + [{"tool": "bash", "args": {"command": "sleep 0.4"}}] * 50
    task = make_tiny_task(tmp_path, steps)
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=1.5 / 3600))
    result = await run_agent(run_dir)
    assert result.stop_reason is StopReason.time
    assert 1.5 <= result.spend.wall_seconds < 4.0
    assert result.subtasks[0].raw == 5.0


async def test_tool_call_is_cut_at_the_end_of_the_time_budget(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "sleep 30", "timeout": 600}}])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=1.0 / 3600))
    result = await run_agent(run_dir)
    assert result.stop_reason is StopReason.time
    assert result.spend.wall_seconds < 5
    call = next(r for r in transcript(run_dir) if r["type"] == "tool_call")
    assert call["ok"] is False and "timed out" in call["output"]


async def test_tokens_budget_counts_scripted_estimates(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "read_file", "args": {"path": "notes.txt"}}] * 20)
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(tokens=400))
    result = await run_agent(run_dir)
    assert result.stop_reason is StopReason.tokens
    assert result.spend.usage.total >= 400
    assert result.subtasks[0].raw is None and not result.beat_baseline


async def test_budget_reminders_reach_the_agent(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "read_file", "args": {"path": "notes.txt"}}] * 12)
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(steps=10))
    await run_agent(run_dir)
    conv = [json.loads(line) for line in (run_dir / "conversation.jsonl").read_text().splitlines()]
    reminders = [m["content"] for m in conv if m["role"] == "user" and "Remaining budget" in m["content"]]
    assert any("nearly exhausted" in r and "steps 1" in r for r in reminders)
