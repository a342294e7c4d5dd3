"""The outcome of one run (`result.json`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from labkube.budgets import Spend, StopReason
from labkube.interventions import Intervention
from labkube.run_spec import DEFAULT_AGENT, AgentName, RunPhase, RunSpec
from labkube.sandbox import SandboxMode


class SubtaskScore(BaseModel):
    id: str
    raw: float | None = Field(default=None, description="The metric as the grader reported it.")
    fraction_of_sota: float | None = None
    gap_closed: float | None = Field(default=None, description="(score - baseline) / (SOTA - baseline).")
    beat_baseline: bool | None = None
    implausible: str | None = Field(
        default=None,
        description="Why this value is shown but never counted: its fraction of SOTA lies outside 0-10x (a unit or "
        "scale mistake, most likely); beat_baseline is then null and the value is no run's score.",
    )

    @property
    def completed(self) -> bool:
        return self.raw is not None

    def without_value(self) -> SubtaskScore:
        return SubtaskScore(id=self.id)


def completion_of(subtasks: list[SubtaskScore]) -> float | None:
    """The fraction of subtasks the grader produced a valid number for; None when there are no subtasks to
    count (a grading that never ran)."""
    return sum(s.completed for s in subtasks) / len(subtasks) if subtasks else None


class Outcome(StrEnum):
    """How a run ended, for whoever reads its numbers. Exactly one per run.

    - `scored`: a grading succeeded and gave the headline subtask a value;
    - `no_value`: the grading ran cleanly but gave the headline subtask no value (the message says which
      subtask and what the grader printed);
    - `cancelled`: a person ended the run (`labkube runs cancel`); not the agent's failure nor labkube's, but not a
      measurement either: left out of every statistic and counted apart, its grading (when taken) kept in the score
      curve only;
    - an error outcome: the run's numbers are not a measurement of the agent, and every statistic over
      seeds leaves the run out (and says how many it left out).
    """

    scored = "scored"
    no_value = "no_value"
    grader_error = "grader_error"  # the task's grader exited non-zero or timed out
    judge_error = "judge_error"  # ARE's judge raised (an unreachable judge model, ...)
    world_error = "world_error"  # the Gaia2 world broke
    setup_error = "setup_error"  # the task environment could not be built, or the pristine task changed since
    # the campaign started (its grader is not the one the campaign pinned)
    model_error = "model_error"  # the model API refused the run (credentials, unknown model, ...)
    harness_error = "harness_error"  # labkube itself failed
    cancelled = "cancelled"  # a person cancelled the run (labkube runs cancel)

    @property
    def is_error(self) -> bool:
        return self not in (Outcome.scored, Outcome.no_value, Outcome.cancelled)

    @property
    def measured(self) -> bool:
        """The run's numbers measure the agent: scored or no_value (never an error, never a cancelled run)."""
        return self in (Outcome.scored, Outcome.no_value)


ERROR_OUTCOMES = tuple(o for o in Outcome if o.is_error)


class Grade(BaseModel):
    """One grading of a workspace."""

    at_seconds: float = Field(description="Charged wall time of the run when graded.")
    step: int = 0
    tokens: int = 0
    usd: float = 0.0
    subtasks: list[SubtaskScore] = Field(default_factory=list)
    score: float | None = Field(default=None, description="Headline number (primary subtask).")
    error: str | None = Field(default=None, description="Why this grading failed: the grader's exit and last lines.")
    note: str | None = Field(
        default=None,
        description="Why a clean grading left the headline subtask without a value, and any output it ignored (a "
        "summary this grading did not write).",
    )
    task_changed: bool = Field(
        default=False,
        description="The pristine task's files changed since the campaign started: nothing was graded (`error` "
        "names the files).",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What this grading saw and did not take as a value, beside the values it gave (also in `note`): "
        "rows the markdown parser could not read, a table the task names that the file lacks, a cell that is not a "
        "number, an error in the output of a grader that exited 0, output it did not write.",
    )
    values_before_error: list[SubtaskScore] = Field(
        default_factory=list,
        description="For a grading that failed (`error`): the values it had read all the same (a grader that wrote "
        "them, then exited non-zero), for debugging only; `subtasks` and `score` hold none.",
    )

    @model_validator(mode="after")
    def _no_values_from_a_failed_grading(self) -> Grade:
        """A failed grading measured nothing: what it read moves to `values_before_error` (results written before
        that field existed included)."""
        if self.error is not None:
            self.values_before_error = self.values_before_error or _with_values(self.subtasks)
            self.subtasks = [s.without_value() for s in self.subtasks]
            self.score = None
        return self


