"""Run a task's grader on a workspace, from the pristine grading files.

The grader runs in a *grading view*: a scratch directory whose protected paths
(`grading/`, `task_description.md`, ...) are fresh copies from the pristine task
and whose other entries are symlinks into the workspace. A ResearchGym
`grade.sh` finds the task root as the parent of its own directory, so it reads
the agent's logs and outputs but only ever runs the original grading code.
Edits the agent made to grading files never change a score.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labkube.result import SubtaskScore
from labkube.sandbox import SandboxPolicy, sandbox_argv
from labkube.task_card import Subtask, TaskCard
from labkube.tasks._markdown import YOUR_METHOD, Table, method_of, parse_tables
from labkube.tasks.numbers import (
    NotANumber,
    NumberStyle,
    column_writes_percent,
    in_task_units,
    read_number,
    read_numbers,
    shown,
    style_of,
)
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
        warnings: list[str] | None = None,
    ) -> None:
        self.subtasks = subtasks
        self.score = score
        self.error = error
        self.note = note
        self.task_changed = task_changed
        self.warnings = warnings or []

    @classmethod
    def not_graded(cls, card: TaskCard, error: str, task_changed: bool = False) -> GradeOutcome:
        """A grading that never produced values: every subtask without one."""
        return cls([score_subtask(None, s) for s in card.subtasks], None, error, task_changed=task_changed)


def last_lines(text: str, lines: int = 8, max_chars: int = 1200) -> str:
    """The end of a program's output, as a reader of an error wants it: its last non-blank lines."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-max_chars:]


def no_value_note(
    card: TaskCard, scores: list[SubtaskScore], printed: str, refused: Mapping[str, str] | None = None
) -> str | None:
    """Why a clean grading has no headline value: the subtasks left empty, where the headline's value was and why it
    is none (`refused`: a cell that is not a number, a table the file lacks), and what the grader printed; or why the
    value it has is not counted (flagged as implausible)."""
    primary = card.primary
    score = next((s for s in scores if primary is not None and s.id == primary.id), None)
    if primary is None or score is None:
        return None
    if score.implausible:
        return f"the value of subtask {primary.id} is flagged: {score.implausible}"
    if score.raw is not None:
        return None
    missing = [s.id for s in scores if s.raw is None]
    others = f" (and {len(missing) - 1} other subtask(s) without one)" if len(missing) > 1 else ""
    why = f"; {refused[primary.id]}" if refused and primary.id in refused else ""
    said = last_lines(printed, lines=5, max_chars=600) or "(nothing)"
    return f"the grader gave no value for subtask {primary.id}{others}{why}; it printed: {said}"


# What a grader that failed prints even when it exits 0: a Python traceback, or a line that starts with an exception's
# name or an error tag (`ValueError: ...`, `ERROR:root:...`, `Error: ...`). Not: such a line whose text is a number
# (a metric named Error: `Error: 0.14`), Python's note of an exception it ignored at exit (`Exception ignored in`),
# warnings, or the word anywhere else in a line (`error rate 0.1`, `0 errors`).
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):\s*$")
_ERROR_LINE = re.compile(
    r"^\s*(?:(?:[A-Za-z_][\w.]*)?(?:Error|Exception)|ERROR|FATAL|Fatal error)\b\s*(?::\s*(?P<said>.*))?$"
)
_IGNORED_AT_EXIT = re.compile(r"^\s*Exception ignored in\b")


def error_lines(printed: str) -> list[str]:
    """The lines of a grader's output that say it failed (see `_ERROR_LINE`), in order."""
    found: list[str] = []
    for line in printed.splitlines():
        if _IGNORED_AT_EXIT.match(line):
            continue
        if _TRACEBACK.match(line):
            found.append(line.strip())
            continue
        match = _ERROR_LINE.match(line)
        if match is None:
            continue
        said = (match.group("said") or "").strip()
        try:
            if said and all(n is not None for n in read_numbers(said)):
                continue  # a metric named Error, and its value
        except NotANumber:
            pass
        found.append(line.strip())
    return found


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


@dataclass(frozen=True)
class TaskNumbers:
    """What the task's own values say about reading a grader's (from its pristine description): whether they use
    decimal commas or thousands separators, and which subtasks' columns it writes in percent."""

    style: NumberStyle
    percent_columns: frozenset[str]
    tables: list[Table]

    @classmethod
    def of(cls, card: TaskCard) -> TaskNumbers:
        tables = parse_tables(card.description)[0] if card.description else []
        listed = [cell for t in tables for row in t.rows if not _is_your_method(row) for cell in row[1:]]
        percent: set[str] = set()
        for s in card.subtasks:
            table = tables[s.table] if s.table is not None and s.table < len(tables) else None
            col = table.column(s.column) if table is not None and s.column else None
            if table is not None and col is not None:
                cells = [row[col] for row in table.rows if not _is_your_method(row)]
                if column_writes_percent(table.header[col], cells):
                    percent.add(s.id)
        return cls(style=style_of(listed), percent_columns=frozenset(percent), tables=tables)


