"""rg-agent in a Gaia2 world: the world's app tools, notifications, the simulated clock and turns.

The world is an ARE process (`labkube.tasks.gaia2`): a sidecar in a pod (`LABKUBE_WORLD_URL`) or a
process this agent starts locally. Before each step the pending notifications (the user's task
first, then environment events) reach the agent as timestamped messages. The clock is paused for
every model call and charged the call's measured latency (or a fixed think time). A turn ends when
the agent messages the user; a multi-turn scenario continues with the user's next message, and the
run ends when the last turn is done or the world stops. ARE's own judge then decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkube.agent.messages import Message
from labkube.agent.providers.registry import secret
from labkube.agent.rg.tool import Tool, ToolError, tool
from labkube.agent.rg.tools import ToolContext
from labkube.agent.rg.world_errors import WorldFailure
from labkube.tasks.gaia2 import (
    CONTROL_TOKEN_VARIABLE,
    Notification,
    ToolSpec,
    ValidationResult,
    WorldBroken,
    WorldClient,
    WorldDied,
    WorldError,
    WorldProcess,
    start_world,
    world_python,
)

NEXT_TURN_WAIT_S = 24 * 3600.0  # simulated seconds; the world jumps straight to the user's next message
# ARE's SystemApp tool, called as the agent's `get_current_time` (logged by ARE; its noise applies)
SYSTEM_TIME_TOOL = "SystemApp__get_current_time"
WORLD_LOG_LINES = 8  # of the world log, in the error of a run whose world failed


@dataclass
class WorldSession:
    client: WorldClient
    process: WorldProcess | None = None  # None when the world is a sidecar we did not start
    think_time_s: float | None = None
    nb_turns: int = 1
    turns_completed: int = 0
    awaiting_next_turn: bool = False
    stopped: bool = False
    seen: list[Notification] = field(default_factory=list)
    log_path: Path | None = None  # a pooled world's log (LABKUBE_WORLD_LOG), for the tail in a failed run's error

    @property
    def done(self) -> bool:
        return self.stopped or self.turns_completed >= self.nb_turns

    def failed(self, exc: Exception) -> WorldFailure:
        """The run's world error: what the world said, and the last lines of its log when we started it."""
        log_path = self.process.log_path if self.process is not None else self.log_path
        if log_path is None:  # a sidecar: its log is the pod's, and the world's own error says what failed
            return WorldFailure(str(exc))
        try:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-WORLD_LOG_LINES:])
        except OSError:
            tail = ""
        lines = " | ".join(line.strip() for line in tail.splitlines() if line.strip())
        return WorldFailure(f"{exc}; world log ({log_path}): {lines}" if lines else str(exc))

    async def inject_notifications(self, run: Any) -> None:
        """Add pending notifications to the conversation; wait for the next turn's user message if due."""
        try:
            pulled = await self.client.pull_notifications()
            if not pulled.notifications and self.awaiting_next_turn and not pulled.world_stopped:
                await self.client.wait_for_notification(NEXT_TURN_WAIT_S)
                pulled = await self.client.pull_notifications()
        except WorldError as exc:
            raise self.failed(exc) from exc
        self.awaiting_next_turn = False
        for note in pulled.notifications:
            self.seen.append(note)
            if note.type == "environment_stop":
                self.stopped = True
            run.add_message(Message(role="user", content=format_notification(note)))
        if pulled.world_stopped:
            self.stopped = True
        if self.done:
            run.ctx.ended = True

    async def pause(self) -> None:
        try:
            await self.client.pause_clock()
        except WorldError as exc:
            raise self.failed(exc) from exc

    async def resume(self, model_seconds: float) -> None:
        try:
            if self.think_time_s is None:
                await self.client.resume_clock("measured", seconds=model_seconds)
            else:
                await self.client.resume_clock("fixed", seconds=self.think_time_s)
        except WorldError as exc:
            raise self.failed(exc) from exc

    def after_turn(self, turns_completed: int | None, world_stopped: bool) -> None:
        if turns_completed is not None:
            self.turns_completed = turns_completed
        self.stopped = self.stopped or world_stopped
        self.awaiting_next_turn = not self.done

    async def finish(self) -> ValidationResult:
        try:
            return await self.client.finish()
        except WorldError as exc:
            raise self.failed(exc) from exc

    async def close(self) -> None:
        await self.client.aclose()
        if self.process is not None:
            self.process.stop()


def format_notification(note: Notification) -> str:
    kind = {
        "user_message": "Message from the user",
        "environment": "Notification",
        "environment_stop": "The world has stopped",
    }[note.type]
    return f"[{note.datetime}] {kind}: {note.message}"


