"""The campaign report as one self-contained HTML file: tables and plots, nothing fetched from the network.

    render_report_html(campaign_dir)  ->  str     (`labkube report DIR --format html --out FILE`)

Plots are matplotlib figures inlined as SVG, with their text kept as `<text>`: the page needs no script to show
them, prints and archives as it is, its numbers are searchable, and a plot weighs 20-60 kB. An inlined plotly.js
alone is about 4.6 MB per file (and again in every trajectory view), for hover tooltips that the tables beside
each plot already give.

Scores are in normalized units (the primary subtask's fraction of SOTA): the task card's baseline becomes its own
fraction of SOTA, and SOTA is 1.0. GAIA (v1) questions are pass/fail and are reported as pass rates per level.
Gaia2 results come later: `render_gaia2_section` takes per-capability numbers and is already wired into the page.
"""

from __future__ import annotations

import functools
import html
import io
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jinja2
from markupsafe import Markup
from pydantic import BaseModel, Field

from labkube.budgets import lower_bound, total_cost
from labkube.integrity_report import Verdict, verdict_basis
from labkube.interventions import Intervention, InterventionKind
from labkube.report import Aggregate, ReportRow, aggregate, report_rows, scaffold_rank
from labkube.result import AGENT_POD_CURVE_LABEL, GpuUse, RunResult
from labkube.results.gpu_report import gpu_text
from labkube.run_spec import RunSpec
from labkube.store import CampaignDir

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labkube.task_card import Subtask

__all__ = ["CapabilityScore", "render_gaia2_section", "render_report_html"]

TEMPLATES = Path(__file__).parent / "templates"
SEED_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
MODEL_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]
BASELINE_COLOR = "#6b7280"
SOTA_COLOR = "#111827"
INTERVENTION_COLOR = "#c026d3"


# -- shared with the trajectory view ----------------------------------------------------------------------------


@functools.cache
def template_env() -> jinja2.Environment:
    """Templates with autoescaping on: transcripts hold model output, which may contain any HTML."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["score"] = fmt_score
    # with `at_least`, "≥" before a known figure that is a lower bound (a model call's answer did not say its usage)
    env.filters["usd"] = lambda usd, at_least=False: lower_bound(fmt_usd(usd), at_least and usd is not None)
    env.filters["at_least"] = lower_bound
    env.filters["seconds"] = fmt_seconds
    env.filters["thousands"] = lambda n: f"{int(n):,}"
    env.filters["pct"] = lambda x: "—" if x is None else f"{x:.0%}"
    env.filters["known_pct"] = lambda x: "unknown" if x is None else f"{x:.0%}"
    env.filters["verdict_basis"] = verdict_basis
    return env


def fmt_score(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def fmt_usd(x: float | None) -> str:
    if x is None:
        return "unknown"  # a model with no price: never shown as $0
    return f"${x:,.2f}" if x >= 1 or x == 0 else f"${x:.4f}"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    h, rem = divmod(whole, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def html_id(text: str) -> str:
    """A safe fragment identifier (`#...`) for a run id or a task name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


@contextmanager
def plot_style() -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",  # text stays text: smaller files, searchable numbers
            "font.family": "sans-serif",
            "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial"],
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.color": "#e5e7eb",
            "grid.linewidth": 0.6,
            "legend.frameon": False,
            "legend.fontsize": 8,
        }
    ):
        yield


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot: no global state, no GUI backend, safe in threads."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_legend(fig: Figure, key: Callable[[str], Any] | None = None) -> None:
    """One legend for the whole figure, each label once (every subplot draws the same reference lines)."""
    handles: dict[str, Artist] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        labels = sorted(handles, key=key) if key else list(handles)
        fig.legend([handles[k] for k in labels], labels, loc="outside right upper")


def figure_svg(fig: Figure, salt: str, label: str) -> Markup:
    """`fig` as an inline `<svg>` element that scales to its container."""
    import matplotlib

    buf = io.StringIO()
    # A per-figure salt keeps the ids of clip paths and markers unique when several SVGs share one page.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(label)}" ', 1)
    return Markup(svg)


