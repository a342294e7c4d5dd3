"""The front door, part 3 (issue #45 items 3, 5 and 6): `status --watch` ends, with a line, when the campaign is
finished or nothing runs it, and prints its table into a pipe; what cannot be graded or has nothing to run is
refused before a campaign folder is written; a YAML key given twice is an error naming both lines; `audit` refuses
a run that has not ended; `report` says when run folders are missing. The CLI as a subprocess
(tests/cli_helpers.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import BUNDLED_TASK, labkube, one_line_error, tree_digest

from labkube.store import LOCK_FILE
from labkube.tasks import BUNDLED

pytestmark = pytest.mark.slow
TASK_DIR = BUNDLED / "researchgym" / "continual-learning-lite"
RUN_IDS = ("continual-learning-lite--noop--s0", "continual-learning-lite--noop--s1")
HOLD_LOCK = """
import sys, time
from labkube.store import CampaignDir
with CampaignDir(sys.argv[1]).lock():
    print("locked", flush=True)
    time.sleep(600)  # until the test kills it, as a `labkube run` that holds the campaign
"""


def refused(proc: subprocess.CompletedProcess, *expected: str) -> str:
    """The one line of a refusal, checked: exit 2, no traceback, each of `expected` in it."""
    line = one_line_error(proc)
    for part in expected:
        assert part in line, line
    return line


def refused_writing_nothing(cwd: Path, *args: str, expected: tuple[str, ...]) -> str:
    before = tree_digest(cwd)
    line = refused(labkube(*args, cwd=cwd, timeout=120), *expected)
    assert tree_digest(cwd) == before, "something was written"
    return line


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished campaign of two do-nothing runs (seeds 0 and 1) of the bundled task."""
    work = tmp_path_factory.mktemp("refusals")
    proc = labkube("run", BUNDLED_TASK, "--model", "noop", "--seeds", "2", "--out", str(work / "camp"), cwd=work)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert sorted(p.name for p in (work / "camp" / "runs").iterdir()) == list(RUN_IDS)
    return work / "camp"


@pytest.fixture
def copied(campaign: Path, tmp_path: Path) -> Path:
    out = tmp_path / "camp"
    shutil.copytree(campaign, out, symlinks=True)
    return out


def unfinish(run_dir: Path, phase: str = "Running") -> None:
    """The run as a runner left it mid-way: no result.json, its status `phase`."""
    (run_dir / "result.json").unlink()
    (run_dir / "integrity.json").unlink(missing_ok=True)
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps({**status, "phase": phase}))


