"""What the audit looks at: the workspace's changes against the pristine task, the transcript's tool calls
(with when each ran), background jobs, the final grade and the grader's JSON summary."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from labkube.result import RunResult
from labkube.task_card import TaskCard
from labkube.tasks.workspace import GIT, PRISTINE_TAG

PATCH_PATHS = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)


@dataclass
class FileChange:
    path: str
    status: str  # A added, M modified, D deleted, T type change


@dataclass
class ToolCall:
    step: int
    tool: str
    args: dict[str, Any]
    ok: bool
    output: str
    started: datetime
    ended: datetime

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

    @property
    def pristine(self) -> Path:
        return Path(self.card.path)

    def change(self, path: str) -> FileChange | None:
        return next((c for c in self.changes if c.path == path), None)

    def mtime(self, path: str) -> datetime | None:
        try:
            return datetime.fromtimestamp((self.workspace / path).stat().st_mtime, UTC)
        except OSError:
            return None


def normpath(path: str) -> str:
    return os.path.normpath(path) if path.startswith("/") else os.path.normpath(path).removeprefix("./")


def _git(workspace: Path, index: Path, *args: str) -> str:
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    proc = subprocess.run([*GIT, *args], cwd=workspace, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()[:200]}")
    return proc.stdout


def workspace_changes(workspace: Path) -> tuple[list[FileChange], str]:
    """Every file added, modified or deleted since the pristine commit, ignored files included,
    computed in a scratch index so the workspace's own index is untouched."""
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        _git(workspace, index, "read-tree", PRISTINE_TAG)
        _git(workspace, index, "add", "-A", "-f", ".")
        names = _git(workspace, index, "diff", "--cached", "--no-renames", "--name-status", PRISTINE_TAG)
        diff = _git(workspace, index, "diff", "--cached", "--no-renames", "--no-color", PRISTINE_TAG)
    changes = []
    for line in names.splitlines():
        status, _, path = line.partition("\t")
        if "__pycache__" in path or path.endswith(".pyc"):
            continue
        changes.append(FileChange(path=path, status=status[:1]))
    return changes, diff


def split_diff(diff: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in re.split(r"(?m)^diff --git ", diff):
        match = re.match(r"a/(.+?) b/", chunk)
        if match:
            out[match.group(1)] = chunk
    return out


def read_tool_calls(transcript: Path) -> list[ToolCall]:
    calls = []
    try:
        lines = transcript.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") != "tool_call":
            continue
        ended = datetime.fromisoformat(r["ts"])
        calls.append(
            ToolCall(
                step=int(r.get("step", 0)),
                tool=str(r.get("tool")),
                args=r.get("args") or {},
                ok=bool(r.get("ok")),
                output=str(r.get("output", "")),
                started=ended - timedelta(seconds=float(r.get("duration_s", 0))),
                ended=ended,
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


def gather(card: TaskCard, run_dir: Path) -> Evidence:
    workspace = run_dir / "workspace"
    changes, diff = workspace_changes(workspace)
    calls = read_tool_calls(run_dir / "transcript.jsonl")
    result = None
    with contextlib.suppress(FileNotFoundError, ValueError):
        result = RunResult.model_validate_json((run_dir / "result.json").read_text())
    try:
        checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    except (FileNotFoundError, ValueError):
        checkpoint = {}
    run_end = result.finished_at if result and result.finished_at else datetime.now(UTC)
    summary = None
    if card.grading.summary:
        try:
            summary = json.loads((run_dir / "scratch" / "grading-view" / card.grading.summary).read_text())
        except (FileNotFoundError, ValueError):
            summary = None
    return Evidence(
        card=card,
        workspace=workspace,
        changes=changes,
        diff=diff,
        tool_calls=calls,
        processes=process_windows(calls, checkpoint.get("jobs", []), run_end),
        result=result,
        grader_summary=summary,
        diff_by_file=split_diff(diff),
    )