# -- task references (baseline, SOTA, GAIA level) ----------------------------------------------------------------


@dataclass
class TaskReference:
    """What a report needs from a task card; `error` says why the card could not be read."""

    scoring: Literal["normalized", "pass_fail"] = "normalized"
    baseline: float | None = None  # the primary subtask's baseline, as a fraction of SOTA
    primary: str | None = None
    subtasks: list[Subtask] = field(default_factory=list)
    level: int | None = None
    error: str | None = None


@functools.lru_cache(maxsize=4096)
def _reference(task: str, task_path: str, task_id: str | None, overlay_json: str = "null") -> TaskReference:
    from labkube.tasks import TaskError, card_for_run
    from labkube.tasks.scoring import fraction_of_sota

    scoring: Literal["normalized", "pass_fail"] = "pass_fail" if task_id is not None else "normalized"
    try:
        card = card_for_run(task, task_path, task_id, overlay=json.loads(overlay_json))
    except (TaskError, OSError, ValueError) as exc:
        return TaskReference(scoring=scoring, error=f"task card unavailable: {exc}")
    primary = card.primary
    baseline = None
    if primary is not None and primary.baseline is not None:
        baseline = fraction_of_sota(primary.baseline, primary)
    return TaskReference(
        scoring=card.scoring,
        baseline=baseline,
        primary=primary.id if primary else None,
        subtasks=list(card.subtasks),
        level=card.gaia.level if card.gaia else None,
    )


def task_reference(spec: RunSpec) -> TaskReference:
    """The baseline and SOTA (normalized) of a run's task, or its GAIA level."""
    if spec.family.value == "gaia2":
        return TaskReference(scoring="pass_fail")
    if spec.task_id is not None:
        # A GAIA question: the level is in the group name (`gaia/demo L2`); reading the card is the fallback.
        match = re.search(r"\bL([1-3])$", spec.group)
        if match:
            return TaskReference(scoring="pass_fail", level=int(match.group(1)))
    overlay = json.dumps(spec.task_overlay, sort_keys=True)  # hashable, for the cache
    return _reference(spec.task, spec.task_path, spec.task_id, overlay)


# -- Gaia2: the hook ---------------------------------------------------------------------------------------------


class CapabilityScore(BaseModel):
    """One model's Gaia2 numbers for one capability (execution, search, adaptability, time, ambiguity, ...)."""

    capability: str
    model: str
    pass_at_1: float | None = Field(ge=0, le=1, description="None when every attempt ended in an error outcome.")
    pass_at_k: float | None = Field(ge=0, le=1)
    pass_hat_k: float | None = Field(ge=0, le=1, description="pass^k: every one of k tries passed.")
    k: int = Field(ge=0)
    scenarios: int = Field(default=0, ge=0)
    excluded: int = Field(default=0, ge=0, description="Attempts left out: error outcomes (judge, world, ...).")


