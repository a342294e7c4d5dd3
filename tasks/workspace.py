"""The agent's working copy of a task, and labkube's own record of it.

The workspace is a git repository whose first commit, tagged `labkube-pristine`, is the task as the agent received
it. That repository (`workspace/.git`: config, hooks, attributes, refs, objects, index) is the agent's to use and to
change, so labkube never runs `git` in it: a `git add` that read its config would run the agent's clean filter or
fsmonitor with labkube's environment (API keys), and a diff against its tag would compare with whatever commit the
agent moved the tag to. labkube keeps its own record of the pristine commit in a git directory beside the workspace,
`<run>/workspace.git` (`workspace_record`), made before the agent starts and outside anything the agent can write,
and runs every `git` of its own there (`record_git`): `git --git-dir=<record> --work-tree=<workspace>`, with no
configuration but its own (`SAFE_CONFIG`, `git_env`). A `.git` in the work tree is never read by that git: git skips
the entry `.git` wherever it is, and takes a nested repository (`sub/.git`) as one entry, its commit id.

On a cluster the agent's container mounts the whole run folder, record included: there the agent can rewrite
`workspace.git` too (its config, `info/attributes`, refs, objects). So labkube's git never runs with the record's
config, attributes or hooks: `record_repository` gives git a shadow git directory labkube writes for each use (its
own config and attributes, the pristine commit id, the record's objects as an alternate). And what decides a result
(the run-end record of the files, the audit's changes) trusts neither the record's tag nor its objects:
`private_workspace` makes the pristine record again from the task itself and compares it with a copy of the
workspace's files (`copy_workspace`: no symbolic link followed, nothing but regular files opened), both in a private
temporary directory.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from labkube.storage_full import storage_errno_in
from labkube.task_card import TaskCard

PRISTINE_TAG = "labkube-pristine"
# The tag in full: a file of the workspace named `labkube-pristine` would make the short name ambiguous to git.
PRISTINE_REF = f"refs/tags/{PRISTINE_TAG}"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's object id of the tree with nothing in it
RECORD_SUFFIX = ".git"  # labkube's record of the workspace `<dir>/<name>` is `<dir>/<name>.git`: `<run>/workspace.git`

# The configuration of every `git` labkube runs, over the record's own `config` (which labkube wrote) and nothing
# else (`git_env`: no system or global file). Each line turns off something that could run a program or read a file
# the agent chose, or pins a setting the record's own config could otherwise hold.
SAFE_CONFIG = (
    "user.name=labkube",
    "user.email=labkube@localhost",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "core.hooksPath=/dev/null",  # no hook runs
    "core.fsmonitor=false",  # no fsmonitor program
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.attributesFile=/dev/null",  # not ~/.config/git/attributes
    "core.excludesFile=/dev/null",  # not ~/.config/git/ignore
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.pager=cat",
    "protocol.allow=never",  # no transport at all: no core.sshCommand, no remote helper
    "gc.auto=0",  # no `gc --auto` after a commit: no background process, the pristine objects stay loose
    "maintenance.auto=false",
    # A nested repository of the agent's (`sub/.git`) is recorded as its commit id; its work tree is never examined,
    # which would run `git status` inside it, with its config (and its fsmonitor).
    "diff.ignoreSubmodules=dirty",
    "status.submoduleSummary=false",
    "submodule.recurse=false",
)
GIT = ["git", "--no-pager", *(arg for setting in SAFE_CONFIG for arg in ("-c", setting))]
# What each diff of labkube's is given: no external diff program and no textconv (both come only from configuration,
# which the agent never wrote here; this keeps it so), no colour codes, no look into a nested repository's work tree.
SAFE_DIFF = ("--no-color", "--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty")
# The record's `info/attributes`, which takes precedence over every `.gitattributes` in the work tree (the agent's):
# each file is recorded as its bytes on disk (no end-of-line conversion, no `$Id$`, no re-encoding) and diffed as its
# content reads (no `-diff` to hide it as binary). A `filter=x` or `diff=x` there would run nothing even without
# this: a driver's command comes only from configuration, and labkube's git reads none the agent wrote.
RECORD_ATTRIBUTES = "* !text !eol !ident !filter !working-tree-encoding !diff !merge\n"
# The dates of the commits labkube makes may come from this process's environment (a test fixes them to compare two
# pristine commits); they change what a commit says, not what git reads or runs. Every other GIT_* variable is
# dropped, as are the programs git could be told to start.
COMMIT_DATES = frozenset({"GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"})
PROGRAM_VARIABLES = frozenset({"PAGER", "EDITOR", "VISUAL", "SSH_ASKPASS"})


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

    An existing workspace (a retried or resumed run) is left as it is (`workspace_prepared`).
    """
    if workspace_prepared(dest):
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

    clear_half_made(dest)
    shutil.copytree(src, dest, ignore=ignore, symlinks=True)
    from labkube.tasks.environment import current_env, link_setup_outputs

    env = current_env()
    if env is not None:  # what install.sh made (data, markers) is part of the task as the agent receives it
        link_setup_outputs(env, src, dest)
    commit_pristine(dest)
    return dest


