"""What the audit looks at: the workspace's changes against the pristine task, the transcript's tool calls
(with when each ran), background jobs, the final grade and the grader's JSON summary.

When each changed file was last written comes from `workspace-files.json`, which the agent process writes when
the run ends (`record_workspace_files`): every changed file's content id and its modification time then. A file's
own mtime is not evidence after that: `cp -r` of a campaign, a restore from a backup or a sync to another machine
resets it, and a re-audit would see logs "written" long after every command ended.

The changes are taken against labkube's own record of the pristine task, never with the agent's `.git`: its config
could run the agent's code in labkube's `git`, and its tag could be moved to the agent's last commit, leaving nothing
to see. When the run's task is known (a run ending, `labkube audit`), that record is made again from the task in a
private directory and compared with a copy of the workspace's files (`private_workspace`): on a cluster the agent's
container can write the run folder's `workspace.git` too. Without the task, the run folder's record is read
(`<run>/workspace.git`); a run without that record says so (`MissingRecord`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from labkube.integrity.gateway_calls import TranscriptCheck, compare, read_gateway_calls
from labkube.result import RunResult
from labkube.sandbox import SANDBOX_WORKSPACE
from labkube.store import NotRegularFile, read_model, read_regular, utcnow, write_model
from labkube.task_card import TaskCard
from labkube.tasks import PristineTask
from labkube.tasks.workspace import PRISTINE_REF, SAFE_DIFF, pristine_is_empty, private_workspace, record_repository

PATCH_PATHS = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)
# Compiled as the module is imported (in the agent zygote, once for every run it forks), not on each run's audit.
DIFF_HEADER = re.compile(r"(?m)^diff --git ")
DIFF_PATHS = re.compile(r"a/(.+?) b/")
WORKSPACE_FILES = "workspace-files.json"


@dataclass
class FileChange:
    path: str
    status: str  # A added, M modified, D deleted, T type change
    blob: str | None = None  # git's object id of the content now; None for a deleted file


class RecordedFile(BaseModel):
    blob: str = Field(description="git's object id of the file's content when the run ended.")
    modified_at: datetime = Field(description="The file's modification time when the run ended.")


class WorkspaceFiles(BaseModel):
    """`workspace-files.json`: the run's changed files as they were when the run ended."""

    recorded_at: datetime
    files: dict[str, RecordedFile] = Field(default_factory=dict)
    skipped: list[str] = Field(
        default_factory=list,
        description="What the copy of the workspace left out and why: a FIFO, socket, device, unreadable file.",
    )


@dataclass
class ToolCall:
    step: int
    tool: str
    args: dict[str, Any]
    ok: bool
    output: str
    started: datetime
    ended: datetime
    # a vendor CLI's own name and arguments for the call, as its model issued them (`cli_events.tool_line`)
    native_tool: str | None = None
    native_args: Any = None

    @property
    def command(self) -> str:
        return str(self.args.get("command") or self.args.get("code") or "")

    def written_paths(self) -> list[str]:
        """Files this call wrote through a file tool (not through a process)."""
        if self.tool in ("write_file", "replace") and isinstance(self.args.get("path"), str):
            return [normpath(self.args["path"])]
        if self.tool == "apply_patch":
            return [normpath(p) for p in PATCH_PATHS.findall(str(self.args.get("patch", "")))]
        return []


@dataclass
class ProcessWindow:
    """When a process the agent started was running (a bash/python call or a background job)."""

    start: datetime
    end: datetime
    command: str
    step: int | None


@dataclass
class Evidence:
    card: TaskCard
    workspace: Path
    changes: list[FileChange]
    diff: str
    tool_calls: list[ToolCall]
    processes: list[ProcessWindow]
    result: RunResult | None = None
    grader_summary: object = None
    diff_by_file: dict[str, str] = field(default_factory=dict)
    recorded: WorkspaceFiles | None = None
    # The transcript held against the gateway's record of the model's tool calls (`gateway_calls.py`); None: no record
    transcript_check: TranscriptCheck | None = None

    @property
    def pristine(self) -> Path:
        return Path(self.card.path)

    def change(self, path: str) -> FileChange | None:
        return next((c for c in self.changes if c.path == path), None)

    def written_at(self, path: str) -> datetime | None:
        """When the agent's side last wrote `path`, as the run-end record says; None when that is unknown (the
        content changed after the run ended, or the file was not recorded).

        A run from before the record existed falls back to the file's mtime, unless that is later than the run's
        end: then the file was copied or touched afterwards and its time says nothing about the run."""
        change = self.change(path)
        if self.recorded is not None:
            entry = self.recorded.files.get(path)
            if entry is None or change is None or entry.blob != change.blob:
                return None
            return entry.modified_at
        mtime = file_mtime(self.workspace / path)
        ended = self.result.finished_at if self.result is not None else None
        if mtime is None or (ended is not None and mtime > ended + timedelta(seconds=5)):
            return None
        return mtime

    def changed_since_record(self, path: str) -> bool:
        """`path` holds content the run-end record does not know: written after the run ended."""
        change = self.change(path)
        if self.recorded is None or change is None or change.blob is None:
            return False
        entry = self.recorded.files.get(path)
        return entry is None or entry.blob != change.blob


