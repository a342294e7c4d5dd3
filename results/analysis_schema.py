"""What `labkube analyze` states and writes: its rules, once (every output prints them), the pydantic models of
analysis.json down to the series of every figure, and a run's score curve.

`analysis` computes an `Analysis` from the store and calls `analysis_figures` for its figures; the figures, the
Markdown and the HTML page read these models from here, never from `analysis`, so the read side has no import
cycle.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from labkube.result import AGENT_POD_CURVE_LABEL, RunResult
from labkube.results.analysis_stats import Correlation, Interval
from labkube.results.analysis_transcript import FLAT_LOSS_MIN
from labkube.results.passk import CapabilityScore

# -- the rules, stated once (they are printed in every output) ---------------------------------------------------

PHASE_RULE = (
    "A run's steps are split in thirds by step number: start = steps 1..N/3, ramp = the middle third, "
    "steady = the last third (N = the run's step count); a tool call belongs to the phase of its step."
)
PLATEAU_SHARE = 0.25
PLATEAU_RULE = (
    f"Plateaued: the score has not improved (no grade above the one before it) during the last "
    f"{PLATEAU_SHARE:.0%} or more of the run's wall time."
)
BUDGET_FRACTIONS = (0.25, 0.5, 0.75)
SHARE_RULE = (
    "Share of the final score reached at x% of a budget: the last graded score at or before x% of the budget, "
    "divided by the final score (None when the final score is 0 or unknown, when no grading before that point gave "
    "a value, or when the budget is not set)."
)
SCORES_RULE = (
    "Fractions of SOTA (the result's headline number). Runs that ended in an error outcome (grader, judge, world, "
    "setup, model or harness error) are left out of every analysis and counted (`errors`); so are runs a person "
    "cancelled (`cancelled`: not errors, not measurements either). Best, mean, median, worst "
    "and the mean's interval are over the runs with a value; a run whose grading gave no value is counted in "
    "`no_value`, and only `mean_no_value_as_zero` (ResearchGym's averaging) counts it as 0."
)
PASS_RULE = (
    "A paper-task run passes when it beats the baseline (a run with no value does not pass; error outcomes are left "
    "out); a Gaia2 run passes when ARE's judge says so (a judge or world error is neither a pass nor a fail: left out "
    "and counted in `excluded`)."
)
CURVE_SOURCE_RULE = (
    "Score curves (time to best, plateau, share of the final score, the curves figures) come from the run's periodic "
    f"gradings. A Kubernetes run's ran inside the agent's pod (curve_source `agent_pod`): {AGENT_POD_CURVE_LABEL}, "
    "the agent's own claim, marked wherever they are used; only its final score is the grading pod's."
)
DENSITY_RULE = "Action density: tool calls per hour of the run's charged wall time."
HANDOFF_FLAG = 2
FLAG_RULES = {
    "silent_failure": (
        "A tool output shows NaN/inf on a line, or a loss printed at least "
        f"{FLAT_LOSS_MIN} times never moves, and a later model message claims progress "
        "(improv*, progress, better, converg*, decreas*, works, success*); or the agent's end_task claims progress "
        "and the final grading gave no value (outcome no_value)."
    ),
    "early_stop": (
        "The agent ended the run itself (stop reason `done`) with more than half of every set budget left, "
        "and its final score is below the task's baseline or its grading gave no value (runs whose task has no "
        "baseline never fire)."
    ),
    "parallel_collapse": (
        "Two async jobs (start_async) running at the same time write the same output path or log "
        "(shell redirection, tee, or --out/--output/--output-dir/--log/--save-dir). A job runs from its start_async "
        "call until a check_async/cancel_async output says it exited, else until the run's last event."
    ),
    "context_pressure": f"The run dropped turns to fit the context window, or handed off {HANDOFF_FLAG}+ times.",
    "integrity": "The integrity audit's verdict is SUSPICIOUS or NEEDS_REVIEW (from result.json / integrity.json).",
}


# -- the JSON (pydantic at the boundary) -------------------------------------------------------------------------


class PassK(BaseModel):
    k: int
    pass_at_k: float
    pass_hat_k: float
    pass_at_k_ci: Interval
    pass_hat_k_ci: Interval


class GroupStats(BaseModel):
    """One task x model (scaffold) over its seeds."""

    task: str
    model: str
    runs: int = Field(description="Runs measured (a value or no value): what beat-baseline and pass@k are over.")
    scored: int = Field(description="Runs with a value: what best, mean, median, worst and the interval are over.")
    no_value: int = Field(description="Runs whose grading gave no value (not averaged, except as 0 where labelled).")
    errors: int = Field(description="Runs that ended in an error outcome: left out of every number here.")
    cancelled: int = Field(default=0, description="Runs a person cancelled: left out of every number here.")
    seeds: list[int]
    best: float | None
    mean: float | None
    median: float | None
    worst: float | None
    std: float | None
    spread: float | None = Field(description="best - worst")
    mean_ci: Interval
    mean_no_value_as_zero: float | None = Field(
        description="ResearchGym's averaging: the mean over measured runs with a run without a value counted as 0."
    )
    completion_rate: float | None = Field(description="Mean subtask completion; None when no grading completed.")
    beat_baseline: int
    pass_k: list[PassK] = Field(description="A run passes when it beats the baseline; one with no value does not.")
    baseline: float | None
    sota: float = 1.0


class EfficiencyRow(BaseModel):
    run_id: str
    task: str
    model: str
    final_score: float | None
    best_score: float | None
    time_to_best_s: float | None
    last_improvement_s: float | None
    since_last_improvement_s: float | None
    plateaued: bool | None = Field(description="None when no grading gave a value.")
    share_of_final: dict[str, dict[str, float | None]] = Field(
        description="budget kind (wall, tokens, usd) -> '25%' / '50%' / '75%' -> share of the final score"
    )
    curve_source: Literal["referee", "agent_pod"] = Field(
        default="referee",
        description="Who ran the gradings this row is computed from (the result's `score_curve_source`): agent_pod "
        "marks the agent pod's own claim, not the referee's (every number here but final_score).",
    )


class BehaviourRow(BaseModel):
    run_id: str
    task: str
    model: str
    score: float | None
    steps: int
    wall_seconds: float
    tool_calls: int
    actions_per_hour: float | None
    reasoning_tokens: int
    output_tokens: int
    tool_mix: dict[str, dict[str, int]] = Field(description="phase (start, ramp, steady) -> tool -> calls")
    handoffs: int
    context_drops: int
    dropped_messages: int
    async_jobs: int
    overlapping_job_pairs: int
    max_concurrent_jobs: int


class Flag(BaseModel):
    kind: Literal["silent_failure", "early_stop", "parallel_collapse", "context_pressure", "integrity"]
    run_id: str
    rule: str
    evidence: str
    heuristic: bool = True


class Gaia2Row(BaseModel):
    run_id: str
    task: str
    model: str
    seed: int
    capabilities: list[str]
    outcome: str | None = Field(default=None, description="scored, no_value or an error outcome (judge/world error).")
    passed: bool | None = Field(description="ARE's verdict; None without one or for an error outcome.")
    cost_usd: float | None = Field(description="None (unknown) when a model the run called has no price.")
    simulated_seconds: float | None
    wall_seconds: float


class Gaia2Capability(CapabilityScore):
    """pass@k of one model on one capability, as `report` computes it (`passk.CapabilityScore`)."""

    excluded: int = Field(default=0, description="Attempts left out: an error outcome or no verdict.")


class Series(BaseModel):
    label: str
    x: list[float | str]
    y: list[float | None]


class Panel(BaseModel):
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    hlines: dict[str, float] = Field(default_factory=dict, description="label -> y (baseline, SOTA)")


class FigureData(BaseModel):
    id: str
    kind: Literal["points", "lines", "scatter", "bars", "stacked"]
    title: str
    caption: str
    panels: list[Panel]


class ExcludedRun(BaseModel):
    run_id: str
    task: str
    model: str
    outcome: str
    error: str | None = Field(description="The last line of what failed.")


class Analysis(BaseModel):
    campaigns: list[str]
    generated_at: datetime
    runs: int = Field(description="Runs analysed: final, not an error outcome, not left out by a filter.")
    skipped: list[str] = Field(default_factory=list, description="Runs without a final result, not analysed.")
    errors: list[ExcludedRun] = Field(
        default_factory=list, description="Runs that ended in an error outcome, left out of every analysis."
    )
    cancelled: list[ExcludedRun] = Field(
        default_factory=list,
        description="Runs a person cancelled (`labkube runs cancel`): not errors, but left out of every analysis.",
    )
    excluded_intervened: list[str] = Field(
        default_factory=list,
        description="Runs left out by --exclude-intervened (a person or a usage checkpoint intervened while they ran).",
    )
    intervened: list[str] = Field(
        default_factory=list,
        description="Runs analysed that a person (or a usage checkpoint) intervened in while they ran.",
    )
    excluded_suspicious: list[str] = Field(
        default_factory=list, description="Runs left out by --exclude-suspicious (integrity verdict SUSPICIOUS)."
    )
    excluded_unsandboxed: list[str] = Field(
        default_factory=list, description="Runs left out by --exclude-unsandboxed (run with --sandbox none)."
    )
    agent_pod_curves: list[str] = Field(
        default_factory=list,
        description="Runs analysed whose score curve is the agent pod's own claim (`curve_source` agent_pod).",
    )
    rules: dict[str, str]
    groups: list[GroupStats]
    efficiency: list[EfficiencyRow]
    behaviour: list[BehaviourRow]
    tool_mix: dict[str, dict[str, int]] = Field(description="All runs pooled: phase -> tool -> calls")
    density_vs_score: Correlation
    reasoning_vs_tool_calls: Correlation
    flags: list[Flag]
    gaia2: list[Gaia2Row]
    gaia2_capabilities: list[Gaia2Capability]
    figures: list[FigureData]


# -- a run's score curve, for the efficiency rows and the curves figure ------------------------------------------


def curve_points(result: RunResult) -> list[tuple[float, float, float, int, float | None]]:
    """(seconds, tokens, dollars, step, score) per grading; None for a grading that gave no value (or failed)."""
    pts: list[tuple[float, float, float, int, float | None]]
    pts = [(g.at_seconds, float(g.tokens), g.usd, g.step, g.score) for g in result.score_curve]
    if not pts and result.score is not None:
        s = result.spend
        pts = [(s.wall_seconds, float(s.usage.total), s.usd, s.steps, result.score)]
    return pts
