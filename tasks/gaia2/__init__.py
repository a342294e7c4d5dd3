"""Gaia2 worlds on Meta ARE: the world process, its HTTP protocol, scenarios and the judge.

ARE runs in its own virtualenv (`setup_world_env`) as a world process (`start_world`, `WorldPool`)
that serves `world_server.py`'s protocol (docs/gaia2-world-protocol.md); the agent talks to it
through `WorldClient`. Scenario references (`gaia2/<name>`, JSON files, dataset rows) resolve with
`resolve_scenarios`.
"""

from labkube.tasks.gaia2.scenarios import (
    BUNDLED_DIR,
    CAPABILITIES,
    Gaia2Scenario,
    ScenarioError,
    bundled_scenarios,
    capability_tags,
    load_scenario,
    resolve_scenarios,
)
from labkube.tasks.gaia2.world_client import (
    CONTROL_TOKEN_VARIABLE,
    AgentLogEntry,
    AreAgentReport,
    AreAgentRun,
    ClockResumed,
    ClockState,
    Health,
    Notification,
    Notifications,
    ScenarioInfo,
    ToolResult,
    ToolSpec,
    TurnEnd,
    ValidationResult,
    WaitResult,
    WorldBroken,
    WorldClient,
    WorldDied,
    WorldError,
    WorldRequestError,
    WorldTimeout,
)
from labkube.tasks.gaia2.world_env import (
    ARE_VERSION,
    WorldEnvError,
    is_world_env_ready,
    setup_world_env,
    world_env_dir,
    world_python,
)
from labkube.tasks.gaia2.world_llm import WorldLLM, WorldLLMError, world_llm
from labkube.tasks.gaia2.world_process import WorldPool, WorldProcess, WorldStartError, start_world

__all__ = [
    "ARE_VERSION",
    "BUNDLED_DIR",
    "CAPABILITIES",
    "CONTROL_TOKEN_VARIABLE",
    "AgentLogEntry",
    "AreAgentReport",
    "AreAgentRun",
    "ClockResumed",
    "ClockState",
    "Gaia2Scenario",
    "Health",
    "Notification",
    "Notifications",
    "ScenarioError",
    "ScenarioInfo",
    "ToolResult",
    "ToolSpec",
    "TurnEnd",
    "ValidationResult",
    "WaitResult",
    "WorldBroken",
    "WorldClient",
    "WorldDied",
    "WorldEnvError",
    "WorldError",
    "WorldLLM",
    "WorldLLMError",
    "WorldPool",
    "WorldProcess",
    "WorldRequestError",
    "WorldStartError",
    "WorldTimeout",
    "bundled_scenarios",
    "capability_tags",
    "is_world_env_ready",
    "load_scenario",
    "resolve_scenarios",
    "setup_world_env",
    "start_world",
    "world_env_dir",
    "world_llm",
    "world_python",
]
