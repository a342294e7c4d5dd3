"""One run: a task, a model and a seed, with its budgets; and its live status."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from labkube.budgets import Budgets, Spend, StopReason
from labkube.interventions import Intervention
from labkube.sandbox import SandboxMode
from labkube.task_card import TaskFamily

JUDGE_MODEL_HELP = (
    "Gaia2: model for ARE's soft (LLM) judge checks; without one ARE's judge runs its hard checks only. "
    "Its dollars are its own (gaia2_judge_budget_usd), apart from the agent's and the inspector's."
)
JUDGE_BUDGET_HELP = (
    "Gaia2: ARE's soft judge's own dollar budget per run (default: none); a judge that would pass it stops "
    "judging and the run is a judge_error."
)
# The Gaia2 world validates a run within WORLD_VALIDATION_LIMIT_S (else the run is a world_error); the judge model's own
# time-out must be shorter, so that a judge that never answers is a judge_error. The world keeps the same numbers
# (tasks/gaia2/world_protocol.py: it runs in ARE's environment, without labkube).
WORLD_VALIDATION_LIMIT_S = 300.0
DEFAULT_JUDGE_TIMEOUT_S = 120.0
JUDGE_TIMEOUT_HELP = (
    f"Gaia2: seconds ARE's soft judge model may take to answer one check (default {DEFAULT_JUDGE_TIMEOUT_S:.0f}, "
    f"below the world's {WORLD_VALIDATION_LIMIT_S:.0f} s for validating a run); a judge that does not answer in time "
    "is a judge_error."
)
PAUSE_EVERY_USD_HELP = (
    "A usage checkpoint: each run pauses when its model spend crosses the next multiple of this many dollars, until a "
    "person resumes or extends it (labkube runs resume|extend)."
)
PAUSE_EVERY_HOURS_HELP = (
    "A usage checkpoint: each run pauses when its charged wall time crosses the next multiple of this many hours, "
    "until a person resumes or extends it."
)
INSPECTOR_MODEL_HELP = "Model for the LLM integrity inspector (the rule checks always run)."
INSPECTOR_BUDGET_HELP = "The integrity inspector's own dollar budget per run."


def before_judge_split(data: Any) -> Any:
    """A run.json or campaign.json written before the judge split (issue #23) had `judge_model` drive both the
    integrity inspector and ARE's soft judge, and `judge_budget_usd` be the inspector's budget. Every such file
    holds `judge_budget_usd` (they are full dumps), which no longer exists: read with it, it keeps its meaning.
    A campaign file that names only `judge_model` gets ARE's judge and no inspector."""
    if not isinstance(data, dict) or "judge_budget_usd" not in data or "inspector_model" in data:
        return data
    legacy = {k: v for k, v in data.items() if k != "judge_budget_usd"}
    legacy["inspector_model"] = data.get("judge_model")
    legacy.setdefault("inspector_budget_usd", data["judge_budget_usd"])
    return legacy


AgentName = Literal["rg-agent", "are-default", "claude-code", "codex"]
CLI_AGENTS = ("claude-code", "codex")  # third-party CLIs, run through the model gateway
DEFAULT_AGENT = "rg-agent"


RUN_SPEC_VARIABLE = "LABKUBE_RUN_SPEC"  # a pod's containers get the Run's spec as JSON in this variable

CLUSTER_ACCOUNT_VARIABLE = "LABKUBE_CLUSTER_ACCOUNT"  # a grading pod gets the operator's account of the run


class ClusterAccount(BaseModel):
    """What the operator saw of a run on a cluster, from sources the agent's container cannot write: given to the
    grading pod (`CLUSTER_ACCOUNT_VARIABLE`), which charges the run with it instead of the checkpoint's account."""

    model_config = ConfigDict(extra="forbid")

    spend: Spend | None = Field(
        description="The gateway sidecars' reports (the Run's `clusterSpend`); None: no gateway reported (a "
        "scripted model, which calls no API)."
    )
    wall_seconds: float = Field(ge=0, description="The run's pods' time as the API reported it (the GPU ledger).")
    attempts: int = Field(ge=0, description="Agent pods started.")
    budget_stop: StopReason | None = Field(default=None, description="The budget a gateway refused calls for.")
    interventions: list[Intervention] = Field(
        default_factory=list,
        description="The Run's `spec.interventions` (labkube runs, kubectl patch): the result's record of them, and a "
        "cancel among them makes the outcome `cancelled` whatever the agent's checkpoint says.",
    )


class RunSpec(BaseModel):
    """What the supervisor hands a sandbox; written as `run.json`."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    campaign: str
    task: str = Field(description="Task reference as the campaign names it.")
    task_path: str = Field(description="Pristine task directory the workspace is copied from.")
    task_id: str | None = Field(default=None, description="The question within a dataset (GAIA).")
    family: TaskFamily = Field(default=TaskFamily.researchgym, description="Task family; gaia2 runs get a world.")
    group: str = Field(default="", description="What reports aggregate by: the task, or a GAIA level.")
    model: str
    agent: AgentName = Field(
        default=DEFAULT_AGENT, description="The scaffold: rg-agent, or ARE's own default agent (Gaia2 only)."
    )
    seed: int = Field(ge=0)
    budgets: Budgets = Field(default_factory=Budgets)
    idea_hint: bool = False
    grade_interval_s: float | None = Field(default=None, gt=0)
    prices: dict[str, tuple[float, ...]] = Field(
        default_factory=dict, description="Per-model USD per million (input, output) tokens; overrides."
    )
    gpus: int = Field(default=0, ge=0)
    gaia2_noise: bool = Field(
        default=False, description="Gaia2: ARE's noise augmentation (tool failures, extra events), seeded."
    )
    gaia2_a2a: float = Field(
        default=0.0, ge=0, le=1, description="Gaia2: share of apps ARE turns into app agents (agent2agent), seeded."
    )
    gaia2_a2a_model: str | None = Field(
        default=None, description="Gaia2: model for the agent2agent app agents (default: the run's model)."
    )
    think_time_s: float | None = Field(
        default=None, ge=0, description="Gaia2: simulated seconds charged per model call (default: as measured)."
    )
    context_threshold: int | None = Field(
        default=None,
        gt=0,
        description="Hand off when the context passes this many tokens (default: 3/4 of the window).",
    )
    model_timeout_s: float = Field(default=900.0, gt=0, description="Per model call; a time-out is retried.")
    judge_model: str | None = Field(default=None, description=JUDGE_MODEL_HELP)
    gaia2_judge_budget_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=JUDGE_BUDGET_HELP)
    gaia2_judge_timeout_s: float = Field(
        default=DEFAULT_JUDGE_TIMEOUT_S, gt=0, lt=WORLD_VALIDATION_LIMIT_S, description=JUDGE_TIMEOUT_HELP
    )
    inspector_model: str | None = Field(default=None, description=INSPECTOR_MODEL_HELP)
    inspector_budget_usd: float = Field(default=1.0, gt=0, description=INSPECTOR_BUDGET_HELP)
    api_key_env: dict[str, str] = Field(
        default_factory=dict, description="Model string -> environment variable holding its API key."
    )
    sandbox: SandboxMode = Field(
        default=SandboxMode.bwrap,
        description="Where the agent's processes run: bwrap (a local sandbox per run), none (unsandboxed, the "
        "user's choice: marked in every report), pod (a cluster: the agent's container is the room).",
    )
    task_overlay: dict[str, Any] | None = Field(
        default=None,
        description="The labkube.yaml mapping the campaign merges over the task's own (its `task_overlays` "
        "entry): the planner, the agent, the grader and the audit all load the task card with it.",
    )
    task_digest: str | None = Field(
        default=None,
        description="Digest of the pristine task's files (sha256 of its manifest: each file's path, mode and sha256), "
        "pinned when the campaign started; a grading that finds the task changed fails, naming the files.",
    )
    pause_every_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=PAUSE_EVERY_USD_HELP)
    pause_every_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=PAUSE_EVERY_HOURS_HELP)

    @model_validator(mode="before")
    @classmethod
    def _written_before_the_judge_split(cls, data: Any) -> Any:
        return before_judge_split(data)


class RunPhase(StrEnum):
    pending = "Pending"
    starting = "Starting"
    running = "Running"
    grading = "Grading"
    paused = "Paused"  # a person paused it (or a usage checkpoint did): saved, its slot and GPUs free, not charged
    finished = "Finished"  # reached a final state by itself or by a budget
    failed = "Failed"  # harness error

    @property
    def final(self) -> bool:
        return self in (RunPhase.finished, RunPhase.failed)


class RunStatus(BaseModel):
    """Live progress of one run, written by the agent after every step (`status.json`)."""

    run_id: str
    phase: RunPhase = RunPhase.pending
    step: int = 0
    score: float | None = None
    spend: Spend = Field(default_factory=Spend)
    stop_reason: StopReason | None = None
    message: str = ""
    updated_at: datetime | None = None
    attempts: int = 0


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str) -> str:
    """A filesystem- and label-safe form of a task or model name."""
    return _SLUG.sub("-", text).strip("-.").lower()[:60] or "x"


def make_run_id(task: str, model: str, seed: int, agent: str = DEFAULT_AGENT) -> str:
    parts = [p for p in task.rstrip("/").split("/") if p]
    name = "-".join(parts[-2:]) if parts and parts[0] == "gaia" else (parts[-1] if parts else task)
    scaffold = "" if agent == DEFAULT_AGENT else f"--{agent}"
    return f"{slug(name)}--{slug(model)}{scaffold}--s{seed}"


def scaffold_label(agent: str, model: str) -> str:
    """What reports compare: the model, and the scaffold when it is not rg-agent."""
    return model if agent == DEFAULT_AGENT else f"{model} ({agent})"
