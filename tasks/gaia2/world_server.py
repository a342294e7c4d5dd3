"""The Gaia2 world process: a warm ARE 1.2.0 runtime behind a small HTTP JSON protocol.

Standalone: it imports only the standard library and ARE, and runs with the ARE virtualenv's python,
by path:

    <are-venv>/bin/python world_server.py --port 0

The first line on stdout is `LISTENING <port>`; everything else (ARE's logging included) goes to
stderr. One process serves any number of scenarios one after another (`POST /scenario` replaces the
current one). The protocol is documented in docs/gaia2-world-protocol.md.

ARE decides everything that matters: the apps and their tools, the event loop and its simulated clock,
the notification system, the turn triggers and the judge (GraphPerEventJudge for Gaia2 JSON scenarios,
the scenario's own `validate` for registry scenarios). This file only adapts them to HTTP.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from are.simulation.apps.agent_user_interface import AgentUserInterface
from are.simulation.apps.system import SystemApp
from are.simulation.data_handler.importer import JsonScenarioImporter
from are.simulation.environment import Environment, EnvironmentConfig
from are.simulation.notification_system import MessageType, VerboseNotificationSystem
from are.simulation.scenarios.scenario_imported_from_json.benchmark_scenario import (
    BenchmarkScenarioImportedFromJson,
)
from are.simulation.scenarios.scenario_imported_from_json.utils import get_scenario_duration, preprocess_scenario
from are.simulation.scenarios.utils.scenario_expander import EnvEventsConfig
from are.simulation.types import (
    CapabilityTag,
    ConditionCheckEvent,
    EnvironmentState,
    EnvironmentType,
    EventLog,
    ToolAugmentationConfig,
)
from are.simulation.utils.serialization import make_serializable
from are.simulation.validation import ScriptedGraphPerEventJudgeConfig
from are.simulation.validation import judge as are_judge
from are.simulation.validation import tool_judge as are_tool_judge
from are.simulation.validation.utils import llm_utils as are_llm_utils
from verdict_message import ONE_SCENARIO_VARIABLE, VERDICT_FILE_VARIABLE, verdict_report
from world_health import (
    WorldBroken,
    WorldEnvironment,
    check_alive,
    check_oracle_apps,
    check_oracle_trace,
    deliver_first_user_message,
)

ARE_VERSION = "1.2.0"
MAX_SCENARIO_DURATION = 1800  # ARE's Gaia2 runner defaults (scenarios/config.py)
MAX_TIME_SCENARIO_DURATION = 420
# Tools ARE's own agent removes: user messages reach the agent as notifications instead.
HIDDEN_TOOLS = {
    "AgentUserInterface__get_last_message_from_user",
    "AgentUserInterface__get_last_message_from_agent",
    "AgentUserInterface__get_last_unread_messages",
    "AgentUserInterface__get_all_messages",
}
SEND_TO_USER = "AgentUserInterface__send_message_to_user"
HARD_CHECKS = ["tool_call_counts", "hard_argument_checks", "causality", "time_window"]
DEADLINES = {"load": 180.0, "tool": 60.0, "wait": 60.0, "finish": 300.0, "oracle": 180.0, "app_agent": 300.0}
ARE_AGENT_DEADLINE = 3600.0  # POST /are_agent: the caller may ask for less (its wall budget)

UTC = timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+; ARE also runs on 3.10)
log = logging.getLogger("labkube.world")


class ProtocolError(Exception):
    """A request the world cannot serve; becomes `{"error": message}` with this HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _with_deadline(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run `fn` in a helper thread; a call that outlives `seconds` becomes a 504 instead of a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name=f"world-{what}")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise ProtocolError(504, f"{what} did not finish within {seconds:.0f} s; load a scenario again")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@functools.lru_cache(maxsize=8192)
def _template(text: str) -> tuple[Any, frozenset[str]]:
    import jinja2
    from jinja2 import meta

    variables = frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(text)))
    return jinja2.Template(text, keep_trailing_newline=True), variables


def _install_template_cache() -> None:
    """Building ARE's judge compiles about 8,000 jinja templates (seconds per scenario, even for hard
    checks only); compile each distinct template once. The checks and what is rendered are unchanged."""

    def jinja_format(template: str, skip_validation: bool = True, **kwargs: Any) -> str:
        compiled, variables = _template(template)
        if not skip_validation:
            if not all(k in kwargs for k in variables):
                raise ValueError(f"Expected: {set(variables)}, got: {sorted(kwargs)}.\nTemplate:\n{template}")
            kwargs = {k: kwargs[k] for k in variables}
        if all(isinstance(v, str) for v in kwargs.values()):  # a plain template of strings renders the same each time
            return _rendered(template, tuple(sorted(kwargs.items())))
        return compiled.render(**kwargs)

    are_llm_utils.jinja_format = jinja_format
    are_judge.jinja_format = jinja_format
    # Each judge's tool judges read their checkers' parameter names: about 1,800 signatures per judge, the same ones.
    are_tool_judge.inspect = _SignatureCache()


@functools.lru_cache(maxsize=65536)
def _rendered(template: str, kwargs: tuple[tuple[str, str], ...]) -> str:
    return _template(template)[0].render(**dict(kwargs))


