"""The outcome of one run (`result.json`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from labkube.budgets import Spend, StopReason
from labkube.run_spec import DEFAULT_AGENT, AgentName, RunPhase


class SubtaskScore(BaseModel):
    id: str
    raw: float | None = Field(default=None, description="The metric as the grader reported it.")
    fraction_of_sota: float | None = None
    gap_closed: float | None = Field(default=None, description="(score - baseline) / (SOTA - baseline).")
    beat_baseline: bool | None = None

    @property
    def completed(self) -> bool:
        return self.raw is not None


def completion_of(subtasks: list[SubtaskScore]) -> float:
    """The fraction of subtasks the grader produced a valid number for."""
    return sum(s.completed for s in subtasks) / len(subtasks) if subtasks else 0.0


class Grade(BaseModel):
    """One grading of a workspace."""

    at_seconds: float = Field(description="Charged wall time of the run when graded.")
    step: int = 0
    tokens: int = 0
    usd: float = 0.0
    subtasks: list[SubtaskScore] = Field(default_factory=list)
    score: float | None = Field(default=None, description="Headline number (primary subtask).")
    error: str | None = None


class RunResult(BaseModel):
    run_id: str
    task: str
    model: str
    agent: AgentName = Field(default=DEFAULT_AGENT, description="The scaffold that ran: rg-agent or are-default.")
    seed: int
    status: RunPhase
    stop_reason: StopReason | None = None
    error: str | None = None
    score: float | None = None
    beat_baseline: bool = False
    completion: float = Field(default=0.0, description="Fraction of subtasks with a valid number.")
    subtasks: list[SubtaskScore] = Field(default_factory=list)
    spend: Spend = Field(default_factory=Spend)
    score_curve: list[Grade] = Field(default_factory=list)
    integrity_verdict: str | None = None
    capabilities: list[str] = Field(default_factory=list, description="Gaia2 capability tags.")
    details: dict[str, Any] = Field(default_factory=dict, description="Family-specific outcome (Gaia2 judge).")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    resumes: int = 0

    @property
    def final(self) -> bool:
        return self.status.final