def render_gaia2_section(scores: Sequence[CapabilityScore]) -> Markup:
    """The Gaia2 section: a table and bar charts of pass@1, pass@k and pass^k per capability; empty without data."""
    if not scores:
        return Markup("")
    capabilities = list(dict.fromkeys(s.capability for s in scores))
    models = list(dict.fromkeys(s.model for s in scores))
    by_key = {(s.capability, s.model): s for s in scores}
    ks = sorted({s.k for s in scores if s.k})
    k_label = str(ks[0]) if len(ks) == 1 else "k"
    metrics = [("pass_at_1", "pass@1"), ("pass_at_k", f"pass@{k_label}"), ("pass_hat_k", f"pass^{k_label}")]
    with plot_style():
        fig = new_figure(10.5, 3.0)
        axes = fig.subplots(1, 3, sharey=True)
        width = 0.8 / len(models)
        for ax, (attr, title) in zip(axes, metrics, strict=True):
            for m, model in enumerate(models):
                xs, ys = [], []
                for c, cap in enumerate(capabilities):
                    score = by_key.get((cap, model))
                    if score is not None and getattr(score, attr) is not None:
                        xs.append(c + (m - (len(models) - 1) / 2) * width)
                        ys.append(getattr(score, attr))
                bars = ax.bar(xs, ys, width * 0.92, color=MODEL_COLORS[m % len(MODEL_COLORS)], label=model)
                for i, bar in enumerate(bars):
                    bar.set_gid(f"gaia2-{attr}-{html_id(model)}-{i}")
            ax.set_title(title)
            ax.set_xticks(range(len(capabilities)), capabilities, rotation=30, ha="right")
            ax.set_ylim(0, 1.05)
            ax.grid(axis="x", visible=False)
        axes[0].set_ylabel("fraction of scenarios")
        figure_legend(fig)
        svg = figure_svg(fig, "gaia2", "Gaia2 pass@1, pass@k and pass^k per capability")
    return Markup(
        template_env()
        .get_template("_gaia2.html.j2")
        .render(svg=svg, scores=scores, capabilities=capabilities, models=models, by_key=by_key, k_label=k_label)
    )


# -- the campaign report -----------------------------------------------------------------------------------------


@dataclass
class RunEntry:
    row: ReportRow
    spec: RunSpec
    result: RunResult | None
    ref: TaskReference

    @property
    def anchor(self) -> str:
        return "run-" + html_id(self.row.run_id)

    @property
    def is_gaia(self) -> bool:
        return self.ref.scoring == "pass_fail"

    @property
    def gpu_note(self) -> str:
        return gpu_text(self.row.gpu_utilization, self.row.gpu_memory_peak_bytes)

    @property
    def subtask_note(self) -> str:
        if self.result is None:
            return ""
        parts = []
        for s in self.result.subtasks:
            raw = "—" if s.raw is None else f"{s.raw:g}"
            frac = "" if s.fraction_of_sota is None else f" ({s.fraction_of_sota:.2f} of SOTA)"
            parts.append(f"{s.id} = {raw}{frac}")
        return "; ".join(parts)


@dataclass
class TaskSection:
    task: str
    anchor: str
    ref: TaskReference
    aggregates: list[Aggregate]  # one per model and scaffold, the scaffolds of a model adjacent
    runs: list[RunEntry]
    svg: Markup | None = None
    note: str = ""
    gpu_svg: Markup | None = None  # the runs' GPU utilisation and memory; None when no run had a GPU


@dataclass
class GaiaCell:
    """One model on one GAIA level. Pass rates count measured runs; a run that ended in an error outcome (or failed)
    and a cancelled run are listed apart."""

    passed: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    cost_usd: float | None = 0.0
    tokens: int = 0

    @property
    def rate(self) -> float | None:
        return self.passed / self.finished if self.finished else None


@dataclass
class GaiaSection:
    dataset: str
    anchor: str
    levels: list[int]
    models: list[str]
    cells: dict[tuple[int, str], GaiaCell]
    svg: Markup | None = None

    def total(self, model: str) -> GaiaCell:
        out = GaiaCell()
        for (_, m), c in self.cells.items():
            if m == model:
                out.passed += c.passed
                out.finished += c.finished
                out.failed += c.failed
                out.cancelled += c.cancelled
                out.cost_usd = total_cost([out.cost_usd, c.cost_usd])
                out.tokens += c.tokens
        return out


