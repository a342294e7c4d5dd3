"""GAIA (v1): static questions with a short answer, an optional attached file, bash and python.

A dataset is a directory in GAIA's own layout: `metadata.jsonl` (task_id, Question,
Level, Final answer, file_name, ...) with the attachments beside it. A task
reference names the whole dataset (`gaia/<name>` for a bundled one, or the
directory's path) or one question (`gaia/<name>/<task_id>`, `<dir>#<task_id>`).
The answer the agent gives through `end_task` is scored by GAIA's official rules.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import stat
import time
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from labkube.result import SubtaskScore
from labkube.task_card import GaiaQuestion, Subtask, TaskCard, TaskFamily
from labkube.tasks.gaia_scorer import extract_final_answer, question_scorer
from labkube.tasks.researchgym import TaskError

PROMPT = """You are answering a question. Use the tools (bash, python, files) as you need.
{attachment}
Question: {question}

When you are done, call end_task with your answer as the summary, in the form
`FINAL ANSWER: <answer>`. The answer should be a number, as few words as possible, or a
comma-separated list of numbers and/or strings. Write numbers in digits without units or
thousands separators unless asked; do not abbreviate or add articles to strings.
"""


RECENT_NS = 2_000_000_000
_ROWS = TypeAdapter(list[GaiaQuestion])
_loaded: dict[Path, tuple[tuple[int, ...], list[GaiaQuestion]]] = {}  # dataset -> (its state when read, questions)


def load_questions(dataset: Path) -> list[GaiaQuestion]:
    """The dataset's questions, checked. A process reads a dataset again only once its files changed: a campaign's
    supervisor asks for one question's card per run, and the whole file is read and checked for each."""
    state = _dataset_state(dataset)
    known = _loaded.get(dataset)
    if state is not None and known is not None and known[0] == state:
        return list(known[1])
    questions = _read_questions(dataset)
    if state is not None and not any("/" in q.file_name for q in questions):
        _loaded[dataset] = (state, questions)
    return list(questions)


def _dataset_state(dataset: Path) -> tuple[int, ...] | None:
    """What changes when metadata.jsonl is rewritten or an attachment beside it is added, removed, renamed or
    replaced: the file's identity and time, and the folder's (an attachment in a subfolder is never cached). None
    (not cached) for one changed in the last seconds: the kernel's file times move in ticks of a few ms, so two
    writes of the same size within one tick would look the same."""
    try:
        meta, folder = (dataset / "metadata.jsonl").stat(), dataset.stat()
    except OSError:
        return None
    if time.time_ns() - max(meta.st_mtime_ns, folder.st_mtime_ns) < RECENT_NS:
        return None
    return (meta.st_ino, meta.st_mtime_ns, meta.st_size, folder.st_ino, folder.st_mtime_ns)


def _read_questions(dataset: Path) -> list[GaiaQuestion]:
    meta = dataset / "metadata.jsonl"
    if not meta.exists():
        raise TaskError(f"GAIA dataset {dataset}: no metadata.jsonl (expected GAIA's layout)")
    try:
        text = meta.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"GAIA dataset {dataset}: metadata.jsonl is not a text (UTF-8) file") from None
    except OSError as exc:
        raise TaskError(f"GAIA dataset {dataset}: cannot read metadata.jsonl ({exc.strerror or exc})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:  # a campaign of no runs, and an empty table for every command that lists them
        raise TaskError(
            f"GAIA dataset {dataset}: metadata.jsonl holds no questions; add one JSON object per line "
            '({"task_id": ..., "Question": ..., "Level": ..., "Final answer": ...})'
        )
    try:  # every row at once; a dataset that fails is read again row by row, to say which line is wrong
        questions = _ROWS.validate_json(f"[{','.join(lines)}]")
    except ValidationError:
        questions = []
    if len(questions) != len(lines):
        questions = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                questions.append(GaiaQuestion.model_validate(json.loads(line)))
            except (ValueError, ValidationError) as exc:
                where = f"GAIA dataset {dataset}: metadata.jsonl line {n}"
                raise TaskError(f"{where}: {str(exc).splitlines()[0]}") from None
    ids = [q.task_id for q in questions]
    if len(set(ids)) != len(ids):
        raise TaskError(f"GAIA dataset {dataset}: duplicate task_id in metadata.jsonl")
    inside = os.path.realpath(dataset).rstrip(os.sep) + os.sep
    for q in questions:
        if not q.file_name:
            continue
        path = os.path.join(dataset, q.file_name)
        if os.path.isabs(q.file_name) or not os.path.realpath(path).startswith(inside):
            raise TaskError(
                f"GAIA dataset {dataset}: question {q.task_id}: attachment {q.file_name!r} is outside "
                "the dataset directory"
            )
        if not os.path.isfile(path):
            raise TaskError(f"GAIA dataset {dataset}: question {q.task_id}: attachment {q.file_name} is missing")
    return questions


def question_card(dataset: Path, ref: str, q: GaiaQuestion) -> TaskCard:
    return TaskCard(
        ref=ref,
        name=q.task_id,
        family=TaskFamily.gaia,
        path=str(dataset.resolve()),
        description=q.question,
        subtasks=[Subtask(id="correct", metric="Correct", baseline=0.0, sota=1.0, primary=True)],
        scoring="pass_fail",
        group=f"{ref.rsplit('/', 1)[0] if '/' in ref else dataset.name} L{q.level}",
        gaia=q,
    )


def load_gaia(dataset: Path, base_ref: str, task_id: str | None = None) -> list[TaskCard]:
    questions = load_questions(dataset)
    if task_id is not None:
        questions = [q for q in questions if q.task_id == task_id]
        if not questions:
            ids = [q.task_id for q in load_questions(dataset)]
            near = difflib.get_close_matches(task_id, ids, n=1)
            hint = f"did you mean {near[0]}?" if near else f"its questions: {', '.join(ids[:10])}"
            raise TaskError(f"GAIA dataset {dataset}: no question {task_id!r} ({hint})")
    return [question_card(dataset, f"{base_ref}/{q.task_id}", q) for q in questions]


def prepare_gaia_workspace(card: TaskCard, dest: Path) -> None:
    """An empty workspace with the question's attachment, read-only."""
    assert card.gaia is not None
    dest.mkdir(parents=True, exist_ok=True)
    if card.gaia.file_name:
        target = dest / card.gaia.file_name
        if not target.exists():
            shutil.copy2(Path(card.path) / card.gaia.file_name, target)
        target.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def gaia_prompt(card: TaskCard, workspace: Path) -> str:
    assert card.gaia is not None
    attachment = ""
    if card.gaia.file_name:
        attachment = f"The question comes with a file: {workspace / card.gaia.file_name}\n"
    return PROMPT.format(attachment=attachment, question=card.gaia.question)


def grade_answer(card: TaskCard, answer: str | None) -> tuple[list[SubtaskScore], float | None]:
    """1 if the agent's final answer is right by GAIA's rules, else 0 (no answer: 0, not completed)."""
    assert card.gaia is not None
    if not answer or not answer.strip():
        return [SubtaskScore(id="correct")], 0.0
    correct = question_scorer(extract_final_answer(answer), card.gaia.final_answer)
    value = 1.0 if correct else 0.0
    return [
        SubtaskScore(id="correct", raw=value, fraction_of_sota=value, gap_closed=value, beat_baseline=correct)
    ], value
