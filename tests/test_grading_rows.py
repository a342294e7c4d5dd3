"""The grader reads each subtask's own `Your Method` row: a ResearchGym table may hold one per section (cross-modal
retrieval's BLIP ViT-B/16 and ViT-L/16 blocks), and a value filled in the second must not be read from the first."""

from __future__ import annotations

import shutil
from pathlib import Path

from labkube.tasks._markdown import parse_tables
from labkube.tasks.grading import read_values
from labkube.tasks.researchgym import load_researchgym

TASK = Path(__file__).parent / "data" / "researchgym_tasks" / "cross-modal-retrieval"


def test_each_section_reads_its_own_your_method_row(tmp_path: Path) -> None:
    view = tmp_path / "view"
    shutil.copytree(TASK, view)
    card = load_researchgym(view, "researchgym/cross-modal-retrieval")
    first = next(s for s in card.subtasks if s.id == "coco_c_image_blip_vit_b_16_gauss")
    second = next(s for s in card.subtasks if s.id == "coco_c_image_blip_vit_l_16_gauss")
    assert first.table == second.table and (first.row or 0) == 0 and second.row == 1
    md = view / "task_description.md"
    lines = md.read_text().splitlines()
    filled = 0
    for i, line in enumerate(lines):  # fill the table's Your Method rows with 11.0, 22.0 in order
        cells = line.split("|")
        if len(cells) > 2 and cells[1].strip().strip("*").strip().lower() == "your method" and filled < 2:
            table = parse_tables("\n".join(lines))[0][first.table]
            column = table.column(first.column)
            cells[column + 1] = f" {11.0 * (filled + 1):.1f} "
            lines[i] = "|".join(cells)
            filled += 1
    md.write_text("\n".join(lines) + "\n")
    values = read_values(card, view)
    assert values[first.id] == 11.0 and values[second.id] == 22.0
