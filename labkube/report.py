"""Report rows (one per run) and per-task, per-model aggregates, read from the results store."""

from __future__ import annotations

import statistics

from pydantic import BaseModel, Field

from labkube.run_spec import RunPhase, scaffold_label
from labkube.store import CampaignDir


class ReportRow(BaseModel):
    run_id: str
    task: str
    group: str = Field(default="", description="What aggregates group by: the task, or a GAIA dataset and level.")
    model: str
    seed: int
    status: str
    stop_reason: str | None = None
    score: float | None = None
    beat_baseline: bool = False
    completion: float = 0.0
    cost_usd: float = 0.0
    tokens_total: int = 0
    wall_seconds: float = 0.0
    steps: int = 0
    integrity_verdict: str | None = None
    error: str | None = None
    message: str = Field(default="", description="What the run is waiting on, or why it failed.")


class Aggregate(BaseModel):
    task: str = Field(description="The task, or a GAIA dataset and level.")
    model: str
    runs: int
    finished: int
    mean_score: float | None
    best_score: float | None
    std_score: float | None
    beat_baseline: int
    mean_completion: float
    cost_usd: float


def report_rows(cdir: CampaignDir) -> list[ReportRow]:
    rows = []
    for run_id in cdir.run_ids():
        spec = cdir.run_spec(run_id)
        if spec is None:
            continue
        result = cdir.result(run_id)
        if result is not None:
            rows.append(
                ReportRow(
                    run_id=run_id,
                    task=result.task,
                    group=spec.group or spec.task,
                    model=scaffold_label(spec.agent, result.model),
                    seed=result.seed,
                    status=result.status.value,
                    stop_reason=result.stop_reason.value if result.stop_reason else None,
                    score=result.score,
                    beat_baseline=result.beat_baseline,
                    completion=result.completion,
                    cost_usd=round(result.spend.usd, 6),
                    tokens_total=result.spend.usage.total,
                    wall_seconds=round(result.spend.wall_seconds, 3),
                    steps=result.spend.steps,
                    integrity_verdict=result.integrity_verdict,
                    error=result.error,
                    message=result.error or "",
                )
            )
            continue
        status = cdir.status(run_id)
        rows.append(
            ReportRow(
                run_id=run_id,
                task=spec.task,
                group=spec.group or spec.task,
                model=scaffold_label(spec.agent, spec.model),
                seed=spec.seed,
                status=(status.phase if status else RunPhase.pending).value,
                score=status.score if status else None,
                cost_usd=round(status.spend.usd, 6) if status else 0.0,
                tokens_total=status.spend.usage.total if status else 0,
                wall_seconds=round(status.spend.wall_seconds, 3) if status else 0.0,
                steps=status.spend.steps if status else 0,
                message=status.message if status else "",
            )
        )
    return rows


def aggregate(rows: list[ReportRow]) -> list[Aggregate]:
    groups: dict[tuple[str, str], list[ReportRow]] = {}
    for row in rows:
        groups.setdefault((row.group or row.task, row.model), []).append(row)
    out = []
    for (task, model), group in groups.items():
        finished = [r for r in group if r.status == RunPhase.finished.value]
        scores = [r.score for r in finished if r.score is not None]
        out.append(
            Aggregate(
                task=task,
                model=model,
                runs=len(group),
                finished=len(finished),
                mean_score=statistics.fmean(scores) if scores else None,
                best_score=max(scores) if scores else None,
                std_score=statistics.stdev(scores) if len(scores) > 1 else (0.0 if scores else None),
                beat_baseline=sum(r.beat_baseline for r in finished),
                mean_completion=statistics.fmean([r.completion for r in finished]) if finished else 0.0,
                cost_usd=round(sum(r.cost_usd for r in group), 6),
            )
        )
    return out
