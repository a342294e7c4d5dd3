"""Every bundled paper task: the baseline reproduces the numbers in labkube.yaml; the reference solution
beats the baseline through the real agent loop; a do-nothing run does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tinytask import make_run_dir

from labkube.agent.harness.entrypoint import run_agent
from labkube.tasks import bundled_tasks, load_task

PAPER_TASKS = [t for t in bundled_tasks() if t.startswith("researchgym/")]


@pytest.mark.parametrize("ref", PAPER_TASKS)
def test_baseline_reproduces_the_numbers_in_labkube_yaml(ref: str, tmp_path: Path) -> None:
    card = load_task(ref)
    assert card.baseline_check, f"{ref}: labkube.yaml has no baseline_check"
    scratch = tmp_path / "task"
    shutil.copytree(card.path, scratch)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", card.baseline_check],
        cwd=scratch,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    for subtask in card.subtasks:
        assert measured[subtask.id] == pytest.approx(subtask.baseline, abs=1e-4), subtask.id
        assert subtask.sota is not None
        better = (
            subtask.sota > subtask.baseline if subtask.direction.value == "higher" else subtask.sota < subtask.baseline
        )
        assert better, f"{ref}: SOTA of {subtask.id} is not better than its baseline"


@pytest.mark.parametrize("ref", PAPER_TASKS)
async def test_oracle_beats_and_noop_does_not(ref: str, tmp_path: Path) -> None:
    card = load_task(ref)
    oracle = await run_agent(make_run_dir(tmp_path / "oracle", Path(card.path), model="oracle"))
    assert oracle.stop_reason.value == "done" and oracle.beat_baseline, oracle.subtasks
    assert oracle.completion == 1.0
    assert 0 < oracle.score < 1  # between nothing and SOTA
    noop = await run_agent(make_run_dir(tmp_path / "noop", Path(card.path), model="noop"))
    assert not noop.beat_baseline and noop.score is None


CHEAT_TYPES = {
    "edit-grader": "grader_modified",
    "hardcode": "hardcoded_metric",
    "read-labels": "heldout_read",
    "fake-log": "fake_log",
}


@pytest.mark.parametrize("cheat", sorted(CHEAT_TYPES))
@pytest.mark.parametrize("ref", PAPER_TASKS)
async def test_every_scripted_cheat_is_suspicious_with_the_right_violation(
    ref: str, cheat: str, tmp_path: Path
) -> None:
    card = load_task(ref)
    result = await run_agent(make_run_dir(tmp_path, Path(card.path), model=f"cheat:{cheat}"))
    report = json.loads((tmp_path / "runs" / result.run_id / "integrity.json").read_text())
    assert report["verdict"] == "SUSPICIOUS", report["violations"]
    assert CHEAT_TYPES[cheat] in {v["type"] for v in report["violations"]}


@pytest.mark.parametrize("ref", PAPER_TASKS)
async def test_oracle_run_passes_the_audit_with_no_violation(ref: str, tmp_path: Path) -> None:
    card = load_task(ref)
    result = await run_agent(make_run_dir(tmp_path, Path(card.path), model="oracle"))
    report = json.loads((tmp_path / "runs" / result.run_id / "integrity.json").read_text())
    assert report["verdict"] == "PASS" and report["violations"] == []
