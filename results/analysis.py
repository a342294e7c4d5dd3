"""`labkube analyze`: the ResearchGym paper's analyses over one or more campaign directories (pooled).

    analyze_campaigns([dir, ...])  ->  Analysis        (pydantic: the JSON file holds every number of every figure)
    labkube.results.analysis_md.render_markdown(analysis) -> str
    labkube.results.analysis_html.render_analysis_html(analysis) -> str

What it computes, from what the store keeps per run (run.json, result.json, transcript.jsonl):

1. capability and reliability per task x model (scaffold): best / mean / median / worst normalised score over
   seeds, spread, subtask completion, beat-baseline count, pass@k and pass^k (a run "passes" when it beats the
   baseline) with bootstrap intervals;
2. efficiency from score curves: time to best, share of the final score reached at 25/50/75% of each budget,
   a plateau detector;
3. behaviour from transcripts, read one line at a time (memory does not grow with a transcript's length):
   tool mix per phase, action density and its correlation with the score, reasoning tokens, hand-offs,
   context drops, overlapping async jobs;
4. failure-mode flags (heuristics, each with its rule and the evidence line that fired it);
5. Gaia2: pass@1 per capability, success against cost and simulated time.

Scores are fractions of SOTA (the result's headline number). Which runs count, as in `labkube report`: a run that
ended in an error outcome (grader, judge, world, setup, model or harness error: its numbers measure a failure of
labkube's side, not the agent) is left out of every analysis and listed with its outcome, and so is a run a person
cancelled (not an error, but not a measurement either: counted apart); each group and Gaia2 capability says how many
it left out. A run a person otherwise touched (paused, resumed, extended, sent a message) is analysed and listed in
`intervened`; `exclude_intervened` leaves out every touched run. A run whose grading gave no value (`no_value`) is
measured but has no score: best / mean / median / worst and their interval are over the runs with a value, it does
not beat the baseline (pass@k), and only the column labelled "no value = 0" (ResearchGym's averaging) counts it as 0.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from labkube.result import Outcome, RunResult
from labkube.results.analysis_figures import build_figures
from labkube.results.analysis_schema import (
    BUDGET_FRACTIONS,
    CURVE_SOURCE_RULE,
    DENSITY_RULE,
    FLAG_RULES,
    HANDOFF_FLAG,
    PASS_RULE,
    PHASE_RULE,
    PLATEAU_RULE,
    PLATEAU_SHARE,
    SCORES_RULE,
    SHARE_RULE,
    Analysis,
    BehaviourRow,
    EfficiencyRow,
    ExcludedRun,
    Flag,
    Gaia2Capability,
    Gaia2Row,
    GroupStats,
    PassK,
    curve_points,
)
from labkube.results.analysis_stats import bootstrap, correlation
from labkube.results.analysis_transcript import (
    PHASES,
    PROGRESS_WORDS,
    Job,
    TranscriptStats,
    clip,
    phase_of,
    read_transcript,
)
from labkube.results.passk import Attempt, capability_scores, pass_at_k, pass_hat_k
from labkube.run_spec import RunSpec, scaffold_label
from labkube.sandbox import SandboxMode
from labkube.store import CampaignDir, StoreError

__all__ = ["Analysis", "AnalysisError", "analyze_campaigns", "phase_of", "read_transcript"]


class AnalysisError(ValueError):
    """A campaign directory that cannot be analysed; the message says what to do."""


# -- reading the store -------------------------------------------------------------------------------------------


@dataclass
class RunData:
    spec: RunSpec
    result: RunResult
    stats: TranscriptStats
    baseline: float | None
    integrity_note: str | None

    @property
    def label(self) -> str:
        return scaffold_label(self.spec.agent, self.result.model)

    @property
    def score(self) -> float | None:
        return self.result.score

    @property
    def measured(self) -> bool:
        """Counted in statistics, as `labkube report` counts it: not an error outcome, not cancelled."""
        return self.result.measured

    @property
    def is_gaia2(self) -> bool:
        return self.spec.family.value == "gaia2"


def open_campaigns(paths: list[Path]) -> list[tuple[CampaignDir, list[str]]]:
    """Each campaign directory and its run ids.

    Raises:
        AnalysisError: a path is not a campaign directory, or no campaign holds a run.
    """
    out = []
    for path in paths:
        cdir = CampaignDir(path)
        try:
            cdir.load_spec()
        except StoreError as exc:
            raise AnalysisError(f"{exc}: pass the --out directory of a `labkube run`") from None
        out.append((cdir, cdir.run_ids()))
    if not any(ids for _, ids in out):
        raise AnalysisError(f"{', '.join(map(str, paths))}: no runs yet; start them with `labkube run ... --out DIR`")
    return out


def load_run(cdir: CampaignDir, run_id: str) -> RunData | None:
    """A run with a final result (None otherwise), its transcript read in one streaming pass."""
    spec, result = cdir.run_spec(run_id), cdir.result(run_id)
    if spec is None or result is None or not result.final:
        return None
    baseline = None
    if spec.family.value != "gaia2":
        from labkube.results.html_report import task_reference

        baseline = task_reference(spec).baseline
    run_dir = cdir.run_dir(run_id)
    stats = read_transcript(run_dir / "transcript.jsonl", result.spend.steps)
    return RunData(spec, result, stats, baseline, _integrity_note(run_dir))


def _integrity_note(run_dir: Path) -> str | None:
    try:
        data = json.loads((run_dir / "integrity.json").read_text())
        v = (data.get("violations") or [{}])[0]
        return f"{v.get('type')}: {clip(str(v.get('evidence', '')))}" if v else None
    except (OSError, ValueError, AttributeError, IndexError):
        return None


# -- 1. capability and reliability -------------------------------------------------------------------------------


def group_stats(runs: list[RunData]) -> list[GroupStats]:
    """Per task x model (scaffold), over the measured runs (`runs` may hold error outcomes and cancelled runs: they
    are counted apart)."""
    groups: dict[tuple[str, str], list[RunData]] = {}
    for r in runs:
        groups.setdefault((r.spec.group or r.spec.task, r.label), []).append(r)
    out = []
    for (task, model), group in sorted(groups.items()):
        rs = sorted((r for r in group if r.measured), key=lambda r: r.result.seed)
        scores = [r.score for r in rs if r.score is not None]
        completions = [r.result.completion for r in rs if r.result.completion is not None]
        passes = [float(r.result.beat_baseline is True) for r in rs]
        n, c = len(passes), int(sum(passes))
        pk = []
        for k in sorted({1, min(2, n), n} - {0}) if n else []:
            pk.append(
                PassK(
                    k=k,
                    pass_at_k=pass_at_k(n, c, k),
                    pass_hat_k=pass_hat_k(n, c, k),
                    pass_at_k_ci=bootstrap(passes, lambda s, k=k: pass_at_k(len(s), int(s.sum()), k)),
                    pass_hat_k_ci=bootstrap(passes, lambda s, k=k: pass_hat_k(len(s), int(s.sum()), k)),
                )
            )
        out.append(
            GroupStats(
                task=task,
                model=model,
                runs=len(rs),
                scored=len(scores),
                no_value=len(rs) - len(scores),
                errors=sum(r.result.is_error for r in group),
                cancelled=sum(r.result.outcome is Outcome.cancelled for r in group),
                seeds=[r.result.seed for r in rs],
                best=max(scores) if scores else None,
                mean=statistics.fmean(scores) if scores else None,
                median=statistics.median(scores) if scores else None,
                worst=min(scores) if scores else None,
                std=statistics.stdev(scores) if len(scores) > 1 else None,
                spread=max(scores) - min(scores) if scores else None,
                mean_ci=bootstrap(scores, np.mean),
                mean_no_value_as_zero=statistics.fmean(r.score or 0.0 for r in rs) if rs else None,
                completion_rate=statistics.fmean(completions) if completions else None,
                beat_baseline=c,
                pass_k=pk,
                baseline=next((r.baseline for r in rs if r.baseline is not None), None),
            )
        )
    return out


# -- 2. efficiency dynamics --------------------------------------------------------------------------------------


def efficiency(run: RunData) -> EfficiencyRow:
    """Over the gradings that gave a value; a run with none has no best, no time to best and no plateau verdict."""
    result = run.result
    pts = [(t, tok, usd, step, score) for t, tok, usd, step, score in curve_points(result) if score is not None]
    final = result.score
    best = max((p[4] for p in pts), default=None)
    time_to_best = next((p[0] for p in pts if best is not None and p[4] >= best - 1e-12), None)
    last_improvement = pts[0][0] if pts else None
    for prev, cur in itertools.pairwise(pts):
        if cur[4] > prev[4] + 1e-12:
            last_improvement = cur[0]
    end = max(result.spend.wall_seconds, pts[-1][0] if pts else 0.0)
    since = None if last_improvement is None else end - last_improvement
    plateaued = None if since is None else end > 0 and since >= PLATEAU_SHARE * end
    budgets = run.spec.budgets
    shares: dict[str, dict[str, float | None]] = {}
    for kind, limit, axis in (
        ("wall", budgets.wall_seconds, 0),
        ("tokens", budgets.tokens, 1),
        ("usd", budgets.usd, 2),
    ):
        if limit is None:
            continue
        row: dict[str, float | None] = {}
        for f in BUDGET_FRACTIONS:
            reached = [p[4] for p in pts if p[axis] <= f * limit + 1e-9]
            row[f"{f:.0%}"] = reached[-1] / final if reached and final else None
        shares[kind] = row
    return EfficiencyRow(
        run_id=result.run_id,
        task=run.spec.group or run.spec.task,
        model=run.label,
        final_score=final,
        best_score=best,
        time_to_best_s=time_to_best,
        last_improvement_s=last_improvement,
        since_last_improvement_s=since,
        plateaued=plateaued,
        share_of_final=shares,
        curve_source=result.score_curve_source,
    )


# -- 3. behaviour ------------------------------------------------------------------------------------------------


def overlapping_pairs(jobs: list[Job], run_end: float) -> list[tuple[Job, Job]]:
    pairs = []
    for i, a in enumerate(jobs):
        for b in jobs[i + 1 :]:
            a_end, b_end = a.end if a.end is not None else run_end, b.end if b.end is not None else run_end
            if a.start < b_end and b.start < a_end:
                pairs.append((a, b))
    return pairs


def max_concurrent(jobs: list[Job], run_end: float) -> int:
    events = sorted(
        [(j.start, 1) for j in jobs] + [(j.end if j.end is not None else run_end, -1) for j in jobs],
        key=lambda e: (e[0], e[1]),
    )
    now = best = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


def behaviour(run: RunData) -> BehaviourRow:
    st, result = run.stats, run.result
    hours = result.spend.wall_seconds / 3600.0
    jobs = list(st.jobs.values())
    end = st.last_ts or 0.0
    return BehaviourRow(
        run_id=result.run_id,
        task=run.spec.group or run.spec.task,
        model=run.label,
        score=result.score,
        steps=result.spend.steps,
        wall_seconds=result.spend.wall_seconds,
        tool_calls=st.tool_calls,
        actions_per_hour=st.tool_calls / hours if hours > 0 else None,
        reasoning_tokens=st.reasoning_tokens,
        output_tokens=st.output_tokens,
        tool_mix={p: dict(sorted(st.mix[p].items())) for p in PHASES},
        handoffs=st.handoffs,
        context_drops=st.context_drops,
        dropped_messages=st.dropped_messages,
        async_jobs=len(jobs),
        overlapping_job_pairs=len(overlapping_pairs(jobs, end)),
        max_concurrent_jobs=max_concurrent(jobs, end) if jobs else 0,
    )


# -- 4. failure-mode flags ---------------------------------------------------------------------------------------


def flags_for(run: RunData) -> list[Flag]:
    st, result, rid = run.stats, run.result, run.result.run_id
    out: list[Flag] = []

    def flag(kind: str, evidence: str) -> None:
        out.append(Flag(kind=kind, run_id=rid, rule=FLAG_RULES[kind], evidence=evidence))  # type: ignore[arg-type]

    if st.progress_after_problem is not None:
        problem = st.nan_evidence or f"loss stays at {st.loss_first} over {st.loss_count} readings ({st.loss_evidence})"
        flag("silent_failure", f"{problem}; then {st.progress_after_problem}")
    elif result.outcome is Outcome.no_value and st.end_task and PROGRESS_WORDS.search(st.end_task):
        flag("silent_failure", f"{st.end_task}; then the final grading gave no value: {clip(result.message or '')}")
    used = _used_fractions(run)
    below = run.baseline is not None and (run.score is None or run.score < run.baseline)
    if (
        result.stop_reason is not None
        and result.stop_reason.value == "done"
        and used
        and max(used.values()) < 0.5
        and below
    ):
        spent = ", ".join(f"{k} {v:.0%} used" for k, v in used.items())
        base = "—" if run.baseline is None else f"{run.baseline:.3f}"
        score = "no value" if run.score is None else f"{run.score:.3f}"
        flag("early_stop", f"{st.end_task or 'ended by the agent'}; {spent}; score {score} < baseline {base}")
    jobs = list(st.jobs.values())
    for a, b in overlapping_pairs(jobs, st.last_ts or 0.0):
        shared = sorted(a.targets & b.targets)
        if shared:
            flag(
                "parallel_collapse",
                f"{a.id} (step {a.step}: {clip(a.command, 90)}) and {b.id} (step {b.step}: {clip(b.command, 90)}) "
                f"both write {', '.join(shared)} while both run",
            )
    if st.context_drops or st.handoffs >= HANDOFF_FLAG:
        parts = [e for e in (st.drop_evidence, st.handoff_evidence) if e]
        flag(
            "context_pressure",
            f"{st.handoffs} hand-offs, {st.context_drops} context drops ({st.dropped_messages} messages); "
            + "; ".join(parts),
        )
    if result.integrity_verdict in ("SUSPICIOUS", "NEEDS_REVIEW"):
        flag(
            "integrity",
            f"verdict {result.integrity_verdict}" + (f": {run.integrity_note}" if run.integrity_note else ""),
        )
    return out


def _used_fractions(run: RunData) -> dict[str, float]:
    b, s = run.spec.budgets, run.result.spend
    pairs = {"wall": (s.wall_seconds, b.wall_seconds), "tokens": (s.usage.total, b.tokens), "usd": (s.usd, b.usd)}
    pairs["steps"] = (s.steps, b.steps)
    return {k: used / limit for k, (used, limit) in pairs.items() if limit}


# -- 5. Gaia2 ----------------------------------------------------------------------------------------------------


def gaia2_row(run: RunData) -> Gaia2Row:
    """A pass is ARE's verdict as the run's score holds it (1 passed, 0 failed), as `labkube report` reads it; an
    error outcome (the judge raised, the world broke) or a run without a verdict has none."""
    result = run.result
    verdict = result.details.get("gaia2") or {}
    sim = verdict.get("simulated_seconds")
    return Gaia2Row(
        run_id=result.run_id,
        task=run.spec.task,
        model=run.label,
        seed=result.seed,
        capabilities=result.capabilities,
        outcome=result.outcome.value if result.outcome else None,
        passed=None if not result.measured or result.score is None else result.score == 1.0,
        cost_usd=run.result.spend.cost_usd,
        simulated_seconds=float(sim) if isinstance(sim, int | float) else None,
        wall_seconds=run.result.spend.wall_seconds,
    )


def gaia2_capabilities(rows: list[Gaia2Row]) -> list[Gaia2Capability]:
    """pass@1, pass@k, pass^k per capability and model (scaffold), by labkube.results.passk; a run without a pass or
    fail (an error outcome, no verdict) is left out and counted in `excluded`."""
    attempts = [
        Attempt(
            scenario=r.task,
            model=r.model,
            seed=r.seed,
            passed=r.passed is True,
            capabilities=r.capabilities,
            counted=r.passed is not None,
        )
        for r in rows
    ]
    return [Gaia2Capability(**s.model_dump()) for s in capability_scores(attempts)] if attempts else []


# -- putting it together -----------------------------------------------------------------------------------------


def analyze_campaigns(
    paths: list[Path],
    progress: bool = False,
    exclude_suspicious: bool = False,
    exclude_unsandboxed: bool = False,
    exclude_intervened: bool = False,
) -> Analysis:
    """Every analysis over the finished runs of `paths`, pooled. Runs that ended in an error outcome or were
    cancelled are left out and listed; with `exclude_suspicious`, so are runs the integrity audit found SUSPICIOUS
    (as `labkube report --exclude-suspicious`); with `exclude_unsandboxed`, runs whose agent ran outside labkube's
    sandbox; with `exclude_intervened`, runs a person (or a usage checkpoint) intervened in.

    Raises:
        AnalysisError: a path is not a campaign directory, or no run has a final result.
    """
    from datetime import UTC

    opened = open_campaigns(paths)
    todo = [(cdir, rid) for cdir, ids in opened for rid in ids]
    runs: list[RunData] = []
    skipped: list[str] = []
    if progress:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("reading runs", total=len(todo))
            for cdir, rid in todo:
                _collect(cdir, rid, runs, skipped)
                bar.advance(task)
    else:
        for cdir, rid in todo:
            _collect(cdir, rid, runs, skipped)
    if not runs:
        raise AnalysisError(
            f"{', '.join(map(str, paths))}: no run has finished yet; check `labkube status DIR` and analyse it then"
        )
    suspicious = [r.result.run_id for r in runs if exclude_suspicious and r.result.integrity_verdict == "SUSPICIOUS"]
    unsandboxed = [r.result.run_id for r in runs if exclude_unsandboxed and r.spec.sandbox is SandboxMode.none]
    intervened = [r.result.run_id for r in runs if exclude_intervened and r.result.intervened]
    left_out = {*suspicious, *unsandboxed, *intervened}
    kept = [r for r in runs if r.result.run_id not in left_out]
    errors = [r for r in kept if not r.measured]
    runs = [r for r in kept if r.measured]
    paper = [r for r in runs if not r.is_gaia2]
    behaviour_rows = [behaviour(r) for r in runs]
    pooled: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
    for r in runs:
        for p in PHASES:
            pooled[p].update(r.stats.mix[p])
    paper_ids = {r.result.run_id for r in paper}
    dense = [
        b for b in behaviour_rows if b.run_id in paper_ids and b.actions_per_hour is not None and b.score is not None
    ]
    analysis = Analysis(
        campaigns=[str(c.root) for c, _ in opened],
        generated_at=datetime.now(UTC),
        runs=len(runs),
        skipped=skipped,
        errors=[excluded_run(r) for r in errors if r.result.is_error],
        cancelled=[excluded_run(r) for r in errors if r.result.outcome is Outcome.cancelled],
        excluded_suspicious=suspicious,
        excluded_unsandboxed=unsandboxed,
        excluded_intervened=intervened,
        intervened=[r.result.run_id for r in runs if r.result.intervened],
        agent_pod_curves=[r.result.run_id for r in runs if r.result.curve_is_agent_claim],
        rules={
            "phases": PHASE_RULE,
            "plateau": PLATEAU_RULE,
            "share_of_final": SHARE_RULE,
            "curve_source": CURVE_SOURCE_RULE,
            "action_density": DENSITY_RULE + " Its correlation with the score is over paper-task runs only.",
            "scores": SCORES_RULE,
            "pass": PASS_RULE,
            **{f"flag.{k}": v for k, v in FLAG_RULES.items()},
        },
        groups=group_stats(paper + [r for r in errors if not r.is_gaia2]),
        efficiency=[efficiency(r) for r in paper],
        behaviour=behaviour_rows,
        tool_mix={p: dict(sorted(pooled[p].items())) for p in PHASES},
        density_vs_score=correlation(
            "actions_per_hour", "score", [b.actions_per_hour or 0.0 for b in dense], [b.score or 0.0 for b in dense]
        ),
        reasoning_vs_tool_calls=correlation(
            "tool_calls",
            "reasoning_tokens",
            [float(b.tool_calls) for b in behaviour_rows],
            [float(b.reasoning_tokens) for b in behaviour_rows],
        ),
        flags=[f for r in runs for f in flags_for(r)],
        gaia2=[gaia2_row(r) for r in runs + errors if r.is_gaia2],
        gaia2_capabilities=[],
        figures=[],
    )
    analysis.gaia2_capabilities = gaia2_capabilities(analysis.gaia2)
    analysis.figures = build_figures(analysis, {r.result.run_id: r.result for r in paper})
    return analysis


def excluded_run(run: RunData) -> ExcludedRun:
    error = (run.result.error or "").strip().splitlines()
    return ExcludedRun(
        run_id=run.result.run_id,
        task=run.spec.group or run.spec.task,
        model=run.label,
        outcome=str(run.result.outcome),
        error=clip(error[-1]) if error else None,
    )


def _collect(cdir: CampaignDir, run_id: str, runs: list[RunData], skipped: list[str]) -> None:
    run = load_run(cdir, run_id)
    if run is None:
        skipped.append(run_id)
    else:
        runs.append(run)
