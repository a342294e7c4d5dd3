"""The conversation in a provider-neutral form; providers convert to and from their wire formats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from labkube.budgets import Usage


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = Field(default=None, description="Tool name, on tool results.")
    thinking: str | None = Field(default=None, description="Reasoning the model exposed, if any.")
    provider_data: dict[str, Any] | None = Field(
        default=None,
        description="Opaque provider items that must be sent back verbatim (reasoning, signatures).",
    )


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class ModelResponse(BaseModel):
    message: Message
    usage: Usage = Field(default_factory=Usage)
    usage_stated: bool = Field(
        default=True, description="The provider's answer said its usage; when it did not, `usage` is a lower bound."
    )
    model: str = ""
    stop_reason: str | None = None

    @classmethod
    def from_sdk(
        cls, message: Message, sdk_usage: Any, read_usage: Callable[[Any], Usage], model: str, stop_reason: str | None
    ) -> ModelResponse:
        """An SDK's answer, its usage as the SDK parsed it: None where the server left it out, which is counted as
        none and marked not stated (a lower bound), never an exact 0."""
        usage, stated = read_usage(sdk_usage), sdk_usage is not None
        return cls(message=message, usage=usage, usage_stated=stated, model=model, stop_reason=stop_reason)
