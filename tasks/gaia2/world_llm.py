"""A labkube model string as the LLM spec the world process hands to ARE's LiteLLM engine.

The world uses a model for three things: the judge's soft checks, agent2agent app agents and ARE's own
default agent (`--agent are-default`). Each takes the same spec, `{"model", "provider", "endpoint",
"api_key"}`, built here from the model string the user already gives rg-agent, so the same string
means the same model everywhere. The key travels in the request body, never in the world's environment.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from labkube.model_ref import API_PROVIDERS, ModelRef


class WorldLLMError(ValueError):
    pass


class WorldLLM(BaseModel):
    model: str
    provider: str  # LiteLLM's provider name
    endpoint: str | None = None
    api_key: str | None = None
    budget_usd: float | None = Field(default=None, description="Dollars the world may spend on this model.")
    usd_per_million: tuple[float, float, float] | None = Field(
        default=None, description="Input, output and cached-input price, for the budget."
    )


# The same base-URL variables the openai and anthropic SDKs read, so rg-agent and the world agree.
_BASE_URL_ENV = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


def world_llm(ref: ModelRef, api_key: str | None, what: str) -> WorldLLM:
    """`what` names the use ("the judge", "agent2agent", "are-default") for the error message."""
    if ref.provider not in API_PROVIDERS:
        raise WorldLLMError(
            f"{what} needs a model API (openai:, openai-chat:, anthropic: or openai-compatible:URL#MODEL); "
            f"{ref} is scripted and cannot play it"
        )
    if ref.provider == "openai-compatible":
        return WorldLLM(model=ref.name, provider="openai", endpoint=ref.base_url, api_key=api_key or "not-needed")
    provider = "anthropic" if ref.provider == "anthropic" else "openai"
    return WorldLLM(
        model=ref.name, provider=provider, endpoint=os.environ.get(_BASE_URL_ENV[provider]) or None, api_key=api_key
    )
