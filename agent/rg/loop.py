"""The rg-agent loop: ask the model, run its tool calls, charge the budgets, checkpoint, repeat.

Context: when the estimated context passes `context_threshold` tokens, the agent
writes a hand-off summary and the conversation restarts from the task, every
earlier summary and the latest state of the workspace. If a call still
overflows, the oldest turns are dropped, never leaving a tool result without
the call that produced it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from labkube.agent.budget import BudgetTracker
from labkube.agent.checkpoint import Checkpoint
from labkube.agent.messages import Message, ToolCall
from labkube.agent.providers.provider import CallOutcome, ContextOverflow, ModelClient, ProviderError
from labkube.agent.rg.tool import Tool, ToolError
from labkube.agent.rg.tools import ToolContext
from labkube.agent.rg.world_errors import WorldFailure
from labkube.agent.telemetry import RunTelemetry
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.budgets import StopReason, unsaid_note

NUDGE = "No tool was called. Continue working with the tools, or call end_task when you are done."
HANDOFF_REQUEST = (
    "Your context is nearly full and will be reset. Write a hand-off summary for your successor, who "
    "sees only the task and your summaries: what you have done so far, what you learned (numbers, "
    "what worked and what did not), your current approach, and the next steps. Do not call tools."
)


def _model_seconds(outcome: CallOutcome | None) -> float:
    return 0.0 if outcome is None else max(0.0, outcome.duration_s - outcome.backoff_s)


def estimate_tokens(message: Message) -> int:
    """About four characters a token; good enough to decide when to hand off."""
    chars = len(message.content) + len(message.thinking or "")
    chars += sum(len(c.name) + len(str(c.arguments)) for c in message.tool_calls)
    return chars // 4 + 4


@dataclass
class AgentRun:
    """Everything one run's loop needs; `checkpoint` is what survives a crash."""

    client: ModelClient
    tools: dict[str, Tool]
    ctx: ToolContext
    tracker: BudgetTracker
    transcript: JsonlLog
    conversation: JsonlLog
    checkpoint: Checkpoint
    messages: list[Message] = field(default_factory=list)
    reminder_every_s: float = 1800.0
    on_step: Callable[[AgentRun], Awaitable[None]] | None = None  # grading, status, checkpoint
    # live control (agent/harness/steering.py): budgets extended, the operator's messages, a pause at this boundary
    before_step: Callable[[AgentRun], None] | None = None
    context_threshold: int = 0  # 0: never hand off
    base_messages: Callable[[list[str]], list[Message]] | None = None  # task + summaries + latest state
    context_estimate: int = 0
    telemetry: RunTelemetry | None = None
    world: Any = None  # a WorldSession for Gaia2 runs (agent/rg/world_session.py)
    world_error: str | None = None

    def add_message(self, message: Message) -> None:
        self.messages.append(message)
        self.context_estimate += estimate_tokens(message)
        self.conversation.append({"epoch": len(self.checkpoint.summaries), **message.model_dump(exclude_none=True)})

    def restart_conversation(self, messages: list[Message]) -> None:
        """Begin a new epoch of the append-only conversation log with `messages`."""
        self.checkpoint.epoch_start_offset = self.conversation.offset
        self.messages = []
        self.context_estimate = 0
        for m in messages:
            self.add_message(m)


async def run_tool_call(run: AgentRun, call: ToolCall) -> Message:
    started = time.monotonic()
    tool = run.tools.get(call.name)
    ok = True
    if tool is None:
        output = f"unknown tool {call.name!r}; available: {', '.join(run.tools)}"
        ok = False
    else:
        try:
            output = await tool(call.arguments)
        except ToolError as exc:
            output, ok = f"error: {exc}", False
    run.transcript.append(
        {
            "type": "tool_call",
            "step": run.checkpoint.step + 1,
            "ts": now_iso(),
            "call_id": call.id,
            "tool": call.name,
            "access": tool.access if tool else None,
            "args": call.arguments,
            "ok": ok,
            "output": output,
            "duration_s": round(time.monotonic() - started, 4),
        }
    )
    if run.telemetry is not None:
        run.telemetry.tool_call(call.name, ok)
    return Message(role="tool", content=output, tool_call_id=call.id, name=call.name)


