"""Relative scenario, task and `replay:` paths resolve against the user's working directory and are stored absolute
(issue #23, item 8): each run's processes work in their own directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import labkube
from export_helpers import WHITFIELD, replay_model
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec, absolute_task_ref, resolve_local_paths
from labkube.runs_cli import campaign_here
from labkube.store import CampaignDir
from labkube.tasks import BUNDLED


@pytest.mark.gaia2
def test_relative_scenario_and_replay_paths_resolve_against_the_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "broken").mkdir(parents=True)
    shutil.copy(BUNDLED / "gaia2" / "execution_budget_email.json", work / "broken" / "x.json")
    replay_model(work / "plan.jsonl", WHITFIELD)
    proc = labkube("run", "broken/x.json", "--model", "replay:plan.jsonl", "--out", "c", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = json.loads((work / "c" / "campaign.json").read_text())["spec"]
    assert spec["tasks"] == [str(work / "broken" / "x.json")]
    assert spec["models"] == [f"replay:{work / 'plan.jsonl'}"]
    (run_dir,) = (work / "c" / "runs").iterdir()
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["task"], run["model"]) == (spec["tasks"][0], spec["models"][0])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] == 1.0, result.get("error")


def test_a_missing_replay_file_is_refused_up_front(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = labkube("run", str(task), "--model", "replay:runs/gone.jsonl", "--out", "c", cwd=work, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{work}/runs/gone.jsonl not found" in line and "transcript.jsonl" in line
    assert not (work / "c").exists()


def test_a_replay_file_without_tool_calls_is_refused_up_front(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    (tmp_path / "empty.jsonl").write_text('{"type": "start"}\n')
    proc = labkube("run", str(task), "--model", "replay:empty.jsonl", "--out", "c", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "holds no tool calls" in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "c").exists()


def test_only_references_to_paths_that_are_here_become_absolute(tmp_path: Path) -> None:
    (tmp_path / "data" / "gaia").mkdir(parents=True)
    (tmp_path / "gaia2").mkdir()
    assert absolute_task_ref("data/gaia#q1", tmp_path) == f"{tmp_path}/data/gaia#q1"
    assert absolute_task_ref("./data/gaia/", tmp_path) == f"{tmp_path}/data/gaia"
    assert absolute_task_ref("gaia2", tmp_path) == "gaia2"  # every bundled scenario, whatever is here
    assert absolute_task_ref("researchgym/continual-learning-lite", tmp_path) == "researchgym/continual-learning-lite"
    assert absolute_task_ref("/abs/task/", tmp_path) == "/abs/task/"


def test_a_campaign_written_with_relative_paths_resumes_as_it_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytask").mkdir()
    (tmp_path / "plan.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    typed = CampaignSpec(tasks=["mytask"], models=["replay:plan.jsonl"])
    cdir = CampaignDir(tmp_path / "c")
    cdir.write_campaign(typed, [])
    assert campaign_here(typed, cdir) == typed  # finished runs keep their task names: one group per task
    fresh = CampaignDir(tmp_path / "new")
    assert campaign_here(typed, fresh) == resolve_local_paths(typed, tmp_path)
    assert campaign_here(typed, fresh).tasks == [str(tmp_path / "mytask")]