class _SignatureCache:
    """`inspect` for ARE's tool judges, with `signature` remembered per function (a bound method's by its function:
    the same parameters, less the first)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, bool], inspect.Signature] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    def signature(self, fn: Any) -> inspect.Signature:
        function = getattr(fn, "__func__", None)
        if function is None or not inspect.ismethod(fn):
            return inspect.signature(fn)
        key = (function, True)
        if key not in self._seen:
            self._seen[key] = inspect.signature(fn)
        return self._seen[key]


# ---------------------------------------------------------------------------------------------------
# Tool specs


def _split_top(type_str: str, sep: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in type_str:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == sep and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


_SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


def json_schema_for(type_str: str | None) -> dict[str, Any]:
    """A JSON schema for an ARE argument type string such as `list[str] | None`."""
    if not type_str or type_str in ("Any", "typing.Any"):
        return {}
    options = _split_top(type_str, "|")
    if len(options) > 1:
        return {"anyOf": [json_schema_for(o) for o in options]}
    t = options[0]
    for wrapper, extra in (("Optional[", ["None"]), ("Union[", [])):
        if t.startswith(wrapper) and t.endswith("]"):
            return {"anyOf": [json_schema_for(o) for o in [*_split_top(t[len(wrapper) : -1], ","), *extra]]}
    if t in ("None", "NoneType"):
        return {"type": "null"}
    if t in _SCALARS:
        return {"type": _SCALARS[t]}
    base, _, inner = t.partition("[")
    if base in ("list", "List", "tuple", "set"):
        items = _split_top(inner[:-1], ",") if inner else []
        return {"type": "array", "items": json_schema_for(items[0])} if items else {"type": "array"}
    if base in ("dict", "Dict"):
        return {"type": "object"}
    return {"type": "string", "description": f"ARE type {t}"}


def variadic_params(function: Any) -> set[str]:
    """Names of a function's `*args`/`**kwargs`: ARE lists them among a tool's arguments (without a default)."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def tool_spec(tool: Any) -> dict[str, Any]:
    """The agent's view of an ARE app tool.

    ARE's AppToolArg does not record a parameter's kind, so `**kwargs` of e.g.
    `SandboxLocalFileSystem.mkdir(path, create_parents=True, **kwargs)` reaches ARE's own agents as an
    argument without a default (type "any" in its JSON agent's prompt; required in `to_open_ai()`, which
    marks every argument required). A model cannot pass a variadic by name (`kwargs={}` would arrive as a
    key named "kwargs"), so we leave variadics out of the schema instead of matching ARE there.
    """
    properties: dict[str, Any] = {}
    required: list[str] = []
    variadic = variadic_params(getattr(tool, "function", None))
    for arg in tool.args:
        if arg.name in variadic:
            continue
        schema = json_schema_for(str(arg.arg_type) if arg.arg_type is not None else None)
        if arg.description:
            schema = {**schema, "description": arg.description}
        if arg.has_default:
            schema = {**schema, "default": make_serializable(arg.default)}
        else:
            required.append(arg.name)
        properties[arg.name] = schema
    return {
        "name": tool._public_name or tool.name,
        "app": tool.app_name,
        "description": tool._public_description or tool.function_description or "",
        "parameters": {"type": "object", "properties": properties, "required": required},
        "write": bool(tool.write_operation),
    }


# ---------------------------------------------------------------------------------------------------
# The environment


def _environment(scenario: Any, oracle: bool) -> WorldEnvironment:
    config = EnvironmentConfig(
        oracle_mode=oracle,
        queue_based_loop=oracle,
        exit_when_no_events=oracle,
        time_increment_in_seconds=scenario.time_increment_in_seconds,
    )
    if scenario.start_time and scenario.start_time > 0:
        config.start_time = scenario.start_time
    return WorldEnvironment(
        environment_type=EnvironmentType.CLI, config=config, notification_system=VerboseNotificationSystem()
    )


def _noise_configs(noise: Any) -> tuple[ToolAugmentationConfig | None, EnvEventsConfig | None]:
    """`true` gives ARE's `--noise` defaults; a dict overrides them."""
    if not noise:
        return None, None
    spec = noise if isinstance(noise, dict) else {}
    known = {
        "tool_failure_probability",
        "apply_tool_name_augmentation",
        "apply_tool_description_augmentation",
        "env_events_per_minute",
        "env_events_seed",
    }
    unknown = set(spec) - known
    if unknown:
        raise ProtocolError(400, f"noise: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    tools = ToolAugmentationConfig(
        tool_failure_probability=float(spec.get("tool_failure_probability", 0.1)),
        apply_tool_name_augmentation=bool(spec.get("apply_tool_name_augmentation", True)),
        apply_tool_description_augmentation=bool(spec.get("apply_tool_description_augmentation", True)),
    )
    per_minute = int(spec.get("env_events_per_minute", 10))
    events = EnvEventsConfig(num_env_events_per_minute=per_minute, env_events_seed=int(spec.get("env_events_seed", 0)))
    return tools, (events if per_minute > 0 else None)


def _judge_config(judge: dict[str, Any] | None) -> tuple[Any, str, list[str]]:
    """ARE's Gaia2 judge: hard checks only unless a judge model is given for the soft (LLM) checks."""
    if not judge:
        config = ScriptedGraphPerEventJudgeConfig(engine=_no_llm, event_id_to_checker_params={})
        return config, "hard checks only", list(HARD_CHECKS)
    from are.simulation.validation.configs import GraphPerEventJudgeConfig

    engine = llm_engine(judge, "judge")
    label = f"hard and soft checks (LLM judge {judge['model']})"
    return GraphPerEventJudgeConfig(engine=engine), label, [*HARD_CHECKS, "soft_llm_checks"]


LLM_KEYS = {"model", "provider", "endpoint", "api_key", "budget_usd", "usd_per_million"}


def _llm_spec(spec: Any, what: str) -> dict[str, Any]:
    example = '{"model": "gpt-4o", "provider": "openai", "endpoint": null, "api_key": "..."}'
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str) or not spec["model"]:
        raise ProtocolError(400, f"{what}: needs a model, e.g. {example}")
    unknown = set(spec) - LLM_KEYS
    if unknown:
        raise ProtocolError(400, f"{what}: unknown keys {sorted(unknown)} (known: {sorted(LLM_KEYS)})")
    return spec


