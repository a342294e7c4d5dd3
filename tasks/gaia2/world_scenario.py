"""Loading a scenario into ARE for the world process: where it comes from (JSON text, a file, ARE's registry), its
environment, the noise and agent2agent augmentations, seeded tool failures, its capability tags, and the
agent's view of its tools (`tool_spec`: ARE's argument types as JSON schemas).

Standalone like world_server.py (stdlib + ARE only), imported by name from the same folder.
"""

from __future__ import annotations

import inspect
import logging
import random
import threading
import typing
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from are.simulation import environment as are_environment
from are.simulation import types as are_types
from are.simulation.data_handler.importer import JsonScenarioImporter
from are.simulation.environment import Environment, EnvironmentConfig
from are.simulation.notification_system import VerboseNotificationSystem
from are.simulation.scenarios.scenario_imported_from_json.benchmark_scenario import BenchmarkScenarioImportedFromJson
from are.simulation.scenarios.utils.scenario_expander import EnvEventsConfig
from are.simulation.types import CapabilityTag, EnvironmentType, ToolAugmentationConfig
from are.simulation.utils import type_utils as are_type_utils
from are.simulation.utils.serialization import make_serializable
from world_engines import engine_builder, llm_spec
from world_health import WorldEnvironment
from world_protocol import ProtocolError, one_line

log = logging.getLogger("labkube.world")

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
# The scenario and its environment


def environment_for(scenario: Any, oracle: bool) -> WorldEnvironment:
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


_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def format_only_logged_environment_messages() -> None:
    """ARE's environment formats a message for every event it processes (its simulated time, a colour through
    termcolor, which asks whether stdout is a terminal each time) before its logger decides to drop it: debug and
    info messages, dropped at the world's default level, cost about 2 ms of CPU per oracle run. Format a
    message only when ARE's environment logger would emit it; what is logged is ARE's message, unchanged."""
    format_and_log = Environment._log
    if getattr(format_and_log, "labkube_skips_unlogged", False):
        return

    def log_if_enabled(self: Environment, message: str, level: str, color: str, attrs: list[str] | None = None) -> None:
        numeric = _LOG_LEVELS.get(level)  # ARE logs nothing at a level it does not name
        if numeric is not None and are_environment.logger.isEnabledFor(numeric):
            format_and_log(self, message, level, color, attrs)

    log_if_enabled.labkube_skips_unlogged = True  # type: ignore[attr-defined]
    Environment._log = log_if_enabled  # type: ignore[method-assign]


def install_environment_shortcuts() -> None:
    """What ARE's environment and apps recompute on every event, computed once per world process."""
    format_only_logged_environment_messages()
    remember_tool_signatures()


class _RememberedSignatures:
    """`inspect` for ARE's modules, with `signature` remembered per function (a function's parameters do not change
    once it is defined); any other name is `inspect`'s own. At most `limit` functions are remembered, so functions
    made on the fly cannot grow it without bound; past it, a signature is computed as `inspect` does."""

    def __init__(self, limit: int = 4096) -> None:
        self._seen: dict[Any, inspect.Signature] = {}
        self._limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    def signature(self, fn: Any) -> inspect.Signature:
        if not inspect.isfunction(fn):  # a bound method, a class, a partial: as inspect computes it
            return inspect.signature(fn)
        seen = self._seen.get(fn)
        if seen is None:
            seen = inspect.signature(fn)
            if len(self._seen) < self._limit:
                self._seen[fn] = seen
        return seen


