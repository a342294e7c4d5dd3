"""Anthropic's Messages API (`anthropic:<model>`), streamed so long generations never hit the SDK's
non-streaming time guard. Thinking blocks are sent back with their signatures."""

from __future__ import annotations

from typing import Any

import anthropic

from labkube.agent.messages import Message, ModelResponse, ToolCall, ToolSpec
from labkube.agent.providers.provider import Provider, ProviderError
from labkube.agent.providers.sdk_errors import map_sdk_error
from labkube.agent.usage import anthropic_usage

EFFORT_BUDGETS = {"low": 2_048, "medium": 8_192, "high": 24_576}


def map_anthropic_error(exc: Exception) -> ProviderError:
    return map_sdk_error(exc, anthropic)


def to_anthropic(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """System text and alternating user/assistant turns; tool results ride in user turns."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for m in messages:
        if m.role == "system":
            system.append(m.content)
        elif m.role == "user":
            add("user", [{"type": "text", "text": m.content or "(empty)"}])
        elif m.role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": m.tool_call_id,
                        "content": m.content or "(no output)",
                    }
                ],
            )
        else:
            blocks: list[dict[str, Any]] = list((m.provider_data or {}).get("anthropic_thinking", []))
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls)
            add("assistant", blocks or [{"type": "text", "text": "(no reply)"}])
    return "\n\n".join(system), turns


class AnthropicMessages(Provider):
    def __init__(
        self,
        model: str,
        effort: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 32_000,
        timeout_s: float = 900.0,
    ) -> None:
        self.model = model
        self.thinking_budget = None
        if effort:
            self.thinking_budget = EFFORT_BUDGETS.get(effort) or int(effort)
        self.max_tokens = max(max_tokens, (self.thinking_budget or 0) + 4_096)
        self.client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)

    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        system, turns = to_anthropic(messages)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": turns,
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools],
        }
        if system:
            kwargs["system"] = system
        if self.thinking_budget:
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        try:
            async with self.client.messages.stream(**kwargs) as stream:
                resp = await stream.get_final_message()
        except Exception as exc:
            raise map_anthropic_error(exc) from None
        text, calls, thinking, thinking_blocks = [], [], [], []
        for block in resp.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                args = block.input if isinstance(block.input, dict) else {"__raw_arguments__": block.input}
                calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
            elif block.type in ("thinking", "redacted_thinking"):
                thinking.append(getattr(block, "thinking", "") or "")
                thinking_blocks.append(block.model_dump(exclude_none=True))
        message = Message(
            role="assistant",
            content="".join(text),
            tool_calls=calls,
            thinking="\n".join(thinking) or None,
            provider_data={"anthropic_thinking": thinking_blocks} if thinking_blocks else None,
        )
        return ModelResponse.from_sdk(message, resp.usage, anthropic_usage, resp.model or self.model, resp.stop_reason)

    async def aclose(self) -> None:
        await self.client.close()
