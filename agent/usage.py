"""Token usage as each model API reports it, read into labkube's `Usage`: one reading for rg-agent's providers (SDK
objects) and the model gateway (raw JSON), so every agent is counted the same way.

`input` counts every prompt token (cached ones included), `output` every generated token (reasoning included).
"""

from __future__ import annotations

from typing import Any

from labkube.budgets import Usage


def _plain(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, dict):
        return usage
    return usage.model_dump()


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _detail(usage: dict[str, Any], group: str, field: str) -> int:
    details = usage.get(group)
    return _int(details.get(field)) if isinstance(details, dict) else 0


def responses_usage(usage: Any) -> Usage:
    """OpenAI Responses API: `input_tokens` include the cached ones, `output_tokens` the reasoning ones."""
    u = _plain(usage)
    return Usage(
        input=_int(u.get("input_tokens")),
        output=_int(u.get("output_tokens")),
        cached=_detail(u, "input_tokens_details", "cached_tokens"),
        reasoning=_detail(u, "output_tokens_details", "reasoning_tokens"),
    )


def chat_usage(usage: Any) -> Usage:
    """OpenAI Chat Completions (and OpenAI-compatible servers)."""
    u = _plain(usage)
    return Usage(
        input=_int(u.get("prompt_tokens")),
        output=_int(u.get("completion_tokens")),
        cached=_detail(u, "prompt_tokens_details", "cached_tokens"),
        reasoning=_detail(u, "completion_tokens_details", "reasoning_tokens"),
    )


def anthropic_usage(usage: Any) -> Usage:
    """Anthropic Messages: `input_tokens` EXCLUDE cache reads and writes, so the prompt is the sum of the three."""
    u = _plain(usage)
    cached = _int(u.get("cache_read_input_tokens"))
    return Usage(
        input=_int(u.get("input_tokens")) + cached + _int(u.get("cache_creation_input_tokens")),
        output=_int(u.get("output_tokens")),
        cached=cached,
        reasoning=_detail(u, "output_tokens_details", "thinking_tokens"),
    )
