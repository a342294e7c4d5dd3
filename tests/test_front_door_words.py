"""The front door speaks the user's words (issue #45 item 6): a refusal names the flag or campaign YAML key the user
gave (not the field behind it), says what it accepts, and suggests the nearest valid name for a typo'd task, GAIA
question, Gaia2 scenario, YAML key or flag; each exits 2 with one line and writes nothing. The CLI as a
subprocess (tests/cli_helpers.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import BUNDLED_TASK, labkube, one_line_error, tree_digest

from labkube.tasks import BUNDLED


def refused(cwd: Path, *args: str, expected: tuple[str, ...], unwanted: tuple[str, ...] = ()) -> str:
    """The one line of a refusal of `labkube ARGS`, checked: exit 2, no traceback, nothing written, each of
    `expected` in it and none of `unwanted`."""
    before = tree_digest(cwd)
    line = one_line_error(labkube(*args, cwd=cwd, timeout=120))
    for part in expected:
        assert part in line, line
    for part in unwanted:
        assert part not in line, line
    assert tree_digest(cwd) == before, "something was written"
    return line


def campaign_file(cwd: Path, text: str) -> Path:
    path = cwd / "c.yaml"
    path.write_text(text)
    return path


def test_a_bad_flag_value_names_the_flag_and_what_it_accepts(tmp_path: Path) -> None:
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, "--grade-interval", "0", "--out", "c"),
        expected=("--grade-interval 0", "give a number above 0"),
        unwanted=("grade_interval_s", "Input should"),
    )


def test_a_flag_whose_field_has_a_unit_is_named_as_typed(tmp_path: Path) -> None:
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, "--judge-timeout", "1000", "--out", "c"),
        expected=("--judge-timeout 1000", "give a number below"),
        unwanted=("gaia2_judge_timeout_s",),
    )


def test_a_bad_yaml_value_names_the_key_the_file_and_what_it_accepts(tmp_path: Path) -> None:
    spec = campaign_file(tmp_path, f"tasks: [{BUNDLED_TASK}]\nseeds: abc\n")
    refused(
        tmp_path,
        *("campaign", "run", str(spec), "--out", "c"),
        expected=(f"{spec}: seeds is abc", "give a whole number or a list"),
        unwanted=("seeds.int", "Input should"),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"tasks: [{BUNDLED_TASK}]\nmodel: [noop]\n", "model is not a key it accepts; did you mean models?"),
        (f"tasks: [{BUNDLED_TASK}]\nseed: 2\n", "seed is not a key it accepts; did you mean seeds?"),
        (
            f"tasks: [{BUNDLED_TASK}]\nbudgets: {{wall_hour: 2}}\n",
            "budgets.wall_hour is not a key it accepts; did you mean wall_hours?",
        ),
        ("task: [x]\n", "task is not a key it accepts; did you mean tasks?"),
    ],
)
def test_an_unknown_yaml_key_suggests_the_nearest_key(tmp_path: Path, text: str, expected: str) -> None:
    spec = campaign_file(tmp_path, text)
    refused(tmp_path, "campaign", "run", str(spec), "--out", "c", expected=(f"{spec}: {expected}",))


def test_a_missing_yaml_key_is_named(tmp_path: Path) -> None:
    spec = campaign_file(tmp_path, "seeds: 2\n")
    refused(tmp_path, "campaign", "run", str(spec), "--out", "c", expected=(f"{spec}: tasks is missing; add it",))


def test_a_task_given_twice_on_the_command_line_is_named(tmp_path: Path) -> None:
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, BUNDLED_TASK, "--model", "noop", "--out", "c"),
        expected=(f"task {BUNDLED_TASK} is given twice; give it once",),
        unwanted=("slugging",),
    )


def test_a_task_given_twice_in_a_campaign_file_is_named(tmp_path: Path) -> None:
    spec = campaign_file(tmp_path, f"tasks: [{BUNDLED_TASK}, {BUNDLED_TASK}]\nmodels: [noop]\n")
    refused(
        tmp_path,
        *("campaign", "run", str(spec), "--out", "c"),
        expected=(f"{spec}: tasks: task {BUNDLED_TASK} is given twice; give it once",),
    )


def test_a_task_given_under_two_spellings_is_named(tmp_path: Path) -> None:
    """The bundled name and the task's folder, or a dataset and one of its questions: one task, given twice."""
    folder = str(BUNDLED / "researchgym" / "continual-learning-lite")
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, folder, "--model", "noop", "--out", "c"),
        expected=(f"tasks {BUNDLED_TASK} and {folder} both name", "give it once"),
        unwanted=("slugging",),
    )
    refused(
        tmp_path,
        *("run", "gaia/demo", "gaia/demo/demo-factorials", "--model", "noop", "--out", "c"),
        expected=("tasks gaia/demo and gaia/demo/demo-factorials both name gaia/demo/demo-factorials; give it once",),
    )


def test_a_model_given_twice_is_named(tmp_path: Path) -> None:
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, "--model", "noop", "--model", "noop", "--out", "c"),
        expected=("--model: model noop is given twice; give it once",),
    )


@pytest.mark.parametrize(
    ("task", "suggested"),
    [
        ("researchgym/continual-learning-lit", "did you mean researchgym/continual-learning-lite?"),
        ("researchgym/retreival-ranking", "did you mean researchgym/retrieval-ranking?"),
        ("gaia/dem", "did you mean gaia/demo?"),
        ("gaia/demo/demo-factorial", "no question 'demo-factorial' (did you mean demo-factorials?)"),
        ("gaia2/time_door_cod", "did you mean gaia2/time_door_code?"),
    ],
)
def test_a_typod_task_suggests_the_nearest(tmp_path: Path, task: str, suggested: str) -> None:
    refused(tmp_path, "run", task, "--model", "noop", "--out", "c", expected=(suggested,))


def test_a_typod_task_folder_suggests_the_folder_beside_it(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    shutil.copytree(BUNDLED / "researchgym" / "continual-learning-lite", tmp_path / "tasks" / "my-paper-task")
    refused(
        tmp_path,
        *("run", "tasks/my-papr-task", "--model", "noop", "--out", "c"),
        expected=("unknown task 'tasks/my-papr-task'", "did you mean tasks/my-paper-task?"),
    )


def test_a_typod_question_suggests_the_nearest_in_tasks_show(tmp_path: Path) -> None:
    refused(tmp_path, "tasks", "show", "gaia/demo/demo-factorial", expected=("did you mean demo-factorials?",))


def test_an_unknown_flag_suggests_the_nearest_flag(tmp_path: Path) -> None:
    """Click's own usage error (three lines: usage, a hint, the error), which names the flag and its nearest."""
    proc: subprocess.CompletedProcess = labkube("run", BUNDLED_TASK, "--sed", "3", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "No such option '--sed'. Did you mean '--seeds'?" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_a_check_across_flags_is_said_without_internals(tmp_path: Path) -> None:
    refused(
        tmp_path,
        *("run", BUNDLED_TASK, "--agent", "are-default", "--out", "c"),
        expected=("error: agent are-default runs ARE's own agent on a model API",),
        unwanted=("(top level)", "campaign:"),
    )