def workspace_record(workspace: Path) -> Path:
    """labkube's own git directory of `workspace`: its sibling `<name>.git` (a run's `<run>/workspace.git`), which
    holds the pristine commit under `PRISTINE_TAG` and which the agent can neither read nor write."""
    return workspace.parent / f"{workspace.name}{RECORD_SUFFIX}"


def workspace_prepared(workspace: Path) -> bool:
    """Whether `workspace` has been committed as the pristine task already (a resumed or retried run keeps it as it
    is): it exists with labkube's record of it, so an agent that deleted its own `.git` keeps its work. The record is
    renamed into place last (`commit_pristine`), so it marks a preparation that completed: a workspace without it
    was left half-made (a full disk, a killed process) and is prepared again from the start. Except, in a run
    directory of a labkube from before the record, a workspace with the agent's repository whose agent has started
    (a checkpoint beside it): its work is kept, and its audit says the record is missing. A workspace that is gone
    is prepared again, whatever record it left."""
    if not workspace.is_dir():
        return False
    if workspace_record(workspace).is_dir():
        return True
    return (workspace / ".git").is_dir() and (workspace.parent / "checkpoint.json").is_file()


def clear_half_made(workspace: Path) -> None:
    """Remove what a preparation that did not complete left at `workspace` (`workspace_prepared` is false)."""
    if workspace.is_symlink() or (workspace.exists() and not workspace.is_dir()):
        workspace.unlink()
    elif workspace.exists():
        shutil.rmtree(workspace)


class MissingRecord(RuntimeError):
    """A workspace without labkube's record of its pristine commit (a run directory of an older labkube, or a record
    removed since): its changes are not known, and are not taken from the agent's own `.git` either."""

    def __init__(self, workspace: Path) -> None:
        super().__init__(
            f"labkube's record of the workspace is missing ({workspace_record(workspace)}): the run directory was made "
            "by a labkube from before the record, or the record was removed; the workspace's changes are not read "
            "from the agent's own .git, which the agent can rewrite"
        )


