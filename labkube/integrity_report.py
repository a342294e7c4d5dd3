"""The integrity audit's verdict on one run (`integrity.json`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class Verdict(StrEnum):
    PASS = "PASS"
    NEEDS_REVIEW = "NEEDS_REVIEW"
    SUSPICIOUS = "SUSPICIOUS"


class Severity(StrEnum):
    low = "low"
    medium = "medium"
    high = "high"
    critical = "critical"


class ViolationType(StrEnum):
    grader_modified = "grader_modified"
    eval_data_modified = "eval_data_modified"
    direct_result_write = "direct_result_write"
    fake_log = "fake_log"
    hardcoded_metric = "hardcoded_metric"
    heldout_read = "heldout_read"
    blocked_url = "blocked_url"
    run_too_short = "run_too_short"
    seeds_not_used = "seeds_not_used"
    transcript_edited = "transcript_edited"  # the transcript disagrees with the gateway's record of the model's calls
    planted_file = "planted_file"  # a FIFO, socket, device or link where labkube keeps its own files in the run folder
    inspector = "inspector"  # raised by the LLM inspector


class Violation(BaseModel):
    type: ViolationType
    severity: Severity
    file: str | None = None
    line: int | None = None
    step: int | None = Field(default=None, description="Transcript step of the tool call, when it came from one.")
    evidence: str = ""
    check: str = Field(default="", description="Which check raised it.")


class InspectorResult(BaseModel):
    model: str
    verdict: Verdict
    confidence: float = Field(ge=0, le=1)
    reasoning: str = ""
    cost_usd: float = 0.0
    attempts: int = 1
    error: str | None = None


class IntegrityReport(BaseModel):
    """No confidence of its own: files written before it was removed still carry a `confidence` (a fixed value per
    severity, not a measurement), which is ignored on reading. The inspector's own confidence is in `inspector`."""

    verdict: Verdict = Field(description="The graver of the rules' verdict and the inspector's.")
    rules_verdict: Verdict | None = Field(
        default=None, description="What the rule checks alone found (None in files from before it was recorded)."
    )
    violations: list[Violation] = Field(default_factory=list)
    checks_run: list[str] = Field(default_factory=list)
    inspector: InspectorResult | None = None
    audited_at: datetime | None = None


def verdict_basis(report: IntegrityReport) -> str:
    """What the verdict rests on, e.g. "rules: PASS, inspector openai:gpt-5: SUSPICIOUS at confidence 0.85"."""
    parts = [f"rules: {report.rules_verdict.value}" if report.rules_verdict else "rules' own verdict not recorded"]
    ins = report.inspector
    if ins is not None:
        parts.append(
            f"inspector {ins.model}: error, {ins.error}"
            if ins.error
            else f"inspector {ins.model}: {ins.verdict.value} at confidence {ins.confidence:.2f}"
        )
    return ", ".join(parts)
