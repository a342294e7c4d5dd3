"""Model strings to providers, with lazy SDK imports."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from labkube.agent.providers.provider import Provider, ProviderError
from labkube.agent.providers.scripted import (
    PlanError,
    PlanStep,
    ScriptedProvider,
    load_plan,
    noop_provider,
    oracle_provider,
    replay_provider,
)
from labkube.budgets import StopReason
from labkube.model_ref import ModelRef
from labkube.run_spec import RunSpec
from labkube.task_card import TaskCard

DEFAULT_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "openai-chat": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openai-compatible": "OPENAI_COMPATIBLE_API_KEY",
}
# Providers that refuse a call without a key; a local openai-compatible server may need none.
KEY_REQUIRED = frozenset({"openai", "openai-chat", "anthropic"})


def required_key_variable(model: str, ref: ModelRef, api_key_env: dict[str, str]) -> str | None:
    """The variable a model's key must be in before anything runs: the model's own (`api_key_env`), else its
    provider's where the provider needs a key; None where none is needed."""
    return api_key_env.get(model) or (DEFAULT_KEY_ENV[ref.provider] if ref.provider in KEY_REQUIRED else None)


def api_key_for(ref: ModelRef, spec: RunSpec) -> str | None:
    """The key from the run's per-endpoint variable, else the provider's usual one."""
    return api_key_from_env(ref, spec.api_key_env)


# Keys handed over on stdin by the local sandbox, so they are in no process environment the agent's
# commands could read (`/proc/<pid>/environ`).
_SECRETS: dict[str, str] = {}


def set_secrets(secrets: dict[str, str]) -> None:
    _SECRETS.update(secrets)


def secret(name: str) -> str | None:
    """A secret handed over on stdin, else the environment's variable (a run started by hand, a test)."""
    return _SECRETS.get(name) or os.environ.get(name)


def api_key_from_env(ref: ModelRef, api_key_env: dict[str, str]) -> str | None:
    var = api_key_env.get(str(ref)) or DEFAULT_KEY_ENV.get(ref.provider)
    key = secret(var) if var else None
    if var and key is not None:
        try:
            key = header_safe_key(var, key)
        except ValueError as exc:
            raise ProviderError(str(exc), retryable=False, reason=StopReason.auth) from None
    if key is None and ref.provider in KEY_REQUIRED:
        raise ProviderError(f"{var} is not set; export it for model {ref}", retryable=False, reason=StopReason.auth)
    return key


def header_safe_key(var: str, value: str) -> str | None:
    """The key in `value` as a request header carries it: surrounding whitespace dropped (a key read from a file,
    such as a Kubernetes Secret made with --from-file, ends with its newline); None when nothing is left (not set).
    ValueError, naming the variable but never the key, for a character no API key has: it would make a malformed
    request, or a header of its own."""
    key = value.strip()
    bad = next((i for i, c in enumerate(key) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"{var} holds a character no API key has (character {bad + 1} of {len(key)},"
            f" {unicodedata.name(key[bad], f'U+{ord(key[bad]):04X}')}); set it to the key alone"
        )
    return key or None


def make_provider(ref: ModelRef, card: TaskCard, spec: RunSpec) -> Provider:
    try:
        if ref.provider == "oracle" and card.gaia is not None:  # the annotated answer is the reference
            answer = PlanStep(tool="end_task", args={"summary": f"FINAL ANSWER: {card.gaia.final_answer}"})
            return ScriptedProvider([answer], model="oracle")
        if ref.provider == "oracle":
            return oracle_provider(Path(card.path), card.oracle, spec.seed)
        if ref.provider == "noop":
            return noop_provider()
        if ref.provider == "replay":
            return replay_provider(Path(ref.name))
        if ref.provider == "cheat":  # scripted cheating, for testing the integrity audit
            plan = Path(card.path) / "oracle" / "cheats" / f"{ref.name}.yaml"
            return ScriptedProvider(load_plan(plan).steps, model=f"cheat:{ref.name}", seed=spec.seed)
    except PlanError as exc:
        raise ProviderError(str(exc), retryable=False) from None
    return gateway_provider(ref, spec.model_timeout_s) or make_api_provider(
        ref, api_key_for(ref, spec), spec.model_timeout_s
    )


def gateway_provider(ref: ModelRef, timeout_s: float) -> Provider | None:
    """In a pod with a gateway sidecar, the provider for `ref` through it, with its run token (the keys are the
    sidecar's alone, and it counts the run's spend where the agent's container cannot write); None elsewhere."""
    from labkube.agent.gateway.sidecar import sidecar_gateway
    from labkube.agent.gateway.state import GatewayError

    try:
        gateway = sidecar_gateway()
    except GatewayError as exc:
        raise ProviderError(str(exc), retryable=False) from None
    if gateway is None:
        return None
    token = gateway.config.token
    if ref.provider == "openai":
        from labkube.agent.providers.openai_provider import OpenAIResponses

        return OpenAIResponses(
            ref.name, ref.effort, api_key=token, base_url=gateway.openai_base_url, timeout_s=timeout_s
        )
    if ref.provider in ("openai-chat", "openai-compatible"):
        from labkube.agent.providers.openai_provider import OpenAIChat

        return OpenAIChat(ref.name, ref.effort, api_key=token, base_url=gateway.openai_base_url, timeout_s=timeout_s)
    if ref.provider == "anthropic":
        from labkube.agent.providers.anthropic_provider import AnthropicMessages

        return AnthropicMessages(
            ref.name, ref.effort, api_key=token, base_url=gateway.anthropic_base_url, timeout_s=timeout_s
        )
    return None


def make_api_provider(ref: ModelRef, key: str | None, timeout_s: float = 900.0) -> Provider:
    """A provider for a model API (not a scripted one)."""
    if ref.provider == "openai":
        from labkube.agent.providers.openai_provider import OpenAIResponses

        return OpenAIResponses(ref.name, ref.effort, api_key=key, timeout_s=timeout_s)
    if ref.provider in ("openai-chat", "openai-compatible"):
        from labkube.agent.providers.openai_provider import OpenAIChat

        return OpenAIChat(ref.name, ref.effort, api_key=key or "not-needed", base_url=ref.base_url, timeout_s=timeout_s)
    if ref.provider == "anthropic":
        from labkube.agent.providers.anthropic_provider import AnthropicMessages

        return AnthropicMessages(ref.name, ref.effort, api_key=key, timeout_s=timeout_s)
    raise ProviderError(f"no provider for {ref}", retryable=False)