def _is_your_method(row: list[str]) -> bool:
    return bool(row) and method_of(row) == YOUR_METHOD


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
    return graded_values(card, view, None).values


@dataclass
class GradedValues:
    """What one grading's outputs give: each subtask's raw value (None: none); for a subtask without one, where its
    value was and why it is none (`refused`: a cell that is not a number, a table the file lacks; `unfilled`: a
    placeholder); output this grading did not write (`ignored`); and what the parser saw beside the values
    (`warnings`)."""

    values: dict[str, float | None]
    refused: dict[str, str] = field(default_factory=dict)
    unfilled: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def graded_values(card: TaskCard, view: Path, before: Mapping[str, FileState] | None) -> GradedValues:
    """Each subtask's raw value, from the JSON summary first, then the filled `Your Method` rows; and what was
    ignored or refused. With `before` (`outputs_before`), a summary or a description counts only if this grading
    wrote it: a task that ships a `results.json` or a filled row, or a grader that wrote nothing this time, scores
    nothing. A value counts only when it is a number in a form the task's own values use (`labkube.tasks.numbers`)."""

    def written(path: Path) -> bool:
        return before is None or file_state(path) != before.get(path.relative_to(view).as_posix())

    task = TaskNumbers.of(card)
    graded = GradedValues(values={})
    summary: Summary | None = None
    pattern = card.grading.summary
    path = summary_file(view, pattern, written) if pattern else None
    if path is not None and path.is_file():
        rel = path.relative_to(view).as_posix()
        try:
            summary = Summary(rel, json.loads(path.read_text(errors="replace")))
        except (OSError, ValueError) as exc:
            graded.warnings.append(f"{rel} is not JSON ({exc}); its values ignored")
    stale = summary_file(view, pattern) if pattern and (path is None or not path.is_file()) else None
    if stale is not None and stale.is_file():
        graded.ignored.append(f"{_origin(view, stale)} and this grading did not rewrite it; ignored")
    md = view / DESCRIPTION
    text = md.read_text(errors="replace") if md.is_file() else ""
    fresh_tables = written(md)
    tables = parse_tables(text)[0] if text and fresh_tables else None
    if tables is not None:
        graded.warnings.extend(new_row_problems(task.tables, tables))
    for s in card.subtasks:
        read = _value_for(s, summary, tables, task)
        graded.values[s.id] = read.value
        graded.warnings.extend(read.warnings)
        if read.refused is not None:
            graded.refused[s.id] = read.refused
        if read.unfilled is not None:
            graded.unfilled[s.id] = read.unfilled
    if text and not fresh_tables:
        shipped = parse_tables(text)[0]
        if any(
            graded.values[s.id] is None and _value_for(s, None, shipped, task).value is not None for s in card.subtasks
        ):
            graded.ignored.append(
                f"{_origin(view, md)} with a filled Your Method row and this grading did not rewrite it; "
                "its values ignored"
            )
    return graded


@dataclass(frozen=True)
class Summary:
    """The grader's JSON summary, and where it is in the grading view."""

    path: str
    data: object


def new_row_problems(pristine: list[Table], graded: list[Table]) -> list[str]:
    """Rows of the graded description whose cell count differs from their header's and that the pristine one does not
    have (the task's own are `tasks show`'s warnings)."""
    known = {(t.index, m.method, m.cells) for t in pristine for m in t.malformed}
    return [
        f"{DESCRIPTION} as graded: {m.problem(t)}"
        for t in graded
        for m in t.malformed
        if (t.index, m.method, m.cells) not in known
    ]


def _origin(view: Path, path: Path) -> str:
    """Where a file in the grading view came from: a copy from the pristine task, or the workspace (a symlink)."""
    rel = path.relative_to(view).as_posix()
    linked = path.is_symlink() or (view / rel.split("/")[0]).is_symlink()
    return f"{rel} was there before this grading" if linked else f"{rel} was shipped with the task"


