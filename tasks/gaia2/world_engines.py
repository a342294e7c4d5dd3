"""The models ARE calls in the world process: the LiteLLM engine (metered: tokens, duration, dollars against a
budget) for the soft judge, agent2agent app agents and ARE's own agent, and how ARE's agent's log reads as JSON.

Standalone like world_server.py (stdlib + ARE only), imported by name from the same folder.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from are.simulation.utils.serialization import make_serializable
from world_protocol import DEFAULT_JUDGE_TIMEOUT_S, VALIDATION_DEADLINE_S, ProtocolError, one_line

log = logging.getLogger("labkube.world")


LLM_KEYS = {"model", "provider", "endpoint", "api_key", "budget_usd", "usd_per_million", "timeout_s"}


def llm_spec(spec: Any, what: str) -> dict[str, Any]:
    example = '{"model": "gpt-4o", "provider": "openai", "endpoint": null, "api_key": "..."}'
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str) or not spec["model"]:
        raise ProtocolError(400, f"{what}: needs a model, e.g. {example}")
    unknown = set(spec) - LLM_KEYS
    if unknown:
        raise ProtocolError(400, f"{what}: unknown keys {sorted(unknown)} (known: {sorted(LLM_KEYS)})")
    timeout = spec.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < VALIDATION_DEADLINE_S
    ):
        raise ProtocolError(
            400, f"{what}: timeout_s must be a number of seconds above 0 and below {VALIDATION_DEADLINE_S:.0f}"
        )
    return spec


def llm_engine(spec: Any, what: str) -> Any:
    """ARE's LiteLLM engine for a model: the judge's soft checks, agent2agent app agents, ARE's own agent.

    Built directly rather than through ARE's LLMEngineBuilder, which sends provider "openai" to the Hugging
    Face client (no endpoint) and reads keys only from the environment; the key comes with the request."""
    from are.simulation.agents.llm.litellm.litellm_engine import LiteLLMModelConfig

    spec = llm_spec(spec, what)
    config = LiteLLMModelConfig(
        model_name=spec["model"],
        provider=spec.get("provider") or "openai",
        endpoint=spec.get("endpoint"),
        api_key=spec.get("api_key"),
    )
    engine = _metered_engine_class()(model_config=config)
    engine.json_booleans = what != "judge"
    engine.budget_usd = spec.get("budget_usd")
    engine.usd_per_million = spec.get("usd_per_million")
    engine.timeout_s = spec.get("timeout_s", DEFAULT_JUDGE_TIMEOUT_S if what == "judge" else None)
    return engine


@functools.cache
def _metered_engine_class() -> type:
    import litellm
    from are.simulation.agents.llm.litellm.litellm_engine import LiteLLMEngine
    from are.simulation.agents.llm.llm_engine import LLMEngineException

    class MeteredLiteLLMEngine(LiteLLMEngine):
        """ARE's LiteLLM engine, but returning each call's token usage and duration as metadata: ARE's own
        returns none, so its agent logs zero tokens and "measured" think time charges nothing.

        ARE's engine also rewrites True/False to true/false in every reply, for its agents' JSON actions;
        done to the judge's replies it turns "[[True]]" into "[[true]]", which the signature and sanity
        checkers never accept, so here it applies to agents only (`json_booleans`)."""

        json_booleans = True
        budget_usd: float | None = None  # the caller's dollars for this model (ARE's soft judge's own budget)
        usd_per_million: list[float] | None = None  # input, output, cached input
        timeout_s: float | None = None  # one call's limit, retries included (the judge's `--judge-timeout`)
        spent_usd = 0.0

        def chat_completion(
            self, messages: list[dict[str, Any]], stop_sequences: list[str] | None = None, **_: Any
        ) -> tuple[str, dict[str, Any]]:
            cfg = self.model_config
            if self.budget_usd is not None and self.spent_usd >= self.budget_usd:
                raise LLMEngineException(
                    f"the budget of ${self.budget_usd:g} for {cfg.model_name} is spent (${self.spent_usd:.4f})"
                )
            started = time.monotonic()
            limits = {} if self.timeout_s is None else {"timeout": self.timeout_s, "num_retries": 0, "max_retries": 0}
            try:
                response = litellm.completion(
                    model=cfg.model_name,
                    custom_llm_provider=cfg.provider if cfg.provider != "local" else None,
                    messages=[self._convert_message_to_litellm_format(m) for m in messages],
                    api_base=cfg.endpoint,
                    api_key=cfg.api_key,
                    **limits,
                )
            except litellm.exceptions.Timeout as exc:
                raise LLMEngineException(
                    f"{cfg.model_name} did not answer within {self.timeout_s:g} s: {one_line(exc)}"
                ) from exc
            except (litellm.exceptions.AuthenticationError, litellm.exceptions.APIError) as exc:
                raise LLMEngineException(f"the model call failed: {one_line(exc)}") from exc
            text = response.choices[0].message.content
            if text is None:
                raise LLMEngineException("the model returned no text")
            if self.json_booleans:
                text = text.replace("False", "false").replace("True", "true")
            for stop in stop_sequences or []:
                text = text.split(stop)[0]
            usage = getattr(response, "usage", None)
            details = getattr(usage, "completion_tokens_details", None)
            if self.usd_per_million is not None:
                p_in, p_out = self.usd_per_million[0], self.usd_per_million[1]
                prompt = getattr(usage, "prompt_tokens", 0) or 0
                completion = getattr(usage, "completion_tokens", 0) or 0
                self.spent_usd += (prompt * p_in + completion * p_out) / 1_000_000
            return text, {
                "prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
                "total_tokens": getattr(usage, "total_tokens", 0) or 0,
                "reasoning_tokens": getattr(details, "reasoning_tokens", 0) or 0,
                "completion_duration": time.monotonic() - started,
            }

    return MeteredLiteLLMEngine


def engine_builder(spec: dict[str, Any], what: str) -> Any:
    """ARE's agent builders take an LLMEngineBuilder: this one always builds the engine for `spec`."""
    from are.simulation.agents.llm.llm_engine_builder import LLMEngineBuilder

    class Builder(LLMEngineBuilder):
        def _create_concrete_engine(self, engine_config: Any) -> Any:
            return llm_engine(spec, what)

    return Builder()


