"""OpenAI: the Responses API (`openai:`), Chat Completions (`openai-chat:`) and any
OpenAI-compatible server such as vLLM or llama.cpp (`openai-compatible:URL#model`)."""

from __future__ import annotations

import json
from typing import Any

import openai

from labkube.agent.messages import Message, ModelResponse, ToolCall, ToolSpec
from labkube.agent.providers.provider import Provider, ProviderError
from labkube.agent.providers.sdk_errors import map_sdk_error
from labkube.agent.usage import chat_usage, responses_usage


def map_openai_error(exc: Exception) -> ProviderError:
    return map_sdk_error(exc, openai)


def _args(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"__raw_arguments__": text}
    return value if isinstance(value, dict) else {"__raw_arguments__": text}


class _OpenAIBase(Provider):
    """What both OpenAI wire formats share: the client and its settings."""

    def __init__(
        self,
        model: str,
        effort: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 900.0,
    ) -> None:
        self.model = model
        self.effort = effort
        # Retries are ModelClient's, so that back-off is measured and left out of the time budget.
        self.client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)

    async def aclose(self) -> None:
        await self.client.close()


class OpenAIResponses(_OpenAIBase):
    """The Responses API; reasoning items are sent back verbatim on the next turn."""

    def to_input(self, messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
        instructions = None
        items: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "system":
                instructions = m.content if instructions is None else f"{instructions}\n\n{m.content}"
            elif m.role == "user":
                items.append({"role": "user", "content": m.content})
            elif m.role == "tool":
                items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content})
            elif m.provider_data and "openai_output" in m.provider_data:
                items.extend(m.provider_data["openai_output"])
            else:
                if m.content:
                    items.append({"role": "assistant", "content": m.content})
                for c in m.tool_calls:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": c.id,
                            "name": c.name,
                            "arguments": json.dumps(c.arguments),
                        }
                    )
        return instructions, items

    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        instructions, items = self.to_input(messages)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "input": items,
            "tools": [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ],
        }
        if instructions:
            kwargs["instructions"] = instructions
        if self.effort:
            kwargs["reasoning"] = {"effort": self.effort, "summary": "auto"}
        try:
            resp = await self.client.responses.create(**kwargs)
        except Exception as exc:
            raise map_openai_error(exc) from None
        text, calls, thinking, raw = [], [], [], []
        for item in resp.output or []:
            raw.append(item.model_dump(exclude_none=True, exclude_unset=True))
            if item.type == "message":
                text.extend(c.text for c in item.content if getattr(c, "type", "") == "output_text")
            elif item.type == "function_call":
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments=_args(item.arguments)))
            elif item.type == "reasoning":
                thinking.extend(s.text for s in (item.summary or []))
        message = Message(
            role="assistant",
            content="".join(text),
            tool_calls=calls,
            thinking="\n".join(thinking) or None,
            provider_data={"openai_output": raw},
        )
        return ModelResponse.from_sdk(message, resp.usage, responses_usage, resp.model or self.model, resp.status)


class OpenAIChat(_OpenAIBase):
    """Chat Completions: OpenAI itself and every OpenAI-compatible server."""

    @staticmethod
    def to_messages(messages: list[Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool":
                out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
            elif m.role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": m.content or None}
                if m.tool_calls:
                    msg["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for c in m.tool_calls
                    ]
                out.append(msg)
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": self.to_messages(messages),
            "tools": [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ],
        }
        if self.effort:
            kwargs["reasoning_effort"] = self.effort
        try:
            resp = await self.client.chat.completions.create(**kwargs)
        except Exception as exc:
            raise map_openai_error(exc) from None
        if not resp.choices:
            raise ProviderError("malformed response: no choices", retryable=True)
        choice = resp.choices[0]
        msg = choice.message
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=_args(c.function.arguments))
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        thinking = getattr(msg, "reasoning_content", None)  # vLLM and llama.cpp expose reasoning here
        message = Message(role="assistant", content=msg.content or "", tool_calls=calls, thinking=thinking)
        return ModelResponse.from_sdk(message, resp.usage, chat_usage, resp.model or self.model, choice.finish_reason)
