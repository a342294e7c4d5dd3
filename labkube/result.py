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
    agent: AgentName = Field(
        default=DEFAULT_AGENT, description="The scaffold that ran: rg-agent, are-default, claude-code or codex."
    )
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
    setup_seconds: float | None = Field(
        default=None,
        description="Time the sandbox spent on the task environment before the agent started (not charged to it).",
    )

    @property
    def final(self) -> bool:
        return self.status.final


# -- a result as a pod's termination message ------------------------------------------------------

TERMINATION_MESSAGE_LIMIT = 4096  # bytes Kubernetes keeps of a container's termination message
_REPORT_KEY = "labkube.result/v1"


def termination_report(result: RunResult) -> str:
    """`result` as the agent container's termination message: how the operator learns a run's outcome when
    it does not share the pod's volume (another namespace, an emptyDir or a claim per run).

    The score curve and family details stay in the pod's `result.json`; subtasks and the error are dropped or
    cut, in that order, until the report fits Kubernetes' 4096-byte limit.
    """
    slim = result.model_copy(update={"score_curve": [], "details": {}})
    for update in ({}, {"subtasks": []}, {"subtasks": [], "error": (result.error or "")[:300] or None}):
        text = _report_text(slim.model_copy(update=update))
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
            return text
    return _report_text(slim.model_copy(update={"subtasks": [], "error": None, "capabilities": []}))


def _report_text(result: RunResult) -> str:
    import json

    return json.dumps({_REPORT_KEY: result.model_dump(mode="json", exclude_defaults=True)}, separators=(",", ":"))


def result_from_report(text: str | None) -> RunResult | None:
    """The `RunResult` in a termination message written by `termination_report`; None when the message is
    anything else (the tail of the container's log, with `FallbackToLogsOnError`)."""
    import json

    from pydantic import ValidationError

    try:
        data = json.loads(text or "")
        return RunResult.model_validate(data[_REPORT_KEY])
    except (ValueError, TypeError, KeyError, ValidationError):
        return None