def hold_lock(cdir: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(cdir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def watch(cdir: Path, cwd: Path) -> subprocess.Popen:
    """`labkube status --watch` with its output into a pipe (not a terminal)."""
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "status", "--watch", str(cdir)],
        cwd=cwd,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rows_shown(table: str) -> int:
    """The runs a table shows (a narrow column cuts their ids short)."""
    return table.count("continual-learning-lite--noop")


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# -- item 3: watches end -------------------------------------------------------------------------------------------


def test_watching_a_finished_campaign_prints_the_table_into_a_pipe_and_ends(campaign: Path, tmp_path: Path) -> None:
    proc = labkube("status", "--watch", str(campaign), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows_shown(proc.stdout) == 2, proc.stdout
    assert last_line(proc.stdout) == "campaign finished: all 2 run(s) are final"


def test_watching_an_unfinished_campaign_nothing_runs_ends_saying_how_to_go_on(copied: Path, tmp_path: Path) -> None:
    unfinish(copied / "runs" / RUN_IDS[1])
    proc = labkube("status", "--watch", str(copied), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows_shown(proc.stdout) == 2 and "Running" in proc.stdout, proc.stdout
    line = last_line(proc.stdout)
    assert line.startswith("nothing is running this campaign: 1 unfinished run(s); "), line
    assert "run the same `labkube run`" in line and f"--out {copied}" in line


def test_the_watch_follows_while_a_runner_holds_the_campaign_and_ends_when_it_dies(
    copied: Path, tmp_path: Path
) -> None:
    unfinish(copied / "runs" / RUN_IDS[0], phase="Pending")
    holder = hold_lock(copied)
    watcher = watch(copied, tmp_path)
    try:
        time.sleep(4)
        assert watcher.poll() is None, "the watch ended while a runner held the campaign"
    finally:
        holder.kill()  # the runner dies without a word: the kernel drops its lock
        holder.wait()
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, out + err
    assert out.count(f"runs in {copied}") == 1, "a table per second into a pipe, not one per change"
    assert last_line(out).startswith("nothing is running this campaign: 1 unfinished run(s)"), out


def test_a_campaign_with_no_lock_file_is_watched_until_its_runs_end(copied: Path, tmp_path: Path) -> None:
    """The Kubernetes operator drives a campaign without the lock (its replicas hold a Lease): nothing here can
    tell whether it runs, so the watch goes on."""
    unfinish(copied / "runs" / RUN_IDS[0])
    (copied / LOCK_FILE).unlink()
    watcher = watch(copied, tmp_path)
    try:
        time.sleep(4)
        assert watcher.poll() is None, watcher.communicate()
    finally:
        watcher.kill()
        watcher.wait()


def test_the_watch_ends_when_the_last_run_finishes_while_the_runner_still_holds_it(
    campaign: Path, copied: Path, tmp_path: Path
) -> None:
    run = copied / "runs" / RUN_IDS[1]
    unfinish(run)
    holder = hold_lock(copied)
    try:
        watcher = watch(copied, tmp_path)
        time.sleep(3)
        assert watcher.poll() is None
        for name in ("status.json", "result.json"):  # the run ends, as its runner writes it
            shutil.copy2(campaign / "runs" / RUN_IDS[1] / name, run / name)
        out, err = watcher.communicate(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert watcher.returncode == 0, out + err
    assert out.count(f"runs in {copied}") == 2, out  # the table as it was, and once the run ended
    assert last_line(out) == "campaign finished: all 2 run(s) are final"


# -- item 5: nothing to run, nothing to grade, a key given twice ---------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n  \n"], ids=["empty", "blank-lines"])
def test_an_empty_gaia_dataset_is_refused_by_run_and_every_tasks_command(tmp_path: Path, content: str) -> None:
    dataset = tmp_path / "mygaia"
    dataset.mkdir()
    (dataset / "metadata.jsonl").write_text(content)
    expected = ("metadata.jsonl holds no questions", "add one JSON object per line")
    refused_writing_nothing(tmp_path, "run", "mygaia", "--model", "oracle", "--out", "c", expected=expected)
    for command in (["show"], ["prepare"], ["dockerfile", "--out", "image"]):
        refused_writing_nothing(tmp_path, "tasks", *command, "mygaia", expected=expected)


def paper_task(tmp_path: Path) -> Path:
    task = tmp_path / "mytask"
    shutil.copytree(TASK_DIR, task)
    return task


def test_a_task_folder_without_its_grader_is_refused_before_the_campaign_is_written(tmp_path: Path) -> None:
    task = paper_task(tmp_path)
    shutil.rmtree(task / "grading")
    line = refused_writing_nothing(
        tmp_path, "run", "mytask", "--model", "noop", "--out", "c", expected=("no grading/grade.sh in",)
    )
    assert "add the task's grader there" in line
    show = labkube("tasks", "show", "mytask", cwd=tmp_path, timeout=60)  # what is missing, shown, not refused
    assert show.returncode == 0 and "no grading/grade.sh: runs cannot be graded" in show.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "task_description.md is empty"),
        (b" \n\n\t\n", "task_description.md is empty"),
        (bytes(range(256)) * 4, "task_description.md is not text"),
        ("# Caf\u00e9 task\n| Method | Score |\n".encode("latin-1"), "task_description.md is not text"),
        (b"# Task\x00\x01\x02\n", "task_description.md is not text"),
    ],
    ids=["empty", "blank", "binary", "latin-1", "nul-bytes"],
)
def test_an_empty_or_binary_task_description_is_refused(tmp_path: Path, content: bytes, expected: str) -> None:
    task = paper_task(tmp_path)
    (task / "task_description.md").write_bytes(content)
    refused_writing_nothing(tmp_path, "run", "mytask", "--model", "noop", "--out", "c", expected=(expected,))
    refused_writing_nothing(tmp_path, "tasks", "show", "mytask", expected=(expected,))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"tasks: [{BUNDLED_TASK}]\nmodels: [noop]\nseeds: 1\nmodels: [oracle]\n",
            "`models` is given twice (lines 2 and 4)",
        ),
        (f"seeds: 2\ntasks: [{BUNDLED_TASK}]\nseeds: 3\n", "`seeds` is given twice (lines 1 and 3)"),
        (
            f"tasks: [{BUNDLED_TASK}]\nbudgets:\n  steps: 5\n  wall_hours: 1\n  steps: 9\n",
            "`steps` is given twice (lines 3 and 5)",
        ),
    ],
    ids=["models", "seeds", "nested"],
)
def test_a_key_given_twice_in_a_campaign_file_names_the_key_and_both_lines(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "c.yaml").write_text(text)
    line = refused_writing_nothing(tmp_path, "campaign", "run", "c.yaml", "--out", "c", expected=(expected,))
    assert line.startswith("error: c.yaml: ")


