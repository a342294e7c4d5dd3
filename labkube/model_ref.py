"""Model strings: `openai:gpt-5`, `anthropic:claude-sonnet-4-5`,
`openai-compatible:http://host:8000/v1#model`, `oracle`, `noop`, `replay:PATH`.

One parser, used by the CLI (to reject a bad name before anything is written)
and by the agent (to pick a provider).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

API_PROVIDERS = ("openai", "openai-chat", "anthropic", "openai-compatible")
SCRIPTED = ("oracle", "noop")
SCRIPTED_WITH_ARG = ("replay", "cheat")
CHEATS = ("edit-grader", "hardcode", "read-labels", "fake-log")
KNOWN = API_PROVIDERS + SCRIPTED + SCRIPTED_WITH_ARG  # every provider a model string may name


class ModelRef(BaseModel):
    provider: str
    name: str
    base_url: str | None = None
    effort: str | None = None  # `@high` after the name: reasoning effort, or Anthropic thinking budget (name or tokens)

    def __str__(self) -> str:
        if self.provider in SCRIPTED:
            return self.provider
        effort = f"@{self.effort}" if self.effort else ""
        if self.base_url:
            return f"{self.provider}:{self.base_url}#{self.name}{effort}"
        return f"{self.provider}:{self.name}{effort}"


class UnknownModel(ValueError):
    pass


def parse_model(text: str) -> ModelRef:
    """Parse a model string or raise `UnknownModel` with a message that says what is expected."""
    text = text.strip()
    if text in SCRIPTED:
        return ModelRef(provider=text, name=text)
    provider, sep, rest = text.partition(":")
    if not sep or provider not in API_PROVIDERS + SCRIPTED_WITH_ARG:
        raise UnknownModel(
            f"unknown model {text!r}: use PROVIDER:MODEL with PROVIDER one of "
            f"{', '.join(API_PROVIDERS + SCRIPTED_WITH_ARG)}, or one of {', '.join(SCRIPTED)}"
        )
    if not rest:
        raise UnknownModel(f"model {text!r} names no model after '{provider}:'")
    if provider == "openai-compatible":
        base_url, hash_, name = rest.rpartition("#")
        if not hash_ or not name or not _usable_url(base_url):
            raise UnknownModel(f"model {text!r}: write openai-compatible:http(s)://HOST[:PORT]/v1#MODEL_NAME")
        name, effort = _split_effort(text, name, provider)
        return ModelRef(provider=provider, name=name, base_url=base_url, effort=effort)
    if provider == "cheat" and rest not in CHEATS:
        raise UnknownModel(f"model {text!r}: scripted cheats are {', '.join('cheat:' + c for c in CHEATS)}")
    if provider in SCRIPTED_WITH_ARG:
        return ModelRef(provider=provider, name=rest)
    name, effort = _split_effort(text, rest, provider)
    return ModelRef(provider=provider, name=name, effort=effort)


EFFORTS = ("minimal", "low", "medium", "high")  # OpenAI's reasoning effort names
THINKING_EFFORTS = ("low", "medium", "high")  # Anthropic's thinking budgets (agent/providers/anthropic_provider.py)
MIN_THINKING_TOKENS = 1024  # the least thinking budget Anthropic's Messages API accepts


def _split_effort(text: str, name: str, provider: str) -> tuple[str, str | None]:
    """The name and the effort after '@': a reasoning effort name for the OpenAI APIs (which take no number), a
    thinking budget name or token count for Anthropic."""
    name, at, effort = name.partition("@")
    if not at:
        return name, None
    if provider == "anthropic":
        if effort not in THINKING_EFFORTS and not (effort.isdigit() and int(effort) >= MIN_THINKING_TOKENS):
            raise UnknownModel(
                f"model {text!r}: effort after '@' is one of {', '.join(THINKING_EFFORTS)} or a thinking budget "
                f"of at least {MIN_THINKING_TOKENS} tokens"
            )
    elif effort not in EFFORTS:
        raise UnknownModel(
            f"model {text!r}: {provider} takes a reasoning effort name after '@', one of {', '.join(EFFORTS)} "
            "(a token budget is for anthropic: models)"
        )
    return name, effort


def _usable_url(url: str) -> bool:
    """An http(s) URL with a host, a valid port and no whitespace or control characters."""
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return False
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and (port is None or 0 < port < 65536)


def absolute_replay(text: str, cwd: Path) -> str:
    """`replay:PATH` with a relative PATH made absolute against `cwd` (the user's working directory: the run's own
    process works elsewhere); any other model string as it is."""
    ref = parse_model(text)
    if ref.provider != "replay" or Path(ref.name).expanduser().is_absolute():
        return text
    return f"replay:{os.path.abspath(cwd / ref.name)}"
