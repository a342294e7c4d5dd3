"""labkube's own record of a workspace (`<run>/workspace.git`, tasks/workspace.py): labkube's `git` never reads the
agent's `.git`.

The workspace's repository is the agent's: it may write a clean filter, a diff driver, hooks or an fsmonitor into its
config, attributes that rewrite what `git add` stores, move or delete `labkube-pristine`, or delete the repository.
Each test plays such an agent with real files and the real `git` (first showing, where it can, that the trap it set
does fire for a `git` that reads the agent's repository), then takes what labkube takes when a run ends: the run-end
record (`record_workspace_files`), the audit's changes (`workspace_changes`), the diff (`workspace_diff`) and the
hand-off's `git status` (`latest_state`). Nothing of the agent's runs, and the changes are the files' real content.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import audit, latest_state, record_workspace
from labkube.agent.jobs import JobManager
from labkube.integrity.evidence import (
    WORKSPACE_FILES,
    WorkspaceChanges,
    WorkspaceFiles,
    record_workspace_files,
    workspace_changes,
)
from labkube.integrity_report import IntegrityReport
from labkube.result import RunResult
from labkube.run_spec import RunPhase
from labkube.store import RunDir
from labkube.task_card import TaskCard
from labkube.tasks import PristineTask, card_for_run, make_empty_pristine, remove_empty_pristine
from labkube.tasks.workspace import (
    EMPTY_TREE,
    PRISTINE_TAG,
    commit_pristine,
    prepare_workspace,
    pristine_is_empty,
    workspace_diff,
    workspace_record,
)

PRISTINE = "print('the pristine task')\n"
CHEATED = "print('the agent was here')\n"


def agent_git(workspace: Path, *args: str, check: bool = True) -> str:
    """`git` as the agent's own commands run it: in its workspace, with its repository and its config."""
    proc = subprocess.run(
        ["git", "-c", "user.name=agent", "-c", "user.email=agent@localhost", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=check,
    )
    return proc.stdout.strip()


def record_git(run_dir: Path, *args: str) -> str:
    """Read labkube's record of the run's workspace, as a test may (never as labkube runs it)."""
    proc = subprocess.run(["git", f"--git-dir={run_dir / 'workspace.git'}", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def trap(marker: Path) -> str:
    """A shell command that leaves `marker` behind when anything runs it."""
    return f"touch {shlex.quote(str(marker))}"


def hook(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{trap(marker)}\n")
    path.chmod(0o755)
    return path


def add_config(workspace: Path, text: str) -> None:
    with (workspace / ".git" / "config").open("a") as config:
        config.write(text)


def armed(workspace: Path, marker: Path, *git_args: str) -> None:
    """The trap fires for a `git` that reads the agent's repository (as labkube's did); cleared for the test."""
    agent_git(workspace, *git_args, check=False)
    assert marker.exists(), f"the trap did not fire for git {' '.join(git_args)}"
    marker.unlink()


def everything_labkube_runs(run_dir: Path) -> list[WorkspaceChanges]:
    """What labkube runs in a workspace when a run hands off and ends: the hand-off's status, the diff, the run-end
    record and the audit's changes (the last two returned)."""
    workspace = run_dir / "workspace"
    latest_state(workspace, JobManager(run_dir / "jobs"))
    workspace_diff(workspace)
    return [record_workspace_files(run_dir), workspace_changes(workspace)]


def assert_the_change_is_recorded(run_dir: Path, found: list[WorkspaceChanges], content: bytes) -> None:
    for changes in found:
        change = next(c for c in changes.changes if c.path == "train.py")
        assert (change.status, change.blob) == ("M", blob_id(content))
        assert "-print('the pristine task')" in changes.diff
    stored = WorkspaceFiles.model_validate_json((run_dir / WORKSPACE_FILES).read_text())
    assert stored.files["train.py"].blob == blob_id(content)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    workspace = run / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "train.py").write_text(PRISTINE)
    commit_pristine(workspace)
    return run


@pytest.fixture
def empty_pristine() -> Iterator[None]:
    make_empty_pristine()
    yield
    remove_empty_pristine()


def test_a_clean_filter_of_the_agents_does_not_run_and_the_real_content_is_recorded(
    run_dir: Path, tmp_path: Path
) -> None:
    workspace, marker = run_dir / "workspace", tmp_path / "filter-ran"
    add_config(workspace, f'[filter "x"]\n\tclean = "{trap(marker)}; echo innocent"\n\tsmudge = cat\n')
    (workspace / ".git" / "info").mkdir(exist_ok=True)
    (workspace / ".git" / "info" / "attributes").write_text("* filter=x\n")
    (workspace / ".gitattributes").write_text("* filter=x\n")
    (workspace / "train.py").write_text(CHEATED)
    armed(workspace, marker, "hash-object", "--path=train.py", "train.py")

    found = everything_labkube_runs(run_dir)
    assert not marker.exists()
    assert_the_change_is_recorded(run_dir, found, CHEATED.encode())
    assert all("+print('the agent was here')" in changes.diff and "innocent" not in changes.diff for changes in found)


def test_a_diff_driver_or_textconv_of_the_agents_does_not_run(run_dir: Path, tmp_path: Path) -> None:
    workspace, marker = run_dir / "workspace", tmp_path / "diff-driver-ran"
    add_config(workspace, f'[diff "x"]\n\tcommand = "{trap(marker)}"\n\ttextconv = "{trap(marker)}; echo innocent"\n')
    (workspace / ".git" / "info").mkdir(exist_ok=True)
    (workspace / ".git" / "info" / "attributes").write_text("* diff=x\n")
    (workspace / "train.py").write_text(CHEATED)
    armed(workspace, marker, "diff")

    found = everything_labkube_runs(run_dir)
    assert not marker.exists()
    assert_the_change_is_recorded(run_dir, found, CHEATED.encode())
    assert all("+print('the agent was here')" in changes.diff for changes in found)


def test_the_agents_gitattributes_change_nothing_that_is_recorded(run_dir: Path) -> None:
    """`text` would store CRLF as LF, `ident` collapse `$Id: ...$`, `-diff` show the change as "Binary files differ":
    the record holds each file's bytes as they are on disk, and its diff shows them."""
    workspace = run_dir / "workspace"
    (workspace / ".gitattributes").write_text("* text eol=crlf ident -diff\n")
    cheated = b"print('the agent was here')\r\n# $Id: made up $\r\n"
    (workspace / "train.py").write_bytes(cheated)

    found = everything_labkube_runs(run_dir)
    assert_the_change_is_recorded(run_dir, found, cheated)
    assert all("+print('the agent was here')" in changes.diff for changes in found)
    assert all("Binary files" not in changes.diff for changes in found)


def test_the_agents_hooks_hooks_path_and_fsmonitor_do_not_run(run_dir: Path, tmp_path: Path) -> None:
    workspace, marker = run_dir / "workspace", tmp_path / "hook-ran"
    names = ("pre-commit", "post-commit", "post-index-change", "reference-transaction", "pre-auto-gc")
    for name in names:  # in the repository's own hooks, and in a hooks folder its config names
        hook(workspace / ".git" / "hooks" / name, marker)
        hook(workspace / "my-hooks" / name, marker)
    fsmonitor = hook(workspace / "my-hooks" / "fsmonitor", marker)
    add_config(workspace, f"[core]\n\thooksPath = {workspace / 'my-hooks'}\n\tfsmonitor = {fsmonitor}\n")
    (workspace / "train.py").write_text(CHEATED)
    armed(workspace, marker, "status")

    found = everything_labkube_runs(run_dir)
    assert not marker.exists()
    assert_the_change_is_recorded(run_dir, found, CHEATED.encode())


def move_the_tag(workspace: Path) -> None:
    agent_git(workspace, "add", "-A")
    agent_git(workspace, "commit", "-q", "-m", "nothing to see")
    agent_git(workspace, "tag", "-f", PRISTINE_TAG)
    assert agent_git(workspace, "diff", PRISTINE_TAG, "--stat") == ""  # the agent's own repository sees nothing


def delete_the_repository(workspace: Path) -> None:
    shutil.rmtree(workspace / ".git")


def point_the_repository_elsewhere(workspace: Path) -> None:
    """The tag moved, then `.git` a file naming that repository under another name."""
    move_the_tag(workspace)
    (workspace / ".git").rename(workspace / ".elsewhere")
    (workspace / ".git").write_text("gitdir: .elsewhere\n")


@pytest.mark.parametrize("tamper", [move_the_tag, delete_the_repository, point_the_repository_elsewhere])
def test_what_the_agent_does_to_its_repository_leaves_the_evidence(run_dir: Path, tamper: object) -> None:
    workspace = run_dir / "workspace"
    (workspace / "train.py").write_text(CHEATED)
    tamper(workspace)  # type: ignore[operator]

    found = everything_labkube_runs(run_dir)
    assert_the_change_is_recorded(run_dir, found, CHEATED.encode())
    assert all("+print('the agent was here')" in changes.diff for changes in found)
    assert all(not c.path.startswith(".git/") for changes in found for c in changes.changes)


def test_the_agents_repository_works_and_shares_no_file_with_the_record(tmp_path: Path) -> None:
    task = tmp_path / "task"
    (task / "grading").mkdir(parents=True)
    (task / "train.py").write_text(PRISTINE)
    (task / "grading" / "grade.sh").write_text("exit 0\n")
    run = tmp_path / "run"
    workspace = prepare_workspace(TaskCard(ref="t", name="t", path=str(task)), run / "workspace")

    record = workspace_record(workspace)
    assert record == run / "workspace.git" == RunDir(run).workspace_record
    assert not record.resolve().is_relative_to(workspace.resolve())
    assert agent_git(workspace, "log", "--format=%s") == "pristine task"
    assert agent_git(workspace, "status", "--porcelain") == ""
    assert agent_git(workspace, "rev-parse", PRISTINE_TAG) == record_git(run, "rev-parse", PRISTINE_TAG)
    assert record_git(run, "ls-tree", "-r", "--name-only", PRISTINE_TAG).split() == ["grading/grade.sh", "train.py"]
    record_inodes = {p.stat().st_ino for p in record.rglob("*") if p.is_file()}
    assert record_inodes.isdisjoint(p.stat().st_ino for p in (workspace / ".git").rglob("*") if p.is_file())
    (workspace / "train.py").write_text(CHEATED)
    agent_git(workspace, "commit", "-q", "-am", "the agent's work")
    assert agent_git(workspace, "log", "--format=%s") == "the agent's work\npristine task"
    assert [(c.path, c.status) for c in workspace_changes(workspace).changes] == [("train.py", "M")]


def test_the_empty_pristine_template_writes_a_valid_record_too(tmp_path: Path, empty_pristine: None) -> None:
    workspace = tmp_path / "run" / "workspace"
    workspace.mkdir(parents=True)
    commit_pristine(workspace)

    run = workspace.parent
    assert sorted(p.name for p in run.iterdir()) == ["workspace", "workspace.git"]  # nothing half-written is left
    assert record_git(run, "rev-parse", f"{PRISTINE_TAG}^{{tree}}") == EMPTY_TREE
    assert record_git(run, "fsck", "--strict") == ""
    assert agent_git(workspace, "rev-parse", PRISTINE_TAG) == record_git(run, "rev-parse", PRISTINE_TAG)
    assert agent_git(workspace, "log", "--format=%s") == "pristine task"
    assert pristine_is_empty(workspace)
    assert workspace_changes(workspace).changes == []
    (workspace / "answer.txt").write_text("4\n")
    move_the_tag(workspace)
    assert pristine_is_empty(workspace)  # the record's pristine commit, whatever the agent's tag says
    assert [(c.path, c.status) for c in workspace_changes(workspace).changes] == [("answer.txt", "A")]


def test_a_run_without_a_record_says_so_instead_of_reading_the_agents_repository(tmp_path: Path) -> None:
    """A run directory of a labkube from before the record: its workspace's `.git` is the only pristine commit there
    is, and the agent's to rewrite. What reads the run folder's record says it is missing (the run-end record taken
    without the task, the hand-off's status); the audit, which makes the pristine record again from the task, sees
    the agent's real change, whatever the agent's tag says."""
    task = make_tiny_task(tmp_path / "tasks", [])
    rd = RunDir(make_run_dir(tmp_path / "campaign", task))
    rd.workspace.mkdir(parents=True)
    (rd.workspace / "train.py").write_text(PRISTINE)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "pristine task"], ["tag", PRISTINE_TAG]):
        agent_git(rd.workspace, *args)
    (rd.workspace / "train.py").write_text(CHEATED)
    move_the_tag(rd.workspace)

    assert record_workspace(rd) is None
    assert "record of the workspace is missing" in (rd.logs / "audit-error.txt").read_text()
    spec = rd.spec()
    result = RunResult(run_id=spec.run_id, task=spec.task, model=spec.model, seed=spec.seed, status=RunPhase.finished)
    card = card_for_run(spec.task, spec.task_path, spec.task_id, spec.family, spec.task_overlay)
    audited = audit(rd, spec, result, card=card)
    assert "record of the workspace is missing" not in (audited.message or "")
    assert IntegrityReport.model_validate_json((rd.root / "integrity.json").read_text()).violations
    changes = workspace_changes(rd.workspace, PristineTask(card)).changes
    assert ("train.py", "A", blob_id(CHEATED.encode())) in {(c.path, c.status, c.blob) for c in changes}
    assert "(unknown)" in latest_state(rd.workspace, JobManager(rd.root / "jobs"))


def test_bytes_that_are_no_utf8_in_a_changed_file_are_recorded(run_dir: Path) -> None:
    cheated = b"print('caf\xe9')\n"
    (run_dir / "workspace" / "train.py").write_bytes(cheated)
    found = everything_labkube_runs(run_dir)
    assert_the_change_is_recorded(run_dir, found, cheated)


def test_a_file_named_like_the_tag_does_not_stop_the_record(run_dir: Path) -> None:
    workspace = run_dir / "workspace"
    (workspace / PRISTINE_TAG).write_text("a file, not the tag\n")
    (workspace / "train.py").write_text(CHEATED)
    found = everything_labkube_runs(run_dir)
    assert_the_change_is_recorded(run_dir, found, CHEATED.encode())
    assert all((PRISTINE_TAG, "A") in [(c.path, c.status) for c in changes.changes] for changes in found)