def render_report_html(
    campaign_dir: Path,
    *,
    exclude_suspicious: bool = False,
    exclude_intervened: bool = False,
    gaia2: Sequence[CapabilityScore] = (),
) -> str:
    """The campaign report as one self-contained HTML page.

    Raises:
        StoreError: `campaign_dir` is not a campaign directory (no readable `campaign.json`).
    """
    cdir = CampaignDir(campaign_dir)
    spec = cdir.load_spec()
    rows = report_rows(cdir)
    excluded = [r for r in rows if exclude_suspicious and r.integrity_verdict == Verdict.SUSPICIOUS.value]
    excluded_intervened = [r for r in rows if exclude_intervened and r.intervened and r not in excluded]
    left_out = {r.run_id for r in [*excluded, *excluded_intervened]}
    rows = [r for r in rows if r.run_id not in left_out]
    entries = []
    for row in rows:
        run_spec = cdir.run_spec(row.run_id)
        if run_spec is None:
            continue
        entries.append(RunEntry(row, run_spec, cdir.result(row.run_id), task_reference(run_spec)))
    entries.sort(key=lambda e: (e.row.task, e.row.model, scaffold_rank(e.row.agent), e.row.seed))
    # Gaia2 runs are summarised per capability (the `gaia2` section) and listed with every run below.
    sections = [e for e in entries if e.spec.family.value != "gaia2"]
    paper = _task_sections([e for e in sections if not e.is_gaia])
    gaia = _gaia_sections([e for e in sections if e.is_gaia])
    verdicts = {v.value: sum(r.integrity_verdict == v.value for r in rows) for v in Verdict}
    totals = {
        "runs": len(rows),
        "finished": sum(r.status == "Finished" for r in rows),
        "failed": sum(r.status == "Failed" for r in rows),
        "cancelled": sum(r.cancelled for r in rows),
        "intervened": sum(r.intervened for r in rows),
        "unfinished": sum(r.status not in ("Finished", "Failed") for r in rows),
        "cost_usd": total_cost(r.cost_usd for r in rows),
        "tokens": sum(r.tokens_total for r in rows),
        "at_least": any(r.spend_at_least for r in rows),
        "wall_seconds": sum(r.wall_seconds for r in rows),
    }
    return (
        template_env()
        .get_template("report.html.j2")
        .render(
            title=f"labkube report: {spec.name}",
            spec=spec,
            root=str(cdir.root),
            entries=entries,
            paper=paper,
            gaia=gaia,
            gaia2=render_gaia2_section(gaia2),
            verdicts=verdicts,
            totals=totals,
            excluded=excluded,
            exclude_suspicious=exclude_suspicious,
            excluded_intervened=excluded_intervened,
            unsandboxed=sum(r.unsandboxed for r in rows),
            agent_pod_curves=sum(e.result is not None and e.result.curve_is_agent_claim for e in entries),
            agent_pod_curve_label=AGENT_POD_CURVE_LABEL,
        )
    )


def _task_sections(entries: list[RunEntry]) -> list[TaskSection]:
    by_task: dict[str, list[RunEntry]] = {}
    for e in entries:
        by_task.setdefault(e.row.task, []).append(e)
    sections = []
    for task, runs in by_task.items():
        ref = next((e.ref for e in runs if e.ref.error is None), runs[0].ref)
        section = TaskSection(task, "task-" + html_id(task), ref, aggregate([e.row for e in runs]), runs)
        section.svg, section.note = _task_plot(section)
        gpu_runs = [(f"{e.row.label} seed {e.row.seed}", e.result.gpu if e.result else None) for e in runs]
        section.gpu_svg = gpu_plot(gpu_runs, "gpu-" + section.anchor, f"GPU use of {task}")
        sections.append(section)
    return sections


def _claimed(entry: RunEntry) -> bool:
    """The run's score curve is the agent pod's own claim (`RunResult.score_curve_source`)."""
    return entry.result is not None and entry.result.curve_is_agent_claim


def _curve(entry: RunEntry) -> list[tuple[float, float, float, float]]:
    """(seconds, tokens, dollars, score) at every grading; score NaN where the grader gave no number."""
    result = entry.result
    if result is None:
        return []
    priced = not result.spend.unpriced  # a run's dollars are unknown when a model it called has no price
    points = [
        (g.at_seconds, float(g.tokens), g.usd if priced else math.nan, math.nan if g.score is None else g.score)
        for g in result.score_curve
    ]
    if not points and result.score is not None:
        spend = result.spend
        usd = spend.cost_usd if spend.cost_usd is not None else math.nan
        points.append((spend.wall_seconds, float(spend.usage.total), usd, result.score))
    return points