def llm_engine(spec: Any, what: str) -> Any:
    """ARE's LiteLLM engine for a model: the judge's soft checks, agent2agent app agents, ARE's own agent.

    Built directly rather than through ARE's LLMEngineBuilder, which sends provider "openai" to the Hugging
    Face client (no endpoint) and reads keys only from the environment; the key comes with the request."""
    from are.simulation.agents.llm.litellm.litellm_engine import LiteLLMModelConfig

    spec = _llm_spec(spec, what)
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
            try:
                response = litellm.completion(
                    model=cfg.model_name,
                    custom_llm_provider=cfg.provider if cfg.provider != "local" else None,
                    messages=[self._convert_message_to_litellm_format(m) for m in messages],
                    api_base=cfg.endpoint,
                    api_key=cfg.api_key,
                )
            except (litellm.exceptions.AuthenticationError, litellm.exceptions.APIError) as exc:
                raise LLMEngineException(f"the model call failed: {_one_line(exc)}") from exc
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


def _engine_builder(spec: dict[str, Any], what: str) -> Any:
    """ARE's agent builders take an LLMEngineBuilder: this one always builds the engine for `spec`."""
    from are.simulation.agents.llm.llm_engine_builder import LLMEngineBuilder

    class Builder(LLMEngineBuilder):
        def _create_concrete_engine(self, engine_config: Any) -> Any:
            return llm_engine(spec, what)

    return Builder()


def _a2a_params(a2a: Any) -> tuple[float, dict[str, Any]]:
    if not isinstance(a2a, dict) or set(a2a) - {"proportion", "llm"}:
        raise ProtocolError(400, 'agent2agent must be {"proportion": 0..1, "llm": {"model": ..., ...}}')
    proportion = a2a.get("proportion", 1.0)
    if not isinstance(proportion, (int, float)) or not 0 < proportion <= 1:
        raise ProtocolError(400, "agent2agent.proportion is the share of apps that become agents: (0, 1]")
    return float(proportion), _llm_spec(a2a.get("llm"), "agent2agent.llm")


def _apply_agent2agent(scenario: Any, env: Environment, proportion: float, llm: dict[str, Any]) -> None:
    """ARE's agent2agent augmentation (`--a2a_app_prop`): a share of the apps, sampled with the scenario's
    seed, become app agents, each reached through one `expert_agent` tool and run by ARE's default app
    agent on the given model."""
    from are.simulation.agents.agent_builder import AppAgentBuilder
    from are.simulation.agents.agent_config_builder import AppAgentConfigBuilder
    from are.simulation.scenario_runner import _apply_a2a_config
    from are.simulation.scenarios.config import ScenarioRunnerConfig

    config = ScenarioRunnerConfig(
        model=llm["model"],
        model_provider=llm.get("provider"),
        endpoint=llm.get("endpoint"),
        a2a_app_prop=proportion,
        a2a_model=llm["model"],
    )
    _apply_a2a_config(
        config, scenario, env, AppAgentConfigBuilder(), AppAgentBuilder(_engine_builder(llm, "agent2agent.llm"))
    )
    if not getattr(scenario, "has_a2a_augmentation", False):
        raise ProtocolError(422, f"agent2agent: a share of {proportion} turns none of the scenario's apps into agents")


def _seed_tool_failures(scenario: Any) -> None:
    """Seed the noise's tool failures from the scenario seed and the tool's name. ARE leaves `AppTool.seed`
    unset, so each tool draws from `Random(None)` and the same seed fails different calls on every run."""
    tools = []
    for app in scenario.apps or []:
        tools += app.get_tools()
        inner = getattr(getattr(app, "app_agent", None), "tools", None) or {}  # agent2agent: the app's own tools
        tools += [t.app_tool for t in inner.values() if hasattr(t, "app_tool")]
    for tool in tools:
        if tool.failure_probability is not None:
            tool.seed = zlib.crc32(f"{scenario.seed}:{tool.name}".encode())
            tool.rng = random.Random(tool.seed)


def _no_llm(*_: Any, **__: Any) -> Any:
    raise RuntimeError("no judge model is configured (hard checks only)")


def _read_source(source: str) -> tuple[str, str]:
    """(kind, payload): kind is "json" (payload = JSON text) or "registry" (payload = scenario id)."""
    text = source.strip()
    if text.startswith("{"):
        return "json", text
    path = Path(text).expanduser()
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ProtocolError(422, f"scenario file {path} does not exist")
        return "json", path.read_text(encoding="utf-8")
    return "registry", text


def _import_json(text: str) -> BenchmarkScenarioImportedFromJson:
    try:
        scenario, _, _ = JsonScenarioImporter().import_from_json_to_benchmark(text, load_completed_events=False)
    except Exception as exc:
        raise ProtocolError(422, f"ARE could not import the scenario JSON: {_one_line(exc)}") from None
    return scenario


def _registry_scenario(scenario_id: str) -> Any:
    from are.simulation.scenarios.utils.registry import registry

    known = registry.get_all_scenarios()
    if scenario_id not in known:
        raise ProtocolError(
            422, f"unknown scenario {scenario_id!r}: not a JSON text, not a file, not in ARE's registry {sorted(known)}"
        )
    return known[scenario_id]()


def _close_apps(scenario: Any) -> None:
    """Close apps that hold resources (MCP sessions) in the background: closing takes a second or more,
    and ARE can hang there (are-run did after scenario_mcp_demo), so nothing waits for it."""
    closers = [app.close for app in (getattr(scenario, "apps", None) or []) if callable(getattr(app, "close", None))]
    if closers:
        threading.Thread(target=lambda: [_quietly(c) for c in closers], daemon=True, name="world-close").start()


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # closing is best effort
        log.warning("closing an app failed: %s", _one_line(exc))


