"""The agent's working copy of a task: a git repository with the pristine task committed."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

from labkube.task_card import TaskCard

GIT = ["git", "-c", "user.name=labkube", "-c", "user.email=labkube@localhost", "-c", "commit.gpgsign=false"]
PRISTINE_TAG = "labkube-pristine"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's object id of the tree with nothing in it


def matches(rel: str, patterns: list[str]) -> bool:
    """Whether a task-relative path is covered by one of the glob patterns (a directory covers its files)."""
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(rel, pattern) or rel == pattern or rel.startswith(pattern + "/"):
            return True
        if pattern.endswith("/**") and (rel == pattern[:-3] or rel.startswith(pattern[:-2])):
            return True
    return False


def hidden_patterns(card: TaskCard, idea_hint: bool) -> list[str]:
    hidden = list(card.hidden)
    if idea_hint:
        hidden = [h for h in hidden if h != "idea_hint.txt"]
    return [*hidden, ".git", "__pycache__", "*/__pycache__"]


def links_outside(task_dir: Path, hidden: list[str]) -> list[tuple[str, str]]:
    """Symbolic links in the part of `task_dir` the agent sees that point outside it: (the link, its target).
    Copied as links, they would hand the agent a path out of its workspace (to /etc, or to the grader's data)."""
    root = task_dir.resolve()
    found = []
    for directory, dirs, files in os.walk(root):
        rel_dir = Path(directory).relative_to(root)
        for name in sorted([*dirs, *files]):
            rel = (rel_dir / name).as_posix().removeprefix("./")
            path = Path(directory) / name
            if matches(rel, [*hidden, ".git", "__pycache__"]) or name == "__pycache__":
                continue
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                found.append((rel, os.readlink(path)))
        dirs[:] = [d for d in dirs if not (Path(directory) / d).is_symlink()]
    return found


def prepare_workspace(card: TaskCard, dest: Path, idea_hint: bool = False) -> Path:
    """Copy what the agent may see into `dest` and commit it as the pristine state.

    An existing workspace (a retried or resumed run) is left as it is.
    """
    if (dest / ".git").is_dir():
        return dest
    src = Path(card.path)
    hidden = hidden_patterns(card, idea_hint)

    def ignore(directory: str, names: list[str]) -> list[str]:
        rel_dir = Path(directory).resolve().relative_to(src)
        out = []
        for name in names:
            rel = (rel_dir / name).as_posix()
            rel = rel[2:] if rel.startswith("./") else rel
            if matches(rel, hidden) or name == "__pycache__":
                out.append(name)
        return out

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=ignore, symlinks=True)
    from labkube.tasks.environment import current_env, link_setup_outputs

    env = current_env()
    if env is not None:  # what install.sh made (data, markers) is part of the task as the agent receives it
        link_setup_outputs(env, src, dest)
    commit_pristine(dest)
    return dest


def commit_pristine(dest: Path) -> None:
    """Make `dest` a git repository whose first commit (tagged) is the task as the agent received it.

    An empty workspace (every Gaia2 scenario, a GAIA question without a file) gets a copy of this process's
    empty pristine repository when it has one (`make_empty_pristine`, made by the agent zygote before it forks):
    the same commit of the empty tree, without four `git` processes per run."""
    if _empty_pristine is not None and not any(dest.iterdir()):
        try:
            shutil.copytree(_empty_pristine[1] / ".git", dest / ".git", symlinks=True)
            return
        except OSError:  # the template is gone (a cleaner of /tmp): git makes this one
            shutil.rmtree(dest / ".git", ignore_errors=True)
    run_git(dest, "init", "-q", "-b", "main")
    run_git(dest, "add", "-A")
    run_git(dest, "commit", "-q", "--allow-empty", "-m", "pristine task")
    run_git(dest, "tag", PRISTINE_TAG)


_empty_pristine: tuple[int, Path] | None = None  # (the process that made it, where); forked children use it too


def make_empty_pristine() -> None:
    """An empty workspace committed as the pristine task, for `commit_pristine` to copy in this process and in the
    processes it forks; the process that made it removes it with `remove_empty_pristine`."""
    global _empty_pristine
    path = Path(tempfile.mkdtemp(prefix="labkube-empty-pristine-"))
    commit_pristine(path)
    # What git reads is HEAD, config, the index, objects and refs; the rest `git init` writes (sample hooks, the
    # reflogs, a description for gitweb, the commit message file) is inert, and leaving it out halves each copy.
    git = path / ".git"
    for inert in ("hooks", "logs", "info", "branches"):
        shutil.rmtree(git / inert, ignore_errors=True)
    for inert in ("description", "COMMIT_EDITMSG"):
        (git / inert).unlink(missing_ok=True)
    _empty_pristine = (os.getpid(), path)


def remove_empty_pristine() -> None:
    global _empty_pristine
    if _empty_pristine is not None and _empty_pristine[0] == os.getpid():
        shutil.rmtree(_empty_pristine[1], ignore_errors=True)
        _empty_pristine = None


def pristine_is_empty(workspace: Path) -> bool:
    """Whether the pristine commit is the empty tree, read from git's own files (a loose tag and commit, as
    `commit_pristine` leaves them); False whenever that cannot be read, so callers fall back to `git`."""
    try:
        commit = (workspace / ".git" / "refs" / "tags" / PRISTINE_TAG).read_text().strip()
        if len(commit) != 40 or not all(c in "0123456789abcdef" for c in commit):
            return False
        raw = zlib.decompress((workspace / ".git" / "objects" / commit[:2] / commit[2:]).read_bytes())
    except (OSError, zlib.error):
        return False
    header, _, body = raw.partition(b"\0")
    return header.startswith(b"commit ") and body.startswith(f"tree {EMPTY_TREE}\n".encode())


def run_git(cwd: Path, *args: str) -> str:
    proc = subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def workspace_diff(workspace: Path) -> str:
    """The agent's changes against the pristine commit, untracked files included."""
    run_git(workspace, "add", "-A", "--intent-to-add")
    return run_git(workspace, "diff", PRISTINE_TAG, "--no-color", "--no-ext-diff")