def gave_up(react_agent: Any) -> tuple[str, str | None]:
    """(stopped, error) of an agent that returned: "finished", or why it ended a turn without finishing:
    it ran out of iterations ("max_iterations"). ARE counts a failed model call as an iteration, so a model
    that only answers errors ends there too ("model_failed"). ARE then sends the user a message itself and
    returns normally, so this is only in its log."""
    logs = react_agent.logs
    errors = [log for log in logs if log.get_type() == "error"]
    if not any(log.error == "MaxIterationsAgentError" for log in errors):
        return "finished", None
    cap = react_agent.max_iterations
    if any(log.get_type() == "llm_output" for log in logs):
        stopped, reason = "max_iterations", f"ARE's agent reached max_iterations ({cap}) without finishing the task"
    else:
        stopped = "model_failed"
        reason = f"the model never answered ARE's agent: all of its max_iterations ({cap}) model calls failed"
    other = [log for log in errors if log.error != "MaxIterationsAgentError"]
    last = f"; last error: {other[-1].error}: {other[-1].exception}" if other else ""
    return stopped, (reason + last)[:2000]


def agent_log_entry(log: Any) -> dict[str, Any]:
    """One entry of ARE's agent log, as JSON: what it is, when (simulated), what it says, and tokens."""
    entry: dict[str, Any] = {"type": log.get_type(), "timestamp": log.timestamp}
    if log.get_type() == "tool_call":
        entry["tool"] = log.tool_name
        entry["arguments"] = make_serializable(log.tool_arguments)
    elif log.get_type() == "llm_input":
        entry["messages"] = len(log.content)  # the whole prompt again each step: counted, not copied
    elif log.get_type() == "error":
        entry["content"] = f"{log.error}: {log.exception}"
    else:
        content = log.get_content_for_llm()
        entry["content"] = content[:20000] if isinstance(content, str) else content
    for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "completion_duration"):
        if hasattr(log, key):
            entry[key] = getattr(log, key)
    return entry