def capability_tags(scenario: Any) -> list[str]:
    tags = [t.value.lower() for t in getattr(scenario, "tags", ()) or () if isinstance(t, CapabilityTag)]
    if getattr(scenario, "has_a2a_augmentation", False):
        tags.append("agent2agent")
    if getattr(scenario, "tool_augmentation_config", None) or getattr(scenario, "env_events_config", None):
        tags.append("noise")
    return sorted(set(tags))


# ---------------------------------------------------------------------------------------------------
# The session: one loaded scenario


class WorldSession:
    """The scenario currently served. Every method returns the JSON body of its endpoint."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.scenario: Any = None
        self.env: WorldEnvironment | None = None
        self.kind = ""
        self.source_text = ""
        self.oracle = False
        self.finished = False
        self.broken = False
        self.judge_spec: dict[str, Any] | None = None
        self.judge_label = ""
        self.checks: list[str] = []
        self.tools: dict[str, Any] = {}
        self.paused_at: float | None = None
        self.loaded_wall = 0.0
        self.load_params: dict[str, Any] = {}
        self.loaded_once = False

    # -- helpers ------------------------------------------------------------------------------------

    def _deadline(self, fn: Callable[[], Any], kind: str, what: str) -> Any:
        try:
            return _with_deadline(fn, DEADLINES[kind], what)
        except ProtocolError as exc:
            if exc.status == 504:  # the stuck call may still hold ARE's locks: serve nothing more from it
                self.broken = True
            raise

    def _require(self, *, agent: bool | None = None, running: bool = False) -> WorldEnvironment:
        if self.broken:
            raise ProtocolError(409, "an earlier request timed out and the world may be stuck: load a scenario again")
        if self.scenario is None:
            raise ProtocolError(409, "no scenario is loaded: POST /scenario first")
        if agent is True and self.oracle:
            raise ProtocolError(
                409, "the scenario was loaded with oracle: true; load it with oracle: false for an agent"
            )
        if agent is False and not self.oracle:
            raise ProtocolError(
                409, "the scenario was loaded for an agent; load it with oracle: true to run the oracle"
            )
        if running and self.finished:
            raise ProtocolError(409, f"scenario {self.scenario.scenario_id} is finished: load the next one")
        if self.env is None:
            raise ProtocolError(409, "the scenario has no running environment")
        check_alive(self.env)
        return self.env

    def _now(self) -> float:
        assert self.env is not None
        return self.env.time_manager.time()

    def _sends_to_user(self) -> int:
        assert self.env is not None
        return sum(
            1
            for e in self.env.event_log.list_view()
            if e.event_type.value == "AGENT" and getattr(e, "tool_name", "") == SEND_TO_USER and not e.failed()
        )

    def _nb_turns(self) -> int:
        scenario = self.scenario
        if getattr(scenario, "nb_turns", None):
            return int(scenario.nb_turns)
        if self.kind == "json" and scenario is not None and scenario.events:
            # Oracle mode does not initialise ARE's turns; count them the way ARE does.
            return max(scenario.build_event_id_to_turn_idx().values(), default=0) + 1
        return 1

    def _unload(self) -> None:
        env, scenario = self.env, self.scenario
        self.env, self.scenario, self.tools, self.paused_at = None, None, {}, None
        if env is not None:
            env.stop()  # its loop thread notices within a tick and exits; nothing waits for it
        if scenario is not None:
            _close_apps(scenario)

    def info(self) -> dict[str, Any]:
        with self.lock:
            return self._info()

    def state(self) -> dict[str, Any]:
        """ARE's own dumps of the loaded scenario: its apps' state and its event log (a warm world's next
        scenario is checked against a fresh world's with these)."""
        with self.lock:
            if self.env is None:
                raise ProtocolError(404, "no scenario is loaded")
            return {
                "apps": json.loads(self.env.apps_state_json())["apps"],
                "event_log": json.loads(self.env.event_log_json())["event_log"],
            }

    def _info(self) -> dict[str, Any]:
        if self.scenario is None:
            raise ProtocolError(404, "no scenario is loaded")
        s = self.scenario
        body = {
            "scenario_id": s.scenario_id,
            "kind": self.kind,
            "oracle": self.oracle,
            "seed": s.seed,
            "start_time": s.start_time,
            "duration": self.env.duration if self.env is not None and not self.oracle else s.duration,
            "nb_turns": self._nb_turns(),
            "capabilities": capability_tags(s),
            "judge": self.judge_label,
            "finished": self.finished,
        }
        if self.env is not None:
            body["time"] = self._now()
            body["datetime"] = _iso(self._now())
        return body

    # -- loading ------------------------------------------------------------------------------------

    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        source = req.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ProtocolError(400, "POST /scenario needs source: an ARE registry id, a JSON file path or JSON text")
        if req.get("agent2agent") and req.get("oracle"):
            raise ProtocolError(400, "agent2agent augments an agent run; the oracle replays its events without agents")
        a2a = _a2a_params(req["agent2agent"]) if req.get("agent2agent") else None
        if req.get("judge") is not None:
            _llm_spec(req["judge"], "judge")
        with self.lock:
            if self.loaded_once and os.environ.get(ONE_SCENARIO_VARIABLE) == "1":
                # A pod's sidecar serves the one scenario its harness loaded before the agent started; the agent's
                # shell reaches this port too, and a reload (say, as an oracle run) would replace what it is judged on.
                raise ProtocolError(409, "this world serves one run's scenario, loaded already: start a new world")
            self.loaded_once = True
            self._unload()
            self.finished = False
            self.broken = False
            self.oracle = bool(req.get("oracle", False))
            self.judge_spec = req.get("judge")
            self.load_params = req
            kind, payload = _read_source(source)
            self.kind, self.source_text = kind, payload if kind == "json" else ""
            try:
                self._deadline(lambda: self._build(kind, payload, req, a2a), "load", "loading the scenario")
            except WorldBroken:
                self._unload()
                raise
            self.loaded_wall = time.monotonic()
            return self._info()

    def _prepare(self, scenario: Any, req: dict[str, Any]) -> None:
        if req.get("seed") is not None:
            scenario.seed = int(req["seed"])
        tools_noise, events_noise = _noise_configs(req.get("noise"))
        scenario.tool_augmentation_config = tools_noise
        scenario.env_events_config = events_noise

    def _build(self, kind: str, payload: str, req: dict[str, Any], a2a: tuple[float, dict[str, Any]] | None) -> None:
        if kind == "json":
            scenario = _import_json(payload)
        else:
            scenario = self._call_are(lambda: _registry_scenario(payload), "creating the scenario")
        self._prepare(scenario, req)
        if kind == "json":
            self.judge_label, self.checks = "", []
            if not self.oracle:
                judge_config, self.judge_label, self.checks = _judge_config(self.judge_spec)
                self.judge_engine = getattr(judge_config, "engine", None)
                duration = req.get("duration") or get_scenario_duration(
                    scenario, MAX_TIME_SCENARIO_DURATION, MAX_SCENARIO_DURATION
                )
                self._call_are(
                    lambda: preprocess_scenario(
                        scenario,
                        judge_config=judge_config,
                        max_scenario_duration=int(duration),
                        tool_augmentation_config=scenario.tool_augmentation_config,
                        env_events_config=scenario.env_events_config,
                    ),
                    "preparing the scenario",
                )
                check_oracle_apps(scenario)
                # ARE's preprocessing ran the oracle to record what the judge expects: it must be whole.
                check_oracle_trace(scenario, getattr(scenario, "oracle_run_event_log", None) or [], "ARE's oracle run")
            else:
                self._call_are(scenario.initialize, "initializing the scenario")
                check_oracle_apps(scenario)
                scenario.patch_oracle_user_message_order()
        else:
            self.judge_label, self.checks = (
                "the scenario's own validation (ARE registry scenario)",
                ["scenario.validate"],
            )
            if req.get("duration"):
                scenario.duration = float(req["duration"])
            self._call_are(scenario.initialize, "initializing the scenario")
            check_oracle_apps(scenario)
            if not self.oracle and not any(isinstance(a, SystemApp) for a in scenario.apps or []):
                scenario.apps.append(SystemApp())  # wait_for_notification / get_current_time, as Gaia2 has
        env = _environment(scenario, self.oracle)
        if a2a is not None:
            self._call_are(lambda: _apply_agent2agent(scenario, env, *a2a), "agent2agent")
        self.scenario, self.env = scenario, env
        _seed_tool_failures(scenario)
        if self.oracle:
            return
        self.env.run(scenario, wait_for_end=False)
        aui = self.env.get_app_with_class(AgentUserInterface)
        if aui is not None:
            aui.wait_for_user_response = False  # as ARE's agent does: user replies arrive as notifications
        self.tools = {}
        for tool in scenario.get_tools():
            if tool.name not in HIDDEN_TOOLS:
                self.tools[tool._public_name or tool.name] = tool
        self.env.first_tick.wait(10)
        deliver_first_user_message(self.env, scenario)

    @staticmethod
    def _call_are(fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except ProtocolError:
            raise
        except Exception as exc:
            raise ProtocolError(422, f"{what} failed in ARE: {_one_line(exc)}") from None

    # -- the agent's side ---------------------------------------------------------------------------

    def list_tools(self) -> dict[str, Any]:
        with self.lock:
            self._require(agent=True)
            return {"tools": [tool_spec(t) for t in self.tools.values()]}

    def call_tool(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("name")
        arguments = req.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise ProtocolError(400, "POST /tools/call needs name (string) and arguments (object)")
        with self.lock:
            env = self._require(agent=True, running=True)
            tool = self.tools.get(name)
            if tool is None:
                return {"ok": False, "error": f"unknown tool {name!r}", "result": None, "text": "", "time": self._now()}
            if name == "SystemApp__wait_for_notification":  # same path as POST /wait_for_notification
                try:
                    waited = self.wait({"timeout": arguments.get("timeout", 0)})
                except ProtocolError as exc:
                    if exc.status != 400:
                        raise
                    return {"ok": False, "error": str(exc), "result": None, "text": "", "time": self._now()}
                ok = waited["error"] is None
                return {
                    "ok": ok,
                    "error": waited["error"],
                    "result": None,
                    "text": "None" if ok else "",
                    "time": waited["time"],
                }

            def run() -> Any:
                with env.tick_lock:
                    return tool(**arguments)

            try:
                kind = "app_agent" if name.endswith("__expert_agent") else "tool"
                result = self._deadline(run, kind, f"tool {name}")
            except ProtocolError:
                raise
            except Exception as exc:
                return {"ok": False, "error": _one_line(exc), "result": None, "text": "", "time": self._now()}
            body = {"ok": True, "error": None, "result": make_serializable(result), "text": str(result)}
            if tool.name == SEND_TO_USER:
                body.update(self._after_turn_end())
            check_alive(env)
            body["time"] = self._now()
            return body

    def _after_turn_end(self) -> dict[str, Any]:
        self._deadline(self._settle_turn_conditions, "finish", "judging the turn")
        return {"turn_ended": True, "turns_completed": self._sends_to_user(), "world_stopped": self._stopped()}

    def _stopped(self) -> bool:
        """True once ARE stopped the world (its duration ran out, or the judge rejected a turn)."""
        env = self.env
        if env is None:
            return False
        return env.stop_event.is_set() or env.state not in (EnvironmentState.RUNNING, EnvironmentState.PAUSED)

    def _settle_turn_conditions(self) -> None:
        """ARE checks a finished turn in a ConditionCheckEvent on its next tick (about a second of wall time);
        run that tick now, so the judge's verdict and the next user message do not depend on wall-clock luck."""
        env = self.env
        if env is None or self.paused_at is not None or self.oracle:
            return
        sends = self._sends_to_user()
        with env.tick_lock:
            for _ in range(5):
                due = [
                    e
                    for e in env.event_queue.list_view()
                    if isinstance(e, ConditionCheckEvent)
                    and e.event_id.startswith("condition_turn_")
                    and int(e.event_id.rsplit("_", 1)[1]) <= sends
                ]
                if not due or self._stopped():
                    return
                next_time = min(e.event_time for e in due)
                now = env.time_manager.time()
                if next_time > now:
                    env.time_manager.add_offset(next_time - now)
                try:
                    env.tick()
                except Exception:
                    check_alive(env)
                    raise

    def pull_notifications(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True)
            with env.tick_lock:
                now = self._now()
                messages = env.notification_system.message_queue.get_by_timestamp(datetime.fromtimestamp(now, tz=UTC))
            kinds = {
                MessageType.USER_MESSAGE: "user_message",
                MessageType.ENVIRONMENT_NOTIFICATION: "environment",
                MessageType.ENVIRONMENT_STOP: "environment_stop",
            }
            return {
                "notifications": [
                    {
                        "type": kinds.get(m.message_type, str(m.message_type)),
                        "message": m.message,
                        "timestamp": m.timestamp.timestamp(),
                        "datetime": m.timestamp.strftime("%Y-%m-%d %H:%M:%S"),
                    }
                    for m in messages
                ],
                "time": now,
                "world_stopped": self._stopped(),
            }

    def wait(self, req: dict[str, Any]) -> dict[str, Any]:
        timeout = req.get("timeout", 60)
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ProtocolError(400, "POST /wait_for_notification needs timeout: seconds of simulated time (>= 0)")
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is paused: resume it before waiting")
            tool = self.tools.get("SystemApp__wait_for_notification")
            if tool is None:
                raise ProtocolError(409, "this scenario has no SystemApp, so it cannot wait for notifications")
            before = self._now()
            pending = env.notification_system.message_queue.has_new_messages(datetime.fromtimestamp(before, tz=UTC))
            error = None
            if not pending and not self._stopped():
                # ARE jumps the clock to the next event or notification (or to the timeout): no wall-time sleep.
                def run() -> None:
                    with env.tick_lock:
                        tool(timeout=int(timeout))

                try:
                    self._deadline(run, "wait", "wait_for_notification")
                except ProtocolError:
                    raise
                except Exception as exc:  # e.g. a failure injected by ARE's noise augmentation
                    error = _one_line(exc)
            check_alive(env)
            after = self._now()
            return {
                "time": after,
                "datetime": _iso(after),
                "advanced": after - before,
                "world_stopped": self._stopped(),
                "error": error,
            }

    def clock(self) -> dict[str, Any]:
        with self.lock:
            env = self._require()
            now = self._now()
            return {
                "time": now,
                "datetime": _iso(now),
                "start_time": env.start_time,
                "elapsed": now - env.start_time,
                "paused": self.paused_at is not None,
            }

    def pause(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is already paused")
            with env.tick_lock:
                env.pause()
            self.paused_at = time.monotonic()
            return {"time": self._now(), "paused": True}

    def resume(self, req: dict[str, Any]) -> dict[str, Any]:
        mode = req.get("mode", "measured")
        seconds = req.get("seconds")
        if mode not in ("measured", "fixed") or (seconds is not None and not isinstance(seconds, (int, float))):
            raise ProtocolError(400, "POST /clock/resume takes mode: measured|fixed and seconds: number")
        if mode == "fixed" and seconds is None:
            raise ProtocolError(400, "mode fixed needs seconds: the simulated think time to charge")
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is None:
                raise ProtocolError(409, "the clock is not paused")
            charged = float(seconds) if seconds is not None else time.monotonic() - self.paused_at
            if charged < 0:
                raise ProtocolError(400, "seconds must be >= 0")
            with env.tick_lock:
                if env.state == EnvironmentState.PAUSED:
                    env.resume_with_offset(charged)  # ARE's own call after a model generation
                else:
                    charged = 0.0  # the world stopped meanwhile: its clock no longer matters
            self.paused_at = None
            return {"time": self._now(), "paused": False, "charged": charged}

    def message_to_user(self, req: dict[str, Any]) -> dict[str, Any]:
        content = req.get("content")
        if not isinstance(content, str):
            raise ProtocolError(400, "POST /message_to_user needs content (string)")
        body = self.call_tool({"name": SEND_TO_USER, "arguments": {"content": content}})
        if not body["ok"]:
            raise ProtocolError(409, f"sending the message failed in ARE: {body['error']}")
        return {k: body[k] for k in ("time", "turn_ended", "turns_completed", "world_stopped")} | {
            "nb_turns": self._nb_turns()
        }

    # -- verdicts -----------------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                self.resume({"mode": "fixed", "seconds": 0})
            self._deadline(self._settle_turn_conditions, "finish", "judging the last turn")
            with env.tick_lock:
                env.pause()  # no event may fire while the judge reads the log
            check_alive(env)
            scenario = self.scenario
            result = self._deadline(lambda: scenario.validate(env), "finish", "validation")
            body = self._verdict(result, simulated=self._now() - env.start_time)
            self.finished = True
            env.stop()
            return body

    def run_are_agent(self, req: dict[str, Any]) -> dict[str, Any]:
        """ARE's own default agent (the reference scaffold) runs the loaded scenario, then the judge decides."""
        llm = _llm_spec(req.get("llm"), "llm")
        think = req.get("think_time") or {"mode": "measured"}
        timeout = req.get("timeout", ARE_AGENT_DEADLINE)
        max_iterations = req.get("max_iterations")
        if not isinstance(think, dict) or think.get("mode") not in ("measured", "fixed"):
            raise ProtocolError(400, 'think_time is {"mode": "measured"} or {"mode": "fixed", "seconds": N}')
        if think["mode"] == "fixed" and not isinstance(think.get("seconds"), (int, float)):
            raise ProtocolError(400, "think_time mode fixed needs seconds: the simulated time charged per model call")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ProtocolError(400, "timeout is the wall-clock seconds ARE's agent may run (> 0)")
        if max_iterations is not None and (not isinstance(max_iterations, int) or max_iterations < 1):
            raise ProtocolError(400, "max_iterations is a positive integer (ARE's default is 80 per turn)")
        from are.simulation.agents.agent_builder import AgentBuilder
        from are.simulation.agents.agent_config_builder import AgentConfigBuilder
        from are.simulation.agents.are_simulation_agent_config import LLMEngineConfig
        from are.simulation.types import SimulatedGenerationTimeConfig

        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is paused: resume it before starting ARE's agent")
            scenario = self.scenario
            config = AgentConfigBuilder().build(agent_name="default")
            base = config.get_base_agent_config()
            base.llm_engine_config = LLMEngineConfig(
                model_name=llm["model"], provider=llm.get("provider"), endpoint=llm.get("endpoint")
            )
            base.simulated_generation_time_config = SimulatedGenerationTimeConfig(
                mode=think["mode"], seconds=think.get("seconds", 1.0)
            )
            agent = self._call_are(
                lambda: AgentBuilder(_engine_builder(llm, "llm")).build(agent_config=config, env=env),
                "building ARE's agent",
            )
            if max_iterations is not None:
                # ARE's AgentBuilder drops the config's max_iterations: its ARESimulationAgent resets the
                # ReAct agent to its own default (80). Set it where the termination check reads it.
                agent.max_iterations = agent.react_agent.max_iterations = max_iterations
            output, stopped, error = None, "finished", None
            try:
                output = _with_deadline(
                    lambda: agent.run_scenario(scenario=scenario, notification_system=env.notification_system),
                    float(timeout),
                    "ARE's agent",
                ).output
                stopped, error = _gave_up(agent.react_agent)
            except ProtocolError as exc:  # out of time: stop it and judge what it did
                agent.stop()
                stopped, error = "timeout", str(exc).split(";")[0]
            except Exception as exc:  # an agent failure: judged as it stands, the error reported
                stopped, error = "error", _one_line(exc)
            body = self.finish()
            body["agent"] = {
                "name": "are-default",
                "model": llm["model"],
                "output": None if output is None else str(output),
                "stopped": stopped,
                "error": error,
                "logs": [_agent_log(log) for log in agent.react_agent.logs],
            }
            return body

    def run_oracle(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=False, running=True)
            scenario = self.scenario

            def run() -> dict[str, Any]:
                try:
                    env.run(scenario, wait_for_end=True)
                    check_alive(env)
                    check_oracle_trace(scenario, env.event_log.list_view(), "ARE's oracle run")
                    ran = scenario.validate(env)
                    simulated = self._now() - env.start_time
                finally:
                    env.stop()
                if self.kind != "json":
                    self.judge_label = "the scenario's own validation (ARE registry scenario)"
                    self.checks = ["scenario.validate"]
                    return self._verdict(ran, simulated)
                return self._judge_oracle_run(ran, env.event_log.list_view(), simulated)

            body = self._deadline(run, "oracle", "the oracle run")
            self.finished = True
            return body

    def _judge_oracle_run(self, ran: Any, completed: list[Any], simulated: float) -> dict[str, Any]:
        """A Gaia2 JSON scenario's oracle trace, judged offline by ARE's GraphPerEventJudge (its judge-only
        path): proof that the scenario's oracle passes the same judge an agent faces."""
        if not ran.success:
            self.judge_label, self.checks = "ARE oracle run", ["oracle_run"]
            return self._verdict(ran, simulated)
        fresh = _import_json(self.source_text)
        self._prepare(fresh, self.load_params)
        judge_config, label, checks = _judge_config(self.judge_spec)
        self.judge_engine = getattr(judge_config, "engine", None)
        self.judge_label, self.checks = label, ["oracle_run", *checks]
        self._call_are(
            lambda: preprocess_scenario(fresh, judge_config=judge_config, offline_validation=True),
            "preparing the judge",
        )
        judged_env = Environment()
        judged_env.event_log = EventLog.from_list_view(completed)
        return self._verdict(fresh.validate(judged_env), simulated, getattr(fresh, "judge", None))

    def _verdict(self, result: Any, simulated: float, judge: Any = None) -> dict[str, Any]:
        exception = getattr(result, "exception", None)
        soft = "judged" if "soft_llm_checks" in self.checks else "not judged (no judge model configured)"
        if soft == "judged" and exception is not None:
            soft = "failed (the judge raised; see exception)"
        if self.kind != "json":
            soft = "not applicable"
        success = bool(result.success)
        rationale = getattr(result, "rationale", None)
        if rationale in ("None", ""):  # ARE's judge stringifies a missing failure
            rationale = None
        if not success and not rationale:
            if exception is not None:
                rationale = _one_line(exception)
            elif result.success is None:
                rationale = "ARE gave no verdict (success=None): the scenario has no oracle events to judge against"
            else:
                rationale = "the scenario's validation returned success=False (ARE gives no rationale for it)"
        turns_total = self._nb_turns()
        body = {
            "scenario_id": self.scenario.scenario_id,
            "success": success,
            "rationale": rationale,
            "exception": _one_line(exception) if exception is not None else None,
            "judge": self.judge_label,
            "judge_usd": _judge_usd(getattr(self, "judge_engine", None)),
            "checks": self.checks,
            "soft_checks": soft,
            "oracle": self.oracle,
            "turns_completed": self._sends_to_user() if self.env else 0,
            "nb_turns": turns_total,
            "simulated_seconds": simulated,
            "wall_seconds": time.monotonic() - self.loaded_wall,
            "matches": judge_matches(judge if judge is not None else getattr(self.scenario, "judge", None)),
        }
        publish_verdict(body)
        return body


def publish_verdict(body: dict[str, Any]) -> None:
    """Also write the verdict where `LABKUBE_WORLD_VERDICT_FILE` says: in a pod, the world container's termination
    message, which only this container can write. The operator hands it to the grading pod; the copy the agent's
    harness keeps in its checkpoint is on a volume the agent can write, so on a cluster it is not the record."""
    path = os.environ.get(VERDICT_FILE_VARIABLE)
    if path:
        Path(path).write_text(verdict_report(body))


def _judge_usd(engine: Any) -> float | None:
    """What ARE's soft judge spent on its model, where its price was given (with its budget); else unknown."""
    if getattr(engine, "usd_per_million", None) is None:
        return None
    return round(engine.spent_usd, 6)


def judge_matches(judge: Any) -> list[dict[str, Any]] | None:
    """The agent events a GraphPerEventJudge weighed, in order, each with the oracle event it matched (ARE keeps
    this in the judge's state only); None for judges without per-event matching."""
    state = getattr(judge, "state", None)
    matched = getattr(state, "agent_idx_to_oracle_id", None)
    if state is None or matched is None:
        return None
    out = []
    index = 0
    for turn, events in enumerate(getattr(state, "turn_to_agent_events", []) or []):
        for event in events:
            try:
                tool = f"{event.app_name()}__{event.function_name()}"
                args = make_serializable(dict(getattr(event.action, "args", {}) or {}))
            except Exception:  # an event ARE could not describe: keep its place in the order
                tool, args = "unknown", {}
            out.append(
                {
                    "tool": tool,
                    "args": {k: v for k, v in args.items() if k != "self"},
                    "turn": turn,
                    "simulated_time": getattr(event, "event_time", None),
                    "oracle_event_id": matched.get(index),
                }
            )
            index += 1
    return out


def _gave_up(react_agent: Any) -> tuple[str, str | None]:
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


def _agent_log(log: Any) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stalls
    session: WorldSession  # set by serve()

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise ProtocolError(400, f"the request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ProtocolError(400, "the request body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        s = self.session
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
            ("GET", "/health"): lambda _: {"status": "ok", "are_version": ARE_VERSION, "pid": os.getpid()},
            ("GET", "/scenario"): lambda _: s.info(),
            ("GET", "/state"): lambda _: s.state(),
            ("POST", "/scenario"): s.load,
            ("GET", "/tools"): lambda _: s.list_tools(),
            ("POST", "/tools/call"): s.call_tool,
            ("POST", "/notifications/pull"): lambda _: s.pull_notifications(),
            ("POST", "/wait_for_notification"): s.wait,
            ("GET", "/time"): lambda _: s.clock(),
            ("POST", "/clock/pause"): lambda _: s.pause(),
            ("POST", "/clock/resume"): s.resume,
            ("POST", "/message_to_user"): s.message_to_user,
            ("POST", "/finish"): lambda _: s.finish(),
            ("POST", "/oracle"): lambda _: s.run_oracle(),
            ("POST", "/are_agent"): s.run_are_agent,
        }
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            route = routes.get((method, path))
            if route is None:
                known = ", ".join(f"{m} {p}" for m, p in routes)
                raise ProtocolError(404, f"no endpoint {method} {path} (endpoints: {known})")
            self._send(200, route(self._body() if method == "POST" else {}))
        except ProtocolError as exc:
            self._send(exc.status, {"error": str(exc)})
        except WorldBroken as exc:
            log.error("the world is broken (%s %s): %s", method, path, exc)
            self._send(503, {"error": str(exc), "world_broken": True})
        except Exception as exc:
            log.error("unexpected error on %s %s\n%s", method, path, traceback.format_exc())
            self._send(500, {"error": f"unexpected error in the world process: {_one_line(exc)}"})

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


def _warm_judge() -> None:
    """Build ARE's judge once in the background, so the template cache is warm for the first scenario."""
    try:
        from are.simulation.validation import JudgeFactory

        JudgeFactory()(_judge_config(None)[0])
    except Exception as exc:  # only an optimisation
        log.warning("warming the judge failed: %s", _one_line(exc))


def _exit_with_parent(parent: int) -> None:
    """A world belongs to the agent that started it: when that process is gone, so is the world."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def serve(host: str, port: int, announce: Callable[[str], None]) -> None:
    if os.environ.get("LABKUBE_WORLD_ORPHAN_EXIT", "1") == "1":
        threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="world-parent").start()
    _install_template_cache()
    threading.Thread(target=_warm_judge, daemon=True, name="world-warm-judge").start()
    Handler.session = WorldSession()
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    announce(f"LISTENING {server.server_address[1]}")
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve ARE Gaia2 scenarios over HTTP (labkube world process).")
    # A pod's world sidecar gets its port from LABKUBE_WORLD_PORT (the chart's runs.world.port).
    parser.add_argument("--host", default=os.environ.get("LABKUBE_WORLD_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("LABKUBE_WORLD_PORT", "0")),
        help="0 picks a free port (printed as LISTENING <port>); default: $LABKUBE_WORLD_PORT",
    )
    parser.add_argument("--log-level", default=os.environ.get("LABKUBE_WORLD_LOG_LEVEL", "WARNING"))
    args = parser.parse_args(argv)
    # ARE starts some tool servers (MCP) as a bare `python`: make that this virtualenv's python.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # stdout carries only the LISTENING line: anything ARE prints goes to stderr.
    announce_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("are").setLevel(args.log_level.upper())

    def announce(line: str) -> None:
        os.write(announce_fd, (line + "\n").encode())
        os.close(announce_fd)

    serve(args.host, args.port, announce)


if __name__ == "__main__":
    main()
