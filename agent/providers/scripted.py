"""Scripted providers: replay a fixed plan through the same loop a real model uses.

- `oracle`: the task's reference solution (`labkube.yaml: oracle: plan.yaml`).
- `noop`: ends the task at once (a do-nothing run).
- `replay:PATH`: the assistant turns of a recorded `transcript.jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labkube.agent.messages import Message, ModelResponse, ToolCall, ToolSpec
from labkube.agent.providers.provider import Provider
from labkube.budgets import Usage


class PlanStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    thought: str = ""


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[PlanStep] = Field(min_length=1)


class PlanError(ValueError):
    pass


def load_plan(path: Path) -> Plan:
    try:
        return Plan.model_validate(yaml.safe_load(path.read_text()))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except (yaml.YAMLError, ValidationError) as exc:
        raise PlanError(f"{path}: not a valid plan ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def estimate_tokens(text: str) -> int:
    """About four characters a token: what scripted calls are charged, so budgets still apply."""
    return max(1, len(text) // 4)


def _with_seed(step: PlanStep, seed: int) -> PlanStep:
    """Plans may write `{{seed}}` in string arguments: each run uses its own seed."""

    def sub(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{{seed}}", str(seed))
        if isinstance(value, dict):
            return {k: sub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [sub(v) for v in value]
        return value

    return PlanStep(tool=step.tool, args=sub(step.args), thought=step.thought)


class ScriptedProvider(Provider):
    """Emits one planned tool call per model call, then `end_task`."""

    def __init__(self, steps: list[PlanStep], model: str, seed: int = 0) -> None:
        self.steps = [_with_seed(s, seed) for s in steps]
        self.model = model
        self.cursor = 0

    def state(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def restore(self, state: dict[str, Any]) -> None:
        self.cursor = int(state.get("cursor", 0))

    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        if not tools:  # asked for a hand-off summary
            text = f"Hand-off summary: {self.cursor} of {len(self.steps)} planned steps done; continuing."
            usage = Usage(
                input=estimate_tokens("x" * sum(len(m.content) for m in messages[-4:])),
                output=estimate_tokens(text),
            )
            return ModelResponse(message=Message(role="assistant", content=text), usage=usage, model=self.model)
        if self.cursor < len(self.steps):
            step = self.steps[self.cursor]
        else:
            step = PlanStep(tool="end_task", args={"summary": "plan complete"})
        self.cursor += 1
        call = ToolCall(id=f"call_{self.cursor}_{step.tool}", name=step.tool, arguments=step.args)
        message = Message(role="assistant", content=step.thought, tool_calls=[call])
        prompt_chars = sum(len(m.content) for m in messages[-4:])
        usage = Usage(input=estimate_tokens("x" * prompt_chars), output=estimate_tokens(json.dumps(step.args)))
        return ModelResponse(message=message, usage=usage, model=self.model, stop_reason="tool_use")


def oracle_provider(task_path: Path, plan_rel: str | None, seed: int = 0) -> ScriptedProvider:
    if not plan_rel:
        raise PlanError(f"task at {task_path} has no reference solution (`oracle:` in labkube.yaml)")
    return ScriptedProvider(load_plan(task_path / plan_rel).steps, model="oracle", seed=seed)


def noop_provider() -> ScriptedProvider:
    return ScriptedProvider([PlanStep(tool="end_task", args={"summary": "did nothing"})], model="noop")


def replay_provider(transcript: Path) -> ScriptedProvider:
    """Replay the tool calls of a recorded run, in order."""
    steps: list[PlanStep] = []
    try:
        lines = transcript.read_text().splitlines()
    except FileNotFoundError:
        raise PlanError(f"replay: {transcript} not found") from None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") != "model_call":
            continue
        msg = record.get("message", {})
        for call in msg.get("tool_calls", []):
            steps.append(PlanStep(tool=call["name"], args=call.get("arguments", {}), thought=msg.get("content", "")))
    if not steps:
        raise PlanError(f"replay: {transcript} holds no tool calls")
    return ScriptedProvider(steps, model=f"replay:{transcript}")
