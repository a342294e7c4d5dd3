"""Rich tables for the terminal: live run status and the campaign report."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from labkube.budgets import format_tokens, format_usd
from labkube.report import Aggregate, ReportRow
from labkube.results.gpu_report import gpu_text

PHASE_STYLE = {
    "Pending": "dim",
    "Starting": "cyan",
    "Running": "blue",
    "Grading": "magenta",
    "Paused": "yellow",
    "Finished": "green",
    "Failed": "bold red",
}


def fmt_score(score: float | None) -> str:
    return "—" if score is None else f"{score:.3f}"


UNKNOWN = Text("unknown", style="dim italic")


def fmt_beat(beat: bool | None) -> Text:
    if beat is None:
        return UNKNOWN
    return Text("yes", style="green") if beat else Text("no", style="dim")


def fmt_fraction(value: float | None) -> Text | str:
    return UNKNOWN if value is None else f"{value:.0%}"


CANCELLED = Text("cancelled", style="magenta")


def run_score_cell(r: ReportRow) -> Text | str:
    """A final run's score, or what stands in its place: the error outcome, "cancelled" or "no value"; never a
    number the run does not have."""
    if r.is_error:
        return Text(r.outcome or "error", style="bold red")
    if r.cancelled:
        return CANCELLED
    if r.outcome == "no_value" and r.flagged_score is not None:
        return Text(f"{r.flagged_score:.3f} implausible", style="yellow")
    if r.outcome == "no_value":
        return Text("no value", style="yellow")
    return fmt_score(r.score)


def run_phase(r: ReportRow) -> Text:
    why = r.outcome if r.is_error or r.cancelled else r.stop_reason
    return Text(r.status + (f" ({why})" if why else ""), style=PHASE_STYLE.get(r.status, ""))


def fmt_seconds(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def interventions_cell(r: ReportRow) -> Text | str:
    """How many times people touched the run (0: never), the last act named: `2 (pause by alice@host)`."""
    if not r.interventions:
        return "0"
    last = r.interventions[-1]
    return Text(f"{len(r.interventions)} ({last.kind.value} by {last.by})", style="magenta")


def keep_whole(table: Table, header: str) -> None:
    """A short cell that reads wrong when wrapped (`25% · 7.0 GiB`): other columns fold first."""
    for column in table.columns:
        if column.header == header:
            column.no_wrap = True


def whole_run_ids(table: Table, rows: list[ReportRow]) -> None:
    """The run column as wide as its longest id: the id is what a reader copies into `labkube runs`, `view` and
    `audit`, so the other columns fold first."""
    for column in table.columns:
        if column.header == "run":
            column.no_wrap = True
            column.min_width = max((len(r.run_id) for r in rows), default=3)


def status_table(rows: list[ReportRow], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for col, justify in [
        ("run", "left"),
        ("phase", "left"),
        ("step", "right"),
        ("score", "right"),
        ("tokens", "right"),
        ("$", "right"),
        ("elapsed", "right"),
        ("GPU", "left"),
        ("integrity", "left"),
        ("interventions", "left"),
        ("message", "left"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for short in ("GPU", "$", "tokens", "score", "elapsed"):
        keep_whole(table, short)
    whole_run_ids(table, rows)
    for r in rows:
        table.add_row(
            r.run_id,
            run_phase(r),
            str(r.steps),
            run_score_cell(r) if r.outcome else fmt_score(r.score),
            format_tokens(r.tokens_total, r.spend_at_least),
            format_usd(r.cost_usd, at_least=r.spend_at_least),
            fmt_seconds(r.wall_seconds),
            gpu_text(r.gpu_utilization, r.gpu_memory_peak_bytes),
            r.integrity_label,
            interventions_cell(r),
            Text(message_cell(r.message), style="yellow" if r.status not in ("Finished", "Failed") else "red"),
        )
    return table


def message_cell(message: str, limit: int = 240) -> str:
    """An error's end is where its cause is: a long message keeps its start and its last lines."""
    message = message.strip()
    return message if len(message) <= limit else f"{message[: limit // 3]} … {message[-(2 * limit) // 3 :]}"


def primary_scores_cell(r: ReportRow) -> str:
    """Each primary group's score, one a line (`Flickr 0.512`, `person Re-ID —`); empty for a task that tags one
    group or none."""
    if len(r.primary_scores) < 2:
        return ""
    return "\n".join(f"{name} {fmt_score(None if r.is_error else v)}" for name, v in r.primary_scores.items())