async def open_world(log_dir: Any, think_time_s: float | None) -> WorldSession:
    """Connect to the world the sandbox gave this run (a pod's sidecar, a warm world of the local supervisor's
    pool: LABKUBE_WORLD_URL), or start a world process for this run."""
    url = os.environ.get("LABKUBE_WORLD_URL")
    if url:
        log = os.environ.get("LABKUBE_WORLD_LOG")
        client = WorldClient(url, control_token=secret(CONTROL_TOKEN_VARIABLE))  # None: a world open to all
        return WorldSession(client, None, think_time_s, log_path=Path(log) if log else None)
    try:
        process = start_world(world_python(), log_path=log_dir / "world.log")
    except Exception as exc:  # the ARE environment is missing or the world cannot start
        raise WorldFailure(f"{exc} (run `labkube worlds setup` first)") from exc
    return WorldSession(process.client(), process, think_time_s)


def world_tool(session: WorldSession, spec: ToolSpec, ctx: ToolContext) -> Tool:
    """One of the world's app tools, as the agent sees it."""

    async def execute(**arguments: Any) -> str:
        try:
            result = await session.client.call_tool(spec.name, arguments)
        except (WorldDied, WorldBroken) as exc:
            raise session.failed(exc) from exc
        except WorldError as exc:
            raise ToolError(str(exc)) from None
        if result.turn_ended:
            session.after_turn(result.turns_completed, result.world_stopped)
            if session.done:
                ctx.ended = True
        elif result.world_stopped:
            session.stopped = True
            ctx.ended = True
        if not result.ok:
            raise ToolError(result.error or "the tool failed")
        return result.text

    return Tool(spec.name, spec.description, spec.parameters, execute, "write" if spec.write else "read")


@tool(access="read")
def wait_for_notification(session: WorldSession):
    async def execute(timeout: float = 600.0) -> str:
        """Wait, in simulated time, until something happens (a message, an event) or the timeout passes.
        Returns what arrived.

        Args:
            timeout: Simulated seconds to wait at most.
        """
        try:
            waited = await session.client.wait_for_notification(timeout)
            pulled = await session.client.pull_notifications()
        except (WorldDied, WorldBroken) as exc:
            raise session.failed(exc) from exc
        except WorldError as exc:
            raise ToolError(str(exc)) from None
        if waited.error:
            raise ToolError(waited.error)
        notes = [format_notification(n) for n in pulled.notifications]
        session.seen.extend(pulled.notifications)
        if pulled.world_stopped or any(n.type == "environment_stop" for n in pulled.notifications):
            session.stopped = True
        head = f"waited {waited.advanced:g} simulated seconds; it is now {waited.datetime}"
        return "\n".join([head, *notes]) if notes else f"{head}; nothing arrived"

    return execute


@tool(access="read")
def get_current_time(session: WorldSession):
    async def execute() -> str:
        """The current (simulated) time, date and weekday in the world."""
        try:
            result = await session.client.call_tool(SYSTEM_TIME_TOOL)
        except (WorldDied, WorldBroken) as exc:
            raise session.failed(exc) from exc
        except WorldError as exc:
            raise ToolError(str(exc)) from None
        if not result.ok:  # ARE's noise can fail it like any tool
            raise ToolError(result.error or "the tool failed")
        return result.text

    return execute


async def world_tools(session: WorldSession, ctx: ToolContext) -> list[Tool]:
    try:
        specs = await session.client.list_tools()
    except WorldError as exc:
        raise session.failed(exc) from exc
    harness = {"SystemApp__wait_for_notification", SYSTEM_TIME_TOOL}
    tools = [world_tool(session, s, ctx) for s in specs if s.name not in harness]
    clock = [get_current_time(session)] if any(s.name == SYSTEM_TIME_TOOL for s in specs) else []
    return [*tools, wait_for_notification(session), *clock, give_up(ctx)]


@tool(access="read", name="end_task")
def give_up(ctx: ToolContext):
    async def execute(summary: str = "") -> str:
        """Stop working on the scenario now (ARE's judge then decides on what was done).

        Args:
            summary: Why you stop.
        """
        ctx.ended = True
        ctx.end_summary = summary
        return "stopped"

    return execute


SYSTEM = """You are an assistant working in a simulated world on the user's behalf: phones, email,
calendars, contacts and other apps, reachable through the tools. Time passes while you work and
events arrive as notifications. Do what the user asks, using the apps; wait for notifications when
you need something that has not happened yet; when the user's request is done (or you need their
answer), send them a message with AgentUserInterface__send_message_to_user: that ends your turn."""
