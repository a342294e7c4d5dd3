"""One run's trajectory as a self-contained HTML page (`labkube view RUN_DIR`).

    render_run_html(run_dir)  ->  str

Steps in order, each with the model's text and thinking (where the model exposes them), its tool calls folded
(`<details>`), tokens, cost and time; hand-offs, context drops, budget stops, errors, resumes and people's
interventions (cancel, pause, resume, extend, message, usage checkpoints) marked in place and listed at the top; the
score curve, with a line at each intervention; and the integrity audit's flags, each linked to the step that raised it
(a flag that names only a file links to the steps whose tool calls touched that file).

Long runs stay fast: every fold is closed, long texts show their head and keep the rest behind a "show more" fold
(anything past `KEEP_CHARS` is left out and the transcript named), and steps off screen are not laid out
(`content-visibility: auto`). A run that failed before writing a transcript still gets a page: its status,
error and log tail.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from markupsafe import Markup

from labkube.agent.transcript import iter_jsonl
from labkube.budgets import total_cost
from labkube.control import run_control
from labkube.integrity_report import IntegrityReport, Violation
from labkube.interventions import Intervention
from labkube.result import AGENT_POD_CURVE_LABEL, RunResult
from labkube.results.html_report import (
    BASELINE_COLOR,
    INTERVENTION_COLOR,
    SOTA_COLOR,
    figure_legend,
    figure_svg,
    fmt_score,
    intervention_seconds,
    new_figure,
    plot_style,
    task_reference,
    template_env,
)
from labkube.run_spec import RunSpec, RunStatus
from labkube.store import RunDir, StoreError, read_model

__all__ = ["render_run_html"]

HEAD_CHARS = 2_500
HEAD_LINES = 40
KEEP_CHARS = 200_000
LOG_TAIL_CHARS = 6_000
MARKED_EVENTS = {
    "handoff",
    "context_drop",
    "budget_stop",
    "model_error",
    "harness_error",
    "terminated",
    "resume",
    "intervention",
}


@dataclass
class Clip:
    """A long text cut for display: `head` shown, `rest` behind a fold, `dropped` characters left out entirely."""

    head: str
    rest: str = ""
    dropped: int = 0

    @property
    def rest_chars(self) -> int:
        return len(self.rest)

    @property
    def rest_lines(self) -> int:
        return self.rest.count("\n") + 1 if self.rest else 0


def clip(text: str, head_chars: int = HEAD_CHARS, head_lines: int = HEAD_LINES) -> Clip:
    dropped = max(0, len(text) - KEEP_CHARS)
    if dropped:
        text = text[:KEEP_CHARS]
    cut = min(len(text), head_chars)
    nth = -1
    for _ in range(head_lines):
        nth = text.find("\n", nth + 1)
        if nth < 0:
            break
    if 0 <= nth < cut:
        cut = nth + 1
    return Clip(text[:cut], text[cut:], dropped)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)


# -- the page's parts ------------------------------------------------------------------------------------------


@dataclass
class ToolCallView:
    kind: Literal["tool"]
    call_id: str
    tool: str
    preview: str
    args: list[tuple[str, Clip]]
    output: Clip | None = None
    ok: bool | None = None
    duration_s: float | None = None
    access: str | None = None


@dataclass
class ModelCallView:
    kind: Literal["model"]
    purpose: str
    model: str
    content: Clip | None
    thinking: Clip | None
    thinking_preview: str
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_usd: float | None  # None: the model has no price
    duration_s: float
    backoff_s: float
    attempts: int
    planned: list[str]  # tool call ids the model asked for


@dataclass
class EventView:
    kind: Literal["event"]
    index: int
    type: str
    title: str
    detail: Clip | None = None
    step: int | None = None  # the step it belongs to or follows
    marked: bool = True
    record_id: str | None = None  # an intervention's id (labkube/interventions.py)

    @property
    def anchor(self) -> str:
        return f"event-{self.index}"


@dataclass
class StepView:
    step: int
    items: list[ModelCallView | ToolCallView | EventView] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = 0.0  # None (unknown) once a call of the step has no price
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    cum_tokens: int = 0
    cum_cost: float | None = 0.0
    flags: list[int] = field(default_factory=list)
    failed_tools: int = 0
    tools: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    kind = "step"

    @property
    def anchor(self) -> str:
        return f"step-{self.step}"


@dataclass
class FlagView:
    index: int
    violation: Violation
    steps: list[int]  # existing step anchors it points at
    via_file: bool  # True when the steps were found from the file the flag names
    evidence: Clip

    @property
    def anchor(self) -> str:
        return f"flag-{self.index}"

    @property
    def where(self) -> str:
        v = self.violation
        if v.file is None:
            return ""
        return v.file + (f":{v.line}" if v.line is not None else "")


@dataclass
class Trajectory:
    entries: list[StepView | EventView]
    steps: dict[int, StepView]
    events: list[EventView]
    grades: list[dict[str, Any]]
    tool_calls: list[tuple[int, dict[str, Any]]]


# -- reading the transcript ------------------------------------------------------------------------------------


def read_transcript(path: Path) -> list[dict[str, Any]]:
    """Every whole record; a torn or foreign line is skipped."""
    return list(iter_jsonl(path))


def _preview(tool: str, args: dict[str, Any]) -> str:
    for key in ("command", "path", "query", "pattern", "code", "summary", "url", "job_id"):
        if isinstance(args.get(key), str):
            first = args[key].strip().splitlines()[0] if args[key].strip() else ""
            return first[:140] + ("…" if len(first) > 140 or args[key].strip().count("\n") else "")
    if tool == "apply_patch" and isinstance(args.get("patch"), str):
        files = [
            ln.split(":", 1)[1].strip() for ln in args["patch"].splitlines() if ln.startswith("*** ") and ":" in ln
        ]
        return ", ".join(files)[:140]
    text = json.dumps(args, ensure_ascii=False, default=str)
    return text[:140] + ("…" if len(text) > 140 else "")


def _event(index: int, record: dict[str, Any], step: int | None) -> EventView:
    kind = str(record.get("type", "?"))
    detail = None
    marked = kind in MARKED_EVENTS
    if kind == "handoff":
        title = f"Hand-off #{record.get('n', '?')}: the conversation restarts from the task and the summaries"
        detail = clip(str(record.get("summary", "")))
    elif kind == "context_drop":
        title = f"Context overflow: the {record.get('dropped_messages', '?')} oldest messages were dropped"
    elif kind == "budget_stop":
        title = f"Budget stop ({record.get('reason', '?')})"
        detail = clip(str(record.get("detail", "")))
    elif kind in ("model_error", "harness_error"):
        reason = f" ({record['reason']})" if record.get("reason") else ""
        title = ("Model error" if kind == "model_error" else "Harness error") + reason
        detail = clip(str(record.get("error", "")))
    elif kind == "terminated":
        title = f"Terminated after step {record.get('step', '?')} (resumable from its checkpoint)"
    elif kind == "resume":
        title = f"Resumed from the checkpoint after step {record.get('step', '?')}"
    elif kind == "intervention":
        why = f" ({record['reason']})" if record.get("reason") else ""
        title = f"Intervention: {record.get('kind', '?')} by {record.get('by', '?')}{why}"
    elif kind == "start":
        title = f"Run started: model {record.get('model', '?')}, seed {record.get('seed', '?')}"
    elif kind == "are_agent":  # ARE's own agent (--agent are-default): its log, entry by entry
        log = str(record.get("log", "?"))
        if log == "tool_call":
            title = f"ARE's agent calls {record.get('tool', '?')}"
            detail = clip(as_text(record.get("arguments")))
        else:
            title = f"ARE's agent: {log.replace('_', ' ')}"
            detail = clip(str(record["content"])) if record.get("content") else None
    elif kind == "grade":
        score = record.get("score")
        error = record.get("error")
        title = f"Graded after step {record.get('step', '?')}: score {fmt_score(score)}" + (
            f" ({error})" if error else ""
        )
        subtasks = record.get("subtasks") or []
        parts = [f"{s.get('id')}={s.get('raw')}" for s in subtasks if isinstance(s, dict)]
        detail = clip("; ".join(parts)) if parts else None
    else:
        title = kind.replace("_", " ").capitalize()
        rest = {k: v for k, v in record.items() if k not in ("type", "ts")}
        detail = clip(as_text(rest)) if rest else None
    record_id = str(record["id"]) if kind == "intervention" and record.get("id") else None
    if kind == "intervention" and isinstance(record.get("step"), int):
        step = record["step"]
    return EventView("event", index, kind, title, detail, step, marked, record_id)


def build_trajectory(records: list[dict[str, Any]]) -> Trajectory:
    entries: list[StepView | EventView] = []
    steps: dict[int, StepView] = {}
    events: list[EventView] = []
    grades: list[dict[str, Any]] = []
    tool_calls: list[tuple[int, dict[str, Any]]] = []
    current: StepView | None = None
    pending: list[EventView] = []  # hand-offs and context drops: they belong to the step whose call follows
    executed: set[str] = set()
    cum_tokens = 0
    cum_cost: float | None = 0.0
    last_step = 0

    def close_step() -> None:
        """Calls the model asked for that never ran (the run stopped mid-step) are shown as such."""
        if current is None:
            return
        planned = [c for item in current.items if isinstance(item, ModelCallView) for c in item.planned]
        for call_id in planned:
            if call_id not in executed:
                current.items.append(ToolCallView("tool", call_id, "(not run)", "the run stopped before this call", []))

    for record in records:
        kind = record.get("type")
        step = record.get("step")
        if kind in ("model_call", "tool_call") and isinstance(step, int):
            if current is None or current.step != step:
                close_step()
                executed = set()
                current = StepView(step)
                steps.setdefault(step, current)
                entries.append(current)
                last_step = step
            current.items.extend(pending)
            current.events.extend(e.type for e in pending)
            for e in pending:
                e.step = step
            pending = []
            if kind == "model_call":
                item = _model_call(record)
                current.items.append(item)
                current.input_tokens += item.input_tokens
                current.output_tokens += item.output_tokens
                current.reasoning_tokens += item.reasoning_tokens
                current.cost_usd = total_cost([current.cost_usd, item.cost_usd])
                current.model_seconds += item.duration_s
                cum_tokens += item.input_tokens + item.output_tokens
                cum_cost = total_cost([cum_cost, item.cost_usd])
            else:
                call = _tool_call(record)
                executed.add(call.call_id)
                current.items.append(call)
                current.tool_seconds += call.duration_s or 0.0
                current.tools.append(call.tool)
                current.failed_tools += call.ok is False
                tool_calls.append((step, record))
            current.cum_tokens, current.cum_cost = cum_tokens, cum_cost
            continue
        event = _event(len(events), record, last_step if last_step else None)
        events.append(event)
        if kind == "grade":
            grades.append(record)
        if kind in ("handoff", "context_drop"):
            pending.append(event)
            continue
        close_step()
        current = None
        entries.extend(pending)
        pending = []
        entries.append(event)
    close_step()
    entries.extend(pending)
    return Trajectory(entries, steps, events, grades, tool_calls)


def _model_call(record: dict[str, Any]) -> ModelCallView:
    message = record.get("message") or {}
    usage = record.get("usage") or {}
    content = str(message.get("content") or "")
    thinking = str(message.get("thinking") or "")
    preview = " ".join(thinking.split())[:160]
    return ModelCallView(
        kind="model",
        purpose=str(record.get("purpose", "step")),
        model=str(record.get("model", "")),
        content=clip(content) if content.strip() else None,
        thinking=clip(thinking) if thinking.strip() else None,
        thinking_preview=preview + ("…" if len(thinking) > 160 else ""),
        input_tokens=int(usage.get("input", 0) or 0),
        output_tokens=int(usage.get("output", 0) or 0),
        reasoning_tokens=int(usage.get("reasoning", 0) or 0),
        cached_tokens=int(usage.get("cached", 0) or 0),
        cost_usd=None if record.get("cost_usd", 0.0) is None else float(record.get("cost_usd") or 0.0),
        duration_s=float(record.get("duration_s", 0.0) or 0.0),
        backoff_s=float(record.get("backoff_s", 0.0) or 0.0),
        attempts=int(record.get("attempts", 1) or 1),
        planned=[str(c.get("id")) for c in message.get("tool_calls") or [] if isinstance(c, dict)],
    )


def _tool_call(record: dict[str, Any]) -> ToolCallView:
    tool = str(record.get("tool", "?"))
    args = record.get("args") if isinstance(record.get("args"), dict) else {}
    assert isinstance(args, dict)
    output = record.get("output")
    return ToolCallView(
        kind="tool",
        call_id=str(record.get("call_id", "")),
        tool=tool,
        preview=_preview(tool, args),
        args=[(k, clip(as_text(v), 1_500, 30)) for k, v in args.items()],
        output=None if output is None else clip(as_text(output)),
        ok=record.get("ok") if isinstance(record.get("ok"), bool) else None,
        duration_s=record.get("duration_s") if isinstance(record.get("duration_s"), int | float) else None,
        access=record.get("access") if isinstance(record.get("access"), str) else None,
    )


# -- integrity flags -------------------------------------------------------------------------------------------


def _touching(file: str, tool_calls: list[tuple[int, dict[str, Any]]]) -> list[int]:
    """Steps whose tool calls name `file` (a written path first; else any mention in the arguments)."""
    name = file.lstrip("./")
    direct, mentioned = [], []
    for step, record in tool_calls:
        args = record.get("args") if isinstance(record.get("args"), dict) else {}
        assert isinstance(args, dict)
        path = args.get("path")
        if isinstance(path, str) and path.lstrip("./") == name:
            direct.append(step)
        elif name in json.dumps(args, ensure_ascii=False, default=str):
            mentioned.append(step)
    found = direct or mentioned
    return sorted(dict.fromkeys(found))


def build_flags(report: IntegrityReport | None, trajectory: Trajectory) -> list[FlagView]:
    if report is None:
        return []
    flags = []
    for i, v in enumerate(report.violations):
        via_file = False
        if v.step is not None:
            steps = [v.step] if v.step in trajectory.steps else []
        elif v.file:
            steps = [s for s in _touching(v.file, trajectory.tool_calls) if s in trajectory.steps][:8]
            via_file = bool(steps)
        else:
            steps = []
        flag = FlagView(i, v, steps, via_file, clip(v.evidence, 600, 8))
        flags.append(flag)
        for s in steps:
            trajectory.steps[s].flags.append(i)
    return flags


# -- the page --------------------------------------------------------------------------------------------------


def intervention_steps(
    interventions: list[Intervention], result: RunResult | None, trajectory: Trajectory
) -> list[tuple[str, float]]:
    """The step at which each intervention took effect, for the plot's x axis (steps): the step of its `intervention`
    event in the transcript, which the harness writes when it applies one (the robust source: no clock to map).
    One the transcript does not hold (applied while no harness ran: a cancel of a paused run) is placed by its
    charged time (`html_report.intervention_seconds`) on the score curve's gradings, step against charged seconds."""
    import numpy as np

    recorded = {i.id for i in interventions}
    # only the transcript lines of interventions the record holds: the transcript is the agent's to write in a pod
    logged = {
        str(e.record_id): float(e.step)
        for e in trajectory.events
        if e.type == "intervention" and e.step is not None and e.record_id in recorded
    }
    placed = list(logged.items())
    curve = result.score_curve if result is not None else []
    for intervention in interventions:
        if intervention.id in logged or result is None or not curve:
            continue
        seconds = intervention_seconds(result, intervention)
        if seconds is None:
            continue
        step = float(np.interp(seconds, [g.at_seconds for g in curve], [g.step for g in curve]))
        placed.append((intervention.id, step))
    return placed