def budget_reminder(run: AgentRun) -> Message | None:
    """Tell the agent what is left at a regular interval, and once when it nears the end."""
    spent = run.tracker.spend.wall_seconds
    near_end = run.tracker.used_fraction() >= 0.9
    already_warned = run.checkpoint.last_reminder_at < 0
    due = spent - abs(run.checkpoint.last_reminder_at) >= run.reminder_every_s and not already_warned
    if not (due or (near_end and not already_warned)):
        return None
    run.checkpoint.last_reminder_at = -max(spent, 1e-9) if near_end else spent
    prefix = "Budget nearly exhausted: wrap up, make sure your results are written, then call end_task. "
    return Message(
        role="user", content=f"{prefix if near_end else ''}Remaining budget: {run.tracker.remaining_text()}."
    )


def record_call(run: AgentRun, outcome: CallOutcome, purpose: str = "step") -> None:
    response = outcome.response
    run.tracker.exclude(outcome.backoff_s)
    run.tracker.charge_model(response.usage, outcome.cost_usd, run.client.model_name)
    # What was never said is counted as none: the run's tokens and dollars are lower bounds from here.
    unsaid = outcome.unsaid_attempts + (not response.usage_stated)
    run.tracker.spend.partial_calls += unsaid
    note = unsaid_note(outcome.unsaid_attempts, not response.usage_stated) if unsaid else None
    run.transcript.append(
        {
            "type": "model_call",
            "purpose": purpose,
            "step": run.checkpoint.step + 1,
            "ts": now_iso(),
            "model": response.model or run.client.model_name,
            "message": response.message.model_dump(exclude_none=True, exclude={"provider_data"}),
            "usage": response.usage.model_dump(),
            "cost_usd": outcome.cost_usd,
            "duration_s": round(outcome.duration_s, 4),
            "backoff_s": round(outcome.backoff_s, 4),
            "attempts": outcome.attempts,
            **({"usage_partial": True, "usage_note": note} if note else {}),
        }
    )
    if run.telemetry is not None:
        run.telemetry.model_call(response.usage, outcome.cost_usd, outcome.duration_s - outcome.backoff_s)
        run.telemetry.spend(run.tracker.spend)
    # The API's own count of this call's context replaces our estimate.
    run.context_estimate = max(run.context_estimate, response.usage.input + response.usage.output)


