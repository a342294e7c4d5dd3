"""Primary subtasks as the task tags them (issue #23, item 6).

A task may mark several groups `[Primary sub-task]` (cross-modal retrieval: its person Re-ID datasets and
Flickr): the card keeps each, a run reports a score per group, and `labkube tasks show` warns about a mark it
could not attach, and about a task that trains on a GPU by its own files but asks for none. Through the CLI,
on ResearchGym's own task descriptions where they show it and on small tasks made here where they do not.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import yaml
from cli_helpers import labkube
from click.testing import CliRunner

from labkube.cli import main

REAL_TASKS = Path(__file__).parent / "data" / "researchgym_tasks"


def show(*args: str) -> str:
    result = CliRunner().invoke(main, ["tasks", "show", *args], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.stdout


def show_card(task: Path) -> dict:
    return json.loads(show("--json", str(task)))[0]


def groups_of(card: dict) -> dict[str, str]:
    return {s["primary_group"]: s["id"] for s in card["subtasks"] if s["primary_group"]}


def test_cross_modal_retrieval_keeps_both_primary_groups() -> None:
    """`CUHK-PEDES and ICFG-PEDES (person Re-ID)[Primary sub-tasks], and COCO, Flickr [Primary sub-task]`."""
    card = show_card(REAL_TASKS / "cross-modal-retrieval")
    assert groups_of(card) == {
        "Flickr": "clip_vit_b_16_base2flickr_i2tr_at_1",
        "person Re-ID": "reid_cuhk2icfg_t2ir_at_1",  # the ReID table, by its label
    }
    assert [s["id"] for s in card["subtasks"] if s["primary"]] == ["clip_vit_b_16_base2flickr_i2tr_at_1"]
    text = show(str(REAL_TASKS / "cross-modal-retrieval"))
    assert "primary groups (a score each): Flickr (clip_vit_b_16_base2flickr_i2tr_at_1), person Re-ID" in text
    assert "Primary sub-task], but no table" not in text


def test_tasks_with_one_mark_keep_one_group_heading_their_primary() -> None:
    for task in ("continual-learning", "materials-tokenization", "time-series-explanation"):
        card = show_card(REAL_TASKS / task)
        primary = next(s["id"] for s in card["subtasks"] if s["primary"])
        assert list(groups_of(card).values()) == [primary], task


TWO_TABLES = """# Two benchmarks

## Experimental Settings
- **Datasets**: Alpha [Primary sub-task], Zeta [Primary sub-task], and Beta.

## Baseline Results (to beat)

**Alpha**

| Method | Acc ↑ |
| :--- | ---: |
| Baseline | 1.0 |
| Your Method | -- |

**Beta**

