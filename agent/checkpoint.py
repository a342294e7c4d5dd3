"""The agent's state after its last completed step (`checkpoint.json`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from labkube.agent.jobs import JobRecord
from labkube.budgets import Spend, StopReason
from labkube.result import Grade


class Checkpoint(BaseModel):
    started_at: datetime | None = None
    step: int = 0
    spend: Spend = Field(default_factory=Spend)
    provider_state: dict[str, Any] = Field(default_factory=dict)
    transcript_offset: int = 0
    conversation_offset: int = 0
    epoch_start_offset: int = Field(default=0, description="Where the current conversation (after hand-offs) starts.")
    summaries: list[str] = Field(default_factory=list, description="Hand-off summaries so far.")
    score_curve: list[Grade] = Field(default_factory=list)
    last_grade_at: float = 0.0
    last_reminder_at: float = 0.0
    ended: bool = False
    end_summary: str = ""
    stop_reason: StopReason | None = None
    resumes: int = 0
    jobs: list[JobRecord] = Field(default_factory=list)
    world_verdict: dict[str, Any] | None = Field(default=None, description="ARE's validation of a Gaia2 run.")
    interventions_seen: list[str] = Field(
        default_factory=list,
        description="The interventions (labkube/interventions.py) this run's harness has applied and written to the "
        "transcript: each once, a message delivered once, across resumes.",
    )