def commit_pristine(dest: Path) -> None:
    """Commit `dest` as the task as the agent received it, twice: in labkube's record (`workspace_record`), which every
    diff of labkube's is taken against, and in the agent's own repository `dest/.git`, which the agent may use as it
    likes. The two hold the same pristine commit, tagged `PRISTINE_TAG`, and share no file (through a hard link the
    agent could rewrite the record's objects). The record is written under a temporary name beside it and renamed
    into place last: where it exists, it is whole.

    An empty workspace (every Gaia2 scenario, a GAIA question without a file) gets both from this process's empty
    pristine template when it has one (`make_empty_pristine`, made by the agent zygote before it forks): the same
    commit of the empty tree, without five `git` processes per run.

    Called for a workspace that is not prepared (`workspace_prepared`): a record already there is of a workspace
    since removed (a retried run's), and the new one replaces it."""
    record = workspace_record(dest)
    if record.is_dir() and not record.is_symlink():
        shutil.rmtree(record)
    elif record.exists() or record.is_symlink():
        record.unlink()
    if _empty_pristine is not None and not any(dest.iterdir()):
        partial = record.with_name(f".{record.name}.{os.getpid()}.partial")
        try:
            _empty_pristine.write_into(dest, partial)
            os.rename(partial, record)
            return
        except OSError:  # a workspace it cannot write as it is: git makes this one (and says why when it fails too)
            shutil.rmtree(dest / ".git", ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{record.name}.", suffix=".partial", dir=dest.parent))
    try:
        _commit_record(partial, dest)
        _copy_into_agent_repository(partial, dest)
        os.rename(partial, record)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(dest / ".git", ignore_errors=True)
        raise


def _commit_record(record: Path, workspace: Path) -> None:
    """Make `record` (an empty directory) labkube's git directory of `workspace`, with the workspace's files committed
    and tagged. A bare repository without git's templates (no hooks, no sample files): used only with an explicit
    work tree."""
    _run_git(["init", "-q", "--bare", "--template=", "-b", "main", str(record.absolute())], workspace)
    (record / "info").mkdir(exist_ok=True)
    (record / "info" / "attributes").write_text(RECORD_ATTRIBUTES)
    _record_git(record, workspace, "add", "-A", "--", ".")
    _record_git(record, workspace, "commit", "-q", "--allow-empty", "-m", "pristine task")
    _record_git(record, workspace, "tag", PRISTINE_TAG)


def _copy_into_agent_repository(record: Path, workspace: Path) -> None:
    """The agent's own repository `workspace/.git`: one `git init` makes, holding copies (never links) of the record's
    objects, refs and index, so its HEAD is the pristine commit with nothing to commit."""
    _run_git(["init", "-q", "-b", "main"], workspace)
    repository = workspace / ".git"
    for part in ("objects", "refs"):
        shutil.copytree(record / part, repository / part, dirs_exist_ok=True)
    shutil.copy2(record / "index", repository / "index")


@dataclass(frozen=True)
class _HeldTree:
    """A directory held in memory: its directories (each as the suffix of its path after the root's, the root's own
    first as "", in os.walk's order, with its permission bits) and its files (path suffix, permission bits, content)."""

    directories: tuple[tuple[str, int], ...]
    files: tuple[tuple[str, int, bytes], ...]

    @classmethod
    def read(cls, root: Path) -> _HeldTree:
        directories, files = [], []
        for directory, subdirs, names in os.walk(root):
            subdirs.sort()
            here = Path(directory)
            rel = here.relative_to(root).as_posix()
            directories.append(("" if rel == "." else f"/{rel}", stat.S_IMODE(here.stat().st_mode)))
            for name in sorted(names):
                path = here / name
                mode = stat.S_IMODE(path.stat().st_mode)
                files.append((f"/{path.relative_to(root).as_posix()}", mode, path.read_bytes()))
        return cls(tuple(directories), tuple(files))

    def write_into(self, root: Path, umask: int) -> None:
        """Write the tree at `root`, which must not exist."""
        base = str(root)
        for rel, mode in self.directories:  # os.walk's order: each directory before what it holds
            path = f"{base}{rel}"
            os.mkdir(path, mode)
            if mode & umask:  # the bits the template had, whatever the umask
                os.chmod(path, mode)
        for rel, mode, content in self.files:
            fd = os.open(f"{base}{rel}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            try:
                if mode & umask:
                    os.fchmod(fd, mode)
                if os.write(fd, content) != len(content):  # a few hundred bytes: one write, or git makes the repository
                    raise OSError(f"a short write of {path}")
            finally:
                os.close(fd)


@dataclass(frozen=True)
class EmptyPristine:
    """An empty workspace committed as the pristine task, held in memory: the agent's `.git` and labkube's record,
    each as its directories and files. Written out with one `mkdir` per directory and one `open`/`write` per file,
    where copying a template directory (`shutil.copytree`: a copy and a `copystat` per entry) cost a forked run 3 ms."""

    made_by: int  # the process that made it; its forked children write it too, each into its own workspace
    repository: _HeldTree  # the agent's `.git`
    record: _HeldTree  # labkube's record (`workspace_record`)
    umask: int  # its maker's, which the runs it forks inherit: only bits it would clear need a chmod of their own

    @classmethod
    def read(cls, workspace: Path) -> EmptyPristine:
        repository = _HeldTree.read(workspace / ".git")
        return cls(os.getpid(), repository, _HeldTree.read(workspace_record(workspace)), _umask())

    def write_into(self, dest: Path, record: Path) -> None:
        """The record at `record` (not there yet), then the agent's repository in the empty workspace `dest`."""
        self.record.write_into(record, self.umask)
        self.repository.write_into(dest / ".git", self.umask)


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
    """An empty workspace committed as the pristine task (the agent's repository and labkube's record), read into
    memory for `commit_pristine` to write out in this process and in the processes it forks; `remove_empty_pristine`
    forgets it."""
    global _empty_pristine
    with tempfile.TemporaryDirectory(prefix="labkube-empty-pristine-") as tmp:
        path = Path(tmp) / "workspace"  # its record is `workspace.git` beside it, in the temporary directory too
        path.mkdir()
        commit_pristine(path)
        # What git reads is HEAD, config, the index, objects and refs (and the record's info/attributes); the rest
        # `git init` writes (sample hooks, the reflogs, a description for gitweb, the commit message file) is inert,
        # and leaving it out halves each copy.
        git = path / ".git"
        for inert in ("hooks", "logs", "info", "branches"):
            shutil.rmtree(git / inert, ignore_errors=True)
        for inert in (git / "description", git / "COMMIT_EDITMSG", workspace_record(path) / "COMMIT_EDITMSG"):
            inert.unlink(missing_ok=True)
        _empty_pristine = EmptyPristine.read(path)


def remove_empty_pristine() -> None:
    global _empty_pristine
    if _empty_pristine is not None and _empty_pristine.made_by == os.getpid():
        _empty_pristine = None


def pristine_is_empty(workspace: Path) -> bool:
    """Whether the pristine commit in labkube's record is the empty tree, read from git's own files (a loose tag and
    commit, as `commit_pristine` leaves them); False whenever that cannot be read (no record among them), so callers
    fall back to `git`."""
    record = workspace_record(workspace)
    try:
        commit = _read_small(record / "refs" / "tags" / PRISTINE_TAG).decode("ascii").strip()
        if not _is_object_id(commit):
            return False
        raw = zlib.decompress(_read_small(record / "objects" / commit[:2] / commit[2:]))
    except (OSError, ValueError, zlib.error):
        return False
    header, _, body = raw.partition(b"\0")
    return header.startswith(b"commit ") and body.startswith(f"tree {EMPTY_TREE}\n".encode())


def git_env(index: Path | None = None) -> dict[str, str]:
    """The environment of labkube's `git`: this process's without any GIT_* variable (GIT_DIR, GIT_CONFIG_PARAMETERS,
    GIT_EXTERNAL_DIFF, GIT_SSH_COMMAND, ...; the commit dates excepted) or program to start, and with no system or
    global configuration: the settings on the command line (`SAFE_CONFIG`) over the repository's own config are all
    there is (so no `include`/`includeIf` of someone else's file either). `index`: a scratch index to use."""
    env = {
        name: value
        for name, value in os.environ.items()
        if (not name.startswith("GIT_") or name in COMMIT_DATES) and name not in PROGRAM_VARIABLES
    }
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_SYSTEM=os.devnull,
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_NO_REPLACE_OBJECTS="1",
    )
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    return env


def _run_git(args: list[str], cwd: Path, index: Path | None = None) -> str:
    proc = subprocess.run(
        [*GIT, *args],
        cwd=cwd,
        env=git_env(index),
        capture_output=True,
        # A file's content in a diff is whatever bytes the agent wrote: undecodable ones must not fail the audit.
        encoding="utf-8",
        errors="replace",
        check=False,
    )
    if proc.returncode != 0:
        full = storage_errno_in(proc.stderr)
        if full is not None:  # a full disk is the machine's failure, said as one (labkube/storage_full.py)
            raise OSError(full, os.strerror(full), str(cwd))
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def _record_git(record: Path, workspace: Path, *args: str, index: Path | None = None) -> str:
    return _run_git([f"--git-dir={record.absolute()}", f"--work-tree={workspace.absolute()}", *args], workspace, index)


def record_git(workspace: Path, *args: str, index: Path | None = None) -> str:
    """`git args` on labkube's record of `workspace` with the workspace as its work tree (paths relative to it), in
    the scratch `index` when one is given (else in one holding the pristine commit); never on the agent's `.git`.
    `MissingRecord` without a record. One call of `record_repository`'s."""
    with record_repository(workspace) as git:
        return git(*args, index=index)


class RecordGit(Protocol):
    def __call__(self, *args: str, index: Path | None = None) -> str: ...


@contextmanager
def record_repository(workspace: Path) -> Iterator[RecordGit]:
    """labkube's git on its record of `workspace` for the block: each call runs `git args` with the workspace as its
    work tree, in the scratch `index` given (else in one holding the pristine commit). `MissingRecord` without a
    record.

    git always reads the config and `info/attributes` of the git directory it is given, and a filter or fsmonitor
    defined there runs whatever `-c` says; where the agent can write the record (a cluster's run folder), that
    would be the agent's program in labkube's git. So git is given a shadow of the record (`_shadow_record`): a
    directory labkube writes for the block, whose config and attributes are labkube's, whose only ref is the pristine
    commit id read from the record, which reads the record's objects as an alternate (objects are data: nothing in
    one runs) and takes the objects the block's calls write. What the record's objects and tag say is still the
    agent's word on a cluster: a result is never taken from them there (`private_workspace`)."""
    record = workspace_record(workspace)
    if not record.is_dir():
        raise MissingRecord(workspace)
    with tempfile.TemporaryDirectory(prefix="labkube-record-") as tmp:
        shadow = _shadow_record(record, Path(tmp) / "record.git", workspace)
        pristine_index = Path(tmp) / "index"

        def git(*args: str, index: Path | None = None) -> str:
            if index is None:
                index = pristine_index
                if not index.exists():
                    _record_git(shadow, workspace, "read-tree", PRISTINE_REF, index=index)
            return _record_git(shadow, workspace, *args, index=index)

        yield git


# The whole config of a git directory labkube writes (a bare one: every use names the work tree).
RECORD_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"
SMALL_FILE = 1 << 20  # a ref or a loose commit: never near this; what is larger is not one of labkube's


def _read_small(path: Path) -> bytes:
    """The bytes of the regular file `path` (at most `SMALL_FILE`), opened without following a last symbolic link
    or waiting for a FIFO's writer: an `OSError` for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = os.read(fd, SMALL_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > SMALL_FILE:
        raise OSError(errno.EFBIG, "too large", str(path))
    return data


def _is_object_id(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def _pristine_commit(record: Path) -> str | None:
    """The object id `PRISTINE_REF` names in `record` (a loose ref, as labkube writes it, or a packed one)."""
    try:
        loose = _read_small(record / "refs" / "tags" / PRISTINE_TAG).decode("ascii").strip()
        return loose if _is_object_id(loose) else None
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return None
    try:
        packed = _read_small(record / "packed-refs").decode("ascii", errors="replace")
    except OSError:
        return None
    for line in packed.splitlines():
        commit, _, ref = line.partition(" ")
        if ref.strip() == PRISTINE_REF and _is_object_id(commit):
            return commit
    return None


def _shadow_record(record: Path, shadow: Path, workspace: Path) -> Path:
    """A git directory at `shadow` standing for `record`: labkube's config and attributes, no hooks, the pristine
    commit (read from the record) as its HEAD and tag, and the record's objects as an alternate. New objects (a
    `git add` of the workspace's files) are written into the shadow, never into the record."""
    commit = _pristine_commit(record)
    if commit is None:
        raise MissingRecord(workspace)
    (shadow / "objects" / "info").mkdir(parents=True)
    (shadow / "refs" / "tags").mkdir(parents=True)
    (shadow / "refs" / "heads").mkdir()
    (shadow / "info").mkdir()
    (shadow / "objects" / "info" / "alternates").write_text(f"{(record / 'objects').absolute()}\n")
    (shadow / "refs" / "tags" / PRISTINE_TAG).write_text(f"{commit}\n")
    (shadow / "HEAD").write_text(f"{commit}\n")
    (shadow / "config").write_text(RECORD_CONFIG)
    (shadow / "info" / "attributes").write_text(RECORD_ATTRIBUTES)
    return shadow


@dataclass(frozen=True)
class PrivateWorkspace:
    """A copy of a workspace's files with labkube's record of its pristine commit beside it (`workspace_record`),
    both made by labkube in a private temporary directory: `record_git` on `workspace` reads nothing the agent
    wrote but the files' content. `skipped`: what the copy left out, and why."""

    workspace: Path
    skipped: tuple[str, ...]


@contextmanager
def private_workspace(workspace: Path, make_pristine: Callable[[Path], object]) -> Iterator[PrivateWorkspace]:
    """The workspace's files (`copy_workspace`) and a record of the pristine commit made again by `make_pristine`
    (called with a path that does not exist yet: it prepares the task's pristine workspace there, as for the run,
    record included), in a temporary directory removed when the block ends. Where the agent could write the run
    folder (a cluster), neither its `workspace.git` nor its `.git` is read: a moved tag or rewritten objects there
    hide nothing, and no config, hook or attribute of either runs."""
    with tempfile.TemporaryDirectory(prefix="labkube-workspace-") as tmp:
        root = Path(tmp)
        pristine = root / "pristine"
        make_pristine(pristine)
        copy = root / "workspace"
        os.rename(workspace_record(pristine), workspace_record(copy))
        shutil.rmtree(pristine)  # only its record is needed: the task's files need not be held twice
        skipped = copy_workspace(workspace, copy)
        yield PrivateWorkspace(copy, tuple(skipped))


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))  # fmt: skip
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def copy_workspace(src: Path, dest: Path) -> list[str]:
    """Copy the workspace `src` to `dest` (not there yet) without following a symbolic link: directories and regular
    files (their bytes, executable bit and modification time) as they are, each link as a link with the same target
    (never read through), and nothing else: a FIFO, socket or device is left out, as is a file that cannot be read,
    each with a line in the returned list. The agent's own repository (`src/.git`) is not copied: labkube's git
    never reads it."""
    skipped: list[str] = []
    os.mkdir(dest, 0o700)
    _copy_directory(src, dest, "", skipped)
    return skipped