def _with_values(subtasks: list[SubtaskScore]) -> list[SubtaskScore]:
    """`subtasks` when any has a value, else none (an empty list says there was nothing to keep)."""
    return list(subtasks) if any(s.completed for s in subtasks) else []


GPU_USE_FILE = "gpu.json"  # a run's `GpuUse` while it runs, kept up to date by the agent's GPU meter


class GpuPoint(BaseModel):
    """One sample of the run's GPUs: utilisation averaged over them, memory summed."""

    at_seconds: float = Field(description="Seconds since the run's agent first started (wall clock).")
    utilization: float = Field(ge=0, le=1, description="Fraction of NVML's sample period a kernel ran.")
    memory_used_bytes: int = Field(ge=0)


class GpuUse(BaseModel):
    """A run's GPU use over its life (`agent/harness/gpu.py`), for reports: mean utilisation and peak memory."""

    devices: list[str] = Field(description="The run's GPUs as CUDA_VISIBLE_DEVICES named them.")
    samples: int = 0
    utilization_sum: float = Field(default=0.0, description="Sum of the samples' utilisation (for the mean).")
    peak_memory_bytes: int = 0
    memory_total_bytes: int | None = Field(default=None, description="Memory of the run's GPUs together.")
    curve: list[GpuPoint] = Field(default_factory=list, description="The samples, thinned to at most a few hundred.")

    @property
    def mean_utilization(self) -> float | None:
        return self.utilization_sum / self.samples if self.samples else None


# How every report labels a score curve whose periodic gradings ran in the agent's pod (`score_curve_source`).
AGENT_POD_CURVE_LABEL = "the agent pod's own gradings — not the referee's"


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
    outcome: Outcome | None = Field(
        default=None, description="scored, no_value or an error outcome; derived for results written before it."
    )
    error: str | None = Field(default=None, description="For an error outcome: what failed, with its last lines.")
    message: str | None = Field(
        default=None,
        description="A note beside the numbers: for no_value, which subtask has no value and what the grader "
        "printed; an integrity audit that could not run.",
    )
    score: float | None = None
    primary_scores: dict[str, float | None] = Field(
        default_factory=dict,
        description="The score of each primary group the task tags (cross-modal retrieval: `Flickr`, `person "
        "Re-ID`), as `score` is the primary subtask's; None where the grading gave the group no value.",
    )
    beat_baseline: bool | None = Field(default=None, description="None when the headline subtask has no value.")
    completion: float | None = Field(
        default=None, description="Fraction of subtasks with a valid number; None when no grading completed."
    )
    subtasks: list[SubtaskScore] = Field(default_factory=list)
    spend: Spend = Field(default_factory=Spend)
    score_curve: list[Grade] = Field(default_factory=list)
    # Results written before this field existed read as "referee": right for local runs (the sandbox keeps the
    # agent from the periodic grader), not for one an older labkube finalized in a Kubernetes grading pod, whose
    # curve came from the agent's checkpoint as well; such a result cannot be told apart from its file alone.
    score_curve_source: Literal["referee", "agent_pod"] = Field(
        default="referee",
        description="Who ran the periodic gradings of `score_curve`: `referee` (labkube, out of the agent's reach: "
        "a local run's sandbox) or `agent_pod` (a Kubernetes run: they ran inside the agent's pod and the grading "
        "pod copied them from the agent-writable checkpoint, so they are the agent's own claim, labelled so in every "
        "report). The final grading (the last point, and `score`) is the grading pod's own either way.",
    )
    integrity_verdict: str | None = None
    sandbox: SandboxMode | None = Field(
        default=None, description="Where the agent's processes ran: bwrap, none (unsandboxed) or pod; None: unknown."
    )
    flagged_score: float | None = Field(
        default=None,
        description="The headline subtask's fraction of SOTA when it was flagged as implausible (outside 0-10x: "
        "a unit or scale mistake, most likely): shown, never averaged; the outcome is then no_value, `score` null.",
    )
    values_before_error: list[SubtaskScore] = Field(
        default_factory=list,
        description="For an error outcome: the values the final grading read before the run failed (a grader that "
        "wrote them, then exited non-zero; a grading after the model API failed), for debugging only. An error "
        "outcome carries no score: `score`, `beat_baseline`, `completion`, `primary_scores` and every subtask's "
        "values are null.",
    )
    capabilities: list[str] = Field(default_factory=list, description="Gaia2 capability tags.")
    details: dict[str, Any] = Field(default_factory=dict, description="Family-specific outcome (Gaia2 judge).")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    resumes: int = 0
    setup_seconds: float | None = Field(
        default=None,
        description="Time the sandbox spent on the task environment before the agent started (not charged to it).",
    )
    gpu: GpuUse | None = Field(
        default=None, description="What the run's GPUs did (NVML samples); None: the run had no GPU to sample."
    )
    interventions: list[Intervention] = Field(
        default_factory=list,
        description="What people did to the run while it ran (`labkube runs`: cancel, pause, resume, extend, "
        "message; labkube's usage checkpoints), oldest first: a run with any is marked in every report and export.",
    )

    @classmethod
    def of_run(cls, spec: RunSpec, **fields: Any) -> RunResult:
        """A result of run `spec`: its identity (id, task, model, agent, seed) from the spec, the rest given."""
        identity = {"run_id": spec.run_id, "task": spec.task, "model": spec.model, "agent": spec.agent}
        return cls(**identity, seed=spec.seed, sandbox=spec.sandbox, **fields)

    @property
    def final(self) -> bool:
        return self.status.final

    @property
    def is_error(self) -> bool:
        return self.outcome is not None and self.outcome.is_error

    @property
    def measured(self) -> bool:
        """Its numbers measure the agent (`Outcome.measured`): what every statistic counts."""
        return self.outcome is not None and self.outcome.measured

    @property
    def intervened(self) -> bool:
        """A person (or a usage checkpoint) touched the run while it ran."""
        return bool(self.interventions)

    @property
    def curve_is_agent_claim(self) -> bool:
        """The periodic gradings of `score_curve` ran in the agent's pod: its own claim, never the referee's."""
        return self.score_curve_source == "agent_pod"

    @model_validator(mode="after")
    def _derive_outcome(self) -> RunResult:
        """Results written before outcomes existed: derived from how the run stopped and what it scored."""
        if self.outcome is None:
            last = self.score_curve[-1] if self.score_curve else None
            failed = last is not None and last.error is not None
            self.outcome = outcome_for(self.stop_reason, self.status, grader_failed=failed, score=self.score)
        if not self.outcome.measured:
            self._drop_the_score()
        return self

    def _drop_the_score(self) -> None:
        """An error outcome's numbers measure a failure, not the agent, and a cancelled run's measure a run a person
        ended: none is kept where a reader takes a score from (results written before this rule included); the graded
        values move to `values_before_error` (and stay in the score curve's last point)."""
        self.values_before_error = self.values_before_error or _with_values(self.subtasks)
        self.subtasks = [s.without_value() for s in self.subtasks]
        self.score = None
        self.flagged_score = None
        self.beat_baseline = None
        self.completion = None
        self.primary_scores = dict.fromkeys(self.primary_scores)


