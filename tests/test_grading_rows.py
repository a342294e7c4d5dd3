"""Every value a task's own grader writes is read back: the real ResearchGym graders fill the tables (no cell is
filled by hand here), and labkube reads each subtask's value from what they wrote.

- materials-tokenization: its writer (`grading/aggregate_results.py`, `upsert_row`) fills the `Micro-F1` row in
  place but appends each `| Your Method | Macro-F1 | ...` row at the end of the table's section, outside the
  first table; all 36 values must be read.
- cross-modal-retrieval: one `Your Method` row per section (BLIP ViT-B/16, ViT-L/16); each section's value is
  read from its own row, all 95 of them.

Both graders run as the tasks ship them, through `grade_workspace` (the grading view, the pristine grading
files), on predictions planted in the shapes the tasks' training scripts write (pandas frames pickled by
`ner.py` and `relation_classification.py`, `pc_summary.json`, `gen_summary.json`; `config.yaml` and
`evaluate.txt` per retrieval run). The grader's outputs are not faked: only its inputs are made up.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from labkube.integrity.rules import only_your_method_rows
from labkube.task_card import Subtask, TaskCard
from labkube.tasks._markdown import parse_tables
from labkube.tasks.grading import grade_workspace, read_values
from labkube.tasks.researchgym import TaskError, load_researchgym

REAL_TASKS = Path(__file__).parent / "data" / "researchgym_tasks"
MATERIALS = REAL_TASKS / "materials-tokenization"
CROSS_MODAL = REAL_TASKS / "cross-modal-retrieval"
# What the real writer made of MATERIALS' description from the predictions below (see its README).
GRADED = Path(__file__).parent / "data" / "researchgym_graded" / "materials-tokenization"
REGENERATE = "LABKUBE_REGENERATE_FIXTURES"

# The writer's column keys, in the order of the tables' columns (aggregate_results.py).
GENERATION_KEYS = ["NER", "RC", "EAE", "PC", "SAR", "SC", "SF"]
CLASSIFICATION_KEYS = [
    f"{task}_{split}" for task in ("ner_sofc", "ner_matscholar", "sf", "rc", "pc") for split in ("val", "test")
]
SEEDS = (42, 43, 44)
MODEL = "MatSciBERT_100000"  # grade.py's default MODEL_NAME, which names the result pickles


def spread(mean: float) -> list[float]:
    """Three seeds' values around `mean` (mean exactly `mean`, a spread the writer prints after ±)."""
    return [mean - 0.002, mean, mean + 0.002]


def planted_means() -> dict[tuple[str, str, str], float]:
    """A distinct mean per (table, metric, column key), 30.0, 31.1, 32.2, ... in percent, so a value read from
    the wrong row or column cannot pass. PC* is one accuracy the writer puts in both metric rows."""
    means: dict[tuple[str, str, str], float] = {}
    n = 0
    for metric in ("micro", "macro"):
        for key in GENERATION_KEYS:
            means[("generation", metric, key)] = round(0.30 + 0.011 * n, 4)
            n += 1
        for key in CLASSIFICATION_KEYS:
            if key.startswith("pc_") and metric == "macro":
                means[("classification", metric, key)] = means[("classification", "micro", key)]
                continue
            means[("classification", metric, key)] = round(0.30 + 0.011 * n, 4)
            n += 1
    return means


def result_frame(means: dict[tuple[str, str, str], float], task: str, best: str) -> pd.DataFrame:
    """What `ner.py` / `relation_classification.py` pickle: rows `Val <metric>` / `Test <metric>`, the metric
    they select on first, one column per seed."""
    other = "micro_f1" if best == "macro_f1" else "macro_f1"
    index = [f"Val {best}", f"Test {best}", f"Val {other}", f"Test {other}"]
    rows = [
        spread(means[("classification", metric.split("_")[0], f"{task}_{split.lower()}")])
        for split, metric in (("Val", best), ("Test", best), ("Val", other), ("Test", other))
    ]
    return pd.DataFrame(rows, index=index)