def test_merge_keys_may_repeat_and_be_overridden(tmp_path: Path) -> None:
    """YAML's merge key (`<<`) brings keys in that the mapping may override: that is not a key given twice."""
    from labkube.runs_cli import UniqueKeyLoader

    text = "base: &b {a: 1, b: 2}\nmore: &m {c: 3}\nboth:\n  <<: *b\n  <<: *m\n  a: 9\n"
    assert yaml.load(text, Loader=UniqueKeyLoader)["both"] == {"a": 9, "b": 2, "c": 3}


# -- item 6: exit 2 where the README says, audit of an unended run, report of missing run folders ------------------


def test_tasks_prepare_on_a_whole_gaia_dataset_exits_2(tmp_path: Path) -> None:
    refused_writing_nothing(tmp_path, "tasks", "prepare", "gaia/demo", expected=("names 8 tasks; name one of them",))


def test_tasks_dockerfile_into_a_folder_that_is_not_empty_exits_2(tmp_path: Path) -> None:
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "mine.txt").write_text("mine\n")
    refused_writing_nothing(
        tmp_path, "tasks", "dockerfile", BUNDLED_TASK, "--out", "image", expected=("exists and is not empty",)
    )


def test_audit_refuses_a_run_that_never_started(copied: Path, tmp_path: Path) -> None:
    run = copied / "runs" / RUN_IDS[0]
    for child in run.iterdir():  # what `labkube run` writes of a run before it starts: its run.json
        if child.name != "run.json":
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    line = refused_writing_nothing(tmp_path, "audit", str(run), expected=("this run never started",))
    assert "No such file" not in line


@pytest.mark.parametrize("phase", ["Running", "Grading", "Pending", "Finished"])
def test_audit_refuses_a_run_that_has_not_finished(copied: Path, tmp_path: Path, phase: str) -> None:
    """Finished in status.json with no result.json yet: the run's end is still being written."""
    run = copied / "runs" / RUN_IDS[0]
    unfinish(run, phase)
    line = refused_writing_nothing(copied, "audit", str(run), expected=("this run has not finished",))
    assert f"its status is {phase}" in line and f"labkube status --watch {copied}" in line
    assert not (run / "integrity.json").exists()


def test_audit_of_a_finished_run_still_writes_its_verdict(copied: Path, tmp_path: Path) -> None:
    run = copied / "runs" / RUN_IDS[0]
    proc = labkube("audit", str(run), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"written: {run / 'integrity.json'}" in proc.stdout


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_report_says_when_run_folders_of_the_campaign_are_missing(copied: Path, tmp_path: Path, fmt: str) -> None:
    shutil.rmtree(copied / "runs" / RUN_IDS[1])
    proc = labkube("report", str(copied), "--format", fmt, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("warning: 1 of the campaign's 2 runs have no run folder"), lines[0]
    assert RUN_IDS[1] in lines[0] and f"--out {copied}" in lines[0]
    if fmt == "json":
        assert [row["run_id"] for row in json.loads(proc.stdout)] == [RUN_IDS[0]]
    else:  # the table still printed, with the run that is there
        assert proc.stdout.count("Finished (done)") == 1 and RUN_IDS[1] not in proc.stdout, proc.stdout


def test_report_of_a_whole_campaign_warns_of_nothing(campaign: Path, tmp_path: Path) -> None:
    proc = labkube("report", str(campaign), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