_STOP_OUTCOMES = {
    StopReason.cancelled: Outcome.cancelled,
    StopReason.setup_error: Outcome.setup_error,
    StopReason.world_error: Outcome.world_error,
    StopReason.model_error: Outcome.model_error,
    StopReason.auth: Outcome.model_error,
    StopReason.error: Outcome.harness_error,
}


def outcome_for(
    stop_reason: StopReason | None,
    status: RunPhase,
    *,
    grader_failed: bool,
    score: float | None,
    judge_failed: bool = False,
    task_changed: bool = False,
) -> Outcome:
    """The one outcome of a run: the failure that makes its numbers meaningless first, then whether the grading
    gave a value. A pristine task that changed since the campaign started voids the run whatever else happened."""
    if task_changed:
        return Outcome.setup_error
    if stop_reason in _STOP_OUTCOMES:
        return _STOP_OUTCOMES[stop_reason]
    if grader_failed:
        return Outcome.grader_error
    if judge_failed:
        return Outcome.judge_error
    if status is RunPhase.failed:
        return Outcome.harness_error
    return Outcome.scored if score is not None else Outcome.no_value


# -- a result as a pod's termination message ------------------------------------------------------

TERMINATION_MESSAGE_LIMIT = 4096  # bytes Kubernetes keeps of a container's termination message
_REPORT_KEY = "labkube.result/v1"


def termination_report(result: RunResult) -> str:
    """`result` as the agent container's termination message: how the operator learns a run's outcome when
    it does not share the pod's volume (another namespace, an emptyDir or a claim per run).

    The score curve, family details and the values a failed run's grader wrote (`values_before_error`, kept for
    debugging) stay in the pod's `result.json`; subtasks and the error are dropped or cut, in that order, until the
    report fits Kubernetes' 4096-byte limit.
    """
    slim = result.model_copy(update={"score_curve": [], "details": {}, "values_before_error": []})
    error, message = (result.error or "")[-300:] or None, (result.message or "")[:300] or None
    cut = {"subtasks": [], "error": error, "message": message}
    for update in ({}, {"subtasks": []}, cut):
        text = _report_text(slim.model_copy(update=update))
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
            return text
    return _report_text(slim.model_copy(update={"subtasks": [], "error": None, "message": None, "capabilities": []}))


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
