"""The numbers behind every figure of `labkube analyze`, as `FigureData` (they go into the JSON as they are; the
HTML page draws exactly these series)."""

from __future__ import annotations

from labkube.result import AGENT_POD_CURVE_LABEL, RunResult
from labkube.results.analysis_schema import (
    DENSITY_RULE,
    PHASE_RULE,
    Analysis,
    FigureData,
    Panel,
    Series,
    curve_points,
)
from labkube.results.analysis_transcript import PHASES


def build_figures(a: Analysis, paper_results: dict[str, RunResult]) -> list[FigureData]:
    """Every figure of the analysis; `paper_results` (paper-task runs' results by run id) give the score curves."""
    figures: list[FigureData] = []
    for g_task in dict.fromkeys(g.task for g in a.groups):
        figures.append(_task_points(a, g_task))
        figures.append(_task_curves(a, g_task, paper_results))
    if a.behaviour:
        figures += _behaviour(a)
    if a.gaia2:
        figures += _gaia2(a)
    return figures


def _refs(a: Analysis, task: str) -> dict[str, float]:
    baseline = next((g.baseline for g in a.groups if g.task == task and g.baseline is not None), None)
    return {"SOTA": 1.0} | ({"baseline": baseline} if baseline is not None else {})


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _task_points(a: Analysis, task: str) -> FigureData:
    series = []
    groups = [g for g in a.groups if g.task == task]
    for g in groups:
        rows = [e for e in a.efficiency if e.task == task and e.model == g.model]
        series.append(Series(label=g.model, x=[g.model] * len(rows), y=[e.final_score for e in rows]))
    no_value, errors = sum(g.no_value for g in groups), sum(g.errors for g in groups)
    return FigureData(
        id=f"capability-{_slug(task)}",
        kind="points",
        title=f"Final scores: {task}",
        caption=f"{task}: each point is one run's final score (fraction of SOTA), per model; "
        "dashed line the baseline, dotted line SOTA. Not drawn: "
        f"{no_value} run(s) whose grading gave no value, {errors} run(s) that ended in an error outcome.",
        panels=[Panel(title=task, x_label="model", y_label="fraction of SOTA", series=series, hlines=_refs(a, task))],
    )


def _task_curves(a: Analysis, task: str, results: dict[str, RunResult]) -> FigureData:
    rows = [e for e in a.efficiency if e.task == task]
    axes = [("hours", 0, 1 / 3600), ("dollars", 2, 1.0), ("tokens", 1, 1.0), ("steps", 3, 1.0)]
    panels = []
    for name, axis, scale in axes:
        series = []
        for e in rows:
            pts = curve_points(results[e.run_id])
            label = f"{e.run_id} (agent pod's claim)" if e.curve_source == "agent_pod" else e.run_id
            series.append(Series(label=label, x=[p[axis] * scale for p in pts], y=[p[4] for p in pts]))
        panels.append(
            Panel(
                title=f"against {name}", x_label=name, y_label="fraction of SOTA", series=series, hlines=_refs(a, task)
            )
        )
    claims = [e.run_id for e in rows if e.curve_source == "agent_pod"]
    claimed = (
        f' The curves of {len(claims)} run(s) marked "agent pod\'s claim" are {AGENT_POD_CURVE_LABEL}: their '
        "periodic gradings ran inside the agent's pod on a cluster; only their final scores are the grading pod's."
        if claims
        else ""
    )
    return FigureData(
        id=f"curves-{_slug(task)}",
        kind="lines",
        title=f"Score curves: {task}",
        caption=f"{task}: normalised score at every grading against wall hours, dollars, tokens and steps; "
        "one line per run." + claimed,
        panels=panels,
    )


def _behaviour(a: Analysis) -> list[FigureData]:
    tools = sorted({t for mix in a.tool_mix.values() for t in mix})
    mix = Panel(
        title="tool calls per phase",
        x_label="phase",
        y_label="share of the phase's tool calls",
        series=[
            Series(
                label=t,
                x=list(PHASES),
                y=[a.tool_mix[p].get(t, 0) / (sum(a.tool_mix[p].values()) or 1) for p in PHASES],
            )
            for t in tools
        ],
    )
    models = list(dict.fromkeys(b.model for b in a.behaviour))
    density = Panel(
        title="action density against score",
        x_label="tool calls per hour",
        y_label="final score (fraction of SOTA)",
        series=[
            Series(
                label=m,
                x=[b.actions_per_hour for b in a.behaviour if b.model == m and b.actions_per_hour is not None],
                y=[b.score for b in a.behaviour if b.model == m and b.actions_per_hour is not None],
            )
            for m in models
        ],
    )
    reasoning = Panel(
        title="reasoning tokens against tool calls",
        x_label="tool calls",
        y_label="reasoning tokens",
        series=[
            Series(
                label=m,
                x=[float(b.tool_calls) for b in a.behaviour if b.model == m],
                y=[float(b.reasoning_tokens) for b in a.behaviour if b.model == m],
            )
            for m in models
        ],
    )
    d = a.density_vs_score
    r = "—" if d.pearson is None else f"{d.pearson:.2f}"
    return [
        FigureData(
            id="tool-mix",
            kind="stacked",
            title="Tool mix per phase",
            caption=f"Share of tool calls per tool in each phase, all runs pooled. {PHASE_RULE}",
            panels=[mix],
        ),
        FigureData(
            id="density-vs-score",
            kind="scatter",
            title="Action density against score",
            caption=f"One point per run. {DENSITY_RULE} Pearson r = {r} (n = {d.n}).",
            panels=[density],
        ),
        FigureData(
            id="reasoning-vs-tools",
            kind="scatter",
            title="Reasoning tokens against tool calls",
            caption="One point per run: reasoning tokens the model reported against the run's tool calls.",
            panels=[reasoning],
        ),
    ]


def _gaia2(a: Analysis) -> list[FigureData]:
    caps = list(dict.fromkeys(c.capability for c in a.gaia2_capabilities))
    models = list(dict.fromkeys(r.model for r in a.gaia2))
    by = {(c.capability, c.model): c.pass_at_1 for c in a.gaia2_capabilities}
    bars = Panel(
        title="pass@1 per capability",
        x_label="capability",
        y_label="pass@1",
        series=[Series(label=m, x=list(caps), y=[by.get((c, m)) for c in caps]) for m in models],
    )
    judged = [r for r in a.gaia2 if r.passed is not None]

    def scatter(title: str, x_label: str, attr: str) -> Panel:
        series = []
        for m in models:
            rs = [r for r in judged if r.model == m and getattr(r, attr) is not None]
            series.append(Series(label=m, x=[float(getattr(r, attr)) for r in rs], y=[float(r.passed) for r in rs]))
        return Panel(title=title, x_label=x_label, y_label="success (1 = passed)", series=series)

    return [
        FigureData(
            id="gaia2-capabilities",
            kind="bars",
            title="Gaia2 pass@1 per capability",
            caption="Gaia2: pass@1 per capability, one bar per model and scaffold (ARE's judge decides a pass).",
            panels=[bars],
        ),
        FigureData(
            id="gaia2-cost-time",
            kind="scatter",
            title="Gaia2 success against cost and simulated time",
            caption="Gaia2: each point is one run, success (1) or failure (0) against its dollars and the "
            "simulated seconds its world recorded.",
            panels=[
                scatter("against cost", "dollars", "cost_usd"),
                scatter("against simulated time", "simulated seconds", "simulated_seconds"),
            ],
        ),
    ]
