"""One streaming pass over a run's `transcript.jsonl` for `labkube analyze`: counters and the first evidence line
of each kind are kept, never the lines themselves, so memory does not grow with the transcript's length.

Event types read (agent/rg/loop.py, agent/harness/entrypoint.py): `tool_call` (tool, args, output, step, ts),
`model_call` (usage with reasoning tokens, the assistant message), `handoff`, `context_drop`. Async jobs are
followed through the `start_async` output ("started job1 ...") and `check_async`/`cancel_async` outputs
("job1 (...): exited ...").
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

PHASES = ("start", "ramp", "steady")
FLAT_LOSS_MIN = 5
PROGRESS_WORDS = re.compile(
    r"\b(improv\w*|progress\w*|better|converg\w*|decreas\w*|works|success\w*|good results?)\b", re.I
)
NAN_LINE = re.compile(r"\b(nan|inf)\b", re.I)
LOSS_VALUE = re.compile(r"\bloss\b\s*[=:]?\s*(nan|[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", re.I)
OUTPUT_TARGET = re.compile(
    r"(?:>>?|\btee(?:\s+-a)?)\s*([^\s;&|>]+)|--(?:out|output|output[-_]dir|log|log[-_]file|save[-_]dir)[= ]([^\s;&|]+)"
)
JOB_ID = re.compile(r"\bstarted (job\d+)")
JOB_EXITED = re.compile(r"^(job\d+) \(.*\): exited with code", re.M)


@dataclass
class Job:
    id: str
    command: str
    start: float
    end: float | None = None
    targets: set[str] = field(default_factory=set)
    step: int = 0


@dataclass
class TranscriptStats:
    """What one pass over a transcript keeps: counters and the first evidence of each kind, never the lines."""

    tool_calls: int = 0
    mix: dict[str, Counter[str]] = field(default_factory=lambda: {p: Counter() for p in PHASES})
    reasoning_tokens: int = 0
    output_tokens: int = 0
    handoffs: int = 0
    context_drops: int = 0
    dropped_messages: int = 0
    jobs: dict[str, Job] = field(default_factory=dict)
    first_ts: float | None = None
    last_ts: float | None = None
    nan_evidence: str | None = None
    loss_first: str | None = None
    loss_count: int = 0
    loss_moved: bool = False
    loss_evidence: str | None = None
    progress_after_problem: str | None = None
    drop_evidence: str | None = None
    handoff_evidence: str | None = None
    end_task: str | None = None


def phase_of(step: int, steps: int) -> str:
    """The phase of 1-based `step` in a run of `steps` steps (thirds by step number)."""
    if steps <= 0:
        return PHASES[0]
    return PHASES[min(2, max(0, (step - 1) * 3 // steps))]


def _ts(record: dict[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(record["ts"])).timestamp()
    except (KeyError, ValueError):
        return None


def read_transcript(path: Path, steps: int, line_cap: int = 1_000_000) -> TranscriptStats:
    """One streaming pass over `transcript.jsonl` (a torn or oversized line is skipped)."""
    stats = TranscriptStats()
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return stats
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if len(raw) > line_cap:
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                try:
                    _take(stats, record, lineno, steps)
                except (TypeError, ValueError, AttributeError):  # a record of an unexpected shape: skipped
                    continue
    return stats


def _take(stats: TranscriptStats, record: dict[str, Any], lineno: int, steps: int) -> None:
    kind = record.get("type")
    ts = _ts(record)
    if ts is not None:
        stats.first_ts = ts if stats.first_ts is None else stats.first_ts
        stats.last_ts = ts
    if kind == "tool_call":
        tool = str(record.get("tool", "?"))
        step = int(record.get("step") or 0)
        stats.tool_calls += 1
        stats.mix[phase_of(step, steps)][tool] += 1
        output = str(record.get("output", ""))
        _scan_output(stats, output, lineno, step)
        args = record.get("args") if isinstance(record.get("args"), dict) else {}
        if tool == "start_async":
            match = JOB_ID.search(output)
            command = str(args.get("command", ""))
            if match:
                targets = {a or b for a, b in OUTPUT_TARGET.findall(command)}
                stats.jobs[match.group(1)] = Job(match.group(1), command, ts or 0.0, targets=targets, step=step)
        elif tool in ("check_async", "cancel_async"):
            for job_id in JOB_EXITED.findall(output):
                job = stats.jobs.get(job_id)
                if job is not None and job.end is None:
                    job.end = ts
        elif tool == "end_task":
            stats.end_task = f"line {lineno}, step {step}: end_task {json.dumps(args)[:200]}"
    elif kind == "model_call":
        usage = record.get("usage") or {}
        stats.reasoning_tokens += int(usage.get("reasoning") or 0)
        stats.output_tokens += int(usage.get("output") or 0)
        content = str((record.get("message") or {}).get("content") or "")
        problem = stats.nan_evidence or (stats.loss_count >= FLAT_LOSS_MIN and not stats.loss_moved)
        if problem and stats.progress_after_problem is None:
            match = PROGRESS_WORDS.search(content)
            if match:
                stats.progress_after_problem = f"line {lineno}, step {record.get('step')}: {clip(content)}"
    elif kind == "handoff":
        stats.handoffs += 1
        stats.handoff_evidence = stats.handoff_evidence or f"line {lineno}: hand-off #{record.get('n')}"
    elif kind == "context_drop":
        stats.context_drops += 1
        stats.dropped_messages += int(record.get("dropped_messages") or 0)
        stats.drop_evidence = stats.drop_evidence or (
            f"line {lineno}: context_drop of {record.get('dropped_messages')} messages"
        )


def _scan_output(stats: TranscriptStats, output: str, lineno: int, step: int) -> None:
    for line in output.splitlines():
        if stats.nan_evidence is None and NAN_LINE.search(line):
            stats.nan_evidence = f"line {lineno}, step {step}: {clip(line)}"
        for value in LOSS_VALUE.findall(line):
            stats.loss_count += 1
            if stats.loss_first is None:
                stats.loss_first = value.lower()
                stats.loss_evidence = f"line {lineno}, step {step}: {clip(line)}"
            elif value.lower() != stats.loss_first:
                stats.loss_moved = True


def clip(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
