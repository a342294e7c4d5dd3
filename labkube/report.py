"""Report rows (one per run) and per-task aggregates, one per model and scaffold, read from the results store.

Scaffolds are compared as the ResearchGym paper compares systems: per task, one aggregate row per (model,
scaffold), every row with the same columns, the scaffolds of one model next to each other (`comparison_order`).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, Field

from labkube.budgets import Spend, total_cost
from labkube.control import control_path, run_control
from labkube.integrity_report import Verdict
from labkube.interventions import Intervention
from labkube.result import GPU_USE_FILE, GpuUse, Outcome, RunResult
from labkube.run_spec import DEFAULT_AGENT, AgentName, RunPhase, RunSpec, scaffold_label
from labkube.sandbox import SandboxMode
from labkube.store import CampaignDir, read_model

# rg-agent first, then the others in the order `--agent` lists them; an unknown name sorts last.
SCAFFOLD_ORDER = {name: i for i, name in enumerate(dict.fromkeys([DEFAULT_AGENT, *get_args(AgentName)]))}


def scaffold_rank(agent: str) -> tuple[int, str]:
    return (SCAFFOLD_ORDER.get(agent, len(SCAFFOLD_ORDER)), agent)


class ReportRow(BaseModel):
    run_id: str
    task: str
    group: str = Field(default="", description="What aggregates group by: the task, or a GAIA dataset and level.")
    model: str
    agent: str = Field(default=DEFAULT_AGENT, description="The scaffold: rg-agent, claude-code, codex, are-default.")
    seed: int
    status: str
    stop_reason: str | None = None
    outcome: str | None = Field(default=None, description="scored, no_value or an error outcome; None until final.")
    score: float | None = None
    primary_scores: dict[str, float | None] = Field(
        default_factory=dict, description="The score of each primary group the task tags, by name (RunResult's)."
    )
    flagged_score: float | None = Field(
        default=None,
        description="The value of a run whose headline was flagged as implausible (fraction of SOTA outside "
        "0-10x): shown, never averaged; its outcome is no_value and `score` null (RunResult's).",
    )
    beat_baseline: bool | None = Field(default=None, description="None (unknown) when the run has no value.")
    completion: float | None = Field(default=None, description="None (unknown) when no grading completed.")
    cost_usd: float | None = Field(default=0.0, description="Dollars; None (unknown): a model it called has no price.")
    tokens_total: int = 0
    spend_at_least: bool = Field(
        default=False,
        description="The tokens and dollars are lower bounds: a model call's answer did not say its usage.",
    )
    wall_seconds: float = 0.0
    gpu_hours: float = Field(default=0.0, description="GPUs the run held times its wall time, as the GPU cap counts.")
    gpu_utilization: float | None = Field(
        default=None, description="Mean utilisation of the run's GPUs over the run (NVML); None: no GPU."
    )
    gpu_memory_peak_bytes: int | None = Field(default=None, description="Peak memory on the run's GPUs; None: no GPU.")
    steps: int = 0
    resumes: int = Field(default=0, description="Times the run was resumed from its checkpoint so far.")
    integrity_verdict: str | None = None
    unsandboxed: bool = Field(
        default=False,
        description="The run's agent ran outside labkube's sandbox (`--sandbox none`): it could reach "
        "the referee, so its numbers are the agent's word.",
    )
    error: str | None = None
    message: str = Field(default="", description="What the run is waiting on, or why it failed.")
    interventions: list[Intervention] = Field(
        default_factory=list,
        description="What people (or usage checkpoints) did to the run while it ran, oldest first: the result's once "
        "it has one, the campaign's control file (`control/<run-id>.json`) while it runs.",
    )

    @property
    def integrity_label(self) -> str:
        """The audit's verdict as reports show it, marked where the run was not sandboxed."""
        verdict = self.integrity_verdict or "—"
        return f"{verdict} · unsandboxed" if self.unsandboxed else verdict

    @property
    def label(self) -> str:
        """The model, and the scaffold when it is not rg-agent: one system in plots and legends."""
        return scaffold_label(self.agent, self.model)

    @property
    def is_error(self) -> bool:
        """An error outcome: the run's numbers measure a failure of labkube's side (grader, judge, world, setup,
        model API, harness), not the agent, so statistics over seeds leave it out."""
        return self.outcome is not None and Outcome(self.outcome).is_error

    @property
    def cancelled(self) -> bool:
        """A person cancelled the run: not an error, but not a measurement either (counted apart)."""
        return self.outcome == Outcome.cancelled.value

    @property
    def intervened(self) -> bool:
        return bool(self.interventions)

    @property
    def counted(self) -> bool:
        """A final run whose numbers are a measurement: what means, bests and counts over seeds are taken over
        (never an error outcome, never a cancelled run)."""
        final = self.status in (RunPhase.finished.value, RunPhase.failed.value)
        return final and not self.is_error and not self.cancelled