| Method | Acc ↑ |
| :--- | ---: |
| Baseline | 2.0 |
| Your Method | -- |
"""


def test_a_mark_that_names_no_table_is_warned_about_with_the_line_that_attaches_it(tmp_path: Path) -> None:
    task = tmp_path / "two-benchmarks"
    task.mkdir()
    (task / "task_description.md").write_text(TWO_TABLES)
    assert groups_of(show_card(task)) == {"Alpha": "alpha_acc"}
    gaps = show(str(task)).split("could not infer:")[1]
    fix = '`subtasks: [{id: <id>, primary_group: "Zeta"}]`'
    assert (
        "task_description.md line 4 marks 'Zeta' [Primary sub-task], but no table, section or column names it: "
        f"no score is reported for it; to report one, add to labkube.yaml {fix}"
    ) in gaps

    (task / "labkube.yaml").write_text(fix.strip("`").replace("<id>", "beta_acc") + "\n")
    assert groups_of(show_card(task)) == {"Alpha": "alpha_acc", "Zeta": "beta_acc"}
    assert "Zeta" not in show(str(task)).split("could not infer:")[1]


def test_labkube_yaml_moves_a_group_to_another_subtask(tmp_path: Path) -> None:
    task = tmp_path / "two-benchmarks"
    task.mkdir()
    (task / "task_description.md").write_text(TWO_TABLES)
    (task / "labkube.yaml").write_text('subtasks: [{id: beta_acc, primary_group: "Alpha"}]\n')
    assert groups_of(show_card(task)) == {"Alpha": "beta_acc"}


# ResearchGym's continual-learning ships this requirements.txt head (upstream, at the fixtures' commit).
CUDA_REQUIREMENTS = """--extra-index-url https://download.pytorch.org/whl/cu124
torch==2.5.1+cu124
torchvision==0.20.1+cu124
"""
GPU_FIX = "add to labkube.yaml `resources: {gpus: 1}`"


def test_a_task_that_trains_on_cuda_but_asks_for_no_gpu_is_warned(tmp_path: Path) -> None:
    task = tmp_path / "continual-learning"
    shutil.copytree(REAL_TASKS / "continual-learning", task)
    assert GPU_FIX not in show(str(task))  # its description names no GPU
    (task / "requirements.txt").write_text(CUDA_REQUIREMENTS)
    text = show(str(task))
    assert (
        "requirements.txt line 1 says the task uses a GPU (`--extra-index-url https://download.pytorch.org/whl/cu124`) "
        f"(and 2 more lines), but the card gives its runs none (resources.gpus: 0): {GPU_FIX}"
    ) in text

    (task / "labkube.yaml").write_text("resources: {gpus: 1}\n")
    text = show(str(task))
    assert "resources: 1 GPU" in text and GPU_FIX not in text


def test_the_description_naming_gpu_training_is_warned_and_a_cpu_only_one_is_not(tmp_path: Path) -> None:
    task = tmp_path / "two-benchmarks"
    task.mkdir()
    (task / "task_description.md").write_text(
        TWO_TABLES.replace("- **Datasets**", "- Train on one GPU (CUDA 12).\n- **Datasets**")
    )
    assert "task_description.md line 4 says the task uses a GPU (`- Train on one GPU (CUDA 12).`)" in show(str(task))
    (task / "task_description.md").write_text(
        TWO_TABLES.replace("- **Datasets**", "- CPU-only: no GPU is needed.\n- **Datasets**")
    )
    assert GPU_FIX not in show(str(task))


# -- a run's score per primary group --------------------------------------------------------------------------

FILL_ROWS = """#!/usr/bin/env bash
set -euo pipefail
TASK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 - "$TASK_DIR" <<'PY'
import pathlib, sys
root = pathlib.Path(sys.argv[1])
md = root / "task_description.md"
lines, filled = md.read_text().splitlines(), 0
for name in ("alpha", "beta"):  # each table's Your Method row, in order, from <name>.txt
    result = root / f"{name}.txt"
    value = result.read_text().strip() if result.exists() else "--"
    i = [n for n, line in enumerate(lines) if line.startswith("| Your Method |")][filled]
    lines[i] = f"| Your Method | {value} |"
    filled += 1
md.write_text("\\n".join(lines) + "\\n")
PY
"""


def test_a_run_reports_a_score_per_primary_group_in_every_format(tmp_path: Path) -> None:
    task = tmp_path / "two-benchmarks"
    (task / "grading").mkdir(parents=True)
    (task / "oracle").mkdir()
    (task / "task_description.md").write_text(TWO_TABLES)
    (task / "grading" / "grade.sh").write_text(FILL_ROWS)
    steps = [{"tool": "bash", "args": {"command": "echo 3.5 > alpha.txt"}}]  # Zeta's (Beta's) value never comes
    (task / "oracle" / "plan.yaml").write_text(yaml.safe_dump({"steps": steps}))
    attach = {"id": "beta_acc", "primary_group": "Zeta"}
    (task / "labkube.yaml").write_text(yaml.safe_dump({"oracle": "oracle/plan.yaml", "subtasks": [attach]}))
    out = tmp_path / "c"
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    (row,) = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert row["score"] == 3.5
    assert row["primary_scores"] == {"Alpha": 3.5, "Zeta": None}  # unknown, not 0
    result = json.loads((out / "runs" / row["run_id"] / "result.json").read_text())
    assert result["primary_scores"] == {"Alpha": 3.5, "Zeta": None}

    (csv_row,) = csv.DictReader(io.StringIO(labkube("report", str(out), "--format", "csv", cwd=tmp_path).stdout))
    assert json.loads(csv_row["primary_scores"]) == {"Alpha": 3.5, "Zeta": None}
    (agg,) = json.loads(labkube("report", str(out), "--format", "json", "--by", "scaffold", cwd=tmp_path).stdout)
    assert agg["mean_primary_scores"] == {"Alpha": 3.5, "Zeta": None}

    text = labkube("report", str(out), cwd=tmp_path).stdout
    header, body = text.split("┡", 1)
    assert "primary" in header and "groups" in header  # the column is there only for such a task
    assert "Alpha 3.500" in body and "Zeta —" in body  # one group a line

    page = tmp_path / "r.html"
    assert labkube("report", str(out), "--format", "html", "--out", str(page), cwd=tmp_path).returncode == 0
    html = page.read_text()
    assert html.count('data-group="Alpha">Alpha 3.500<') == 2  # the run's row and its task's aggregate
    assert html.count('data-group="Zeta">Zeta —<') == 2