def _remembered_type_hints(limit: int = 4096) -> Callable[..., dict[str, Any]]:
    seen: dict[Any, dict[str, Any]] = {}

    def get_type_hints(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if args or kwargs or not inspect.isfunction(fn):
            return typing.get_type_hints(fn, *args, **kwargs)
        hints = seen.get(fn)
        if hints is None:
            hints = typing.get_type_hints(fn)
            if len(seen) < limit:
                seen[fn] = hints
        return dict(hints)  # a copy: the caller may change what it gets

    return get_type_hints


def remember_tool_signatures() -> None:
    """Every call of an app's tool goes through ARE's `type_check` (the function's signature and its type hints, from
    its annotations) and, when its app is registered, `event_registered` (its signature again): about 1 ms of CPU
    per oracle run, computed anew each call for the same hundred functions. Compute each once; the checks and the
    events they make are ARE's."""
    if isinstance(are_type_utils.inspect, _RememberedSignatures):
        return
    signatures = _RememberedSignatures()
    are_type_utils.inspect = signatures
    are_type_utils.get_type_hints = _remembered_type_hints()
    are_types.inspect = signatures


def noise_configs(noise: Any) -> tuple[ToolAugmentationConfig | None, EnvEventsConfig | None]:
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


def a2a_params(a2a: Any) -> tuple[float, dict[str, Any]]:
    if not isinstance(a2a, dict) or set(a2a) - {"proportion", "llm"}:
        raise ProtocolError(400, 'agent2agent must be {"proportion": 0..1, "llm": {"model": ..., ...}}')
    proportion = a2a.get("proportion", 1.0)
    if not isinstance(proportion, (int, float)) or not 0 < proportion <= 1:
        raise ProtocolError(400, "agent2agent.proportion is the share of apps that become agents: (0, 1]")
    return float(proportion), llm_spec(a2a.get("llm"), "agent2agent.llm")


def apply_agent2agent(scenario: Any, env: Environment, proportion: float, llm: dict[str, Any]) -> None:
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
        config, scenario, env, AppAgentConfigBuilder(), AppAgentBuilder(engine_builder(llm, "agent2agent.llm"))
    )
    if not getattr(scenario, "has_a2a_augmentation", False):
        raise ProtocolError(422, f"agent2agent: a share of {proportion} turns none of the scenario's apps into agents")


def seed_tool_failures(scenario: Any) -> None:
    """Seed the noise's tool failures from the scenario seed and the tool's name. ARE leaves `AppTool.seed`
    unset, so each tool draws from `Random(None)` and the same seed fails different calls on every run."""
    tools = []
    for app in scenario.apps or []:
        if getattr(app, "failure_probability", None) is None:
            continue  # its tools never fail (ARE gives a tool its app's probability); building them costs ms per app
        tools += app.get_tools()
        inner = getattr(getattr(app, "app_agent", None), "tools", None) or {}  # agent2agent: the app's own tools
        tools += [t.app_tool for t in inner.values() if hasattr(t, "app_tool")]
    for tool in tools:
        if tool.failure_probability is not None:
            tool.seed = zlib.crc32(f"{scenario.seed}:{tool.name}".encode())
            tool.rng = random.Random(tool.seed)


def read_source(source: str) -> tuple[str, str]:
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


def import_json(text: str) -> BenchmarkScenarioImportedFromJson:
    try:
        scenario, _, _ = JsonScenarioImporter().import_from_json_to_benchmark(text, load_completed_events=False)
    except Exception as exc:
        raise ProtocolError(422, f"ARE could not import the scenario JSON: {one_line(exc)}") from None
    return scenario


def registry_scenario(scenario_id: str) -> Any:
    from are.simulation.scenarios.utils.registry import registry

    known = registry.get_all_scenarios()
    if scenario_id not in known:
        raise ProtocolError(
            422, f"unknown scenario {scenario_id!r}: not a JSON text, not a file, not in ARE's registry {sorted(known)}"
        )
    return known[scenario_id]()


def close_apps(scenario: Any) -> None:
    """Close apps that hold resources (MCP sessions) in the background: closing takes a second or more,
    and ARE can hang there (are-run did after scenario_mcp_demo), so nothing waits for it."""
    closers = [app.close for app in (getattr(scenario, "apps", None) or []) if callable(getattr(app, "close", None))]
    if closers:
        threading.Thread(target=lambda: [_quietly(c) for c in closers], daemon=True, name="world-close").start()


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # closing is best effort
        log.warning("closing an app failed: %s", one_line(exc))


def capability_tags(scenario: Any) -> list[str]:
    tags = [t.value.lower() for t in getattr(scenario, "tags", ()) or () if isinstance(t, CapabilityTag)]
    if getattr(scenario, "has_a2a_augmentation", False):
        tags.append("agent2agent")
    if getattr(scenario, "tool_augmentation_config", None) or getattr(scenario, "env_events_config", None):
        tags.append("noise")
    return sorted(set(tags))
