"""Settings are validated like flags (issue #45 item 4): every `LABKUBE_*` variable a user sets is read through
labkube/settings.py, checked before `labkube run`, `demo` and `campaign run` write anything, and a value it does not
accept is one line naming the variable, the value and what it accepts, exit 2; booleans take the usual spellings;
`labkube settings` lists them all. The CLI as a subprocess (tests/cli_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import BUNDLED_TASK, labkube, one_line_error, tree_digest

from labkube.settings import USER_SETTINGS, WARM_WORKERS, SettingError, settings_problems


def a_file(tmp_path: Path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    return str(path)


# A value each setting refuses, as a user might type it. A setting added to labkube/settings.py without a row here
# fails test_every_setting_has_a_junk_value.
JUNK: dict[str, Callable[[Path], str]] = {
    "LABKUBE_CONTAINMENT": lambda _: "junk",
    "LABKUBE_LOCAL_GPUS": lambda _: "abc",
    "LABKUBE_ENV_CACHE": a_file,
    "LABKUBE_WARM_WORKERS": lambda _: "maybe",
    "LABKUBE_TASK_OVERLAY": lambda tmp: str(tmp / "no-such-overlay.yaml"),
    "LABKUBE_WEB_SEARCH": lambda _: "google",
    "LABKUBE_CLI_CACHE": lambda tmp: a_file(tmp) + "/cli",
    "LABKUBE_ARE_VENV": a_file,
    "LABKUBE_BWRAP": lambda tmp: str(tmp / "no-such-bwrap"),
    "LABKUBE_GPU_SAMPLE_S": lambda _: "-1",
    "LABKUBE_GPU_REPLAY": lambda tmp: str(tmp / "no-such-recording.jsonl"),
}

# Unset (empty is unset) every setting the test does not give, whatever the environment running the tests holds.
UNSET = {setting.name: "" for setting in USER_SETTINGS}


def refused_writing_nothing(tmp_path: Path, name: str, value: str, *args: str) -> str:
    before = tree_digest(tmp_path)
    proc = labkube(*args, cwd=tmp_path, env={**UNSET, name: value}, timeout=120)
    line = one_line_error(proc)
    assert tree_digest(tmp_path) == before, "something was written"
    assert not (tmp_path / "c").exists() and not (tmp_path / "campaigns").exists()
    return line


def test_every_setting_has_a_junk_value() -> None:
    assert sorted(JUNK) == sorted(s.name for s in USER_SETTINGS)


@pytest.mark.parametrize("name", sorted(JUNK))
def test_labkube_run_refuses_a_junk_setting_in_one_line_before_writing(tmp_path: Path, name: str) -> None:
    value = JUNK[name](tmp_path)
    line = refused_writing_nothing(tmp_path, name, value, "run", BUNDLED_TASK, "--model", "noop", "--out", "c")
    assert name in line and value in line, line
    setting = next(s for s in USER_SETTINGS if s.name == name)
    if setting.checked_at_start:
        assert setting.accepts in line, line
    else:  # the bubblewrap binary is checked with the sandbox, which says how to run without one
        assert "--sandbox none" in line, line


@pytest.mark.parametrize(
    ("name", "value"),
    [("LABKUBE_CONTAINMENT", "junk"), ("LABKUBE_LOCAL_GPUS", "abc"), ("LABKUBE_WARM_WORKERS", "false-ish")],
)
def test_demo_and_campaign_run_refuse_a_junk_setting_before_writing(tmp_path: Path, name: str, value: str) -> None:
    spec = tmp_path / "campaign.yaml"
    spec.write_text(f"name: mine\ntasks: [{BUNDLED_TASK}]\nmodels: [noop]\n")
    for args in (
        ("demo",),
        ("demo", "--out", "c"),
        ("campaign", "run", str(spec)),
        ("campaign", "run", str(spec), "--out", "c"),
    ):
        line = refused_writing_nothing(tmp_path, name, value, *args)
        assert f"{name}={value!r}" in line, line


def test_the_env_cache_under_a_file_and_a_negative_gpu_count_are_refused(tmp_path: Path) -> None:
    cache = a_file(tmp_path) + "/envs"
    line = refused_writing_nothing(tmp_path, "LABKUBE_ENV_CACHE", cache, "run", BUNDLED_TASK, "--out", "c")
    assert "is a file, not a folder" in line
    line = refused_writing_nothing(tmp_path, "LABKUBE_LOCAL_GPUS", "-1", "run", BUNDLED_TASK, "--out", "c")
    assert "0 or more" in line


def test_accepted_settings_pass_the_front_door(tmp_path: Path) -> None:
    """Good values are not refused: the command goes on to its own flags (here a bad one, so nothing starts)."""
    (tmp_path / "envs").mkdir()
    env = {
        **UNSET,
        "LABKUBE_CONTAINMENT": "Processes",
        "LABKUBE_LOCAL_GPUS": "0",
        "LABKUBE_ENV_CACHE": str(tmp_path / "envs" / "not-yet"),
        "LABKUBE_WARM_WORKERS": "off",
        "LABKUBE_WEB_SEARCH": "searxng:http://127.0.0.1:8888",
        "LABKUBE_GPU_SAMPLE_S": "0.5",
    }
    proc = labkube("run", BUNDLED_TASK, "--seeds", "0", "--out", "c", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2
    assert "Invalid value for '--seeds'" in proc.stderr and "LABKUBE_" not in proc.stderr, proc.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "envs" / "not-yet").exists()


def test_help_is_shown_whatever_the_settings(tmp_path: Path) -> None:
    env = {**UNSET, "LABKUBE_CONTAINMENT": "junk"}
    for args in (("run", "--help"), ("campaign", "run", "-h"), ("demo", "--help")):
        proc = labkube(*args, cwd=tmp_path, env=env, timeout=60)
        assert proc.returncode == 0 and "Usage:" in proc.stdout, proc.stderr


# -- booleans --------------------------------------------------------------------------------------------------

OFF_SPELLINGS = ["0", "false", "FALSE", "no", "No", "off", "OFF", " off "]
ON_SPELLINGS = ["1", "true", "True", "yes", "YES", "on", "On"]


@pytest.mark.parametrize("spelling", OFF_SPELLINGS + ON_SPELLINGS)
def test_warm_workers_take_the_usual_spellings(spelling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkube.operator.warm import warm_workers

    monkeypatch.setenv(WARM_WORKERS.name, spelling)
    assert warm_workers() is (spelling in ON_SPELLINGS)


def test_warm_workers_are_on_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    from labkube.operator.warm import warm_workers

    monkeypatch.delenv(WARM_WORKERS.name, raising=False)
    assert warm_workers() is True
    monkeypatch.setenv(WARM_WORKERS.name, "")
    assert warm_workers() is True
    monkeypatch.setenv(WARM_WORKERS.name, "maybe")
    with pytest.raises(SettingError, match="LABKUBE_WARM_WORKERS='maybe'"):
        warm_workers()


def test_labkube_settings_shows_how_a_boolean_was_read(tmp_path: Path) -> None:
    for spelling, read in (("false", "off"), ("No", "off"), ("OFF", "off"), ("yes", "on"), ("1", "on")):
        proc = labkube("settings", cwd=tmp_path, env={**UNSET, WARM_WORKERS.name: spelling}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        (row,) = [line for line in proc.stdout.splitlines() if WARM_WORKERS.name in line]
        assert f"{spelling} ({read})" in row, row


# -- labkube settings and --help -------------------------------------------------------------------------------


def test_labkube_settings_lists_every_setting(tmp_path: Path) -> None:
    proc = labkube("settings", cwd=tmp_path, env=UNSET, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    for setting in USER_SETTINGS:
        assert setting.name in proc.stdout
    for header in ("variable", "value here", "default", "accepts", "what it does"):
        assert header in proc.stdout
    assert "LABKUBE_RUN_SPEC" not in proc.stdout and "LABKUBE_GATEWAY" not in proc.stdout  # labkube's own contracts


def test_labkube_settings_refuses_a_junk_value_and_shows_it(tmp_path: Path) -> None:
    proc = labkube("settings", cwd=tmp_path, env={**UNSET, "LABKUBE_LOCAL_GPUS": "abc"}, timeout=60)
    assert proc.returncode == 2
    assert "abc (not accepted)" in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "error: LABKUBE_LOCAL_GPUS='abc': not accepted; it accepts a whole number, 0 or more"
    ]


def test_labkube_help_names_the_settings_command(tmp_path: Path) -> None:
    proc = labkube("--help", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0
    assert "settings" in proc.stdout.split("Commands:")[1]
    assert "`labkube settings` lists them" in " ".join(proc.stdout.split())


def test_settings_problems_reads_a_given_environment() -> None:
    assert settings_problems({}) == []
    assert settings_problems({"LABKUBE_WARM_WORKERS": "nope", "LABKUBE_CONTAINMENT": "cgroup"}) == [
        "LABKUBE_WARM_WORKERS='nope': not accepted; it accepts 1/0, true/false, yes/no, on/off"
    ]
    assert settings_problems({"LABKUBE_BWRAP": "/nope"}) == []  # checked with the sandbox
    assert settings_problems({"LABKUBE_BWRAP": "/nope"}, all_settings=True) != []
