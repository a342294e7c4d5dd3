"""A run's harness under live control (`labkube runs`, docs/live-control.md): it reads its interventions
(labkube/interventions.py) from the control file (labkube/control.py `run_control_path`) about once a second and
acts on them.

- cancel, and pause with `now`: the run's task is cancelled at once (`Steering.halt` says why); the harness then
  grades the run as it stands (cancel) or leaves its last step's checkpoint to resume from (pause).
- pause: rg-agent stops at its next step boundary (`before_step` raises `RunPaused` once the step's checkpoint is
  saved); a vendor CLI or ARE's agent has no step boundary of labkube's, so it is paused at once.
- extend and message: applied by rg-agent before its next model call: the tracker's budgets change and the agent is
  told its new remaining budget; the operator's message is a user turn marked as the operator's.
- usage checkpoints: a run whose spend crossed the next multiple of `pause_every_usd` / `pause_every_hours` pauses at
  its step boundary; its supervisor records the checkpoint (the harness never writes the control file).

Every intervention the harness acts on is written once to the transcript (`{"type": "intervention", ...}`) and
counted in the run's telemetry; `Checkpoint.interventions_seen` keeps which, across resumes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from labkube.agent.messages import Message
from labkube.agent.transcript import now_iso
from labkube.budgets import Budgets
from labkube.control import ControlFile, run_control_path
from labkube.interventions import Intervention, InterventionKind, RunControl, pause_line

if TYPE_CHECKING:
    from labkube.agent.checkpoint import Checkpoint
    from labkube.agent.rg.loop import AgentRun
    from labkube.agent.telemetry import RunTelemetry
    from labkube.agent.transcript import JsonlLog
    from labkube.run_spec import RunSpec

POLL_S = 1.0
OPERATOR_PREFIX = "[Message from the operator of this run"

Halt = Literal["cancel", "pause"]


class RunPaused(BaseException):
    """The run pauses here: its checkpoint is saved; the harness exits with PAUSED_EXIT. A BaseException so that no
    `except Exception` on the way (a tool, the loop's harness-error branch) takes it for a failure."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class Steering:
    """The harness's view of its run's control file, re-read when it changes."""

    file: ControlFile
    halt: Halt | None = None

    @classmethod
    def of_run(cls, run_dir: Path, run_id: str) -> Steering:
        return cls(ControlFile(run_control_path(run_dir), run_id))

    @property
    def control(self) -> RunControl:
        """The control as last read."""
        return self.file.control

    def refresh(self) -> RunControl:
        """The control as the file says now."""
        return self.file.read()

    def halt_now(self, steps_itself: bool) -> Halt | None:
        """What must stop the run at once: a cancel; a pause with `now`, or any pause of a run with no step boundary
        of ours (`steps_itself` False)."""
        control = self.refresh()
        if control.cancelled is not None:
            return "cancel"
        pause = control.paused
        if pause is not None and (pause.now or not steps_itself):
            return "pause"
        return None

    async def watch(self, task: asyncio.Task, steps_itself: bool, every_s: float = POLL_S) -> None:
        """Cancel `task` (the run) when an intervention must stop it at once; `halt` says which."""
        while True:
            await asyncio.sleep(every_s)
            halt = self.halt_now(steps_itself)  # a stat, mostly: on the loop, as the step boundary's read is
            if halt is not None:
                self.halt = halt
                task.cancel()
                return


def record_interventions(
    control: RunControl, ckpt: Checkpoint, transcript: JsonlLog, telemetry: RunTelemetry | None, step: int
) -> list[Intervention]:
    """Write each intervention not yet written to the transcript (and count it); the new ones, oldest first."""
    new = [i for i in control.interventions if i.id not in ckpt.interventions_seen]
    for i in new:
        transcript.append(
            {
                "type": "intervention",
                "ts": now_iso(),
                "step": step,
                "id": i.id,
                "kind": i.kind.value,
                "at": i.at.isoformat(),
                "by": i.by,
                "reason": i.reason,
                "detail": i.describe(),
                **({"budgets": i.budgets.model_dump(exclude_none=True)} if i.budgets else {}),
                **({"message": i.message} if i.message is not None else {}),
            }
        )
        ckpt.interventions_seen.append(i.id)
        if telemetry is not None:
            telemetry.intervention(i.kind.value)
    return new


def operator_message(i: Intervention) -> Message:
    why = f"; {i.reason}" if i.reason else ""
    return Message(role="user", content=f"{OPERATOR_PREFIX} ({i.by}, {i.at:%Y-%m-%d %H:%M} UTC{why})]: {i.message}")


def make_before_step(
    steering: Steering, spec: RunSpec, base: Budgets, telemetry: RunTelemetry | None
) -> Callable[[AgentRun], None]:
    """rg-agent's hook before each step (agent/rg/loop.py `AgentRun.before_step`): the run's budgets as extended, the
    operator's messages, a pause at this step boundary, a usage checkpoint crossed."""

    def before_step(run: AgentRun) -> None:
        control = steering.refresh()
        ckpt = run.checkpoint
        new = record_interventions(control, ckpt, run.transcript, telemetry, ckpt.step)
        budgets = control.budgets(base)
        if budgets != run.tracker.budgets:
            run.tracker.budgets = budgets
            ckpt.last_reminder_at = 0.0  # the near-end warning is owed again against the new limits
            changed = [i for i in new if i.kind is InterventionKind.extend]
            why = "; ".join(i.reason for i in changed if i.reason)
            run.add_message(
                Message(
                    role="user",
                    content=f"{OPERATOR_PREFIX}]: your budget was changed{f' ({why})' if why else ''}. "
                    f"Remaining budget: {run.tracker.remaining_text()}.",
                )
            )
        for i in new:
            if i.kind is InterventionKind.message:
                run.add_message(operator_message(i))
        pause = control.paused
        if pause is not None and control.cancelled is None:
            raise RunPaused(pause_line(pause))
        due = control.due_checkpoint(run.tracker.spend, spec.pause_every_usd, spec.pause_every_hours)
        if due:  # its supervisor records it (the same crossing, from the status this step saved)
            crossed = Intervention(kind=InterventionKind.usage_checkpoint, by="labkube", crossed=due)
            raise RunPaused(pause_line(crossed))

    return before_step