async def hand_off(run: AgentRun) -> None:
    """Ask for a summary, then restart the conversation from the task and all summaries."""
    request = Message(role="user", content=HANDOFF_REQUEST)
    try:
        outcome = await run.client.generate([*run.messages, request], [])
    except ContextOverflow as overflow:
        carried = overflow.unsaid_attempts  # attempts cut before the overflow: the retry below does not see them
        try:
            drop_oldest_turns(run, keep_tokens=run.context_threshold // 2)
            outcome = await run.client.generate([*run.messages, request], [])
        except ProviderError as exc:
            exc.unsaid_attempts += carried
            raise
        outcome.unsaid_attempts += carried
    record_call(run, outcome, purpose="handoff")
    summary = outcome.response.message.content.strip() or "(the agent wrote no summary)"
    run.checkpoint.summaries.append(summary)
    run.transcript.append({"type": "handoff", "ts": now_iso(), "n": len(run.checkpoint.summaries), "summary": summary})
    assert run.base_messages is not None
    run.restart_conversation(run.base_messages(run.checkpoint.summaries))


def turn_starts(messages: list[Message]) -> list[int]:
    """Indices where a droppable turn begins: an assistant message (its tool results follow it)."""
    return [i for i, m in enumerate(messages) if m.role == "assistant"]


def drop_oldest_turns(run: AgentRun, keep_tokens: int) -> None:
    """Drop whole turns after the opening messages until the estimate fits `keep_tokens`."""
    starts = turn_starts(run.messages)
    if len(starts) < 2:
        raise ContextOverflow("the task alone does not fit the model's context window")
    head = run.messages[: starts[0]]
    body = run.messages[starts[0] :]
    offsets = [s - starts[0] for s in starts]
    total = sum(estimate_tokens(m) for m in run.messages)
    cut = 0
    for nxt in offsets[1:]:
        if total <= keep_tokens:
            break
        total -= sum(estimate_tokens(m) for m in body[cut:nxt])
        cut = nxt
    if cut == 0:
        cut = offsets[1]
    note = Message(role="user", content="[Earlier turns were dropped to fit the context window.]")
    run.transcript.append({"type": "context_drop", "ts": now_iso(), "dropped_messages": cut})
    run.restart_conversation([*head, note, *body[cut:]])


async def generate_in_world(run: AgentRun, specs: list) -> CallOutcome:
    """A model call; in a Gaia2 world the clock stops meanwhile and is charged the call's latency."""
    if run.world is None:
        return await run.client.generate(run.messages, specs)
    await run.world.pause()
    outcome: CallOutcome | None = None
    try:
        outcome = await run.client.generate(run.messages, specs)
    finally:
        await run.world.resume(_model_seconds(outcome))
    return outcome


async def one_step(run: AgentRun) -> None:
    if run.context_threshold and run.base_messages and run.context_estimate >= run.context_threshold:
        await hand_off(run)
    reminder = budget_reminder(run)
    if reminder is not None:
        run.add_message(reminder)
    specs = [t.spec for t in run.tools.values()]
    carried = 0  # attempts cut before an overflow, which the retry after dropping turns does not see
    try:
        for _ in range(8):
            try:
                outcome = await generate_in_world(run, specs)
                break
            except ContextOverflow as overflow:
                carried += overflow.unsaid_attempts
                drop_oldest_turns(run, keep_tokens=max(1, run.context_estimate * 3 // 4))
        else:
            raise ContextOverflow("the conversation still overflows after dropping turns")
    except ProviderError as exc:  # the error that ends the run counts them too
        exc.unsaid_attempts += carried
        raise
    outcome.unsaid_attempts += carried
    record_call(run, outcome)
    response = outcome.response
    run.add_message(response.message)
    if not response.message.tool_calls:
        run.add_message(Message(role="user", content=NUDGE))
    for call in response.message.tool_calls:
        run.add_message(await run_tool_call(run, call))
        if run.ctx.ended:
            break
    run.tracker.charge_step()


async def run_loop(run: AgentRun) -> StopReason:
    """Steps until the agent ends the task, a budget runs out, or the model API refuses."""
    run.tracker.start()
    while True:
        if run.before_step is not None:
            run.before_step(run)
        exceeded = run.tracker.exceeded()
        if exceeded is not None:
            run.transcript.append(
                {
                    "type": "budget_stop",
                    "ts": now_iso(),
                    "reason": exceeded.kind.value,
                    "detail": str(exceeded),
                }
            )
            return exceeded.kind
        try:
            if run.world is not None:
                await run.world.inject_notifications(run)
                if run.ctx.ended:
                    return StopReason.done
            await one_step(run)
        except WorldFailure as exc:
            run.world_error = str(exc)
            run.transcript.append({"type": "world_error", "ts": now_iso(), "error": str(exc)})
            return StopReason.world_error
        except ProviderError as exc:
            line = {"type": "model_error", "ts": now_iso(), "reason": exc.reason.value, "error": str(exc)}
            if exc.unsaid_attempts:  # they reached the provider: what they cost is not known to be 0
                run.tracker.spend.partial_calls += exc.unsaid_attempts
                line |= {"usage_partial": True, "usage_note": unsaid_note(exc.unsaid_attempts, False)}
                if run.telemetry is not None:
                    run.telemetry.spend(run.tracker.spend)
            run.transcript.append(line)
            return exc.reason
        run.tracker.tick()
        run.checkpoint.step += 1
        if run.on_step is not None:
            await run.on_step(run)
        if run.ctx.ended:
            return StopReason.done