def _score_plot(
    spec: RunSpec, result: RunResult | None, trajectory: Trajectory, interventions: list[Intervention]
) -> Markup | None:
    """Score over steps (points link to their step) and tokens over steps, with hand-offs, stops and interventions
    marked."""
    grades: list[tuple[int, float]] = []
    if result is not None and result.score_curve:
        grades = [(g.step, math.nan if g.score is None else g.score) for g in result.score_curve]
    else:
        for g in trajectory.grades:
            score = g.get("score")
            grades.append((int(g.get("step", 0) or 0), math.nan if score is None else float(score)))
    cumulative = [(s.step, s.cum_tokens) for s in trajectory.steps.values()]
    if not cumulative:
        return None  # no step was taken: nothing to draw
    ref = task_reference(spec)
    marks = [e for e in trajectory.events if e.type in ("handoff", "context_drop", "budget_stop", "resume")]
    from matplotlib.ticker import EngFormatter, MaxNLocator

    with plot_style():
        fig = new_figure(10.5, 2.6)
        ax_score, ax_tokens = fig.subplots(1, 2, sharex=True)
        if ref.scoring == "normalized":
            if ref.baseline is not None:
                ax_score.axhline(ref.baseline, color=BASELINE_COLOR, linestyle="--", linewidth=1, label="baseline")
            ax_score.axhline(1.0, color=SOTA_COLOR, linestyle=":", linewidth=1.1, label="SOTA")
        valid = [(s, y) for s, y in grades if not math.isnan(y)]
        if valid:
            xs, ys = zip(*valid, strict=True)
            claim = result is not None and result.curve_is_agent_claim
            label = "score (the agent pod's own gradings)" if claim else "score"
            ax_score.plot(xs, ys, drawstyle="steps-post", color="#1f77b4", linewidth=1.4, label=label)
            points = ax_score.scatter(xs, ys, s=14, color="#1f77b4", zorder=3)
            points.set_urls([f"#step-{s}" if s in trajectory.steps else None for s in xs])
            points.set_gid("grade-points")
        else:
            ax_score.text(0.5, 0.5, "no graded score", transform=ax_score.transAxes, ha="center", color=BASELINE_COLOR)
        scores = [y for _, y in valid]
        low = min([0.0, *scores, *([ref.baseline] if ref.baseline is not None else [])])
        high = max([1.0, *scores])
        ax_score.set_ylim(low - 0.06 * (high - low), high + 0.06 * (high - low))
        ax_score.set_title("score (fraction of SOTA) by step" if ref.scoring == "normalized" else "score by step")
        if cumulative:
            xs_t, ys_t = zip(*cumulative, strict=True)
            (line,) = ax_tokens.plot(xs_t, ys_t, color="#6d28d9", linewidth=1.4)
            line.set_gid("tokens-line")
        ax_tokens.set_title("tokens used (input + output), cumulative")
        ax_tokens.yaxis.set_major_formatter(EngFormatter(sep=""))
        colors = {"handoff": "#0891b2", "context_drop": "#ca8a04", "budget_stop": "#dc2626", "resume": "#65a30d"}
        acts = intervention_steps(interventions, result, trajectory)
        for ax in (ax_score, ax_tokens):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("step")
            for e in marks:
                if e.step is not None:
                    ax.axvline(e.step, color=colors[e.type], linewidth=0.9, alpha=0.8, label=e.type.replace("_", " "))
            for act_id, step in acts:
                line = ax.axvline(step, color=INTERVENTION_COLOR, linestyle="-.", linewidth=1.1, label="intervention")
                line.set_gid(f"intervention-{'score' if ax is ax_score else 'tokens'}-{act_id}")
        figure_legend(fig)
        return figure_svg(fig, "run", f"Score and tokens by step for {spec.run_id}")


