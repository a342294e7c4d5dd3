"""The pristine commit of an empty workspace copied from a process's template (as the agent zygote's forked runs get
it) is the one `git` makes, and the workspace diff it skips `git` for is the one `git` computes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkube.integrity.evidence import workspace_changes
from labkube.tasks import make_empty_pristine, remove_empty_pristine
from labkube.tasks.workspace import (
    EMPTY_TREE,
    PRISTINE_TAG,
    commit_pristine,
    pristine_is_empty,
    run_git,
    workspace_record,
)


def git(workspace: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=workspace, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def empty_pristine() -> Iterator[None]:
    make_empty_pristine()
    yield
    remove_empty_pristine()


def test_an_empty_workspace_from_the_template_is_a_repository_with_the_empty_pristine_commit(
    tmp_path: Path, empty_pristine: None
) -> None:
    copied, made = tmp_path / "copied", tmp_path / "made"
    copied.mkdir()
    commit_pristine(copied)
    remove_empty_pristine()
    made.mkdir()
    commit_pristine(made)  # no template any more: git makes it
    for workspace in (copied, made):
        assert git(workspace, "rev-parse", f"{PRISTINE_TAG}^{{tree}}") == EMPTY_TREE
        assert git(workspace, "rev-parse", "--abbrev-ref", "HEAD") == "main"
        assert git(workspace, "status", "--porcelain", "--ignored") == ""
        assert pristine_is_empty(workspace)
        assert workspace_changes(workspace).changes == []
        assert git(workspace, "fsck", "--strict") == ""
    # The template leaves out what `git init` writes that git does not need (hooks, reflogs, description): the copy
    # is still a repository an agent can commit to, and the diff against the pristine tag is git's own.
    (copied / "notes.txt").write_text("found it\n")
    run_git(copied, "add", "-A")
    run_git(copied, "commit", "-q", "-m", "the agent's work")
    assert git(copied, "log", "--format=%s") == "the agent's work\npristine task"
    assert git(copied, "diff", "--name-only", PRISTINE_TAG) == "notes.txt"
    assert [c.path for c in workspace_changes(copied).changes] == ["notes.txt"]


def test_a_workspace_with_files_is_committed_by_git_even_with_a_template(tmp_path: Path, empty_pristine: None) -> None:
    (tmp_path / "question.txt").write_text("what is 2 + 2?\n")
    commit_pristine(tmp_path)
    assert git(tmp_path, "ls-tree", "--name-only", PRISTINE_TAG) == "question.txt"
    assert not pristine_is_empty(tmp_path)


def test_the_diff_without_git_is_only_for_an_empty_pristine_and_an_empty_workspace(
    tmp_path: Path, empty_pristine: None
) -> None:
    emptied = tmp_path / "emptied"
    emptied.mkdir()
    (emptied / "question.txt").write_text("what is 2 + 2?\n")
    commit_pristine(emptied)
    (emptied / "question.txt").unlink()  # nothing left but the repository: a deletion, which only git sees
    deleted = workspace_changes(emptied)
    assert [(c.path, c.status) for c in deleted.changes] == [("question.txt", "D")]
    assert "question.txt" in deleted.diff

    written = tmp_path / "written"
    written.mkdir()
    commit_pristine(written)
    (written / "answer.txt").write_text("4\n")
    (written / ".hidden").mkdir()
    (written / ".hidden" / "ignored.log").write_text("x\n")
    (written / ".gitignore").write_text(".hidden/\n")
    added = workspace_changes(written)
    assert sorted((c.path, c.status) for c in added.changes) == [
        (".gitignore", "A"),
        (".hidden/ignored.log", "A"),
        ("answer.txt", "A"),
    ]


def test_an_unreadable_pristine_tag_falls_back_to_git(tmp_path: Path, empty_pristine: None) -> None:
    commit_pristine(tmp_path)
    # The tag read is labkube's record's (tests/test_workspace_record.py); the one in the agent's `.git` is the
    # agent's to move, and no longer decides anything (this test used to damage that one).
    tag = workspace_record(tmp_path) / "refs" / "tags" / PRISTINE_TAG
    tag.write_text("../../../../etc/passwd\n")
    assert not pristine_is_empty(tmp_path)
    tag.unlink()
    assert not pristine_is_empty(tmp_path)


def test_each_workspace_gets_a_repository_of_its_own_from_the_template_held_in_memory(
    tmp_path: Path, empty_pristine: None
) -> None:
    """The template is the zygote's memory (no directory a cleaner of /tmp could take away); two runs' workspaces
    written from it share nothing: one's commit and tag moved leave the other's pristine commit as it was, and the
    objects keep git's read-only bits."""
    first, second = tmp_path / "first", tmp_path / "second"
    for workspace in (first, second):
        workspace.mkdir()
        commit_pristine(workspace)
    (first / "notes.txt").write_text("mine\n")
    run_git(first, "add", "-A")
    run_git(first, "commit", "-q", "-m", "the agent's work")
    run_git(first, "tag", "-f", PRISTINE_TAG)
    assert git(first, "rev-parse", PRISTINE_TAG) != git(second, "rev-parse", PRISTINE_TAG)
    # The agent's moved tag is its own: labkube's record of `first` still holds the empty pristine commit (this test
    # used to assert the opposite, the unsafe contract of reading the pristine commit from the agent's `.git`).
    assert pristine_is_empty(first)
    assert [c.path for c in workspace_changes(first).changes] == ["notes.txt"]
    assert pristine_is_empty(second)
    assert git(second, "log", "--format=%s") == "pristine task"
    assert git(second, "fsck", "--strict") == ""
    assert (second / ".git" / "objects" / EMPTY_TREE[:2] / EMPTY_TREE[2:]).stat().st_mode & 0o777 == 0o444


def modes(workspace: Path) -> dict[str, int]:
    return {p.relative_to(workspace).as_posix(): p.stat().st_mode & 0o7777 for p in (workspace / ".git").rglob("*")}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_template_writes_each_file_and_folder_with_the_bits_git_gives_it(
    tmp_path: Path, umask: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One date for both commits: git names a commit by its content, dates included, so two made a second apart are
    # two different objects (CI once saw that) and the paths compared below would differ for a reason of no interest.
    for variable in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        monkeypatch.setenv(variable, "2026-01-01T00:00:00Z")
    previous = os.umask(umask)
    try:
        make_empty_pristine()
        copied, made = tmp_path / "copied", tmp_path / "made"
        copied.mkdir()
        commit_pristine(copied)
        remove_empty_pristine()
        made.mkdir()
        commit_pristine(made)
    finally:
        remove_empty_pristine()
        os.umask(previous)
    written = modes(copied)
    tags = [(workspace / ".git" / "refs" / "tags" / PRISTINE_TAG).read_text() for workspace in (copied, made)]
    assert tags[0] == tags[1], "one pristine commit, written from the template and made by git"
    assert written == {path: mode for path, mode in modes(made).items() if path in written}
    assert f".git/objects/{EMPTY_TREE[:2]}/{EMPTY_TREE[2:]}" in written