def intervention_seconds(result: RunResult, intervention: Intervention) -> float | None:
    """Where `intervention` falls on the score curve's time axis, which is charged wall seconds
    (`Grade.at_seconds`): its clock time since the run started (`started_at`, the first start), less the time the
    run spent paused before it (from each pause or usage checkpoint to the resume or extend that released it, time
    nobody charged the run), clamped to the run's charged wall time. A gap nothing in the record explains (a host
    that died and a resume from the checkpoint) would still be counted; the transcript's `intervention` events, with
    their step, are what the trajectory viewer places its markers by. None when the result has no start time."""
    if result.started_at is None:
        return None
    at = _utc(intervention.at)
    paused = 0.0
    held_since = None
    for earlier in result.interventions:
        if _utc(earlier.at) >= at:
            break
        if earlier.kind in (InterventionKind.pause, InterventionKind.usage_checkpoint):
            held_since = held_since or _utc(earlier.at)
        elif held_since is not None and earlier.kind in (InterventionKind.resume, InterventionKind.extend):
            paused += (_utc(earlier.at) - held_since).total_seconds()
            held_since = None
    if held_since is not None:  # acted on while paused: the run's charged clock stopped at the pause
        paused += (at - held_since).total_seconds()
    seconds = (at - _utc(result.started_at)).total_seconds() - paused
    return min(max(seconds, 0.0), result.spend.wall_seconds)