@dataclass
class Read:
    """What a grading's outputs hold for one subtask: its value; else what stood there that is not a number, or a
    table or column the file lacks (`refused`), or a placeholder (`unfilled`: a cell the grader did not fill);
    and warnings beside it (a summary value that is not a number where the table has one, duplicate rows)."""

    value: float | None = None
    refused: str | None = None
    unfilled: str | None = None
    warnings: list[str] = field(default_factory=list)


def _value_for(s: Subtask, summary: Summary | None, tables: list[Table] | None, task: TaskNumbers) -> Read:
    """Subtask `s`'s value: the JSON summary's first, then its `Your Method` cell's."""
    percent = s.id in task.percent_columns
    summary_refused = None
    if s.json_key and summary is not None:
        try:
            number = read_number(lookup(summary.data, s.json_key), task.style)
            if number is not None:
                return Read(value=in_task_units(number, s, percent))
        except NotANumber as exc:
            summary_refused = f"{summary.path} `{s.json_key}`: {exc}"
    if tables is None or s.table is None or not s.column:
        return Read(refused=summary_refused)
    read = _table_value(s, tables, task, percent)
    if summary_refused is not None:
        if read.value is not None:
            read.warnings.append(f"{summary_refused}; the table's value taken")
        else:
            read.refused = "; ".join(r for r in (summary_refused, read.refused) if r)
    return read


def _table_value(s: Subtask, tables: list[Table], task: TaskNumbers, percent: bool) -> Read:
    """Subtask `s`'s value from its `Your Method` row of the graded description."""
    assert s.table is not None and s.column is not None
    if s.table >= len(tables):
        return Read(refused=f"{DESCRIPTION} as graded has no table {s.table} (it has {len(tables)})")
    table = tables[s.table]
    where = f"{DESCRIPTION} table {s.table} (line {table.line}), column `{s.column}`"
    col = table.column(s.column)
    if col is None:
        return Read(refused=f"{where}: the table as graded has no such column")
    rows = table.method_rows(YOUR_METHOD)
    read = Read()
    if s.row is not None:  # one `Your Method` row per section or metric: the subtask's own
        chosen = [rows[s.row]] if s.row < len(rows) else []
    elif len(rows) > 1:
        chosen, said = _one_of_duplicates(table, rows, col, s, task)
        read.warnings.append(f"{where}: {said}")
        if not chosen:
            read.refused = f"{where}: {said}"
            return read
    else:
        chosen = rows
    if not chosen:
        broken = [m for m in table.malformed if m.method == YOUR_METHOD and not m.read]
        read.refused = f"{where}: {broken[0].problem(table) if broken else 'no `Your Method` row'}"
        return read
    cell = table.rows[chosen[0]][col]
    try:
        numbers = read_numbers(cell, task.style)
        number = numbers[s.part] if len(numbers) > s.part else None
        if number is None:
            read.unfilled = f"{where}: it held {shown(cell)}, no number"
        else:
            read.value = in_task_units(number, s, percent)
    except NotANumber as exc:
        read.refused = f"{where}: {exc}"
    return read


def _one_of_duplicates(table: Table, rows: list[int], col: int, s: Subtask, task: TaskNumbers) -> tuple[list[int], str]:
    """A table with one `Your Method` row that the grader left with several: the one row with a value for the
    subtask's cell, or all of them when they agree; none when they disagree (which one is this grading's is
    unclear)."""
    with_value: dict[int, float] = {}
    for n in rows:
        try:
            numbers = read_numbers(table.rows[n][col], task.style)
        except NotANumber:
            continue
        number = numbers[s.part] if len(numbers) > s.part else None
        if number is not None:
            with_value[n] = number.value
    count = f"{len(rows)} `Your Method` rows where the task has one"
    if len(set(with_value.values())) > 1:
        held = ", ".join(shown(table.rows[n][col]) for n in with_value)
        return [], f"{count}, with different values ({held}): which one is this grading's is unclear"
    if not with_value:
        return rows[:1], f"{count}; read the first"
    return list(with_value)[:1], f"{count}; read the one value they hold"