def plant_predictions(preds: Path, means: dict[tuple[str, str, str], float]) -> None:
    """The prediction folder as grade.py's subtasks leave it, for `grade.py --aggregate-only` to aggregate."""
    for dataset, task in (("sofc", "ner_sofc"), ("sofc_slot", "sf")):  # 5 folds; ner.py selects on macro-F1
        for fold in range(1, 6):
            folder = preds / "ner" / dataset / f"cv_{fold}"
            folder.mkdir(parents=True)
            with (folder / f"res_{MODEL}_bert-crf.pkl").open("wb") as fh:
                pickle.dump(result_frame(means, task, "macro_f1"), fh)
    folder = preds / "ner" / "matscholar"
    folder.mkdir(parents=True)
    with (folder / f"res_{MODEL}_bert-crf.pkl").open("wb") as fh:
        pickle.dump(result_frame(means, "ner_matscholar", "micro_f1"), fh)
    folder = preds / "relation_classification"
    folder.mkdir(parents=True)
    with (folder / f"res_{MODEL}.pkl").open("wb") as fh:
        pickle.dump(result_frame(means, "rc", "macro_f1"), fh)
    (preds / "cls").mkdir()
    pc = {
        "val_accuracy_list": spread(means[("classification", "micro", "pc_val")]),
        "test_accuracy_list": spread(means[("classification", "micro", "pc_test")]),
    }
    (preds / "cls" / "pc_summary.json").write_text(json.dumps(pc))
    (preds / "generation").mkdir()
    generation = {
        "seeds": list(SEEDS),
        **{m: {k: spread(means[("generation", m, k)]) for k in GENERATION_KEYS} for m in ("micro", "macro")},
    }
    (preds / "generation" / "gen_summary.json").write_text(json.dumps(generation))


def expected_materials(card: TaskCard, means: dict[tuple[str, str, str], float]) -> dict[str, float]:
    """Each subtask's value as the writer prints it (mean in percent, one decimal), found through the table,
    metric row and column the subtask reads."""
    tables = parse_tables((MATERIALS / "task_description.md").read_text())[0]
    expected: dict[str, float] = {}
    for s in card.subtasks:
        assert s.table is not None and s.column is not None and s.row is not None
        kind = ("generation", "classification")[s.table]
        metric = ("micro", "macro")[s.row]
        keys = [*GENERATION_KEYS, "Overall"] if kind == "generation" else CLASSIFICATION_KEYS
        column = tables[s.table].column(s.column)
        assert column is not None
        key = keys[column - 2]  # after `Tokenization | Metric`
        if key == "Overall":  # the writer's mean of the task means
            mean = statistics.mean(statistics.mean(spread(means[(kind, metric, k)])) for k in GENERATION_KEYS)
        else:
            mean = statistics.mean(spread(means[(kind, metric, key)]))
        expected[s.id] = float(f"{mean * 100:.1f}")
    return expected


AGGREGATE_ONLY = 'bash grading/grade.sh --aggregate-only --preds-dir "$PWD/preds"'
SUMMARY_GLOB = "grading/runs/*/grading_summary.json"


def materials_card(**grading: str) -> TaskCard:
    overlay = {"grading": {"command": AGGREGATE_ONLY, **grading}}
    return load_researchgym(MATERIALS, "researchgym/materials-tokenization", overlay_content=overlay)


def grade_materials(tmp_path: Path, card: TaskCard) -> Path:
    """Run the task's grader (aggregation only: the training subtasks need GPUs and models) on planted
    predictions; returns the grading view it ran in."""
    workspace = tmp_path / "workspace"
    plant_predictions(workspace / "preds", planted_means())
    outcome = grade_workspace(card, workspace, tmp_path / "scratch", tmp_path / "grader.log")
    assert outcome.error is None, (tmp_path / "grader.log").read_text()
    return tmp_path / "scratch" / "grading-view"


def test_materials_tokenization_reads_all_36_values_the_real_writer_wrote(tmp_path: Path) -> None:
    card = materials_card()
    view = grade_materials(tmp_path, card)
    written = (view / "task_description.md").read_text()
    # The writer's shape, which a table-only reader misses: the Macro-F1 row of table 1 lands outside it.
    assert "| | Macro-F1 | -- | -- | -- | -- | -- | -- | -- | -- |\n\n\n| Your Method | Macro-F1 | " in written
    if os.environ.get(REGENERATE):
        GRADED.mkdir(parents=True, exist_ok=True)
        (GRADED / "task_description.md").write_text(written)
    assert written == (GRADED / "task_description.md").read_text(), f"the fixture is stale: rerun with {REGENERATE}=1"

    values = read_values(card, view)
    expected = expected_materials(card, planted_means())
    assert len(card.subtasks) == 36
    assert {k: v for k, v in values.items() if v is None} == {}
    assert values == expected
    macro = [s.id for s in card.subtasks if s.id.endswith("macro_f1")]
    assert len(macro) == 18 and all(values[i] == expected[i] for i in macro)


def test_the_committed_fixture_reads_36_of_36(tmp_path: Path) -> None:
    """The graded description as committed, read without running anything."""
    card = materials_card()
    view = tmp_path / "view"
    view.mkdir()
    shutil.copy(GRADED / "task_description.md", view / "task_description.md")
    values = read_values(card, view)
    assert sum(v is not None for v in values.values()) == 36
    assert values == expected_materials(card, planted_means())


