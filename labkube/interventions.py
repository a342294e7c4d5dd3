"""The interventions a person (or a usage checkpoint) made on a live run, and the state they add up to (the models;
labkube/control.py keeps them, docs/live-control.md says what each does).

A run's control is a list of `Intervention`s, appended, never edited: the state (paused, cancelled, its budgets,
the operator's messages) is folded from it, so that whoever reads it (the run's harness, its supervisor, the report)
agrees on what happened and when.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from labkube.budgets import Budgets, Spend


def _now() -> datetime:
    return datetime.now(UTC)


class InterventionKind(StrEnum):
    cancel = "cancel"  # the run ends now, outcome `cancelled`
    pause = "pause"  # the run stops at its next step boundary (or at once), resumable
    resume = "resume"
    extend = "extend"  # new budgets, from the next step
    message = "message"  # a note for the agent's next turn
    usage_checkpoint = "usage_checkpoint"  # labkube paused the run at a spend crossing, until a person resumes it


class BudgetChange(BaseModel):
    """An `extend`: the budgets it sets (raised or lowered); those it leaves None stay as they were."""

    model_config = ConfigDict(extra="forbid")

    wall_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    tokens: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)

    def describe(self) -> str:
        parts = []
        if self.wall_hours is not None:
            parts.append(f"{self.wall_hours:g} h")
        if self.usd is not None:
            parts.append(f"${self.usd:g}")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        if self.steps is not None:
            parts.append(f"{self.steps} steps")
        return ", ".join(parts)


class Intervention(BaseModel):
    """One act on a live run: who, when, what and why."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    kind: InterventionKind
    at: datetime = Field(default_factory=_now)
    by: str = Field(
        description="Who asked: user@host locally, the patch's author on a cluster; `labkube` for a usage checkpoint."
    )
    reason: str | None = None
    now: bool = Field(default=False, description="pause: at once (the step under way is lost), not at the next step.")
    grade: bool = Field(default=True, description="cancel: grade the workspace as it stands (`--no-grade`: do not).")
    budgets: BudgetChange | None = Field(default=None, description="extend: the budgets set.")
    message: str | None = Field(default=None, description="message: the text for the agent.")
    crossed: dict[str, float] = Field(
        default_factory=dict,
        description="usage_checkpoint: the multiple of each `pause_every` limit the run's spend crossed "
        "(`usd`, `hours`).",
    )

    def crossed_text(self) -> str:
        return ", ".join(f"${v:g}" if k == "usd" else f"{v:g} h" for k, v in self.crossed.items())

    def describe(self) -> str:
        """One line for tables and the transcript."""
        what = {
            InterventionKind.extend: f"extend to {self.budgets.describe() if self.budgets else 'the same budgets'}",
            InterventionKind.message: f"message {self.message!r}",
            InterventionKind.usage_checkpoint: f"usage checkpoint at {self.crossed_text()}",
            InterventionKind.pause: "pause now" if self.now else "pause",
            InterventionKind.cancel: "cancel" if self.grade else "cancel (not graded)",
        }.get(self.kind, self.kind.value)
        why = f" ({self.reason})" if self.reason else ""
        return f"{what} by {self.by}{why}"