def report_table(rows: list[ReportRow], title: str) -> Group:
    """One row per run, then what went wrong or has no value, one run a line (an error's last lines kept whole
    rather than folded into a narrow column)."""
    table = Table(title=title, title_justify="left")
    by_group = any(len(r.primary_scores) > 1 for r in rows)  # a task that tags several primary groups
    for col, justify in [
        ("task", "left"),
        ("model", "left"),
        ("scaffold", "left"),
        ("seed", "right"),
        ("status", "left"),
        ("score", "right"),
        *([("primary groups", "left")] if by_group else []),
        ("beat baseline", "center"),
        ("completion", "right"),
        ("tokens", "right"),
        ("$", "right"),
        ("wall", "right"),
        ("GPU", "left"),
        ("integrity", "left"),
        ("interventions", "right"),
    ]:
        folds = col in ("task", "model", "scaffold")  # long names fold; figures and outcomes stay whole
        table.add_column(col, justify=justify, overflow="fold", no_wrap=not folds)  # type: ignore[arg-type]
    keep_whole(table, "GPU")
    for r in rows:
        table.add_row(
            r.task,
            r.model,
            r.agent,
            str(r.seed),
            run_phase(r),
            Text("error", style="bold red") if r.is_error else run_score_cell(r),
            *([primary_scores_cell(r)] if by_group else []),
            fmt_beat(r.beat_baseline),
            fmt_fraction(r.completion),
            format_tokens(r.tokens_total, r.spend_at_least),
            format_usd(r.cost_usd, at_least=r.spend_at_least),
            fmt_seconds(r.wall_seconds),
            gpu_text(r.gpu_utilization, r.gpu_memory_peak_bytes),
            r.integrity_label,
            Text(str(len(r.interventions)), style="magenta") if r.interventions else "0",
        )
    notes = [
        Text.assemble(
            (f"{r.run_id} {r.outcome or r.status}: ", "bold red" if r.is_error else "yellow"),
            message_cell(" | ".join(line.strip() for line in r.message.splitlines() if line.strip()), 400),
        )
        for r in rows
        if r.message and r.status in ("Finished", "Failed")
    ]
    touched = [
        Text.assemble((f"{r.run_id} intervention: ", "magenta"), i.describe()) for r in rows for i in r.interventions
    ]
    return Group(table, *notes, *touched)


AGGREGATE_COLUMNS = [
    "task",
    "model",
    "scaffold",
    "runs",
    "errors",
    "cancelled",
    "mean",
    "best",
    "std",
    "beat baseline",
    "completion",
    "tokens",
    "$",
    "GPU-h",
    "suspicious/audited",
    "intervened",
]


def aggregate_table(aggs: list[Aggregate]) -> Table:
    """Per task, one row per model and scaffold, the scaffolds of one model adjacent (as `aggregate` orders them)."""
    table = Table(title="Per task, model and scaffold (over seeds)", title_justify="left")
    for col in AGGREGATE_COLUMNS:
        if col in ("task", "model", "scaffold"):
            table.add_column(col, overflow="fold")  # the whole name, over two lines if need be: never "openai:gp…"
        else:
            table.add_column(col, justify="right")
    for i, a in enumerate(aggs):
        first = i == 0 or aggs[i - 1].task != a.task
        if first and i:
            table.add_section()
        table.add_row(
            a.task if first else "",  # once per task: its systems follow, a rule between tasks
            a.model,
            a.agent,
            f"{a.finished}/{a.runs}" + (f" ({a.flagged} implausible)" if a.flagged else ""),
            Text(str(a.errors), style="bold red") if a.errors else "0",
            Text(str(a.cancelled), style="magenta") if a.cancelled else "0",
            fmt_score(a.mean_score),
            fmt_score(a.best_score),
            fmt_score(a.std_score),
            f"{a.beat_baseline}/{a.finished}",
            fmt_fraction(a.mean_completion),
            format_tokens(a.tokens_total, a.spend_at_least),
            format_usd(a.cost_usd, at_least=a.spend_at_least),
            f"{a.gpu_hours:.2f}",
            Text(f"{a.suspicious}/{a.audited}", style="bold red" if a.suspicious else ""),
            Text(str(a.intervened), style="magenta") if a.intervened else "0",
        )
    return table