def file_mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return None


def normpath(path: str) -> str:
    """A path a tool call named, normalised; one under `/workspace` (the workspace in the run's sandbox) as the
    task-relative path it is."""
    if path.startswith("/"):
        normal = os.path.normpath(path)
        inside = Path(normal)
        if inside.is_relative_to(SANDBOX_WORKSPACE):
            return inside.relative_to(SANDBOX_WORKSPACE).as_posix()
        return normal
    return os.path.normpath(path).removeprefix("./")


@dataclass
class WorkspaceChanges:
    """The workspace against the pristine commit: each changed file, and the diff as text; with `recorded`, the
    run-end record written of these changes (`record_workspace_files`). `modified`: each changed file's modification
    time (None: unknown); `skipped`: what the copy of the workspace left out (`copy_workspace`)."""

    changes: list[FileChange]
    diff: str
    recorded: WorkspaceFiles | None = None
    modified: dict[str, datetime | None] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def workspace_changes(workspace: Path, pristine: PristineTask | None = None) -> WorkspaceChanges:
    """Every file added, modified or deleted since the pristine commit, ignored files included, computed in a scratch
    index. With `pristine` (the run's task), against a record made again from the task and on a copy of the
    workspace's files, both private (`private_workspace`): nothing in the run folder but the files' bytes is read.
    Without it, against the run folder's record (`record_repository`). The agent's `.git` is not among the changes: git
    skips it, as any `.git` in a work tree. A workspace that holds nothing but the agent's repository, whose pristine
    commit is the empty tree, has no change: known without running `git`."""
    if pristine is not None:
        if pristine.empty and _holds_nothing_but_its_repository(workspace):
            return WorkspaceChanges([], "")
        with private_workspace(workspace, pristine.make) as private:
            found = _changes_against_record(private.workspace)
            found.modified = {c.path: _link_mtime(private.workspace / c.path) for c in found.changes if c.blob}
        found.skipped = list(private.skipped)
        return found
    if _holds_nothing_but_its_repository(workspace) and pristine_is_empty(workspace):
        return WorkspaceChanges([], "")
    found = _changes_against_record(workspace)
    found.modified = {c.path: file_mtime(workspace / c.path) for c in found.changes if c.blob}
    return found


def _link_mtime(path: Path) -> datetime | None:
    """`path`'s own modification time (a link's, not its target's)."""
    try:
        return datetime.fromtimestamp(path.lstat().st_mtime, UTC)
    except OSError:
        return None


def _changes_against_record(workspace: Path) -> WorkspaceChanges:
    """The changes against labkube's record of `workspace` (never the agent's `.git`): a `RuntimeError` when git
    fails, `MissingRecord` when there is no record."""
    with tempfile.TemporaryDirectory() as tmp, record_repository(workspace) as git:
        index = Path(tmp) / "index"
        git("read-tree", PRISTINE_REF, index=index)
        git("add", "-A", "-f", "--", ".", index=index)
        diff_args = ("diff", "--cached", "--no-renames", *SAFE_DIFF)
        raw = git(*diff_args, "--raw", "--no-abbrev", "-z", PRISTINE_REF, "--", index=index)
        diff = git(*diff_args, PRISTINE_REF, "--", index=index)
    changes = []
    fields = raw.split("\0")
    # -z: ":<old mode> <new mode> <old id> <new id> <status>" NUL <path> NUL, per file
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if not meta.startswith(":") or "__pycache__" in path or path.endswith(".pyc"):
            continue
        if path == ".git" or path.startswith(".git/"):  # the agent's repository, which git never adds anyway
            continue
        _, _, _, new_id, status = meta[1:].split(" ")
        changes.append(FileChange(path=path, status=status[:1], blob=None if status.startswith("D") else new_id))
    return WorkspaceChanges(changes, diff)


def _holds_nothing_but_its_repository(workspace: Path) -> bool:
    """Nothing in `workspace` but (if anything) the agent's `.git`, which labkube's record never looks at."""
    try:
        with os.scandir(workspace) as entries:
            return all(e.name == ".git" for e in entries)
    except OSError:
        return False


def record_workspace_files(run_dir: Path, pristine: PristineTask | None = None) -> WorkspaceChanges:
    """Write `workspace-files.json`: each changed file's content id and modification time, as the run ends (before
    anything can copy the run directory), against the `pristine` task made again when it is given
    (`workspace_changes`). The audit reads a file's time from here, never from the file again. Returns the changes
    it recorded, which an audit right after may take instead of computing them again."""
    found = workspace_changes(run_dir / "workspace", pristine)
    files = {}
    for change in found.changes:
        modified = found.modified.get(change.path) if change.blob else None
        if change.blob and modified is not None:
            files[change.path] = RecordedFile(blob=change.blob, modified_at=modified)
    found.recorded = WorkspaceFiles(recorded_at=utcnow(), files=files, skipped=found.skipped)
    write_model(run_dir / WORKSPACE_FILES, found.recorded)
    return found


