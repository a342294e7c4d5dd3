"""The results store: one directory per campaign.

    <campaign>/campaign.json
    <campaign>/runs/<run-id>/run.json          RunSpec
    <campaign>/runs/<run-id>/status.json       RunStatus, rewritten after every step
    <campaign>/runs/<run-id>/checkpoint.json   agent state after the last completed step
    <campaign>/runs/<run-id>/transcript.jsonl  append-only
    <campaign>/runs/<run-id>/result.json       RunResult, once final
    <campaign>/runs/<run-id>/workspace-files.json  changed files' content ids and times at run end (the audit's)
    <campaign>/runs/<run-id>/logs/             agent stdout/stderr, grader output
    <campaign>/runs/<run-id>/workspace/        the agent's working copy (a git repository, the agent's own)
    <campaign>/runs/<run-id>/workspace.git/    labkube's own git record of the workspace's pristine commit

Every JSON file is written atomically (temporary file, then rename), so a
reader never sees half a file and a crash never leaves one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from labkube.campaign import CampaignSpec
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec, RunStatus

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    pass


class CampaignLocked(StoreError):
    """Another process is writing the campaign directory."""


LOCK_FILE = ".campaign.lock"
_held: dict[Path, IO[str]] = {}  # campaign directories this process holds the lock of


def json_bytes(data: object) -> bytes:
    """`data` as indented JSON, as `json.dumps(data, indent=2, default=str)` writes it but in a fraction of the
    time (with an indent, the standard library encodes in Python: 1-2 ms for a run's result or checkpoint, written
    several times a run); NaN and infinities stay the constants Python's json writes and reads."""
    return pydantic_core.to_json(data, indent=2, fallback=str, inf_nan_mode="constants")


_temp_numbers = itertools.count()  # next() is atomic under the GIL: threads of one process get distinct names


