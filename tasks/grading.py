"""Run a task's grader on a workspace, from the pristine grading files.

The grader runs in a *grading view*: a scratch directory whose protected paths
(`grading/`, `task_description.md`, ...) are fresh copies from the pristine task
and whose other entries are symlinks into the workspace. A ResearchGym
`grade.sh` finds the task root as the parent of its own directory, so it reads
the agent's logs and outputs but only ever runs the original grading code.
Edits the agent made to grading files never change a score.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from labkube.result import SubtaskScore
from labkube.sandbox import SandboxPolicy, sandbox_argv
from labkube.task_card import Subtask, TaskCard
from labkube.tasks._markdown import YOUR_METHOD, cell_numbers, first_number, parse_tables
from labkube.tasks.scoring import headline, score_subtask
from labkube.tasks.workspace import matches

DESCRIPTION = "task_description.md"


class GradeOutcome:
    """One grading: the subtasks' scores and the headline; `error` when the grader itself failed (exit status,
    time-out: its last lines) or was not run (`task_changed`: the pristine task is not the one the campaign pinned);
    `note` when it ran cleanly but left the headline subtask without a value, or ignored output it did not write."""

    def __init__(
        self,
        subtasks: list[SubtaskScore],
        score: float | None,
        error: str | None,
        note: str | None = None,
        task_changed: bool = False,
    ) -> None:
        self.subtasks = subtasks
        self.score = score
        self.error = error
        self.note = note
        self.task_changed = task_changed

    @classmethod
    def not_graded(cls, card: TaskCard, error: str, task_changed: bool = False) -> GradeOutcome:
        """A grading that never produced values: every subtask without one."""
        return cls([score_subtask(None, s) for s in card.subtasks], None, error, task_changed=task_changed)


def last_lines(text: str, lines: int = 8, max_chars: int = 1200) -> str:
    """The end of a program's output, as a reader of an error wants it: its last non-blank lines."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-max_chars:]


def no_value_note(card: TaskCard, scores: list[SubtaskScore], printed: str) -> str | None:
    """Why a clean grading has no headline value: the subtasks left empty and what the grader printed."""
    primary = card.primary
    if primary is None or next((s.raw for s in scores if s.id == primary.id), None) is not None:
        return None
    missing = [s.id for s in scores if s.raw is None]
    others = f" (and {len(missing) - 1} other subtask(s) without one)" if len(missing) > 1 else ""
    said = last_lines(printed, lines=5, max_chars=600) or "(nothing)"
    return f"the grader gave no value for subtask {primary.id}{others}; it printed: {said}"


def build_grading_view(card: TaskCard, workspace: Path, view: Path) -> None:
    pristine = Path(card.path)
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    protected_tops = {p.split("/")[0] for p in card.protected}
    for entry in workspace.iterdir():
        if entry.name == ".git" or entry.name in protected_tops:
            continue
        (view / entry.name).symlink_to(entry)
    for top in sorted(protected_tops):
        src = pristine / top
        if src.is_dir():
            shutil.copytree(src, view / top, ignore=shutil.ignore_patterns("__pycache__"))
            # Workspace files under a protected directory that are not themselves protected
            # (the agent's outputs, say) are still visible to the grader.
            agent_side = workspace / top
            if agent_side.is_dir():
                for f in agent_side.rglob("*"):
                    rel = f.relative_to(workspace).as_posix()
                    target = view / rel
                    if f.is_file() and not matches(rel, card.protected) and not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.symlink_to(f)
        elif src.is_file():
            shutil.copy2(src, view / top)


def lookup(data: object, dotted: str) -> object:
    for part in dotted.split("."):
        if isinstance(data, list) and part.lstrip("-").isdigit():
            idx = int(part)
            data = data[idx] if -len(data) <= idx < len(data) else None
        elif isinstance(data, dict):
            data = data.get(part)
        else:
            return None
    return data


def as_number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return first_number(value)
    return None


