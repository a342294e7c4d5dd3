"""ResearchGym task folders as they ship: tables to subtasks, scoring, grading from the pristine grader."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import labkube
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.task_card import Direction, Subtask
from labkube.tasks import load_task
from labkube.tasks.scoring import beats, fraction_of_sota, gap_closed, score_subtask

MULTI = """# Continual learning

## Baseline results

| Method | ImageNet-R (N = 5) Acc ↑ AAA ↑ | ImageNet-R (N = 10) Acc ↑ AAA ↑ |
| :--- | :---: | :---: |
| L2P | 70.1 (0.3) 75.2 (0.2) | 68.0 (0.1) 72.5 (0.4) |
| CODA-P | 76.3 (0.2) 80.9 (0.5) | 74.9 (0.3) 79.1 (0.2) |
| Your Method | -- -- | -- -- |

Prose in between.

| Method | Forgetting ↓ | Time (s) |
| --- | --- | --- |
| L2P | 5.2 | 300 |
| CODA-P | 4.1 | 280 |
| Your Method | -- | -- |

| Not a results table | x |
| --- | --- |
| a | b |
"""


def write_task(root: Path, md: str) -> Path:
    task = root / "rg-task"
    (task / "grading").mkdir(parents=True)
    (task / "task_description.md").write_text(md)
    (task / "grading" / "grade.sh").write_text("true\n")
    return task


def test_tables_become_subtasks_with_directions_and_best_baselines(tmp_path: Path) -> None:
    card = load_task(str(write_task(tmp_path, MULTI)))
    by_metric = {s.metric: s for s in card.subtasks}
    assert list(by_metric) == [
        "ImageNet-R (N = 5) Acc",
        "ImageNet-R (N = 5) AAA",
        "ImageNet-R (N = 10) Acc",
        "ImageNet-R (N = 10) AAA",
        "Forgetting",
        "Time (s)",
    ]
    assert by_metric["ImageNet-R (N = 5) AAA"].baseline == 80.9
    assert by_metric["ImageNet-R (N = 10) Acc"].baseline == 74.9
    assert by_metric["Forgetting"].direction is Direction.lower and by_metric["Forgetting"].baseline == 4.1
    assert card.primary is not None and card.primary.metric == "ImageNet-R (N = 5) Acc"
    assert any("Time (s)" in w and "no ↑/↓ arrow" in w for w in card.warnings)
    assert any("SOTA" in w for w in card.warnings)


def test_malformed_row_and_missing_table_are_reported_not_raised(tmp_path: Path) -> None:
    bad = MULTI.replace("| CODA-P | 4.1 | 280 |", "| CODA-P | 4.1 |")
    card = load_task(str(write_task(tmp_path / "a", bad)))
    assert any("has 2 cells, header has 3" in w for w in card.warnings)
    proc = labkube("tasks", "show", str(write_task(tmp_path / "b", "# No tables here\n")), cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "no markdown table" in proc.stdout


def test_broken_labkube_yaml_is_a_one_line_error(tmp_path: Path) -> None:
    task = write_task(tmp_path, MULTI)
    (task / "labkube.yaml").write_text("subtasks:\n  - id: acc\n    metric: Acc\n    direction: sideways\n")
    proc = labkube("tasks", "show", str(task), cwd=tmp_path)
    assert proc.returncode == 2 and "labkube.yaml: subtasks.0.direction" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


HIGHER = Subtask(id="acc", metric="Acc", direction=Direction.higher, baseline=60.0, sota=80.0)
LOWER = Subtask(id="err", metric="Err", direction=Direction.lower, baseline=10.0, sota=5.0)


@pytest.mark.parametrize(
    ("subtask", "raw", "fraction", "gap", "beat"),
    [
        (HIGHER, 60.0, 0.75, 0.0, False),
        (HIGHER, 80.0, 1.0, 1.0, True),
        (HIGHER, 70.0, 0.875, 0.5, True),
        (HIGHER, 0.0, 0.0, -3.0, False),
        (LOWER, 10.0, 0.5, 0.0, False),
        (LOWER, 5.0, 1.0, 1.0, True),
        (LOWER, 7.5, 5 / 7.5, 0.5, True),
        (LOWER, 20.0, 0.25, -2.0, False),
    ],
)
def test_normalisation_in_both_directions(
    subtask: Subtask, raw: float, fraction: float, gap: float, beat: bool
) -> None:
    assert fraction_of_sota(raw, subtask) == pytest.approx(fraction)
    assert gap_closed(raw, subtask) == pytest.approx(gap)
    assert beats(raw, subtask) is beat


def test_no_number_means_not_completed() -> None:
    score = score_subtask(None, HIGHER)
    assert not score.completed and score.beat_baseline is None
    assert not score_subtask(float("nan"), HIGHER).completed


async def test_forged_grader_does_not_change_the_score(tmp_path: Path) -> None:
    forge = '#!/usr/bin/env bash\nmkdir -p grading\necho \'{"score": 1000}\' > "$(dirname "$0")/results.json"\n'
    steps = [
        {"tool": "bash", "args": {"command": "echo 2 > result.txt"}},
        {"tool": "write_file", "args": {"path": "grading/grade.sh", "content": forge}},
        {"tool": "bash", "args": {"command": "bash grading/grade.sh && cat grading/results.json"}},
    ]
    result = await run_agent(make_run_dir(tmp_path, make_tiny_task(tmp_path, steps)))
    assert result.subtasks[0].raw == 2.0
    assert result.score == pytest.approx(0.2)


async def test_periodic_grading_builds_a_score_curve(tmp_path: Path) -> None:
    steps = [{"tool": "bash", "args": {"command": f"sleep 0.3; echo {i} > result.txt"}} for i in range(2, 8)]
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, steps), grade_interval_s=0.5)
    result = await run_agent(run_dir)
    raws = [g.subtasks[0].raw for g in result.score_curve]
    assert len(raws) >= 3 and raws[-1] == 7.0
    assert raws == sorted(raws)
    times = [g.at_seconds for g in result.score_curve]
    assert times == sorted(times) and result.score_curve[-1].step == result.spend.steps


async def test_idea_hint_is_withheld_unless_asked(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "ls"}}])
    (task / "idea_hint.txt").write_text("try a bigger number\n")
    (task / "requirements.txt").write_text("numpy\n")
    plain = make_run_dir(tmp_path / "a", task)
    await run_agent(plain)
    assert not (plain / "workspace" / "idea_hint.txt").exists()
    assert not (plain / "workspace" / "requirements.txt").exists()
    assert not (plain / "workspace" / "labkube.yaml").exists()
    hinted = make_run_dir(tmp_path / "b", task, idea_hint=True)
    await run_agent(hinted)
    assert (hinted / "workspace" / "idea_hint.txt").exists()
    assert "try a bigger number" in (hinted / "conversation.jsonl").read_text()