def split_diff(diff: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in DIFF_HEADER.split(diff):
        match = DIFF_PATHS.match(chunk)
        if match:
            out[match.group(1)] = chunk
    return out


TRANSCRIPT_LIMIT = 4 << 30  # bytes
JSON_LIMIT = 256 << 20  # bytes of a run's checkpoint, result or grader summary read at most


def read_tool_calls(transcript: Path) -> list[ToolCall]:
    calls = []
    try:  # the agent's file: never a hang on a FIFO it left, nor a read of a sparse terabyte
        lines = read_regular(transcript, TRANSCRIPT_LIMIT).decode(errors="replace").splitlines()
    except (FileNotFoundError, NotRegularFile):
        return []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") != "tool_call":
            continue
        ended = datetime.fromisoformat(r["ts"])
        # rg-agent records how long a call took; a vendor CLI's calls (cli_events) record when each started
        started = ended - timedelta(seconds=float(r.get("duration_s", 0)))
        if "duration_s" not in r and r.get("started"):
            with contextlib.suppress(ValueError, TypeError):
                started = min(ended, datetime.fromisoformat(r["started"]))
        calls.append(
            ToolCall(
                step=int(r.get("step", 0)),
                tool=str(r.get("tool")),
                args=r.get("args") or {},
                ok=bool(r.get("ok")),
                output=str(r.get("output", "")),
                started=started,
                ended=ended,
                native_tool=r.get("native_tool"),
                native_args=r.get("native_args"),
            )
        )
    return calls


PROCESS_TOOLS = ("bash", "python")


def process_windows(calls: list[ToolCall], jobs: list[dict[str, Any]], run_end: datetime) -> list[ProcessWindow]:
    windows = [ProcessWindow(c.started, c.ended, c.command, c.step) for c in calls if c.tool in PROCESS_TOOLS]
    for job in jobs:
        start = datetime.fromtimestamp(float(job.get("started_at", 0)), UTC)
        windows.append(ProcessWindow(start, run_end, str(job.get("command", "")), None))
    return windows


def gather(
    card: TaskCard,
    run_dir: Path,
    changed: WorkspaceChanges | None = None,
    result: RunResult | None = None,
    idea_hint: bool = False,
    gateway_records: Path | None = None,
    agent: str = "rg-agent",
) -> Evidence:
    """The evidence of the run in `run_dir`; `changed`: the workspace's changes when the caller has them already
    (the run-end record's, with nothing run in the workspace since), else they are computed here, against the
    pristine task made again from `card` (with the run's `idea_hint`); `result`: the run's `result.json` as its
    writer holds it, else it is read here; `gateway_records`: the folder of the gateway's record of the model's tool
    calls (a grading pod's, read-only), held against the transcript in the vocabulary of the run's `agent`: the tool
    calls are the transcript's plus every recorded one it does not show (`gateway_calls.py`)."""
    workspace = run_dir / "workspace"
    if changed is None:
        changed = workspace_changes(workspace, PristineTask(card, idea_hint))
    calls = read_tool_calls(run_dir / "transcript.jsonl")
    check = None
    recorded_calls = read_gateway_calls(gateway_records) if gateway_records is not None else None
    if recorded_calls is not None:
        gateway_calls, answers = recorded_calls
        check = compare(gateway_calls, calls, answers, agent, workspace)
    if result is None:  # the run folder's files are the agent's: read without blocking on a FIFO, and bounded
        result = read_model(run_dir / "result.json", RunResult, JSON_LIMIT)
    try:
        checkpoint = json.loads(read_regular(run_dir / "checkpoint.json", JSON_LIMIT))
    except (FileNotFoundError, ValueError, NotRegularFile):
        checkpoint = {}
    run_end = result.finished_at if result and result.finished_at else datetime.now(UTC)
    summary = None
    if card.grading.summary:
        try:
            summary = json.loads(read_regular(run_dir / "scratch" / "grading-view" / card.grading.summary, JSON_LIMIT))
        except (FileNotFoundError, ValueError, NotRegularFile, IsADirectoryError):
            summary = None
    return Evidence(
        card=card,
        workspace=workspace,
        changes=changed.changes,
        diff=changed.diff,
        # a call only the gateway recorded may never have run: no process window of its own
        tool_calls=calls + check.unseen_calls() if check is not None else calls,
        processes=process_windows(calls, checkpoint.get("jobs", []), run_end),
        result=result,
        grader_summary=summary,
        diff_by_file=split_diff(changed.diff),
        recorded=changed.recorded
        if changed.recorded is not None
        else read_model(run_dir / WORKSPACE_FILES, WorkspaceFiles),
        transcript_check=check,
    )