FileState = tuple[int, int, int, str]  # inode, size, mtime_ns, sha256


def file_state(path: Path) -> FileState | None:
    """What tells whether a file was written: a rewrite with other content changes the digest, one with the same
    content its times (or, written beside and renamed, its inode). None for no regular file there."""
    try:
        st = path.stat()
        if not path.is_file():
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    except OSError:
        return None


def outputs_before(card: TaskCard, view: Path) -> dict[str, FileState]:
    """The grader's outputs as the grading view holds them before the grader runs (the description and the JSON
    summary, copies from the pristine task or what earlier gradings left), by path relative to the view."""
    rels = [DESCRIPTION]
    pattern = card.grading.summary
    if pattern:
        rels += [p.relative_to(view).as_posix() for p in view.glob(pattern)] if glob.has_magic(pattern) else [pattern]
    return {rel: state for rel in rels if (state := file_state(view / rel)) is not None}


def summary_file(view: Path, pattern: str, written: Callable[[Path], bool] | None = None) -> Path | None:
    """The grader's JSON summary: `pattern` relative to the task root, or the newest file it matches when it is
    a glob (`grading/runs/*/grading_summary.json`: a grader that writes one per timestamped run). With `written`,
    only a file this grading wrote."""
    if not glob.has_magic(pattern):
        path = view / pattern
        return path if written is None or written(path) else None
    found = [p for p in view.glob(pattern) if p.is_file() and (written is None or written(p))]
    return max(found, key=lambda p: (p.stat().st_mtime, p.as_posix()), default=None)


def read_values(card: TaskCard, view: Path) -> dict[str, float | None]:
    """Each subtask's raw value, from the JSON summary first, then the filled `Your Method` rows."""
    return graded_values(card, view, None)[0]


def graded_values(
    card: TaskCard, view: Path, before: Mapping[str, FileState] | None
) -> tuple[dict[str, float | None], list[str]]:
    """Each subtask's raw value, from the JSON summary first, then the filled `Your Method` rows; and what was
    ignored. With `before` (`outputs_before`), a summary or a description counts only if this grading wrote it: a
    task that ships a `results.json` or a filled row, or a grader that wrote nothing this time, scores nothing."""

    def written(path: Path) -> bool:
        return before is None or file_state(path) != before.get(path.relative_to(view).as_posix())

    ignored: list[str] = []
    summary: object = None
    pattern = card.grading.summary
    path = summary_file(view, pattern, written) if pattern else None
    if path is not None:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = None
    stale = summary_file(view, pattern) if pattern and (path is None or not path.is_file()) else None
    if stale is not None and stale.is_file():
        ignored.append(f"{_origin(view, stale)} and this grading did not rewrite it; ignored")
    md = view / DESCRIPTION
    text = md.read_text(errors="replace") if md.is_file() else ""
    fresh_tables = written(md)
    tables = parse_tables(text)[0] if text and fresh_tables else []
    values = {s.id: _value_for(s, summary, tables) for s in card.subtasks}
    if text and not fresh_tables:
        shipped = parse_tables(text)[0]
        if any(values[s.id] is None and _value_for(s, None, shipped) is not None for s in card.subtasks):
            ignored.append(
                f"{_origin(view, md)} with a filled Your Method row and this grading did not rewrite it; "
                "its values ignored"
            )
    return values, ignored


def _origin(view: Path, path: Path) -> str:
    """Where a file in the grading view came from: a copy from the pristine task, or the workspace (a symlink)."""
    rel = path.relative_to(view).as_posix()
    linked = path.is_symlink() or (view / rel.split("/")[0]).is_symlink()
    return f"{rel} was there before this grading" if linked else f"{rel} was shipped with the task"