def _log_tail(rd: RunDir) -> list[tuple[str, str]]:
    out = []
    for name in ("agent-error.txt", "agent.stderr", "agent.stdout"):
        path = rd.logs / name
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            out.append((name, ("[...]\n" if len(text) > LOG_TAIL_CHARS else "") + text[-LOG_TAIL_CHARS:]))
    return out


def render_run_html(run_dir: Path) -> str:
    """One run's trajectory viewer as one self-contained HTML page.

    Raises:
        StoreError: `run_dir` is not a run directory (no readable `run.json`).
    """
    rd = RunDir(run_dir)
    if not rd.run_json.exists():
        raise StoreError(f"{rd.root}: not a run directory (no run.json); pass a directory under <campaign>/runs/")
    spec = rd.spec()
    result = read_model(rd.result_json, RunResult)
    status = read_model(rd.status_json, RunStatus)
    integrity = read_model(rd.root / "integrity.json", IntegrityReport)
    records = read_transcript(rd.transcript)
    trajectory = build_trajectory(records)
    # a finished run's record is its result's; a running one's, the campaign's control file
    interventions = (
        result.interventions if result is not None else run_control(rd.root.parent.parent, spec.run_id).interventions
    )
    described = {i.id: i for i in interventions}
    for event in trajectory.events:
        if event.type == "intervention" and event.record_id in described:
            event.title = f"Intervention: {described[event.record_id].describe()}"
        elif event.type == "intervention":
            event.title = f"{event.title}: NOT in the run's record of interventions (the transcript's word only)"
    flags = build_flags(integrity, trajectory)
    has_steps = bool(trajectory.steps)
    spend = result.spend if result else (status.spend if status else None)
    return (
        template_env()
        .get_template("run.html.j2")
        .render(
            title=f"labkube run {spec.run_id}",
            spec=spec,
            result=result,
            status=status,
            spend=spend,
            integrity=integrity,
            flags=flags,
            trajectory=trajectory,
            marked=[e for e in trajectory.events if e.marked],
            has_steps=has_steps,
            transcript_exists=rd.transcript.exists(),
            plot=_score_plot(spec, result, trajectory, interventions),
            interventions=interventions,
            curve_claim=AGENT_POD_CURVE_LABEL if result is not None and result.curve_is_agent_claim else None,
            logs=_log_tail(rd) if not has_steps or (result and result.error) else [],
            root=str(rd.root),
            last_step=max(trajectory.steps, default=0),
        )
    )