class Aggregate(BaseModel):
    """One system (a model under a scaffold) on one task, over its seeds."""

    task: str = Field(description="The task, or a GAIA dataset and level.")
    model: str
    agent: str = DEFAULT_AGENT
    runs: int
    finished: int = Field(description="Final runs with a measurement (scored or no value): what the means are over.")
    errors: int = Field(default=0, description="Runs that ended in an error outcome, left out of every statistic.")
    cancelled: int = Field(
        default=0, description="Runs a person cancelled: not errors, but left out of every statistic too."
    )
    intervened: int = Field(
        default=0, description="Runs a person (or a usage checkpoint) intervened in while they ran (counted in)."
    )
    mean_score: float | None = Field(description="Mean over the finished runs that have a value.")
    best_score: float | None
    std_score: float | None
    mean_primary_scores: dict[str, float | None] = Field(
        default_factory=dict,
        description="Per primary group the task tags: the mean over the finished runs that have a value for it.",
    )
    beat_baseline: int = Field(description="Finished runs that beat the baseline (a run with no value does not).")
    flagged: int = Field(
        default=0,
        description="Finished runs whose value was flagged as implausible (fraction of SOTA outside 0-10x): "
        "counted as runs with no value, never averaged.",
    )
    mean_completion: float | None
    tokens_total: int = 0
    cost_usd: float | None = Field(description="Dollars of the group's runs; None (unknown) when any run's is.")
    spend_at_least: bool = Field(default=False, description="The tokens and dollars are lower bounds (a run's are).")
    gpu_hours: float = 0.0
    wall_seconds: float = 0.0
    audited: int = Field(default=0, description="Runs the integrity audit gave a verdict.")
    suspicious: int = Field(default=0, description="Runs the integrity audit found SUSPICIOUS.")

    @property
    def label(self) -> str:
        return scaffold_label(self.agent, self.model)


UNREADABLE_RESULT = "result.json is empty or damaged: no result; run the campaign again to finish this run"


def report_rows(cdir: CampaignDir) -> list[ReportRow]:
    rows = []
    for run_id in cdir.run_ids():
        spec = cdir.run_spec(run_id)
        if spec is not None:
            rows.append(run_row(cdir, run_id, spec, cdir.result(run_id)))
    return rows


