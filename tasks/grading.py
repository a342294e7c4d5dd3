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
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from labkube.result import SubtaskScore
from labkube.task_card import Subtask, TaskCard
from labkube.tasks._markdown import YOUR_METHOD, cell_numbers, first_number, parse_tables
from labkube.tasks.scoring import headline, score_subtask
from labkube.tasks.workspace import matches


class GradeOutcome:
    """One grading: the subtasks' scores and the headline; `error` when the grader itself failed (exit status,
    time-out: its last lines); `note` when it ran cleanly but left the headline subtask without a value."""

    def __init__(
        self, subtasks: list[SubtaskScore], score: float | None, error: str | None, note: str | None = None
    ) -> None:
        self.subtasks = subtasks
        self.score = score
        self.error = error
        self.note = note


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


def summary_file(view: Path, pattern: str) -> Path | None:
    """The grader's JSON summary: `pattern` relative to the task root, or the newest file it matches when it is
    a glob (`grading/runs/*/grading_summary.json`: a grader that writes one per timestamped run)."""
    if not glob.has_magic(pattern):
        return view / pattern
    found = [p for p in view.glob(pattern) if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime, p.as_posix()), default=None)


def read_values(card: TaskCard, view: Path) -> dict[str, float | None]:
    """Each subtask's raw value, from the JSON summary first, then the filled `Your Method` rows."""
    summary: object = None
    path = summary_file(view, card.grading.summary) if card.grading.summary else None
    if path is not None:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = None
    md = view / "task_description.md"
    tables = parse_tables(md.read_text(errors="replace"))[0] if md.exists() else []
    values: dict[str, float | None] = {}
    for s in card.subtasks:
        values[s.id] = _value_for(s, summary, tables)
    return values


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


def grade_workspace(card: TaskCard, workspace: Path, scratch: Path, log_file: Path | None = None) -> GradeOutcome:
    view = scratch / "grading-view"
    try:
        build_grading_view(card, workspace, view)
    except OSError as exc:
        return GradeOutcome([score_subtask(None, s) for s in card.subtasks], None, f"grading view: {exc}")
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
    try:
        proc = subprocess.run(
            ["bash", "-c", card.grading.command],
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
    values = read_values(card, view)
    scores = [score_subtask(values.get(s.id), s) for s in card.subtasks]
    primary = card.primary
    score = None
    if primary is not None:
        p = next(x for x in scores if x.id == primary.id)
        score = headline(p)
    return GradeOutcome(scores, score, error, None if error else no_value_note(card, scores, printed))


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