def _value_for(s: Subtask, summary: object, tables: list) -> float | None:
    if s.json_key and summary is not None:
        value = as_number(lookup(summary, s.json_key))
        if value is not None:
            return value
    if s.table is not None and s.table < len(tables) and s.column:
        table = tables[s.table]
        col = table.column(s.column)
        row = table.row(YOUR_METHOD)
        if s.row is not None:  # one `Your Method` row per section or metric: the subtask's own
            rows = table.method_rows(YOUR_METHOD)
            row = table.rows[rows[s.row]] if s.row < len(rows) else None
        if col is not None and row is not None:
            numbers = cell_numbers(row[col])
            return numbers[s.part] if len(numbers) > s.part else None
    return None


def grader_sandbox(card: TaskCard, workspace: Path, view: Path, env: dict[str, str]) -> SandboxPolicy:
    """The grader's own room: the grading view (the pristine grading files, links into the workspace) read-write as
    its output folder, the workspace read-only, the task environment and interpreter read-only, a fresh /tmp, no
    network; not the pristine task, not the run's records, not another run."""
    from labkube.tasks.environment import sandbox_read_only

    seen, masked = sandbox_read_only(Path(card.path))
    inner = {k: v for k, v in env.items() if not k.startswith(("LABKUBE_", "RAY_"))}
    inner.update(HOME="/tmp", TMPDIR="/tmp")
    return SandboxPolicy(
        writable=(view.resolve(),), read_only=(workspace.resolve(), *seen), masked=masked, cwd=view.resolve(), env=inner
    )


def grade_workspace(
    card: TaskCard, workspace: Path, scratch: Path, log_file: Path | None = None, *, sandboxed: bool = False
) -> GradeOutcome:
    """Run the task's grader over the workspace from the pristine grading files (a grading view); with `sandboxed`,
    in a sandbox of its own (`grader_sandbox`) that sees the workspace read-only and writes only the view."""
    view = scratch / "grading-view"
    try:
        build_grading_view(card, workspace, view)
        before = outputs_before(card, view)
    except OSError as exc:
        return GradeOutcome.not_graded(card, f"grading view: {exc}")
    from labkube.tasks.environment import activate, current_env

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    task_env = current_env()
    if task_env is not None:  # the grader runs in the task's environment, as the agent's code does
        env = activate(task_env.venv, env)
    for key in list(env):
        if key.endswith("_API_KEY"):
            del env[key]
    error = None
    printed = ""
    argv = ["bash", "-c", card.grading.command]
    if sandboxed:
        argv = sandbox_argv(grader_sandbox(card, workspace, view, env), argv)
        env = {"PATH": env.get("PATH", "/usr/bin:/bin")}
    try:
        proc = subprocess.run(
            argv,
            cwd=view,
            env=env,
            capture_output=True,
            text=True,
            timeout=card.grading.timeout_s,
            start_new_session=True,
            check=False,
        )
        output = f"$ {card.grading.command}\n[exit {proc.returncode}]\n{proc.stdout}\n{proc.stderr}\n"
        printed = f"{proc.stdout}\n{proc.stderr}"
        if proc.returncode != 0:
            said = last_lines(proc.stderr) or last_lines(proc.stdout) or "(no output)"
            error = f"grader exited {proc.returncode}: {said}"
    except subprocess.TimeoutExpired as exc:
        output = f"$ {card.grading.command}\n[timed out after {card.grading.timeout_s}s]\n"
        said = last_lines(_text(exc.stderr)) or last_lines(_text(exc.stdout)) or "(no output)"
        error = f"grader timed out after {card.grading.timeout_s:.0f}s: {said}"
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a") as fh:
            fh.write(output)
    values, ignored = graded_values(card, view, before)
    scores = [score_subtask(values.get(s.id), s) for s in card.subtasks]
    primary = card.primary
    score = None
    if primary is not None:
        p = next(x for x in scores if x.id == primary.id)
        score = headline(p)
    notes = [*ignored, no_value_note(card, scores, printed)]
    note = "; ".join(n for n in notes if n) or None
    return GradeOutcome(scores, score, error, None if error else note)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