def run_row(cdir: CampaignDir, run_id: str, spec: RunSpec, result: RunResult | None) -> ReportRow:
    """One run's row: its result's numbers once it has one, its status's while it runs."""
    gpu = run_gpu_use(cdir.run_dir(run_id), result)
    gpu_fields = {
        "gpu_utilization": gpu.mean_utilization if gpu else None,
        "gpu_memory_peak_bytes": gpu.peak_memory_bytes if gpu and gpu.samples else None,
    }
    if result is not None:
        return ReportRow(
            run_id=run_id,
            task=result.task,
            group=spec.group or spec.task,
            model=result.model,
            agent=result.agent,
            seed=result.seed,
            status=result.status.value,
            stop_reason=result.stop_reason.value if result.stop_reason else None,
            outcome=result.outcome.value if result.outcome else None,
            score=result.score,
            flagged_score=result.flagged_score,
            primary_scores=result.primary_scores,
            beat_baseline=result.beat_baseline,
            completion=result.completion,
            cost_usd=dollars(result.spend),
            tokens_total=result.spend.usage.total,
            spend_at_least=result.spend.at_least,
            wall_seconds=round(result.spend.wall_seconds, 3),
            gpu_hours=round(spec.gpus * result.spend.wall_seconds / 3600, 6),
            **gpu_fields,
            steps=result.spend.steps,
            resumes=result.resumes,
            integrity_verdict=result.integrity_verdict,
            unsandboxed=spec.sandbox is SandboxMode.none,
            error=result.error,
            message=result.error or result.message or "",
            interventions=result.interventions,
        )
    status = cdir.status(run_id)
    if status is not None and (cdir.run_dir(run_id) / "result.json").exists():
        # a result.json that cannot be read is no result (as in analyze and export): the run is not finished,
        # whatever its last status said
        phase = RunPhase.pending if status.phase.final else status.phase
        status = status.model_copy(update={"phase": phase, "score": None, "message": UNREADABLE_RESULT})
    return ReportRow(
        run_id=run_id,
        task=spec.task,
        group=spec.group or spec.task,
        model=spec.model,
        agent=spec.agent,
        seed=spec.seed,
        status=(status.phase if status else RunPhase.pending).value,
        score=status.score if status else None,
        cost_usd=dollars(status.spend) if status else 0.0,
        tokens_total=status.spend.usage.total if status else 0,
        spend_at_least=status.spend.at_least if status else False,
        wall_seconds=round(status.spend.wall_seconds, 3) if status else 0.0,
        gpu_hours=round(spec.gpus * status.spend.wall_seconds / 3600, 6) if status else 0.0,
        **gpu_fields,
        steps=status.spend.steps if status else 0,
        resumes=max(status.attempts - 1, 0) if status else 0,
        unsandboxed=spec.sandbox is SandboxMode.none,
        message=status.message if status else "",
        interventions=run_control(cdir.root, run_id).interventions,
    )


FileStamp = tuple[int, int, int] | None  # (inode, size, mtime in ns) of a file; None when it is not there


def _stamp(path: str) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class LiveRows:
    """`report_rows` of a campaign while it runs, for whoever shows or counts its runs again and again (the live
    table, the campaign's metrics). Re-reading every run's files each time cost the driver a few ms per run and
    redraw, for hundreds of runs of which only a few change: here a run's spec and the campaign's run list are read
    once, a running run's row is rebuilt only when one of its files (status, result, GPU use) changed, and a final
    run's row is kept without looking at its files again once its audit has put its verdict into it (one writer
    drives a campaign; `result.json` is final before the audit, whose LLM inspector may take seconds, rewrites it
    with the verdict: a row kept before that would show the run unaudited)."""

    def __init__(self, cdir: CampaignDir) -> None:
        self.cdir = cdir
        self._run_ids: list[str] | None = None
        self._specs: dict[str, RunSpec] = {}
        self._rows: dict[str, tuple[tuple[FileStamp, ...], ReportRow]] = {}
        self._final: dict[str, ReportRow] = {}

    def _stamps(self, run_id: str) -> tuple[FileStamp, ...]:
        root = str(self.cdir.run_dir(run_id))
        files = [os.path.join(root, name) for name in ("status.json", "result.json", GPU_USE_FILE)]
        return tuple(_stamp(path) for path in [*files, str(control_path(self.cdir.root, run_id))])

    def rows(self) -> list[ReportRow]:
        if self._run_ids is None:
            self._run_ids = self.cdir.run_ids()
        rows = []
        for run_id in self._run_ids:
            spec = self._specs.get(run_id) or self.cdir.run_spec(run_id)
            if spec is None:
                continue
            self._specs[run_id] = spec
            if run_id in self._final:
                rows.append(self._final[run_id])
                continue
            stamps = self._stamps(run_id)
            kept = self._rows.get(run_id)
            if kept is None or kept[0] != stamps:
                result = self.cdir.result(run_id)
                kept = (stamps, run_row(self.cdir, run_id, spec, result))
                self._rows[run_id] = kept
                if result is not None and result.final and result.integrity_verdict is not None:
                    self._final[run_id] = kept[1]
                    del self._rows[run_id]
            rows.append(kept[1])
        return rows