def _utc(moment: datetime) -> datetime:
    """A time without a zone (a hand-written record) read as UTC, as labkube writes every time."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _intervention_points(entry: RunEntry) -> list[tuple[Intervention, tuple[float, float, float, float]]]:
    """Each intervention of the run as a point of its curve: (seconds, tokens, dollars, score), the tokens,
    dollars and score those of the curve where the run was then (interpolated between its gradings; the score is
    the step curve's, the last grading's before it)."""
    result = entry.result
    points = _curve(entry)
    if result is None or not result.interventions or not points:
        return []
    import numpy as np

    seconds = [p[0] for p in points]
    out = []
    for intervention in result.interventions:
        at = intervention_seconds(result, intervention)
        if at is None:
            continue
        before = [p[3] for p in points if p[0] <= at and not math.isnan(p[3])]
        score = before[-1] if before else next((p[3] for p in points if not math.isnan(p[3])), math.nan)
        tokens = float(np.interp(at, seconds, [p[1] for p in points]))
        usd = float(np.interp(at, seconds, [p[2] for p in points]))
        out.append((intervention, (at, tokens, usd, score)))
    return out


def gpu_plot(runs: Sequence[tuple[str, GpuUse | None]], salt: str, title: str) -> Markup | None:
    """Utilisation and memory over time, one line per run; None when no run had a GPU."""
    curves = [(label, use) for label, use in runs if use is not None and use.curve]
    if not curves:
        return None
    scale, unit = _time_unit(max(p.at_seconds for _l, use in curves for p in use.curve))
    with plot_style():
        fig = new_figure(10.5, 2.4)
        util_ax, mem_ax = fig.subplots(1, 2, sharex=True)
        for i, (label, use) in enumerate(curves):
            xs = [p.at_seconds / scale for p in use.curve]
            color = SEED_COLORS[i % len(SEED_COLORS)]
            util_ax.plot(xs, [100 * p.utilization for p in use.curve], color=color, linewidth=1.2, label=label)
            mem_ax.plot(xs, [p.memory_used_bytes / 2**30 for p in use.curve], color=color, linewidth=1.2, label=label)
        util_ax.set_ylim(0, 100)
        util_ax.set_title(f"GPU utilisation (%) over wall time ({unit})")
        mem_ax.set_ylim(bottom=0)
        mem_ax.set_title(f"GPU memory used (GiB) over wall time ({unit})")
        figure_legend(fig)
        return figure_svg(fig, salt, title)


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds >= 2 * 3600:
        return 3600.0, "hours"
    if max_seconds >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _task_plot(section: TaskSection) -> tuple[Markup | None, str]:
    curves = {e.row.run_id: _curve(e) for e in section.runs}
    if not any(curves.values()):
        return None, "No gradings yet: no run of this task has a score curve."
    from matplotlib.ticker import EngFormatter, FuncFormatter

    models = list(dict.fromkeys(e.row.label for e in section.runs))
    any_usd = any(p[2] > 0 for pts in curves.values() for p in pts)
    columns = ["time", "tokens"] + (["usd"] if any_usd else [])
    max_seconds = max((p[0] for pts in curves.values() for p in pts), default=0.0)
    scale, unit = _time_unit(max_seconds)
    titles = {"time": f"over wall time ({unit})", "tokens": "over tokens (input + output)", "usd": "over dollars"}
    scores = [p[3] for pts in curves.values() for p in pts if not math.isnan(p[3])]
    refs = [v for v in (section.ref.baseline, 1.0) if v is not None]
    low = min([0.0, *scores, *refs])
    high = max([1.0, *scores, *refs])
    pad = 0.06 * (high - low or 1.0)
    with plot_style():
        fig = new_figure(10.5, 0.6 + 2.1 * len(models))
        grid = fig.subplots(len(models), len(columns), squeeze=False, sharey=True, sharex="col")
        for r, model in enumerate(models):
            for c, col in enumerate(columns):
                ax: Axes = grid[r][c]
                plotted = 0
                for e in (e for e in section.runs if e.row.label == model):
                    pts = curves[e.row.run_id]
                    if not any(not math.isnan(p[3]) for p in pts):
                        continue
                    plotted += 1
                    xs = [p[0] / scale if col == "time" else p[1] if col == "tokens" else p[2] for p in pts]
                    (line,) = ax.plot(
                        xs,
                        [p[3] for p in pts],
                        drawstyle="steps-post",
                        marker="o",
                        markersize=3,
                        linewidth=1.4,
                        color=SEED_COLORS[e.row.seed % len(SEED_COLORS)],
                        label=f"seed {e.row.seed}" + (" (agent pod's claim)" if _claimed(e) else ""),
                    )
                    line.set_gid(f"curve-{col}-{html_id(e.row.run_id)}")
                    for intervention, at in _intervention_points(e):
                        x = at[0] / scale if col == "time" else at[1] if col == "tokens" else at[2]
                        if math.isnan(x) or math.isnan(at[3]):
                            continue
                        mark = ax.scatter(
                            [x], [at[3]], marker="v", s=46, color=INTERVENTION_COLOR, zorder=4, label="intervention"
                        )
                        mark.set_gid(f"intervention-{col}-{html_id(e.row.run_id)}-{intervention.id}")
                if section.ref.baseline is not None:
                    ax.axhline(
                        section.ref.baseline, color=BASELINE_COLOR, linestyle="--", linewidth=1, label="baseline"
                    )
                ax.axhline(1.0, color=SOTA_COLOR, linestyle=":", linewidth=1.1, label="SOTA")
                ax.set_ylim(low - pad, high + pad)
                if not plotted:
                    ax.text(0.5, 0.5, "no graded score", transform=ax.transAxes, ha="center", color=BASELINE_COLOR)
                if col == "tokens":
                    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
                elif col == "usd":
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"${v:g}"))
                if r == 0:
                    ax.set_title(titles[col])
                if c == 0:
                    ax.set_ylabel(f"{model}\nfraction of SOTA", fontsize=8.5)
        for ax in fig.axes:
            ax.set_xlim(left=0)  # after every row is drawn: the columns share their x axis
        figure_legend(fig, key=lambda label: (not label.startswith("seed"), label))
        svg = figure_svg(fig, section.anchor, f"Score curves of {section.task}")
    unpriced = sorted({m for e in section.runs if e.result for m in e.result.spend.unpriced})
    note = "" if any_usd else "No dollar spend recorded for this task (scripted models cost nothing): no dollar axis."
    if unpriced:
        note = (
            f"The dollars of {', '.join(unpriced)} are unknown (no price in labkube's table; give one in the "
            "campaign's prices): their runs have no dollar axis."
        )
    touched = [e for e in section.runs if e.result is not None and e.result.interventions]
    if touched:
        acts = "; ".join(
            f"{e.row.label} seed {e.row.seed}: " + ", ".join(i.kind.value for i in e.result.interventions)
            for e in touched
            if e.result is not None
        )
        note = (
            f"Triangles mark where a person (or a usage checkpoint) intervened in a run ({acts}), placed by the "
            "charged time of the act. " + note
        ).strip()
    claimed = [e for e in section.runs if _claimed(e)]
    if claimed:
        seeds = ", ".join(f"{e.row.label} seed {e.row.seed}" for e in claimed)
        note = (
            f'The curves of {seeds} (marked "agent pod\'s claim") are {AGENT_POD_CURVE_LABEL}: their periodic '
            "gradings ran inside the agent's pod on a cluster; only the final score is the grading pod's. " + note
        ).strip()
    return svg, note


def _gaia_sections(entries: list[RunEntry]) -> list[GaiaSection]:
    by_dataset: dict[str, list[RunEntry]] = {}
    for e in entries:
        dataset = e.spec.task.rsplit("/", 1)[0] if e.spec.task_id else e.spec.task
        by_dataset.setdefault(dataset, []).append(e)
    sections = []
    for dataset, runs in by_dataset.items():
        levels = sorted({e.ref.level or 0 for e in runs})
        models = list(dict.fromkeys(e.row.label for e in runs))
        cells: dict[tuple[int, str], GaiaCell] = {}
        for e in runs:
            cell = cells.setdefault((e.ref.level or 0, e.row.label), GaiaCell())
            cell.finished += e.row.counted
            cell.passed += e.row.counted and (e.row.score or 0.0) >= 1.0
            cell.failed += e.row.status == "Failed" or e.row.is_error
            cell.cancelled += e.row.cancelled
            cell.cost_usd = total_cost([cell.cost_usd, e.row.cost_usd])
            cell.tokens += e.row.tokens_total
        section = GaiaSection(dataset, "gaia-" + html_id(dataset), levels, models, cells)
        section.svg = _gaia_plot(section)
        sections.append(section)
    return sections


def _gaia_plot(section: GaiaSection) -> Markup:
    with plot_style():
        fig = new_figure(6.5, 2.8)
        ax = fig.subplots()
        width = 0.8 / len(section.models)
        for m, model in enumerate(section.models):
            xs, ys, labels = [], [], []
            for i, level in enumerate(section.levels):
                cell = section.cells.get((level, model))
                if cell is not None and cell.rate is not None:
                    xs.append(i + (m - (len(section.models) - 1) / 2) * width)
                    ys.append(cell.rate)
                    labels.append(f"{cell.passed}/{cell.finished}")
            bars = ax.bar(xs, ys, width * 0.92, color=MODEL_COLORS[m % len(MODEL_COLORS)], label=model)
            ax.bar_label(bars, labels, fontsize=7, padding=2)
            for i, bar in enumerate(bars):
                bar.set_gid(f"gaia-bar-{html_id(model)}-{i}")
        ax.set_xticks(range(len(section.levels)), [f"level {lv}" if lv else "level ?" for lv in section.levels])
        ax.set_ylim(0, 1.15)
        ax.set_ylabel("pass rate")
        ax.grid(axis="x", visible=False)
        fig.legend(loc="outside right upper")
        return figure_svg(fig, section.anchor, f"GAIA pass rate per level for {section.dataset}")
