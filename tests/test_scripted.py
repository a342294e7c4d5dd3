"""Scripted providers: the oracle plan (with `{{seed}}`), noop, and the replay of a recorded transcript."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.providers.scripted import PlanError, load_plan, replay_provider
from labkube.budgets import StopReason


async def test_replay_of_a_recorded_run_reproduces_it(tmp_path: Path) -> None:
    steps = [
        {"tool": "bash", "args": {"command": "echo {{seed}}9 > result.txt"}},
        {"tool": "read_file", "args": {"path": "result.txt"}},
    ]
    task = make_tiny_task(tmp_path, steps)
    original = await run_agent(make_run_dir(tmp_path / "a", task, seed=4))
    assert original.subtasks[0].raw == 49.0  # `{{seed}}` in a plan is the run's seed
    recorded = tmp_path / "a" / "runs" / original.run_id / "transcript.jsonl"
    replayed = await run_agent(make_run_dir(tmp_path / "b", task, model=f"replay:{recorded}"))
    assert replayed.subtasks[0].raw == 49.0
    assert replayed.spend.steps == original.spend.steps
    assert replayed.stop_reason is StopReason.done


async def test_noop_does_nothing_and_ends(tmp_path: Path) -> None:
    result = await run_agent(make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="noop"))
    assert result.spend.steps == 1 and result.subtasks[0].raw is None and not result.beat_baseline


def test_bad_plans_and_transcripts_say_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "plan.yaml"
    bad.write_text("steps:\n  - tool: bash\n    argz: {}\n")
    with pytest.raises(PlanError, match="not a valid plan"):
        load_plan(bad)
    empty = tmp_path / "t.jsonl"
    empty.write_text('{"type": "start"}\n')
    with pytest.raises(PlanError, match="no tool calls"):
        replay_provider(empty)
