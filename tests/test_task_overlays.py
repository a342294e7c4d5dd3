"""labkube.yaml kept outside the task folder: a file or a directory of overlays by task name, merged over the
folder's own labkube.yaml; bad overlays are one line that says what to fix."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from cli_helpers import labkube
from click.testing import CliRunner
from pydantic import ValidationError
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec
from labkube.cli import main
from labkube.operator.campaign_run import plan_campaign
from labkube.runs_cli import load_campaign_file
from labkube.task_card import Direction, Subtask, TaskCard
from labkube.tasks import OverlayError, TaskError, card_for_run, load_task, read_task_overlays
from labkube.tasks.researchgym import OVERLAY_ENV, load_researchgym

REAL_TASKS = Path(__file__).parent / "data" / "researchgym_tasks"
TSE = REAL_TASKS / "time-series-explanation"
DOCS = Path(__file__).parent.parent / "docs" / "tasks.md"


@pytest.fixture(autouse=True)
def no_overlay_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OVERLAY_ENV, raising=False)


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, allow_unicode=True))
    return path


def subtask(card: TaskCard, sid: str) -> Subtask:
    return next(s for s in card.subtasks if s.id == sid)


def test_file_overlay_updates_named_subtasks_and_keeps_the_others(tmp_path: Path) -> None:
    overlay = write(
        tmp_path / "tse.yaml",
        {
            "subtasks": [{"id": "state_aup", "sota": 0.991}, {"id": "real_world_pam_avg", "primary": True}],
            "resources": {"gpus": 1, "memory_gb": 32},
            "budgets": {"wall_hours": 12, "usd": 10},
        },
    )
    plain = load_researchgym(TSE, "tse")
    card = load_researchgym(TSE, "tse", overlay=overlay)
    assert card.overlay == str(overlay)
    assert [s.id for s in card.subtasks] == [s.id for s in plain.subtasks]
    aup = subtask(card, "state_aup")
    assert (aup.sota, aup.baseline, aup.baseline_method, aup.metric) == (0.991, 0.944, "LIME", "AUP")
    assert (card.resources.gpus, card.resources.memory_gb, card.budgets.wall_hours) == (1, 32, 12)
    assert not any("primary subtask" in w for w in card.warnings)  # the overlay chose it
    (sota_warning,) = [w for w in card.warnings if "no SOTA values" in w]
    assert "state_aup" not in sota_warning and "real_world_pam_avg" in sota_warning


def test_directory_overlay_is_keyed_by_task_name_in_both_layouts(tmp_path: Path) -> None:
    overlays = tmp_path / "overlays"
    write(overlays / "time-series-explanation.yaml", {"subtasks": [{"id": "state_cpd", "sota": 0.3}]})
    write(overlays / "continual-learning" / "labkube.yaml", {"subtasks": [{"id": "cifar100_acc", "sota": 91.5}]})
    tse = load_researchgym(TSE, "tse", overlay=overlays)
    cl = load_researchgym(REAL_TASKS / "continual-learning", "cl", overlay=overlays)
    assert subtask(tse, "state_cpd").sota == 0.3
    assert subtask(cl, "cifar100_acc").sota == 91.5
    assert cl.overlay == str(overlays / "continual-learning" / "labkube.yaml")
    uncovered = load_researchgym(REAL_TASKS / "materials-tokenization", "mt", overlay=overlays)
    assert uncovered.overlay is None
    assert any("has no materials-tokenization.yaml" in w for w in uncovered.warnings)


def test_directory_with_both_layouts_for_one_task_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "time-series-explanation.yaml", {})
    write(tmp_path / "time-series-explanation" / "labkube.yaml", {})
    with pytest.raises(TaskError, match=r"has both time-series-explanation\.yaml and .*: keep one"):
        load_researchgym(TSE, "tse", overlay=tmp_path)


def test_overlay_merges_over_the_folders_labkube_yaml(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [], resources={"gpus": 0, "cpus": 2, "memory_gb": 8}, budgets={"steps": 60})
    overlay = write(
        tmp_path / "overlay.yaml",
        {
            "subtasks": [{"id": "score", "sota": 4.0}],
            "resources": {"gpus": 2},
            "protected": ["grading/**"],
        },
    )
    card = load_researchgym(task, "tiny", overlay=overlay)
    score = subtask(card, "score")
    # subtasks merge by id: the folder's json_key and baseline stay, the overlay's sota wins
    assert (score.sota, score.json_key, score.baseline, score.primary) == (4.0, "score", 1.0, True)
    # mappings merge key by key
    assert (card.resources.gpus, card.resources.cpus, card.resources.memory_gb) == (2, 2, 8)
    assert card.budgets.steps == 60 and card.grading.summary == "grading/results.json"
    # other values, lists included, are replaced
    assert card.protected == ["grading/**"]
    assert card.oracle == "oracle/plan.yaml" and card.name == "tiny-task"


def test_overlay_primary_moves_the_primary_of_the_folders_labkube_yaml(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [])
    (task / "task_description.md").write_text(
        "| Method | Score ↑ | Time (s) |\n|---|---|---|\n| Baseline | 1.0 | 30 |\n| Your Method | -- | -- |\n"
    )
    overlay = write(tmp_path / "o.yaml", {"subtasks": [{"id": "time_s", "primary": True}]})
    card = load_researchgym(task, "tiny", overlay=overlay)
    assert [s.id for s in card.subtasks if s.primary] == ["time_s"]
    assert subtask(card, "time_s").direction is Direction.lower  # Time: lower by convention


def test_a_listed_subtask_with_the_cell_of_an_inferred_one_renames_it(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [])
    config = yaml.safe_load((task / "labkube.yaml").read_text())
    config["subtasks"][0]["id"] = "value"  # reads table 0, column `Score ↑`: the inferred `score`
    write(task / "labkube.yaml", config)
    card = load_task(str(task))
    assert [(s.id, s.sota, s.baseline) for s in card.subtasks] == [("value", 10.0, 1.0)]


def test_only_listed_subtasks_drops_the_others(tmp_path: Path) -> None:
    overlay = write(
        tmp_path / "o.yaml",
        {"only_listed_subtasks": True, "subtasks": [{"id": "state_aup", "sota": 0.99}, {"id": "state_cpd"}]},
    )
    card = load_researchgym(TSE, "tse", overlay=overlay)
    assert [(s.id, s.primary) for s in card.subtasks] == [("state_aup", True), ("state_cpd", False)]


def test_overlay_can_add_a_subtask_the_tables_do_not_give(tmp_path: Path) -> None:
    overlay = write(
        tmp_path / "o.yaml",
        {"subtasks": [{"id": "wall", "metric": "Wall time", "json_key": "t", "direction": "lower"}]},
    )
    card = load_researchgym(TSE, "tse", overlay=overlay)
    assert card.subtasks[-1].id == "wall" and len(card.subtasks) == 17
    assert (card.subtasks[-1].direction, card.subtasks[-1].direction_inferred) == (Direction.lower, None)


def test_environment_variable_is_the_default_overlay_of_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "time-series-explanation.yaml", {"subtasks": [{"id": "state_aur", "sota": 0.7}]})
    monkeypatch.setenv(OVERLAY_ENV, str(tmp_path))
    result = CliRunner().invoke(main, ["tasks", "show", str(TSE), "--json"])
    assert result.exit_code == 0, result.stderr
    (card,) = json.loads(result.stdout)
    assert subtask(TaskCard.model_validate(card), "state_aur").sota == 0.7
    assert subtask(load_task(str(TSE)), "state_aur").sota is None  # a run's card comes from its spec, not from here
    assert CliRunner().invoke(main, ["tasks", "show", "gaia/demo"]).exit_code == 0  # not a ResearchGym folder


def test_overlay_content_merges_like_a_file_and_is_named_in_errors() -> None:
    content = {"subtasks": [{"id": "state_aup", "sota": 0.991}], "budgets": {"usd": 3}}
    card = load_researchgym(TSE, "tse", overlay_content=content)
    assert subtask(card, "state_aup").sota == 0.991 and card.budgets.usd == 3
    assert card.overlay == "campaign overlay for time-series-explanation"
    assert content == {"subtasks": [{"id": "state_aup", "sota": 0.991}], "budgets": {"usd": 3}}  # not changed
    with pytest.raises(OverlayError) as caught:
        load_researchgym(TSE, "tse", overlay_content={"subtasks": [{"id": "state_aup", "sotta": 1}]})
    assert str(caught.value) == (
        "task time-series-explanation: campaign overlay for time-series-explanation: "
        "subtasks.0.sotta: unknown key (did you mean `sota`?)"
    )


def test_read_task_overlays_keys_each_task_folder_that_has_one(tmp_path: Path) -> None:
    write(tmp_path / "time-series-explanation.yaml", {"subtasks": [{"id": "state_cpd", "sota": 0.3}]})
    write(tmp_path / "continual-learning" / "labkube.yaml", {"budgets": {"steps": 9}})
    tasks = [f"{TSE}/", str(REAL_TASKS / "continual-learning"), "researchgym/materials-tokenization"]
    assert read_task_overlays(tmp_path, tasks) == {
        "time-series-explanation": {"subtasks": [{"id": "state_cpd", "sota": 0.3}]},
        "continual-learning": {"budgets": {"steps": 9}},
    }
    one = write(tmp_path / "one.yaml", {"budgets": {"steps": 3}})
    assert read_task_overlays(one, ["/cluster/tasks/nanogpt"]) == {"nanogpt": {"budgets": {"steps": 3}}}
    write(tmp_path / "bad.yaml", "resources: {gpu: 1}\n")
    with pytest.raises(TaskError, match=r"^task x: overlay .*bad\.yaml: resources\.gpu: unknown key"):
        read_task_overlays(tmp_path / "bad.yaml", ["x"])


def test_documented_labkube_yaml_example_applies_as_an_overlay(tmp_path: Path) -> None:
    block = re.search(r"## labkube\.yaml\n\n```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert block is not None
    card = load_researchgym(TSE, "tse", overlay=write(tmp_path / "doc.yaml", block.group(1)))
    assert subtask(card, "state_aup").sota == 0.991
    pam = subtask(card, "real_world_pam_avg")
    assert (pam.direction, pam.direction_inferred) == (Direction.lower, None)
    assert subtask(card, "my_metric").json_key == "timing.total"
    assert card.resources.gpus == 1 and card.budgets.usd == 10


# -- through the command line --------------------------------------------------------------------------------


def show(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["tasks", "show", *args])
    return result.exit_code, result.stdout, result.stderr


def test_tasks_show_with_overlay_prints_it_and_its_values(tmp_path: Path) -> None:
    overlay = write(tmp_path / "time-series-explanation.yaml", {"subtasks": [{"id": "state_aup", "sota": 0.991}]})
    code, out, err = show(str(TSE), "--overlay", str(tmp_path))
    assert code == 0, err
    assert f"overlay: {overlay}" in out
    (row,) = [line for line in out.splitlines() if "state_aup" in line and "│" in line]
    assert "0.944 (LIME)" in row and "0.991" in row
    code, out, _ = show(str(TSE), "--overlay", str(overlay), "--json")
    (card,) = json.loads(out)
    assert card["overlay"] == str(overlay) and subtask(TaskCard.model_validate(card), "state_aup").sota == 0.991


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "subtask:\n  - {id: state_aup, sota: 0.9}\n",
            "overlay {path}: subtask: unknown key (did you mean `subtasks`?)",
        ),
        ("subtasks:\n  - {id: state_aup, sotta: 0.9}\n", "subtasks.0.sotta: unknown key (did you mean `sota`?)"),
        ("resources: {gpu: 1}\n", "resources.gpu: unknown key (did you mean `gpus`?)"),
        ("subtasks: [{id: state_aup, sota: 0.9}\n", "overlay {path} is not valid YAML at line 2"),
        ("- just a list\n", "must be a mapping of keys to values"),
        (
            "subtasks: [{id: state_aupp, sota: 0.9}]\n",
            "subtask `state_aupp` is not one the tables give (nearest: state_aup",
        ),
    ],
)
def test_a_bad_overlay_is_one_line_that_says_what_to_fix(tmp_path: Path, content: str, expected: str) -> None:
    path = write(tmp_path / "bad.yaml", content)
    code, _, err = show(str(TSE), "--overlay", str(path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "task time-series-explanation: " in err
    assert expected.format(path=path) in " ".join(err.split())


def test_documented_bad_overlay_error_is_what_users_see(tmp_path: Path) -> None:
    example = re.search(r"--overlay bad\.yaml\n(error: .*)\n", DOCS.read_text())
    assert example is not None
    write(tmp_path / "bad.yaml", "subtask:\n  - {id: state_aup, sota: 0.99}\n")
    proc = labkube("tasks", "show", str(TSE), "--overlay", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert " ".join(proc.stderr.split()) == example.group(1).replace("ResearchGym/tasks/test/", "")


def test_a_missing_overlay_path_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = show(str(TSE), "--overlay", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err


def test_overlay_is_refused_for_a_task_that_is_not_a_researchgym_folder() -> None:
    code, _, err = show("gaia/demo", "--overlay", str(TSE / "task_description.md"))
    assert code == 2 and "--overlay is for ResearchGym task folders" in err


def test_run_refuses_one_overlay_file_for_several_tasks(tmp_path: Path) -> None:
    overlay = write(tmp_path / "o.yaml", {})
    result = CliRunner().invoke(
        main, ["run", str(TSE), str(REAL_TASKS / "continual-learning"), "--overlay", str(overlay)]
    )
    assert result.exit_code == 2
    assert "is one task's labkube.yaml; for 2 tasks pass a directory" in result.stderr


def test_a_campaign_resource_with_an_overlay_path_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        CampaignSpec(tasks=["t"], overlay=str(tmp_path), backend="k8s")
    message = caught.value.errors()[0]["msg"]
    assert "the cluster cannot read" in message and "task_overlays" in message and "\n" not in message
    assert "`labkube run --backend k8s --overlay PATH`" in message
    assert CampaignSpec(tasks=["t"], overlay=str(tmp_path)).overlay == str(tmp_path)  # local: a record


def test_local_campaign_carries_each_tasks_overlay_to_its_runs(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path / "tasks", [])
    other = REAL_TASKS / "continual-learning"
    overlay = {"subtasks": [{"id": "score", "sota": 4.0}], "budgets": {"steps": 7}}
    spec = CampaignSpec(tasks=[str(task), str(other)], models=["noop"], task_overlays={"tiny-task": overlay})
    _, runs, cards = plan_campaign(spec, tmp_path / "camp")
    (tiny,) = [r for r in runs if r.task == str(task)]
    (cl,) = [r for r in runs if r.task == str(other)]
    assert (tiny.task_overlay, cl.task_overlay) == (overlay, None)
    assert tiny.budgets.steps == 7 and subtask(cards[str(task)][0], "score").sota == 4.0
    assert subtask(card_for_run(tiny.task, tiny.task_path, None, overlay=tiny.task_overlay), "score").sota == 4.0


@pytest.mark.parametrize(
    ("overlays", "expected"),
    [
        ({"tiny-tsk": {}}, "task_overlays: tiny-tsk is not a task folder this campaign runs (did you mean tiny-task?)"),
        ({"tiny-task": {"subtask": []}}, "campaign overlay for tiny-task: subtask: unknown key"),
        ({"tiny-task": {"subtasks": [{"id": "scor", "sota": 1}]}}, "subtask `scor` is not one the tables give"),
    ],
)
def test_a_bad_campaign_overlay_is_one_line(tmp_path: Path, overlays: dict, expected: str) -> None:
    task = make_tiny_task(tmp_path / "tasks", [])
    spec = CampaignSpec(tasks=[str(task)], models=["noop"], task_overlays=overlays)
    with pytest.raises(OverlayError) as caught:
        plan_campaign(spec, tmp_path / "camp")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_campaign_file_overlay_is_read_into_task_overlays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative overlay is read from where labkube runs
    write(tmp_path / "overlays" / "time-series-explanation.yaml", {"subtasks": [{"id": "state_aup", "sota": 0.9}]})
    content = {"subtasks": [{"id": "state_aup", "sota": 0.9}]}
    local = load_campaign_file(write(tmp_path / "c.yaml", {"tasks": [str(TSE)], "overlay": "overlays"}))
    assert local.task_overlays == {"time-series-explanation": content}
    assert local.overlay == str((tmp_path / "overlays").resolve())
    on_k8s = {"tasks": [str(TSE)], "overlay": str(tmp_path / "overlays"), "backend": "k8s"}
    remote = load_campaign_file(write(tmp_path / "k.yaml", on_k8s))
    assert (remote.overlay, remote.task_overlays, remote.backend) == (None, {"time-series-explanation": content}, "k8s")


@pytest.mark.slow
def test_run_with_overlay_reaches_the_agent_and_its_grading(tmp_path: Path) -> None:
    """The overlay's SOTA is what the run, in its own process under Ray, scores against."""
    steps = [{"tool": "bash", "args": {"command": "echo 2 > result.txt"}}]
    task = make_tiny_task(tmp_path / "tasks", steps)
    overlays = write(tmp_path / "overlays" / "tiny-task.yaml", {"subtasks": [{"id": "score", "sota": 4.0}]}).parent
    out = tmp_path / "camp"
    proc = labkube("run", str(task), "--overlay", str(overlays), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    campaign = json.loads((out / "campaign.json").read_text())
    assert campaign["spec"]["overlay"] == str(overlays.resolve())
    assert campaign["spec"]["task_overlays"] == {"tiny-task": {"subtasks": [{"id": "score", "sota": 4.0}]}}
    (run_id,) = campaign["runs"]
    run = json.loads((out / "runs" / run_id / "run.json").read_text())
    assert run["task_overlay"] == {"subtasks": [{"id": "score", "sota": 4.0}]}
    result = json.loads((out / "runs" / run_id / "result.json").read_text())
    (score,) = result["subtasks"]
    assert score["raw"] == 2.0
    assert score["fraction_of_sota"] == pytest.approx(0.5)  # 2 / 4 (the overlay), not 2 / 10 (the folder)
    shutil.rmtree(out)


def test_documented_task_overlays_campaign_and_its_error(tmp_path: Path) -> None:
    text = DOCS.read_text()
    block = re.search(r"`task_overlays` itself:\n\n```yaml\n(.*?)```", text, re.DOTALL)
    error = re.search(r"does not run is an error, in one line:\n\n```console\nerror: (.*)\n```", text)
    assert block is not None and error is not None
    data = yaml.safe_load(block.group(1).replace("ResearchGym/tasks/test/time-series-explanation", str(TSE)))
    spec = load_campaign_file(write(tmp_path / "campaign.yaml", {**data, "models": ["noop"]}))
    _, (run,), cards = plan_campaign(spec, tmp_path / "camp")
    assert run.task_overlay == {"subtasks": [{"id": "state_aup", "sota": 0.991}]}
    assert subtask(cards[str(TSE)][0], "state_aup").sota == 0.991
    typo = spec.model_copy(update={"task_overlays": {"time-series-explanaton": {}}})
    with pytest.raises(OverlayError) as caught:
        plan_campaign(typo, tmp_path / "camp")
    assert str(caught.value) == error.group(1)


def test_a_campaign_directory_from_before_overlay_contents_resumes_with_the_same_overlay(tmp_path: Path) -> None:
    """campaign.json written when a campaign carried only its overlay's path (no task_overlays) is the same
    campaign when run again with that overlay; with another overlay it is still a different one."""
    from labkube.store import CampaignDir, StoreError

    task = make_tiny_task(tmp_path / "tasks", [])
    overlays = write(tmp_path / "overlays" / "tiny-task.yaml", {"subtasks": [{"id": "score", "sota": 4.0}]}).parent
    content = {"tiny-task": {"subtasks": [{"id": "score", "sota": 4.0}]}}
    now = CampaignSpec(tasks=[str(task)], models=["noop"], overlay=str(overlays), task_overlays=content)
    old = now.model_dump(mode="json", exclude={"task_overlays"})
    cdir = CampaignDir(tmp_path / "camp")
    write(cdir.campaign_json, json.dumps({"spec": old, "runs": [], "updated_at": "2026-01-01T00:00:00Z"}))
    cdir.check_compatible(now)
    elsewhere = now.model_copy(update={"overlay": str(tmp_path / "other")})
    with pytest.raises(StoreError, match="holds a different campaign"):
        cdir.check_compatible(elsewhere)
    new = CampaignDir(tmp_path / "new")
    new.write_campaign(now, [])
    changed = {"tiny-task": {"subtasks": [{"id": "score", "sota": 5.0}]}}
    with pytest.raises(StoreError, match="holds a different campaign"):  # the new form compares the content
        new.check_compatible(now.model_copy(update={"task_overlays": changed}))


def test_a_task_given_as_dot_or_through_a_symlink_is_keyed_by_its_real_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`labkube run . --overlay DIR` from inside the task folder, or a task reached through a symlink: the overlay
    read for the folder's real name is the one the planner checks and the run carries."""
    task = make_tiny_task(tmp_path / "tasks", [])
    (tmp_path / "link").symlink_to(task)
    overlay = {"subtasks": [{"id": "score", "sota": 4.0}]}
    monkeypatch.chdir(task)
    for ref in (".", str(tmp_path / "link")):
        overlays = read_task_overlays(write(tmp_path / "overlays" / "tiny-task.yaml", overlay).parent, [ref])
        assert overlays == {"tiny-task": overlay}
        spec = CampaignSpec(tasks=[ref], models=["noop"], task_overlays=overlays)
        _, (run,), cards = plan_campaign(spec, tmp_path / "camp" / str(len(ref)))
        assert run.task_overlay == overlay and subtask(cards[ref][0], "score").sota == 4.0
