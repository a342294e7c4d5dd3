"""The agent's working copy of a task: a git repository with the pristine task committed."""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
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

    An empty workspace (every Gaia2 scenario, a GAIA question without a file) gets the files of this process's
    empty pristine repository when it has them (`make_empty_pristine`, made by the agent zygote before it forks):
    the same commit of the empty tree, without four `git` processes per run."""
    if _empty_pristine is not None and not any(dest.iterdir()):
        try:
            _empty_pristine.write_into(dest)
            return
        except OSError:  # a workspace it cannot write as it is: git makes this one (and says why when it fails too)
            shutil.rmtree(dest / ".git", ignore_errors=True)
    run_git(dest, "init", "-q", "-b", "main")
    run_git(dest, "add", "-A")
    run_git(dest, "commit", "-q", "--allow-empty", "-m", "pristine task")
    run_git(dest, "tag", PRISTINE_TAG)


@dataclass(frozen=True)
class EmptyPristine:
    """The `.git` of an empty workspace committed as the pristine task, held in memory: its directories and its
    files (path relative to the workspace, permission bits, content). Written out with one `mkdir` per directory and
    one `open`/`write` per file, where copying a template directory (`shutil.copytree`: a copy and a `copystat` per
    entry) cost a forked run 3 ms."""

    made_by: int  # the process that made it; its forked children write it too, each into its own workspace
    directories: tuple[tuple[str, int], ...]
    files: tuple[tuple[str, int, bytes], ...]
    umask: int  # its maker's, which the runs it forks inherit: only bits it would clear need a chmod of their own

    @classmethod
    def read(cls, workspace: Path) -> EmptyPristine:
        directories, files = [], []
        for directory, subdirs, names in os.walk(workspace / ".git"):
            subdirs.sort()
            here = Path(directory)
            directories.append((here.relative_to(workspace).as_posix(), stat.S_IMODE(here.stat().st_mode)))
            for name in sorted(names):
                path = here / name
                mode = stat.S_IMODE(path.stat().st_mode)
                files.append((path.relative_to(workspace).as_posix(), mode, path.read_bytes()))
        return cls(os.getpid(), tuple(directories), tuple(files), _umask())

    def write_into(self, dest: Path) -> None:
        root = str(dest)
        for rel, mode in self.directories:  # os.walk's order: each directory before what it holds
            path = f"{root}/{rel}"
            os.mkdir(path, mode)
            if mode & self.umask:  # the bits the template had, whatever the umask
                os.chmod(path, mode)
        for rel, mode, content in self.files:
            fd = os.open(f"{root}/{rel}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            try:
                if mode & self.umask:
                    os.fchmod(fd, mode)
                if os.write(fd, content) != len(content):  # a few hundred bytes: one write, or git makes the repository
                    raise OSError(f"a short write of {rel}")
            finally:
                os.close(fd)


def _umask() -> int:
    """This process's umask, read where Linux shows it: setting it to learn it would change it, for a moment, for
    every thread of the process."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
        return umask


_empty_pristine: EmptyPristine | None = None  # set in the agent zygote; the runs it forks inherit it


def make_empty_pristine() -> None:
    """An empty workspace committed as the pristine task, read into memory for `commit_pristine` to write out in
    this process and in the processes it forks; `remove_empty_pristine` forgets it."""
    global _empty_pristine
    with tempfile.TemporaryDirectory(prefix="labkube-empty-pristine-") as tmp:
        path = Path(tmp)
        commit_pristine(path)
        # What git reads is HEAD, config, the index, objects and refs; the rest `git init` writes (sample hooks, the
        # reflogs, a description for gitweb, the commit message file) is inert, and leaving it out halves each copy.
        git = path / ".git"
        for inert in ("hooks", "logs", "info", "branches"):
            shutil.rmtree(git / inert, ignore_errors=True)
        for inert in ("description", "COMMIT_EDITMSG"):
            (git / inert).unlink(missing_ok=True)
        _empty_pristine = EmptyPristine.read(path)


def remove_empty_pristine() -> None:
    global _empty_pristine
    if _empty_pristine is not None and _empty_pristine.made_by == os.getpid():
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