def _open_temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path` for its next content: `.NAME.PID.N.tmp`, created exclusively (a name an earlier process
    of the same pid left is skipped). Not `tempfile.mkstemp`, whose random names cost a forked agent a fresh random
    generator; and the directory is made only when it is missing, not tried before every write (a dozen a run)."""
    while True:
        tmp = f"{path.parent}{os.sep}.{path.name}.{os.getpid()}.{next(_temp_numbers)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)


def write_json_atomic(path: Path, data: object) -> None:
    payload = json_bytes(data) + b"\n"
    fd, tmp = _open_temporary(path)
    try:
        try:
            # Whatever the umask: on a shared claim the operator reads what run pods write (same fsGroup, maybe
            # another uid), so store files are readable as any file the process writes would be.
            os.fchmod(fd, 0o644)
            written = memoryview(payload)
            while written:  # os.write, not a file object: no buffer, no fstat/isatty/seek for one write
                written = written[os.write(fd, written) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # os.write names no file: a full disk would be said without where
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_model(path: Path, model: BaseModel) -> None:
    write_json_atomic(path, model.model_dump(mode="json"))


class NotRegularFile(StoreError):
    """Where labkube expects its own JSON there is something else: a FIFO, a device, a socket, a directory or a
    symbolic link (which an agent can plant in its run folder). Refused without reading it."""


_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))  # fmt: skip


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file at `path`, never blocking on what is not one (issue 41: a FIFO named
    status.json froze the supervisor's event loop in its read). Opened without following a last symbolic link and
    without waiting for a FIFO's writer (`O_NOFOLLOW | O_NONBLOCK`), then checked with `fstat` before a byte is
    read: anything but a regular file raises `NotRegularFile` with a one-line message, as does one of more than
    `limit` bytes (a sparse file of a terabyte is regular too). FileNotFoundError as `open` raises it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(f"{path} is a symbolic link, not a regular file: refused, not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "not a regular file")
            raise NotRegularFile(f"{path} is {kind}, not a regular file: labkube reads its own JSON only from one")
        if limit is not None and info.st_size > limit:
            raise NotRegularFile(f"{path} holds {info.st_size} bytes, more than the {limit} expected: refused")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read() if limit is None else f.read(limit + 1)
        if limit is not None and len(data) > limit:  # grew since the fstat
            raise NotRegularFile(f"{path} holds more than the {limit} bytes expected: refused")
        return data
    finally:
        os.close(fd)


REFUSED_SUFFIX = ".refused"


def file_kind(mode: int) -> str:
    """What `mode` (from `lstat`) makes a file, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


PLANTED_FOLDERS = ("", "logs")  # of a run folder: where labkube keeps its own files


@dataclass(frozen=True)
class PlantedFile:
    """An entry of a run folder (or of one of its `PLANTED_FOLDERS`) that labkube never makes there."""

    name: str  # relative to the run folder
    path: Path
    kind: str  # `file_kind`, as `lstat` sees it
    set_aside: bool  # already renamed `<name>.refused` by a grading pod


def planted_files(root: Path, folders: tuple[str, ...] = PLANTED_FOLDERS) -> list[PlantedFile]:
    """What in `root` (and in its `folders`) is neither a regular file nor a folder (a FIFO, a socket, a device or a
    symbolic link: an agent's), and what a grading pod set aside already; each looked at with `lstat`, never opened."""
    found = []
    for folder in folders:
        base = root / folder if folder else root
        try:
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            set_aside = entry.name.endswith(REFUSED_SUFFIX) or REFUSED_SUFFIX + "-" in entry.name
            if set_aside or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                name = (Path(folder) / entry.name).as_posix()
                found.append(PlantedFile(name, Path(entry.path), file_kind(mode), set_aside))
    return found


def set_aside_planted(root: Path, folders: tuple[str, ...] = PLANTED_FOLDERS) -> list[str]:
    """Move out of labkube's way what `planted_files` finds (a FIFO as `transcript.jsonl` would hang a read, one as
    `result.json` a write; a link would take a write elsewhere): each is renamed, never opened, to `<name>.refused`
    (or `.refused-N`); what was moved is returned as "name (kind)"."""
    moved: list[str] = []
    for planted in planted_files(root, folders):
        if planted.set_aside:
            continue
        target, n = planted.path.with_name(planted.path.name + REFUSED_SUFFIX), 1
        while os.path.lexists(target):
            target, n = planted.path.with_name(f"{planted.path.name}{REFUSED_SUFFIX}-{n}"), n + 1
        os.rename(planted.path, target)
        moved.append(f"{planted.name} ({planted.kind})")
    return moved


def read_model(path: Path, cls: type[M], limit: int | None = None) -> M | None:
    """The model stored at `path`, or None when the file is missing or unreadable, or is not a regular file (a FIFO,
    a device, a link an agent planted: refused without blocking, `read_regular`, and said in one warning line), or
    holds more than `limit` bytes."""
    try:
        return cls.model_validate_json(read_regular(path, limit))
    except (FileNotFoundError, ValidationError, ValueError):
        return None
    except NotRegularFile as exc:
        log.warning("labkube: %s", exc)
        return None


def utcnow() -> datetime:
    return datetime.now(UTC)


class CampaignDir:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    @property
    def campaign_json(self) -> Path:
        return self.root / "campaign.json"

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def exists(self) -> bool:
        return self.campaign_json.exists()

    def load_spec(self) -> CampaignSpec:
        try:
            data = json.loads(self.campaign_json.read_text())
            return CampaignSpec.model_validate(data["spec"])
        except FileNotFoundError:
            raise StoreError(f"{self.root}: not a campaign directory (no campaign.json)") from None
        except (KeyError, ValueError, ValidationError) as exc:
            raise StoreError(f"{self.campaign_json}: unreadable ({type(exc).__name__})") from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory for one writer (`labkube run`) until the block ends or the process dies (an flock, which
        the kernel releases with the process); raise `CampaignLocked`, naming the holder, when another process holds
        it. Re-entrant within a process."""
        if self.root in _held:
            yield
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fh = (self.root / LOCK_FILE).open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "a process that has not yet written its pid"
            fh.close()
            raise CampaignLocked(
                f"{self.root} is being written by another labkube run ({holder}): wait for it to end, "
                "or choose another --out"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}, since {utcnow().isoformat(timespec='seconds')}\n")
        fh.flush()
        _held[self.root] = fh
        try:
            yield
        finally:
            del _held[self.root]
            fh.close()  # releases the lock; the file stays (removing it would race with a waiting locker)

    def check_compatible(self, spec: CampaignSpec) -> None:
        """Refuse to mix two different campaigns in one directory."""
        if not self.exists():
            if self.root.exists() and any(p.name != LOCK_FILE for p in self.root.iterdir()):
                raise StoreError(f"{self.root} exists and is not a campaign directory: choose another --out")
            return
        existing = self.load_spec()
        free = {"concurrency"}
        if existing.overlay and not existing.task_overlays and existing.overlay == spec.overlay:
            free.add("task_overlays")  # written before campaigns carried their overlays' content: the same overlay
        if existing.model_dump(exclude=free) != spec.model_dump(exclude=free):
            raise StoreError(
                f"{self.root} holds a different campaign ({existing.name!r}): "
                "use a new --out, or the same tasks, models, seeds and budgets to resume it"
            )

    def write_campaign(self, spec: CampaignSpec, runs: list[RunSpec], keep: frozenset[str] = frozenset()) -> None:
        """Write `campaign.json` and each run's `run.json`, except for the runs in `keep` (finished ones)."""
        write_json_atomic(
            self.campaign_json,
            {
                "spec": spec.model_dump(mode="json"),
                "runs": [r.run_id for r in runs],
                "updated_at": utcnow().isoformat(),
            },
        )
        for run in runs:
            if run.run_id not in keep:
                write_model(self.run_dir(run.run_id) / "run.json", run)

    def run_ids(self) -> list[str]:
        try:
            return list(json.loads(self.campaign_json.read_text())["runs"])
        except (FileNotFoundError, KeyError, ValueError):
            runs = self.root / "runs"
            return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []

    def run_spec(self, run_id: str) -> RunSpec | None:
        return read_model(self.run_dir(run_id) / "run.json", RunSpec)

    def status(self, run_id: str) -> RunStatus | None:
        return read_model(self.run_dir(run_id) / "status.json", RunStatus)

    def result(self, run_id: str) -> RunResult | None:
        return read_model(self.run_dir(run_id) / "result.json", RunResult)

    def is_finished(self, run_id: str) -> bool:
        result = self.result(run_id)
        return result is not None and result.final


STOPPED = "stopped: the campaign was interrupted; run the same command again to resume"
STOPPED_DISK_FULL = "stopped: the disk filled (or went read-only); free space, then run the same command again"


def mark_stopped(cdir: CampaignDir, message: str = STOPPED) -> int:
    """Mark every unfinished run of the campaign as stopped (status.json: Pending, with `message` saying how to
    resume), keeping its step and spend; the number marked."""
    marked = 0
    for run_id in cdir.run_ids():
        if cdir.is_finished(run_id) or not cdir.run_dir(run_id).is_dir():
            continue
        status = cdir.status(run_id) or RunStatus(run_id=run_id)
        if status.phase is RunPhase.paused:  # it stays paused (labkube runs resume), whoever runs the campaign next
            continue
        update = {"phase": RunPhase.pending, "message": message, "updated_at": utcnow()}
        write_model(cdir.run_dir(run_id) / "status.json", status.model_copy(update=update))
        marked += 1
    return marked


class RunDir:
    """Paths inside one run's directory; used by the agent and the supervisor alike."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    run_json = property(lambda self: self.root / "run.json")
    status_json = property(lambda self: self.root / "status.json")
    checkpoint_json = property(lambda self: self.root / "checkpoint.json")
    transcript = property(lambda self: self.root / "transcript.jsonl")
    result_json = property(lambda self: self.root / "result.json")
    logs = property(lambda self: self.root / "logs")
    workspace = property(lambda self: self.root / "workspace")
    # labkube's own git directory of the workspace (tasks/workspace.py `workspace_record`), out of the agent's reach
    workspace_record = property(lambda self: self.root / "workspace.git")

    def spec(self) -> RunSpec:
        spec = read_model(self.run_json, RunSpec)
        if spec is None:
            raise StoreError(f"{self.run_json}: missing or invalid run spec")
        return spec
