"""ResearchGym's own test tasks (tests/data/researchgym_tasks) and small snippets: named subtasks, metrics,
directions stated or inferred, the best listed baseline, and a fix line for what could not be inferred."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from labkube.cli import main
from labkube.task_card import Direction, Subtask, TaskCard
from labkube.tasks import load_task
from labkube.tasks._markdown import conventional_direction, parse_tables
from labkube.tasks.researchgym import ASSUMED, infer_subtasks, load_researchgym

REAL_TASKS = Path(__file__).parent / "data" / "researchgym_tasks"

COCO_C_IMAGE = ["gauss", "shot", "impul", "speckle", "defoc", "glass", "motion", "zoom", "snow", "frost", "fog"]
COCO_C_IMAGE += ["brit", "contr", "elastic", "pixel", "jpeg", "avg"]
COCO_C_TEXT = ["ocr", "ci", "cr", "cs", "cd", "sr", "ri", "rs", "rd", "ip", "formal", "casual", "passive", "active"]
COCO_C_TEXT += ["backtrans", "avg"]
QUERY_GALLERY = [
    f"base2{target}_{direction}_at_1"
    for target in ("flickr", "coco", "fashion", "nocaps_id", "nocaps_nd", "nocaps_od")
    for direction in ("i2tr", "t2ir")
] + ["avg"]
MATSCI_NLP = ["ner", "rc", "eae", "pc", "sar", "sc", "sf", "overall"]
CLASSIFICATION = [
    f"{task}_{split}" for task in ("ner_sofc", "ner_matscholar", "sf", "rc", "pc") for split in ("val", "test")
]

EXPECTED_IDS = {
    "continual-learning": [
        *(f"imagenet_r_n{n}_{m}" for n in (5, 10, 20) for m in ("acc", "aaa")),
        "imagenet_a_n10_acc",
        "imagenet_a_n10_aaa",
        "cifar100_acc",
        "cifar100_aaa",
        "cub200_acc",
        "cub200_aaa",
    ],
    "cross-modal-retrieval": [
        *(f"coco_c_image_blip_vit_{size}_16_{c}" for size in ("b", "l") for c in COCO_C_IMAGE),
        *(f"coco_c_text_blip_vit_{size}_16_{c}" for size in ("b", "l") for c in COCO_C_TEXT),
        *(f"{model}_vit_b_16_{c}" for model in ("clip", "blip") for c in QUERY_GALLERY),
        "reid_cuhk2icfg_t2ir_at_1",
        "reid_icfg2cuhk_t2ir_at_1",
        "reid_avg",
    ],
    "improving-replay-buffers": [
        "dmc_100k_online_quadruped_walk",
        "dmc_100k_online_cheetah_run",
        "dmc_100k_online_reacher_hard",
        "dmc_100k_online_finger_turn_hard",
        "pixel_dmc_100k_online_walker_walk",
        "pixel_dmc_100k_online_cheetah_run",
        "state_based_openai_gym_walker2d_v2",
        "state_based_openai_gym_halfcheetah_v2",
        "state_based_openai_gym_hopper_v2",
    ],
    "materials-tokenization": [
        *(f"matsci_nlp_{c}_{m}" for m in ("micro_f1", "macro_f1") for c in MATSCI_NLP),
        *(f"classification_{c}_{m}" for m in ("micro_f1", "macro_f1") for c in CLASSIFICATION),
    ],
    "time-series-explanation": [
        *(f"real_world_{d}_{s}" for d in ("pam", "boiler", "epilepsy", "wafer", "freezer") for s in ("avg", "zero")),
        *(f"{label}_{m}" for label in ("switch_feature", "state") for m in ("cpd", "aup", "aur")),
    ],
}
EXPECTED_COUNTS = {
    "continual-learning": 12,
    "cross-modal-retrieval": 95,
    "improving-replay-buffers": 9,
    "materials-tokenization": 36,
    "time-series-explanation": 16,
}
EXPECTED_PRIMARY = {
    "continual-learning": "cifar100_acc",  # "CIFAR-100: 10 tasks ... [Primary Sub-task]"
    "cross-modal-retrieval": "clip_vit_b_16_base2flickr_i2tr_at_1",  # "COCO, Flickr [Primary sub-task]"
    "improving-replay-buffers": "state_based_openai_gym_hopper_v2",  # "Hopper-v2 [Primary Sub-task]"
    "materials-tokenization": "classification_ner_sofc_val_micro_f1",  # "(MatScholar, SOFC)[Primary sub-task ...]"
    "time-series-explanation": "real_world_pam_avg",  # "(PAM)[Primary subtask]"
}


def show_json(*args: str) -> list[dict]:
    result = CliRunner().invoke(main, ["tasks", "show", "--json", *args])
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def real_card(task: str) -> TaskCard:
    return load_task(str(REAL_TASKS / task))


def by_id(card: TaskCard) -> dict[str, Subtask]:
    return {s.id: s for s in card.subtasks}


def test_the_fixtures_are_the_five_test_tasks_with_their_source_named() -> None:
    tasks = sorted(p.parent.name for p in REAL_TASKS.glob("*/task_description.md"))
    assert tasks == sorted(EXPECTED_IDS)
    for task in tasks:
        assert (REAL_TASKS / task / "grading" / "grade.sh").is_file()
    readme = (REAL_TASKS / "README.md").read_text()
    assert "https://github.com/Anikethh/ResearchGym" in readme
    assert "148a7850f7d828d361be423431929367ade8ba1f" in readme and "license" in readme.lower()


@pytest.mark.parametrize("task", sorted(EXPECTED_IDS))
def test_tasks_show_gives_each_real_task_its_named_subtasks(task: str) -> None:
    (card,) = show_json(str(REAL_TASKS / task))
    ids = [s["id"] for s in card["subtasks"]]
    assert len(ids) == EXPECTED_COUNTS[task]
    assert ids == EXPECTED_IDS[task]
    assert [s["id"] for s in card["subtasks"] if s["primary"]] == [EXPECTED_PRIMARY[task]]
    assert not [i for i in ids if re.match(r"t\d+_", i)], "ids name the table, not its number"
    assert all(s["baseline"] is not None and s["baseline_method"] for s in card["subtasks"])


@pytest.mark.parametrize("task", sorted(EXPECTED_IDS))
def test_tasks_show_table_lists_every_subtask_and_a_fix_for_each_gap(task: str) -> None:
    result = CliRunner().invoke(main, ["tasks", "show", str(REAL_TASKS / task)])
    assert result.exit_code == 0 and result.exception is None, result.stderr
    assert "Traceback" not in result.output
    for sid in EXPECTED_IDS[task]:
        assert sid in result.stdout
    gaps = result.stdout.split("could not infer:")[1]
    assert f"`subtasks: [{{id: {EXPECTED_PRIMARY[task]}, sota: <value>}}]`" in gaps


@pytest.mark.parametrize("task", sorted(EXPECTED_IDS))
def test_every_fix_line_is_a_labkube_yaml_that_applies(task: str, tmp_path: Path) -> None:
    card = real_card(task)
    fixes = [m for w in card.warnings for m in re.findall(r"`(subtasks: \[.*?\])`", w)]
    assert fixes, card.warnings
    for n, fix in enumerate(fixes):
        overlay = tmp_path / f"fix{n}.yaml"
        overlay.write_text(fix.replace("<value>", "1.5").replace("<id>", card.subtasks[-1].id) + "\n")
        fixed = load_researchgym(REAL_TASKS / task, task, overlay=overlay)
        (entry,) = yaml.safe_load(overlay.read_text())["subtasks"]
        subtask = by_id(fixed)[entry["id"]]
        for key, value in entry.items():
            assert getattr(subtask, key) == value, (fix, key)
        if "direction" in entry:
            assert subtask.direction_inferred is None


def test_bold_labels_name_the_synthetic_tables_of_time_series_explanation() -> None:
    subtasks = by_id(real_card("time-series-explanation"))
    state_aup = subtasks["state_aup"]
    assert (state_aup.metric, state_aup.direction, state_aup.direction_inferred) == ("AUP", Direction.higher, None)
    assert (state_aup.baseline, state_aup.baseline_method) == (0.944, "LIME")
    assert (subtasks["switch_feature_aur"].baseline, subtasks["switch_feature_aur"].baseline_method) == (
        0.851,
        "ContraLSP",
    )
    pam = subtasks["real_world_pam_avg"]  # no arrow: the caption's CPD, which has ↑ in the synthetic tables
    assert pam.direction is Direction.higher and pam.direction_inferred == "caption: CPD ↑ in another table"
    assert pam.metric == "PAM Avg. CPD" and (pam.baseline, pam.baseline_method) == (0.448, "IG")


def test_sections_of_cross_modal_retrieval_have_their_own_baselines_and_rows() -> None:
    subtasks = by_id(real_card("cross-modal-retrieval"))
    base, large = subtasks["coco_c_image_blip_vit_b_16_gauss"], subtasks["coco_c_image_blip_vit_l_16_gauss"]
    assert (base.baseline, base.baseline_method, base.row) == (47.9, "DeYO", 0)
    # the un-adapted source model is a listed method of its own section
    assert (large.baseline, large.baseline_method, large.row) == (50.3, "BLIP ViT-L/16", 1)
    assert subtasks["coco_c_text_blip_vit_b_16_avg"].baseline == 41.5  # COCO-C text, not image, despite one label
    assert subtasks["reid_avg"].row is None
    assert base.direction_inferred == "caption: Recall@1 by convention"
    assert subtasks["reid_cuhk2icfg_t2ir_at_1"].direction_inferred == "T2IR@1 by convention"


def test_grouped_header_of_replay_buffers_keeps_both_cheetah_runs_apart() -> None:
    subtasks = by_id(real_card("improving-replay-buffers"))
    state, pixel = subtasks["dmc_100k_online_cheetah_run"], subtasks["pixel_dmc_100k_online_cheetah_run"]
    assert (state.baseline, state.baseline_method) == (729.35, "SYNTHER")
    assert (pixel.baseline, pixel.baseline_method) == (489.3, "DRQ-v2")  # dash cells hold no number
    assert state.column == "DMC-100k (Online) Cheetah-Run"
    assert state.direction_inferred == "caption: Average returns by convention"
    assert subtasks["state_based_openai_gym_halfcheetah_v2"].baseline == 8612.49


def test_metric_rows_of_materials_tokenization_are_separate_subtasks() -> None:
    subtasks = by_id(real_card("materials-tokenization"))
    micro, macro = subtasks["matsci_nlp_ner_micro_f1"], subtasks["matsci_nlp_ner_macro_f1"]
    assert (micro.metric, micro.baseline, micro.baseline_method, micro.row) == ("NER Micro-F1", 80.0, "PickyBPE", 0)
    assert (macro.metric, macro.baseline, macro.baseline_method, macro.row) == ("NER Macro-F1", 57.0, "SAGE", 1)
    assert micro.direction_inferred == "Micro-F1 by convention"


def test_continual_learning_reads_two_metrics_from_one_cell() -> None:
    subtasks = by_id(real_card("continual-learning"))
    acc, aaa = subtasks["imagenet_r_n5_acc"], subtasks["imagenet_r_n5_aaa"]
    assert (acc.part, aaa.part, acc.column) == (0, 1, "ImageNet-R (N = 5) Acc ↑ AAA↑")
    assert (acc.baseline, aaa.baseline) == (76.95, 81.81)
    assert subtasks["cub200_acc"].baseline_method == "CODA-Prompt"
    assert all(s.direction_inferred is None for s in subtasks.values())  # every column has arrows


def test_a_folder_without_task_description_is_one_line_saying_what_to_add(tmp_path: Path) -> None:
    """ResearchGym's dev tasks (tasks/dev/gcm, ml-tta, sbm) ship only code and a README."""
    dev = tmp_path / "gcm"
    dev.mkdir()
    (dev / "readme.md").write_text("# Monotonic Modeling Skeleton\n")
    (dev / "run.py").write_text("print('baseline')\n")
    result = CliRunner().invoke(main, ["tasks", "show", str(dev)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "no task_description.md" in result.stderr and "`Your Method` row" in result.stderr


# -- inference on snippets -----------------------------------------------------------------------------------


def infer(markdown: str) -> tuple[dict[str, Subtask], list[str]]:
    tables, _ = parse_tables(markdown)
    subtasks, warnings = infer_subtasks(tables, markdown)
    return {s.id: s for s in subtasks}, warnings


def table(header: str, *rows: str) -> str:
    """A pipe table with `header` cells and `rows` (each `|`-separated), then a `Your Method` row to fill."""
    cells = header.count("|") + 1
    lines = [header, "|".join(["---"] * cells), *rows, "|".join(["Your Method"] + ["--"] * (cells - 1))]
    return "\n".join(f"| {line} |" for line in lines) + "\n"


def test_bold_line_above_a_table_labels_its_ids() -> None:
    md = "**Switch-Feature**\n\n" + table("Method | CPD ↑ | AUP ↑", "FO | 0.19 | 0.90")
    assert list(infer(md)[0]) == ["switch_feature_cpd", "switch_feature_aup"]


def test_heading_above_a_table_labels_it_unless_generic() -> None:
    acc = table("Method | Acc ↑", "A | 90")
    assert list(infer("### Results on CIFAR-10\n\n" + acc)[0]) == ["cifar_10_acc"]
    assert list(infer("## Baseline Results (to beat)\n\n" + acc)[0]) == ["acc"]


def test_caption_subject_labels_a_table_and_a_long_one_does_not() -> None:
    acc = table("Method | Acc ↑", "A | 40")
    short = "Table 2: Performance comparison on ImageNet-A across task lengths.\n\n"
    assert list(infer(short + acc)[0]) == ["imagenet_a_acc"]
    long = "Table 2: Performance comparison on state and pixel-based control suites across task lengths.\n\n"
    assert list(infer(long + acc)[0]) == ["acc"]


def test_nearest_bold_line_wins_over_the_caption_above_it() -> None:
    md = "Table 2: Results on the synthetic datasets.\n\n**State**\n\n" + table("Method | AUP ↑", "A | 0.9")
    assert list(infer(md)[0]) == ["state_aup"]


def test_same_label_tables_are_told_apart_by_their_captions() -> None:
    shift = table("Query Shift | Gauss. | Avg.", "A | 1 | 2")
    md = (
        f"Table 1: Results on COCO-C under shift of the IMAGE modality.\n\n{shift}\n"
        f"Table 2: Results on COCO-C under shift of the TEXT modality.\n\n{shift}"
    )
    assert list(infer(md)[0]) == ["coco_c_image_gauss", "coco_c_image_avg", "coco_c_text_gauss", "coco_c_text_avg"]


def test_arrows_state_the_direction_and_pick_the_best_baseline_each_way() -> None:
    md = table("Method | Acc ↑ | Forgetting ↓", "A | 70.1 (0.3) | 5.2", "B | 76.3 ± 0.2 | 4.1", "C | 71.0 | 6.0")
    subtasks, _ = infer(md)
    acc, forgetting = subtasks["acc"], subtasks["forgetting"]
    assert (acc.direction, acc.direction_inferred, acc.baseline, acc.baseline_method) == (
        Direction.higher,
        None,
        76.3,
        "B",
    )
    assert (forgetting.direction, forgetting.baseline, forgetting.baseline_method) == (Direction.lower, 4.1, "B")


def test_sections_and_metric_rows_give_one_subtask_each() -> None:
    sections = table("Model | Acc", "**Small** | ", "• Tent | 10", "Your Method | --", "**Large** | 30", "• Tent | 20")
    subtasks, _ = infer(sections)
    assert [(s.id, s.baseline, s.row) for s in subtasks.values()] == [("small_acc", 10, 0), ("large_acc", 30, 1)]
    rows = "\n".join(
        [
            "| Tokenizer | Metric | NER |",
            "|---|---|---|",
            "| BPE | Micro-F1 | 80 |",
            "| | Macro-F1 | 50 |",
            "| WP | Micro-F1 | 70 |",
            "| | Macro-F1 | 40 |",
            "| Your Method | Micro-F1 | -- |",
            "| | Macro-F1 | -- |",
        ]
    )
    subtasks, _ = infer(rows)
    assert [(s.id, s.baseline, s.baseline_method, s.row) for s in subtasks.values()] == [
        ("ner_micro_f1", 80, "BPE", 0),
        ("ner_macro_f1", 50, "BPE", 1),
    ]


def test_a_header_of_column_groups_joins_the_row_of_columns_below_it() -> None:
    md = table("Env | *State* |  | *Pixel*", " | Walk | Run | Run", "A | 1 | 2 | 3", "B | 4 | \u2013 | 1")
    subtasks, _ = infer(md)
    assert [(s.id, s.column, s.baseline) for s in subtasks.values()] == [
        ("state_walk", "State Walk", 4),
        ("state_run", "State Run", 2),
        ("pixel_run", "Pixel Run", 3),
    ]


@pytest.mark.parametrize(
    ("header", "direction", "why"),
    [
        ("Accuracy", "higher", "Accuracy by convention"),
        ("Macro-F1", "higher", "Macro-F1 by convention"),
        ("AUC", "higher", "AUC by convention"),
        ("nDCG@10", "higher", "nDCG@10 by convention"),
        ("Val loss", "lower", "loss by convention"),
        ("Test error", "lower", "error by convention"),
        ("MSE", "lower", "MSE by convention"),
        ("Perplexity", "lower", "Perplexity by convention"),
        ("Time (s)", "lower", "Time by convention"),
    ],
)
def test_known_metric_conventions_are_inferred_and_say_so(header: str, direction: str, why: str) -> None:
    md = f"| Method | {header} |\n|---|---|\n| A | 10 |\n| B | 20 |\n| Your Method | -- |\n"
    (subtask,) = infer(md)[0].values()
    assert (subtask.direction.value, subtask.direction_inferred) == (direction, why)
    assert subtask.baseline == (20 if direction == "higher" else 10)


def test_an_unknown_metric_is_assumed_higher_with_the_line_that_flips_it() -> None:
    md = "| Method | Widgets |\n|---|---|\n| A | 3 |\n| Your Method | -- |\n"
    subtasks, warnings = infer(md)
    assert subtasks["widgets"].direction_inferred == ASSUMED
    (warning,) = [w for w in warnings if "Widgets" in w]
    assert "assumed higher is better" in warning
    assert "`subtasks: [{id: widgets, direction: lower}]`" in warning


def test_prose_words_in_a_caption_do_not_name_its_metric() -> None:
    assert conventional_direction("mean ± standard error over five runs of time series", prose=True) is None
    assert conventional_direction("regarding the Recall@1 metric", prose=True) == ("higher", "Recall@1")
    assert conventional_direction("Loss and accuracy") is None  # two directions: not one metric


def test_primary_marker_in_the_settings_picks_the_primary_subtask() -> None:
    md = (
        "## Settings\n*   Benchmarks: CIFAR-10, SVHN [Primary sub-task]\n\n"
        "| Method | CIFAR-10 Acc ↑ | SVHN Acc ↑ |\n|---|---|---|\n| A | 90 | 95 |\n| Your Method | -- | -- |\n"
    )
    subtasks, warnings = infer(md)
    assert [s.id for s in subtasks.values() if s.primary] == ["svhn_acc"]
    assert any("primary subtask svhn_acc" in w and "'SVHN' [Primary sub-task]" in w for w in warnings)