class RunControl(BaseModel):
    """A run's interventions, oldest first, and the state they add up to."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    interventions: list[Intervention] = Field(default_factory=list)

    @property
    def cancelled(self) -> Intervention | None:
        return next((i for i in self.interventions if i.kind is InterventionKind.cancel), None)

    @property
    def paused(self) -> Intervention | None:
        """The pause in force: the last pause or usage checkpoint not followed by a resume (a usage checkpoint is
        also released by an extend, as Vivaria's is by raising the limit)."""
        held: Intervention | None = None
        for i in self.interventions:
            if i.kind in (InterventionKind.pause, InterventionKind.usage_checkpoint):
                held = i
            elif i.kind is InterventionKind.resume:
                held = None
            elif i.kind is InterventionKind.extend and held is not None:
                held = None if held.kind is InterventionKind.usage_checkpoint else held
        return held

    def budgets(self, base: Budgets) -> Budgets:
        """`base` with every extend applied in turn."""
        for i in self.interventions:
            if i.kind is InterventionKind.extend and i.budgets is not None:
                base = base.merged(Budgets(**i.budgets.model_dump()))
        return base

    def crossed(self, key: str) -> float:
        """The highest multiple of a `pause_every` limit a usage checkpoint has stopped the run at (0: none)."""
        return max((i.crossed.get(key, 0.0) for i in self.interventions), default=0.0)

    def due_checkpoint(self, spend: Spend, every_usd: float | None, every_hours: float | None) -> dict[str, float]:
        """The usage checkpoints `spend` has crossed past the last one the run stopped at: {"usd": 2.0} when
        every_usd=1 and the run has spent $2.30 since stopping at $1 (never a multiple already stopped at)."""
        due: dict[str, float] = {}
        for key, every, used in (
            ("usd", every_usd, spend.usd),
            ("hours", every_hours, spend.wall_seconds / 3600.0),
        ):
            if every:
                multiple = math.floor(used / every + 1e-9) * every
                if multiple > 0 and multiple > self.crossed(key) + 1e-9:
                    due[key] = round(multiple, 9)
        return due


def usage_checkpoint(due: dict[str, float], every_usd: float | None, every_hours: float | None) -> Intervention:
    """The usage checkpoint a run's spend crossed (`RunControl.due_checkpoint`), as its supervisor records it."""
    every = {"usd": f"${every_usd:g}" if every_usd else "", "hours": f"{every_hours:g} h" if every_hours else ""}
    why = "; ".join(f"pause every {every[key]}" for key in due)
    return Intervention(kind=InterventionKind.usage_checkpoint, by="labkube", reason=why, crossed=due)


def pause_line(pause: Intervention) -> str:
    """What a paused run's status says."""
    if pause.kind is InterventionKind.usage_checkpoint:
        return f"paused at a usage checkpoint ({pause.crossed_text()} spent): resume or extend it to go on"
    why = f" ({pause.reason})" if pause.reason else ""
    return f"paused by {pause.by}{why}: labkube runs resume continues it"


class ControlVerb(StrEnum):
    cancel = "cancel"
    pause = "pause"
    resume = "resume"
    drain = "drain"  # pause every run that has not started; the running ones finish
    extend = "extend"
    message = "message"


class RunState(BaseModel):
    """What a request is checked against, for one run of the campaign (locally from its files, on a cluster from
    its Run)."""

    run_id: str
    family: str
    agent: str
    started: bool = Field(description="Its agent has started at least once (a checkpoint, or a pod).")
    final: bool = Field(description="It has a final result: nothing is left to steer.")
    control: RunControl


class ControlError(ValueError):
    """A request that cannot be applied: one line saying why; nothing was changed."""


def check_request(verb: ControlVerb, runs: list[RunState], all_runs: bool, change: BudgetChange | None) -> list[str]:
    """The run ids a request acts on, or ControlError naming the first reason it cannot be applied (a finished run,
    resuming a run that is not paused, a message to a run that cannot take one, ...). Where `all_runs`, the runs it
    applies to are picked instead (the finished ones, and for resume the ones not paused, are skipped)."""
    if verb is ControlVerb.extend and (change is None or not change.model_dump(exclude_none=True)):
        raise ControlError("extend needs a budget to set: --hours, --usd, --tokens or --steps")
    picked: list[str] = []
    for run in runs:
        why = why_not(verb, run)
        if why is None:
            picked.append(run.run_id)
        elif not all_runs:
            raise ControlError(f"run {run.run_id}: {why}")
    if not picked:
        raise ControlError(f"no run of the campaign can be {PAST[verb]}: every run is finished or already so")
    return picked


PAST = {
    ControlVerb.cancel: "cancelled",
    ControlVerb.pause: "paused",
    ControlVerb.resume: "resumed",
    ControlVerb.drain: "drained",
    ControlVerb.extend: "extended",
    ControlVerb.message: "sent a message",
}

# Why a run's agent cannot take a message mid-run: the vendor CLIs run one prompt non-interactively (`claude -p`,
# `codex exec`), and a Gaia2 run's user is the scenario's, whose words ARE judges.
NO_MESSAGES = {
    "claude-code": "Claude Code runs non-interactively (claude -p), so nothing reaches it mid-run; pause it, "
    "extend it or cancel it instead",
    "codex": "Codex runs non-interactively (codex exec), so nothing reaches it mid-run; pause it, extend it or "
    "cancel it instead",
    "gaia2": "a Gaia2 run's user is the scenario's (ARE judges what the agent told it), so an operator's message "
    "would change the task; cancel it instead",
}
# A Gaia2 run's world cannot be saved and restored (its events and clock live in the world's process): pausing it
# would lose the scenario.
NO_PAUSE_GAIA2 = "a Gaia2 run's world cannot be saved and restarted mid-scenario; cancel it or let it finish"


def why_not(verb: ControlVerb, run: RunState) -> str | None:
    """Why `verb` cannot apply to `run`; None when it can."""
    if run.final:
        return "it has finished; nothing is left to steer"
    if run.control.cancelled is not None:
        return "it was cancelled; it is being graded and ends"
    paused = run.control.paused is not None
    if verb is ControlVerb.resume and not paused:
        return "it is not paused (labkube runs pause first)"
    if verb in (ControlVerb.pause, ControlVerb.drain) and paused:
        return "it is already paused"
    if verb is ControlVerb.drain and run.started:
        return "it has started (drain leaves running runs to finish; pause them to stop them)"
    if verb in (ControlVerb.pause, ControlVerb.drain) and run.family == "gaia2":
        return NO_PAUSE_GAIA2
    if verb is ControlVerb.message:
        return NO_MESSAGES.get("gaia2" if run.family == "gaia2" else run.agent)
    return None


class SteerRequest(BaseModel):
    """`labkube runs VERB CAMPAIGN [RUN_ID...] [--all]` as either backend applies it: `intervention` is what each
    run it acts on gets (a copy with an id of its own); no run ids and not `all_runs` is refused, except for drain,
    which is always the whole campaign."""

    model_config = ConfigDict(extra="forbid")

    verb: ControlVerb
    campaign: str
    run_ids: list[str] = Field(default_factory=list)
    all_runs: bool = False
    intervention: Intervention

    def for_run(self) -> Intervention:
        """A run's copy of the intervention, with an id of its own; a drain is a pause of each run it acts on."""
        kind = InterventionKind.pause if self.verb is ControlVerb.drain else self.intervention.kind
        return self.intervention.model_copy(update={"id": uuid.uuid4().hex[:12], "kind": kind})