def test_summary_glob_reads_the_newest_match(tmp_path: Path) -> None:
    """`grading.summary` as a glob: the JSON the grader writes under grading/runs/<timestamp>/, newest first."""
    card = materials_card(summary=SUMMARY_GLOB)
    sofc = "classification_ner_sofc_val_macro_f1"
    card = card.model_copy(
        update={
            "subtasks": [
                s.model_copy(update={"json_key": "classification.macro.ner_sofc_val.values.1"}) if s.id == sofc else s
                for s in card.subtasks
            ]
        }
    )
    view = grade_materials(tmp_path, card)
    (written,) = view.glob(SUMMARY_GLOB)  # grade.py's own run folder
    planted = planted_means()[("classification", "macro", "ner_sofc_val")]
    assert read_values(card, view)[sofc] == pytest.approx(planted)

    stale = view / "grading" / "runs" / "19990101-000000" / "grading_summary.json"
    stale.parent.mkdir()
    data = json.loads(written.read_text())
    data["classification"]["macro"]["ner_sofc_val"]["values"] = [0.1, 0.2, 0.3]
    stale.write_text(json.dumps(data))
    now = written.stat().st_mtime
    os.utime(stale, (now - 60, now - 60))
    assert read_values(card, view)[sofc] == pytest.approx(planted)
    os.utime(stale, (now + 60, now + 60))
    assert read_values(card, view)[sofc] == pytest.approx(0.2)


@pytest.mark.parametrize("summary", ["/tmp/summary.json", "../elsewhere/*.json"])
def test_summary_outside_the_task_is_refused(summary: str) -> None:
    with pytest.raises(TaskError, match=r"grading\.summary: .* must be a path \(or glob\) inside the task folder"):
        materials_card(summary=summary)


# -- cross-modal retrieval: one Your Method row per section ----------------------------------------------------

QGS_DATASETS = {  # the table's name of a target gallery -> the `dataset` a run's config.yaml names
    "Flickr": "flickr",
    "COCO": "coco",
    "Fashion": "fashion_gen",
    "Nocaps(ID)": "nocaps_in_domain",
    "Nocaps(ND)": "nocaps_near_domain",
    "Nocaps(OD)": "nocaps_out_domain",
}
# Each row the writer fills: (its table, section, backbone config, columns as the headers name them).
IMAGE = ["Gauss.", "Shot", "Impul.", "Speckle", "Defoc.", "Glass", "Motion", "Zoom", "Snow", "Frost", "Fog"]
IMAGE += ["Brit.", "Contr.", "Elastic", "Pixel", "JPEG"]
IMAGE_KEYS = ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "defocus_blur", "glass_blur"]
IMAGE_KEYS += ["motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform"]
IMAGE_KEYS += ["pixelate", "jpeg_compression"]
TEXT = ["OCR", "CI", "CR", "CS", "CD", "SR", "RI", "RS", "RD", "IP", "Formal", "Casual", "Passive", "Active"]
TEXT += ["Backtrans"]
TEXT_KEYS = ["annotation_OcrAug"] + [f"annotation_RandomCharAug_{op}" for op in ("insert", "substitute", "swap")]
TEXT_KEYS += ["annotation_RandomCharAug_delete"] + [f"annotation_{k}" for k in ("sr", "ri", "rs", "rd", "ip")]
TEXT_KEYS += [f"annotation_{k}" for k in ("formal", "casual", "passive", "active", "back_trans")]


def plant_retrieval_runs(output: Path) -> dict[tuple[int, int, str], float]:
    """One run folder (config.yaml + evaluate.txt) per cell; returns the value planted per (table, section,
    column header), each distinct."""
    planted: dict[tuple[int, int, str], float] = {}
    runs: list[tuple[dict[str, object], dict[str, float]]] = []
    n = 0

    def value() -> float:
        nonlocal n
        n += 1
        return round(10.0 + 0.7 * n, 1)

    for table, (headers, keys, metric) in enumerate(((IMAGE, IMAGE_KEYS, "txt_r1"), (TEXT, TEXT_KEYS, "img_r1"))):
        for section, vit in enumerate(("base", "large")):
            for header, key in zip(headers, keys, strict=True):
                planted[(table, section, header)] = v = value()
                where = {"image_root": f"/data/coco-ip/coco_ip_{key}_5"} if table == 0 else {}
                where = where or {"ann_root": f"/data/coco-tp/{key}/5"}
                runs.append(({"backbone": "blip", "vit": vit, "dataset": "coco", **where}, {metric: v}))
    for section, backbone in enumerate(({"backbone": "clip"}, {"backbone": "blip", "vit": "base"})):
        for name, dataset in QGS_DATASETS.items():
            i2t, t2i = value(), value()
            planted[(2, section, f"Base2{name} I2TR@1")] = i2t
            planted[(2, section, f"Base2{name} T2IR@1")] = t2i
            runs.append(({**backbone, "dataset": dataset}, {"txt_r1": i2t, "img_r1": t2i}))
    for header, dataset in (("CUHK2ICFG T2IR@1", "icfg_pedes"), ("ICFG2CUHK T2IR@1", "cuhk_pedes")):
        planted[(3, 0, header)] = v = value()
        runs.append(({"backbone": "clip_reid", "dataset": dataset}, {"img_r1": v}))
    for i, (config, metrics) in enumerate(runs):
        run = output / f"run{i:03d}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "evaluate.txt").write_text(f"epoch 1\n{json.dumps(metrics)}\n")
    return planted