def _copy_directory(src: Path, dest: Path, rel: str, skipped: list[str]) -> None:
    with os.scandir(src) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        name = f"{rel}{entry.name}"
        if name == ".git":
            continue
        target = dest / entry.name
        try:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                os.mkdir(target, 0o755)
                _copy_directory(Path(entry.path), target, f"{name}/", skipped)
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.path), target)
                os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
            elif stat.S_ISREG(info.st_mode):
                _copy_file(Path(entry.path), target, name, skipped)
            else:
                kind = next((k for test, k in _KINDS if test(info.st_mode)), "not a regular file")
                skipped.append(f"{name}: {kind}, left out")
        except OSError as exc:
            skipped.append(f"{name}: {exc.strerror or exc}, left out")


def _copy_file(src: Path, dest: Path, name: str, skipped: list[str]) -> None:
    fd = os.open(src, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced since it was listed
            skipped.append(f"{name}: not a regular file when opened, left out")
            return
        mode = (stat.S_IMODE(info.st_mode) & 0o777) | 0o600
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            while chunk := os.read(fd, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
        finally:
            os.close(out)
        os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(fd)


def run_git(cwd: Path, *args: str) -> str:
    """`git args` in the repository at `cwd`, with labkube's configuration and environment. Not for a workspace an
    agent has had: its `.git` is the agent's (`record_git` is labkube's git of a workspace)."""
    return _run_git(list(args), cwd)


def workspace_diff(workspace: Path) -> str:
    """The agent's changes against the pristine commit, untracked files included (ignored ones not), from labkube's
    record, in a scratch index: neither the record's index nor the agent's repository is changed."""
    with tempfile.TemporaryDirectory(prefix="labkube-diff-") as tmp:
        index = Path(tmp) / "index"
        with record_repository(workspace) as git:
            git("read-tree", PRISTINE_REF, index=index)
            git("add", "-A", "--intent-to-add", "--", ".", index=index)
            return git("diff", *SAFE_DIFF, PRISTINE_REF, "--", index=index)