def run_gpu_use(run_root: Path, result: RunResult | None) -> GpuUse | None:
    """The final result's GPU use, or, while the run goes on, what its meter has written so far."""
    if result is not None and result.final:
        return result.gpu
    return read_model(run_root / GPU_USE_FILE, GpuUse)


def dollars(spend: Spend) -> float | None:
    return rounded(spend.cost_usd)


def rounded(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 6)


def comparison_order(rows: list[ReportRow]) -> list[ReportRow]:
    """Rows by task (in the campaign's order), then model, then scaffold (rg-agent first), then seed: the
    scaffolds of one model on one task are adjacent."""
    tasks = {t: i for i, t in enumerate(dict.fromkeys(r.group or r.task for r in rows))}
    return sorted(rows, key=lambda r: (tasks[r.group or r.task], r.model, scaffold_rank(r.agent), r.seed))


def aggregate(rows: list[ReportRow]) -> list[Aggregate]:
    """One aggregate per task (or GAIA group), model and scaffold, in `comparison_order`."""
    groups: dict[tuple[str, str, str], list[ReportRow]] = {}
    for row in comparison_order(rows):
        groups.setdefault((row.group or row.task, row.model, row.agent), []).append(row)
    out = []
    for (task, model, agent), group in groups.items():
        finished = [r for r in group if r.counted]
        scores = [r.score for r in finished if r.score is not None]
        completions = [r.completion for r in finished if r.completion is not None]
        out.append(
            Aggregate(
                task=task,
                model=model,
                agent=agent,
                runs=len(group),
                finished=len(finished),
                errors=sum(r.is_error for r in group),
                cancelled=sum(r.cancelled for r in group),
                intervened=sum(r.intervened for r in group),
                mean_score=statistics.fmean(scores) if scores else None,
                best_score=max(scores) if scores else None,
                std_score=statistics.stdev(scores) if len(scores) > 1 else (0.0 if scores else None),
                mean_primary_scores=mean_by_group(finished),
                beat_baseline=sum(r.beat_baseline is True for r in finished),
                flagged=sum(r.flagged_score is not None for r in finished),
                mean_completion=statistics.fmean(completions) if completions else None,
                tokens_total=sum(r.tokens_total for r in group),
                spend_at_least=any(r.spend_at_least for r in group),
                cost_usd=rounded(total_cost(r.cost_usd for r in group)),
                gpu_hours=round(sum(r.gpu_hours for r in group), 6),
                wall_seconds=round(sum(r.wall_seconds for r in group), 3),
                audited=sum(r.integrity_verdict is not None for r in group),
                suspicious=sum(r.integrity_verdict == Verdict.SUSPICIOUS.value for r in group),
            )
        )
    return out


def mean_by_group(rows: list[ReportRow]) -> dict[str, float | None]:
    """Each primary group's mean score over `rows`; None for a group no run has a value for."""
    groups = dict.fromkeys(name for r in rows for name in r.primary_scores)
    values = {g: [v for r in rows if (v := r.primary_scores.get(g)) is not None] for g in groups}
    return {g: statistics.fmean(v) if v else None for g, v in values.items()}