def test_cross_modal_each_section_reads_its_own_row_from_the_real_writer(tmp_path: Path) -> None:
    card = load_researchgym(CROSS_MODAL, "researchgym/cross-modal-retrieval")
    workspace = tmp_path / "workspace"
    planted = plant_retrieval_runs(workspace / "output")
    outcome = grade_workspace(card, workspace, tmp_path / "scratch", tmp_path / "grader.log")
    assert outcome.error is None, (tmp_path / "grader.log").read_text()

    def expected(s: Subtask) -> float:
        assert s.table is not None and s.column is not None
        section = s.row or 0
        if s.column.startswith("Avg"):  # the writer's mean of the row
            row = [v for (t, sec, _), v in planted.items() if (t, sec) == (s.table, section)]
            return float(f"{statistics.fmean(row):.1f}")
        return planted[(s.table, section, s.column)]

    read = {s.id: s.raw for s in outcome.subtasks}
    assert len(read) == 95
    assert read == {s.id: expected(s) for s in card.subtasks}
    # The two BLIP sections of one table: same column, each its own row.
    assert read["coco_c_image_blip_vit_b_16_gauss"] == planted[(0, 0, "Gauss.")]
    assert read["coco_c_image_blip_vit_l_16_gauss"] == planted[(0, 1, "Gauss.")]


# -- the two shapes of an appended row, on small tables ----------------------------------------------------------

FILLED_IN_PLACE = """\
| Tokenization | Metric | NER |
|---|---|---|
| BPE | Micro-F1 | 76.6 |
| | Macro-F1 | 47.1 |
| Your Method | Micro-F1 | 80.1 ±0.2 |
| | Macro-F1 | -- |
| Your Method | Macro-F1 | 50.5 ±0.1 |
"""


def test_a_row_appended_below_its_placeholder_takes_its_place() -> None:
    """Hand-written (no task ships this shape): `upsert_row`'s append where no blank line split the table."""
    (table,), problems = parse_tables(FILLED_IN_PLACE)
    assert problems == []
    rows = [table.rows[i] for i in table.method_rows("Your Method")]
    assert [(r[1], r[2]) for r in rows] == [("Micro-F1", "80.1 ±0.2"), ("Macro-F1", "50.5 ±0.1")]


def test_an_appended_row_belongs_to_the_table_above_not_the_next() -> None:
    md = FILLED_IN_PLACE.replace("| Your Method | Macro-F1 | 50.5 ±0.1 |\n", "")
    md = md.replace("| Your Method | Micro-F1 | 80.1 ±0.2 |\n", "| Your Method | Micro-F1 | 80.1 ±0.2 |\n\n")
    md += "\nSome notes on the table.\n\n| Your Method | Macro-F1 | 50.5 ±0.1 |\n"
    md += "Table 2: another.\n\n| Method | Acc |\n|---|---|\n| A | 1.0 |\n| Your Method | -- |\n"
    (first, second), problems = parse_tables(md)
    assert problems == []
    assert [first.rows[i][2] for i in first.method_rows("Your Method")] == ["80.1 ±0.2", "50.5 ±0.1"]
    assert [second.rows[i][1] for i in second.method_rows("Your Method")] == ["--"]
    assert first.rows[-1][0] == "Your Method"  # the `|  | Macro-F1 | -- |` placeholder left outside is not a row


def test_the_real_writers_changes_to_the_description_are_not_an_edit_of_the_grader() -> None:
    """An agent that runs the task's grader in its own workspace leaves this diff; the integrity audit must not
    read it as the agent editing task_description.md (the blank lines and the end-of-file newline included)."""
    diff = subprocess.run(
        ["git", "diff", "--no-index", str(MATERIALS / "task_description.md"), str(GRADED / "task_description.md")],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert "\n+\n" in diff and "\\ No newline at end of file" in diff  # the writer's two side effects
    assert only_your_method_rows(diff)
    assert not only_your_method_rows(diff.replace("+| Your Method | Macro-F1 | 48.7", "+| PickyBPE | Macro-F1 | 48.7"))