def grader_sandbox(card: TaskCard, workspace: Path, view: Path, env: dict[str, str]) -> SandboxPolicy:
    """The grader's own room: the grading view (the pristine grading files, links into the workspace) read-write as
    its output folder, the workspace read-only (at its host path, where the view's links lead, and at /workspace,
    where the agent's own absolute links lead), the task environment and interpreter read-only, a fresh /tmp, no
    network; not the pristine task, not the run's records, not another run."""
    from labkube.tasks.environment import sandbox_read_only

    seen, masked = sandbox_read_only(Path(card.path))
    inner = {k: v for k, v in env.items() if not k.startswith(("LABKUBE_", "RAY_"))}
    inner.update(HOME="/tmp", TMPDIR="/tmp")
    return SandboxPolicy(
        writable=(view.resolve(),),
        read_only=(workspace.resolve(), *seen),
        # also where the agent saw it, so that the links it made to /workspace/... lead where they did in its run
        workspace=workspace.resolve(),
        workspace_writable=False,
        masked=masked,
        cwd=view.resolve(),
        env=inner,
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
    argv = ["bash", "-c", card.grading.command]
    if sandboxed:
        argv = sandbox_argv(grader_sandbox(card, workspace, view, env), argv)
        env = {"PATH": env.get("PATH", "/usr/bin:/bin")}
    ran = run_grader(argv, view, env, card.grading.timeout_s)
    printed = f"{ran.stdout}\n{ran.stderr}"
    said = last_lines(ran.stderr) or last_lines(ran.stdout) or "(no output)"
    if ran.held_open is not None:
        error = f"{ran.held_open}: {said}"
        exit_line = f"[{ran.held_open}]"
    else:
        error = f"grader exited {ran.returncode}: {said}" if ran.returncode != 0 else None
        exit_line = f"[exit {ran.returncode}]"
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a") as fh:
            fh.write(f"$ {card.grading.command}\n{exit_line}\n{ran.stdout}\n{ran.stderr}\n")
    graded = graded_values(card, view, before)
    scores = [score_subtask(graded.values.get(s.id), s) for s in card.subtasks]
    primary = card.primary
    score = None
    if primary is not None:
        p = next(x for x in scores if x.id == primary.id)
        score = headline(p)
    others_refused = [why for sid, why in graded.refused.items() if primary is None or sid != primary.id]
    warnings = [*graded.ignored, *graded.warnings, *others_refused]
    failed_lines = error_lines(printed) if error is None else []
    if failed_lines:
        shown_lines = " | ".join(failed_lines[:3]) + (
            f" (and {len(failed_lines) - 3} more)" if len(failed_lines) > 3 else ""
        )
        if any(s.completed for s in scores):
            warnings.append(f"the grader exited 0 but its output shows an error: {shown_lines}; its values are kept")
        else:
            error = f"grader exited 0 but its output shows an error and it gave no value: {shown_lines}; {said}"
    notes = [*graded.ignored, no_value_note(card, scores, printed, graded.refused | _placeholders(graded, primary))]
    notes += [w for w in warnings if w not in graded.ignored]
    note = "; ".join(n for n in notes if n) or None
    if error:
        return GradeOutcome(scores, score, error)
    return GradeOutcome(scores, score, None, note, warnings=warnings)


def _placeholders(graded: GradedValues, primary: Subtask | None) -> dict[str, str]:
    """The headline's unfilled cell, for its no-value note (other subtasks' placeholders are the usual state of a
    task the agent did part of: not worth a warning)."""
    if primary is None or primary.id not in graded.unfilled:
        return {}
    return {primary.id: graded.unfilled[primary.id]}


@dataclass(frozen=True)
class GraderRun:
    """How the grader's process ended: its exit status and output; `held_open` when it was killed at its time-out,
    saying which process held it (the grader, still running; or one it left behind that kept its output open)."""

    returncode: int | None
    stdout: str
    stderr: str
    held_open: str | None = None


def run_grader(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> GraderRun:
    """Run the grader in a session of its own; at its time-out, kill the session's every process (not only the
    grader: a child it started in the background would live on, holding its output)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return GraderRun(proc.returncode, out, err)
    except subprocess.TimeoutExpired as exc:
        partial_out, partial_err = _text(exc.stdout), _text(exc.stderr)
    exited = proc.poll()
    holders = session_processes(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()
    try:
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a process that left the grader's session holds the output still
        out, err = partial_out, partial_err
    waited = time.monotonic() - started
    if exited is None:
        held = f"grader timed out after {timeout_s:.0f}s, still running"
    else:
        named = ", ".join(holders[:3]) or "a process it started"
        held = (
            f"grader exited {exited}, but a process it left running ({named}) kept its output open until the "
            f"time-out ({timeout_s:.0f}s); killed after {waited:.0f}s"
        )
    return GraderRun(exited, out or partial_out, err or partial_err, held_open=held)


def session_processes(session: int) -> list[str]:
    """The live processes of a session (by /proc), as `pid N (command)`; none where /proc cannot tell."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[3]) != session or fields[0] == "Z":
                continue
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        found.append(f"pid {stat.parent.name} `{cmdline[:80]}`")
    return sorted(found)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
