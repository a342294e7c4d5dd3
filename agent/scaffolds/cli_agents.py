"""Claude Code and Codex CLI as scaffolds beside rg-agent (`--agent claude-code`, `--agent codex`).

The run's `labkube agent` process starts the model gateway (`agent/gateway/`) with the real key, then the
vendor's CLI headless in the run's workspace, pointed at the gateway by the CLI's documented settings
(`ANTHROPIC_BASE_URL`; a Codex model provider's `base_url`) with only the run's gateway token. The CLI's
environment has no API key, its configuration lives in the run directory (`cli-home/`), its event stream becomes
transcript lines (`agent/scaffolds/cli_events.py`) and its raw stream is kept in `logs/<agent>.jsonl`.

Locally (`--sandbox bwrap`, the default) the whole CLI runs in the run's sandbox: node and the CLI's installation
read-only, its config home and the workspace read-write, no network but the task's (`network: proxy`: the run's
proxy, as for rg-agent's commands); it reaches the gateway, the proxy, and in a Gaia2 run the world's tools, through
unix sockets bound in (agent/scaffolds/cli_sandbox.py says how). A command the sandbox could
not start ends the run as a harness error. With `--sandbox none` and in a pod (the gateway a sidecar on the pod's
loopback, `LABKUBE_GATEWAY_URL`) the CLI runs as a plain subprocess, as before.

The vendors' own sandboxes are off inside labkube's: labkube's sandbox is the boundary, and theirs cannot work in it
(bubblewrap in a sandbox needs nested user namespaces, which it does not have; Codex 0.169 wraps each command in
`bwrap` when it finds one and its `codex-linux-sandbox` helper is not on the sandbox's PATH, so every command fails,
silently, and the run ends `done`). Claude Code runs with bypassPermissions (`IS_SANDBOX`); Codex with
`--dangerously-bypass-approvals-and-sandbox`.

Budgets: tokens, dollars and model calls (steps) are the gateway's; wall time is this supervisor's, with the
gateway's retry back-off given back: past the budget the CLI gets SIGINT, then SIGKILL after a grace period. Grading
is periodic and final as for any run. Blocked URLs: in labkube's sandbox nothing but the gateway (and, with `network:
proxy`, the run's proxy, which refuses them) is reachable, so no command reaches them; Claude Code also gets deny
rules and a PreToolUse hook (`scaffolds/cli_hook.py`, rg-agent's own URL rules). Unsandboxed, Codex has no per-URL
control, so its own sandbox keeps commands off the network when the task blocks URLs (where the kernel allows Codex's
sandbox; the pod's NetworkPolicy is the boundary on a cluster). A resumed run continues the CLI's own session
(`claude --resume`, `codex exec resume`); with no session to continue it starts anew and the result says so
(`details.cli.restarted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from labkube.agent.budget import BudgetTracker
from labkube.agent.checkpoint import Checkpoint
from labkube.agent.containment import TOKEN_VARIABLE
from labkube.agent.gateway import (
    GatewayAddress,
    GatewayError,
    GatewayState,
    GatewayView,
    ModelGateway,
    run_config,
    upstream_for,
)
from labkube.agent.gateway.sidecar import GATEWAY_TOKEN_VARIABLE, GATEWAY_URL_VARIABLE
from labkube.agent.prompts import initial_messages
from labkube.agent.providers.provider import ProviderError
from labkube.agent.providers.registry import api_key_for
from labkube.agent.rg.tools import ToolContext
from labkube.agent.rg.workspace import Workspace
from labkube.agent.scaffolds.cli_events import ClaudeCodeEvents, CodexEvents
from labkube.agent.scaffolds.cli_install import (
    CLI_AGENTS,
    CliAgentSpec,
    InstallError,
    ensure_installed,
    install_dir,
    reported_version,
)
from labkube.agent.scaffolds.cli_sandbox import (
    CliSandbox,
    SandboxStatus,
    WorldToolsSocket,
    cli_sandbox,
    write_home_file,
)
from labkube.agent.telemetry import RunTelemetry
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.budgets import StopReason, Usage
from labkube.model_ref import parse_model
from labkube.result import completion_of
from labkube.run_spec import RunPhase, RunSpec
from labkube.sandbox import SANDBOX_WORKSPACE, SandboxFailed, SandboxMode, SandboxUnavailable
from labkube.store import RunDir
from labkube.task_card import NetworkAccess, TaskCard

if TYPE_CHECKING:
    from labkube.agent.rg.world_session import WorldSession
    from labkube.agent.sandbox_proxy import SandboxProxy
    from labkube.result import Grade

log = logging.getLogger(__name__)

# The tools a CLI's calls are recorded as (agent/scaffolds/cli_events.py), for the run's series from the first scrape.
CLI_TOOL_NAMES = ("bash", "write_file", "replace", "read_file", "search", "web_browser", "web_search")
INTERRUPT_GRACE_S = 15.0
TURN_ENDING_TOOL = "AgentUserInterface__send_message_to_user"  # a Gaia2 turn ends when the agent messages the user
WORLD_TOOLS_NOTE = (
    "The world's apps are your tools (the `world` tools, named <App>__<action>), with wait_for_notification and "
    "get_current_time. Reply to the user only with AgentUserInterface__send_message_to_user."
)
POLL_S = 1.0
CONTINUE_PROMPT = (
    "Your session was interrupted (the run's sandbox restarted) and has been resumed. Continue the task from where "
    "you left off; the workspace is as you left it."
)
# Variables the CLI must not inherit: keys, other endpoints, and the CLIs' own configuration from the host.
DROPPED_PREFIXES = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "AZURE_OPENAI", "AWS_", "GOOGLE_", "LABKUBE_")


class CliState(BaseModel):
    """The CLI side of a run, kept in the checkpoint and reported in the result (`details.cli`)."""

    agent: str
    package: str
    version: str = Field(description="The pinned npm version that ran.")
    reported_version: str = Field(default="", description="What the executable's --version says.")
    session_id: str | None = None
    starts: int = 0
    resumed: int = Field(default=0, description="Starts that continued the CLI's own session.")
    restarted: int = Field(default=0, description="Starts after the first that began anew (no session to resume).")


def cli_env(rd: RunDir, spec: RunSpec, card: TaskCard, home: Path) -> dict[str, str]:
    """rg-agent's command environment (the task's environment active, no keys), without any provider or CLI
    settings of the host, with HOME in the run directory."""
    ctx = ToolContext(
        workspace=Workspace(rd.workspace),
        blocked_urls=card.blocked_urls,
        secret_vars=frozenset(spec.api_key_env.values()),
    )
    env = {k: v for k, v in ctx.env().items() if not k.startswith(DROPPED_PREFIXES) or k == TOKEN_VARIABLE}
    env["HOME"] = str(home)
    env.setdefault("LANG", "C.UTF-8")
    return env


def world_mcp_command(world_url: str) -> list[str]:
    """The world's apps as an MCP server over stdio (`labkube world-mcp`), for a CLI in a Gaia2 world."""
    return [sys.executable, "-P", "-m", "labkube", "world-mcp", "--world-url", world_url]


class GatewayRoute(GatewayAddress):
    """The gateway as the CLI reaches it (its URL, and the run token as its API key): the gateway's own address, or
    the relay's on the sandbox's loopback."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token


def claude_setup(
    home: Path,
    env: dict[str, str],
    gw: GatewayRoute,
    model: str,
    blocked: list[str],
    world_server: list[str] | None = None,
    box: CliSandbox | None = None,
) -> list[str]:
    """Claude Code's environment and its settings file: the gateway as its API, nothing sent elsewhere, every tool
    allowed without asking (nobody answers), and the task's blocked URLs refused. `world_server`: the command of the
    MCP server with a Gaia2 world's tools; `box`: the CLI runs in the run's sandbox, with the helpers it has there."""
    env.update(
        {
            "ANTHROPIC_BASE_URL": gw.anthropic_base_url,
            "ANTHROPIC_API_KEY": gw.token,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,  # side calls (titles, summaries) on the run's model too
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",  # bypassPermissions as root: the run's sandbox is the boundary
            # Every tool sent up front and no beta headers a proxy may refuse (without it, a 400 is sent six times,
            # dropping one beta feature a time).
            "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "CLAUDE_CODE_MAX_RETRIES": "2",  # the gateway retries the provider's 429s and 5xx already
        }
    )
    blocked_file = write_home_file(home, "blocked_urls.txt", "\n".join(blocked) + "\n")
    if box is not None:
        hook = box.hook(blocked_file)
    else:
        hook = f"{sys.executable} -P -m labkube.agent.scaffolds.cli_hook {blocked_file}"
    deny = [f"WebFetch(domain:{d})" for d in sorted(_domains(blocked))]
    settings = {
        "permissions": {"deny": deny},
        "hooks": {
            "PreToolUse": [{"matcher": "Bash|WebFetch|WebSearch", "hooks": [{"type": "command", "command": hook}]}]
        },
    }
    path = write_home_file(home, "settings.json", json.dumps(settings, indent=2))
    flags = ["--settings", str(path)]
    if world_server is not None:
        command, *args = world_server
        servers = {"mcpServers": {"world": {"command": command, "args": args}}}
        mcp = write_home_file(home, "mcp.json", json.dumps(servers, indent=2))
        flags += ["--strict-mcp-config", "--mcp-config", str(mcp)]
        env["MCP_TIMEOUT"] = "60000"  # ms for the bridge to start: a cold `python -m labkube` takes seconds
    return flags


def _domains(blocked: list[str]) -> set[str]:
    """Bare hosts among the blocked patterns (WebFetch's deny rules take domains; paths go through the hook)."""
    out = set()
    for pattern in blocked:
        rest = pattern.split("://", 1)[-1]
        host = rest.split("/", 1)[0]
        if host and "*" not in host and rest.strip("/") == host:
            out.add(host.removeprefix("www."))
    return out


def claude_command(exe: Path, prompt: str, settings: list[str], session_id: str | None) -> list[str]:
    resume = ["--resume", session_id] if session_id else []
    return [
        str(exe),
        "-p",
        prompt,
        *resume,
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
        *settings,
    ]


def codex_setup(
    home: Path,
    env: dict[str, str],
    gw: GatewayRoute,
    model: str,
    blocked: list[str],
    world_server: list[str] | None = None,
) -> list[str]:
    """Codex's home (config.toml): the gateway as a model provider of its own, its key the run token; no
    analytics; web search off when the task blocks URLs; `world_server`: the command of the MCP server with a Gaia2
    world's tools."""
    codex_home = home / ".codex"
    web_search = "disabled" if blocked else "live"
    write_home_file(
        home,
        ".codex/config.toml",
        "\n".join(
            [
                f"model = {json.dumps(model)}",
                'model_provider = "labkube"',
                f'web_search = "{web_search}"',
                "[analytics]",
                "enabled = false",
                "[features]",
                "plugins = false",
                "[sandbox_workspace_write]",
                "network_access = false",
                f"writable_roots = [{json.dumps(str(home))}]",
                "[model_providers.labkube]",
                'name = "labkube gateway"',
                f"base_url = {json.dumps(gw.openai_base_url)}",
                'env_key = "LABKUBE_GATEWAY_TOKEN"',
                'wire_api = "responses"',
                "request_max_retries = 2",  # the gateway retries the provider's 429s and 5xx already
                "stream_max_retries = 2",
                *(_codex_world(world_server) if world_server else []),
                "",
            ]
        ),
    )
    env.update({"CODEX_HOME": str(codex_home), "LABKUBE_GATEWAY_TOKEN": gw.token})
    return []


def _codex_world(world_server: list[str]) -> list[str]:
    command, *args = world_server
    return [
        "[mcp_servers.world]",
        f"command = {json.dumps(command)}",
        f"args = {json.dumps(args)}",
        "startup_timeout_sec = 60",  # a cold `labkube world-mcp` takes seconds
        # Required: Codex waits for the server before its first request (otherwise a slow start leaves the first
        # turn without the world's tools) and refuses to run without it, rather than run a world it cannot touch.
        "required = true",
    ]


def codex_command(
    exe: Path,
    prompt: str,
    workspace: Path,
    model: str,
    session_id: str | None,
    blocked: list[str],
    sandboxed: bool = False,
) -> list[str]:
    """`codex exec`. In labkube's sandbox (`sandboxed`) Codex's own is off: there is no network to keep commands off
    (a `network: proxy` task's proxy refuses the blocked URLs itself), and it cannot work there (the module's
    docstring). Unsandboxed, Codex cannot refuse single URLs: when the task
    blocks some, its own sandbox keeps the agent's commands off the network altogether (`workspace-write`,
    network_access = false: the task's packages and data are installed at setup); otherwise commands run as
    rg-agent's do. An unreachable gateway ends the run instead of being retried for ever."""
    own = blocked and not sandboxed
    sandbox = ["--sandbox", "workspace-write"] if own else ["--dangerously-bypass-approvals-and-sandbox"]
    common = ["--json", "--skip-git-repo-check", "-m", model, *sandbox, "--disable", "unbounded_connection_retries"]
    if session_id:
        return [str(exe), "exec", "resume", session_id, *common, prompt]
    return [str(exe), "exec", "-C", str(workspace), *common, prompt]


def task_text(card: TaskCard, spec: RunSpec, workspace: Path) -> str:
    """The same task prompt rg-agent gets (its user message)."""
    messages = initial_messages(card, spec, workspace)
    return "\n\n".join(m.content for m in messages if m.role == "user" and m.content)


async def run_cli_agent(
    rd: RunDir,
    spec: RunSpec,
    card: TaskCard,
    ckpt: Checkpoint,
    transcript: JsonlLog,
    telemetry: RunTelemetry,
    hooks: RunHooks,
    world: WorldSession | None = None,
) -> tuple[StopReason, str | None]:
    """Run the CLI to its end under the run's budgets; the stop reason and error for the final result. In a Gaia2
    world (`world`, its scenario loaded) the world's apps are the CLI's tools over MCP, the world's clock stops
    during model calls, and each further turn of the scenario resumes the CLI's session with the user's message."""
    agent = CLI_AGENTS[spec.agent]
    ref = parse_model(spec.model)
    sidecar = os.environ.get(GATEWAY_URL_VARIABLE)
    try:
        # In a pod the gateway is a sidecar holding the key; this container has none.
        family, upstream = upstream_for(ref, None if sidecar else api_key_for(ref, spec))
    except ProviderError as exc:
        transcript.append({"type": "model_error", "ts": now_iso(), "reason": exc.reason.value, "error": str(exc)})
        return exc.reason, str(exc)
    except GatewayError as exc:
        return StopReason.error, str(exc)
    if family != agent.family:
        return StopReason.error, f"{agent.name} speaks the {agent.family} API and {spec.model} is not served over it"
    try:
        exe = await asyncio.to_thread(ensure_installed, agent)
    except InstallError as exc:
        transcript.append({"type": "setup_error", "ts": now_iso(), "error": str(exc)})
        return StopReason.setup_error, str(exc)

    if sidecar and spec.sandbox is SandboxMode.bwrap:
        return StopReason.error, (
            f"a gateway sidecar ({GATEWAY_URL_VARIABLE}) is reached over the pod's loopback, which a local sandbox "
            "cannot reach: a run beside one is `--sandbox pod`"
        )

    home = rd.root / "cli-home"
    home.mkdir(parents=True, exist_ok=True)
    home = home.resolve()  # bound into the sandbox at this path, the one its settings name
    env = cli_env(rd, spec, card, home)
    state = CliState.model_validate(ckpt.provider_state["cli"]) if "cli" in ckpt.provider_state else None
    state = state or CliState(agent=agent.name, package=agent.package, version=agent.version)
    try:
        minors = hooks.gpu_minors(spec.gpus) if hooks.gpu_minors is not None else None
        outbound = card.network is NetworkAccess.proxy
        box = cli_sandbox(spec, rd, home, install_dir(agent), minors, outbound_proxy=outbound)
        version, version_env = [str(exe), "--version"], env
        if box is not None:  # the CLI's own code runs in the sandbox only, this too
            version, version_env = box.room.command(version, rd.workspace.resolve(), env)
        state.reported_version = await asyncio.to_thread(reported_version, exe, version_env, version)
    except (SandboxFailed, SandboxUnavailable) as exc:
        return sandbox_failure(transcript, exc)
    gw: ModelGateway | GatewayView
    if sidecar:
        try:
            token = await wait_for_token(Path(os.environ.get(GATEWAY_TOKEN_VARIABLE, "/gateway/token")))
        except GatewayError as exc:
            return StopReason.error, str(exc)
        gw = GatewayView(sidecar, token, rd.root / "gateway.json")
    else:
        gw = ModelGateway(
            run_config(spec, family, upstream),
            transcript=transcript,
            telemetry=telemetry,
            state=GatewayState(spend=ckpt.spend.model_copy(deep=True)),
            state_path=rd.root / "gateway.json",
            before_call=world.pause if world else None,
            after_call=world.resume if world else None,
        )
        await gw.start()
    tools: WorldToolsSocket | None = None
    proxy: SandboxProxy | None = None
    try:
        route = GatewayRoute(gw.url, gw.config.token)
        if box is not None:
            assert isinstance(gw, ModelGateway)
            await gw.listen_unix(box.gateway_socket)
            from labkube.agent.sandbox_proxy import start_proxy  # the one rg-agent's commands get too

            proxy = await start_proxy(box.proxy, card, transcript)
            route = GatewayRoute(box.gateway_url, gw.config.token)
            if world is not None:
                rd.logs.mkdir(parents=True, exist_ok=True)
                bridge = world_mcp_command(world.client.base_url)
                tools = WorldToolsSocket(box.world_socket, bridge, box.bridge_env(env), rd.logs / "world-mcp.stderr")
                await tools.start()
        run = CliRun(
            rd, spec, card, ckpt, transcript, telemetry, hooks, agent, exe, home, env, state, gw, world, box, route
        )
        return await run.drive()
    except (SandboxFailed, SandboxUnavailable) as exc:
        return sandbox_failure(transcript, exc)
    finally:
        if tools is not None:
            await tools.close()
        if proxy is not None:
            await proxy.close()
        await gw.close()


def sandbox_failure(transcript: JsonlLog, exc: Exception) -> tuple[StopReason, str]:
    """The run's sandbox could not start the CLI: the harness's failure, not the agent's result."""
    error = f"{type(exc).__name__}: {exc}"
    transcript.append({"type": "harness_error", "ts": now_iso(), "error": error})
    return StopReason.error, error


async def wait_for_token(path: Path, timeout_s: float = 120.0) -> str:
    """The token the gateway sidecar writes once it listens (it starts first; this waits out a slow start)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not path.exists():
        if loop.time() > deadline:
            raise GatewayError(f"the gateway sidecar wrote no token to {path} in {timeout_s:.0f} s; see its log")
        await asyncio.sleep(0.2)
    return path.read_text().strip()


@dataclass
class RunHooks:
    """The entrypoint's own steps, which a CLI run shares with rg-agent's."""

    take_grade: Callable[[RunDir, TaskCard, Checkpoint], Grade]
    write_status: Callable[..., None]
    save_checkpoint: Callable[[RunDir, Checkpoint], None]
    gpu_minors: Callable[[int], list[int] | None] | None = None  # the run's GPUs' device numbers, for its sandbox


@dataclass
class Invocation:
    """How one start of the CLI ended."""

    stop: StopReason | None
    returncode: int | None
    failure: str | None
    turn_ended: bool


@dataclass
class CliRun:
    rd: RunDir
    spec: RunSpec
    card: TaskCard
    ckpt: Checkpoint
    transcript: JsonlLog
    telemetry: RunTelemetry
    hooks: RunHooks
    agent: CliAgentSpec
    exe: Path
    home: Path
    env: dict[str, str]
    state: CliState
    gw: ModelGateway | GatewayView
    world: WorldSession | None = None
    box: CliSandbox | None = None  # the CLI's room in the run's sandbox, where the run has one
    route: GatewayRoute | None = None  # how the CLI reaches the gateway (None: at the gateway's own URL)
    tracker: BudgetTracker = field(init=False)
    _backoff_seen: float = field(init=False)

    def __post_init__(self) -> None:
        self.tracker = BudgetTracker(self.spec.budgets, self.ckpt.spend)
        self._backoff_seen = self.gw.state.backoff_s

    async def drive(self) -> tuple[StopReason, str | None]:
        session = self.state.session_id if self.ckpt.resumes else None
        if self.world is not None and self.ckpt.resumes:
            return StopReason.world_error, "a Gaia2 run cannot resume: its world died with the previous agent"
        prompt = CONTINUE_PROMPT if session else await self.first_prompt()
        if self.ckpt.resumes and session:
            self.state.resumed += 1
        elif self.ckpt.resumes:
            self.state.restarted += 1
            self.transcript.append(
                {"type": "agent_restart", "ts": now_iso(), "agent": self.agent.name, "why": "no session to resume"}
            )
        self.tracker.start()
        while True:
            ended = await self.invoke(prompt, session)
            if ended.stop is not None:
                return ended.stop, None
            if ended.failure is not None or ended.returncode != 0:
                why = ended.failure or f"{self.agent.name} exited {ended.returncode}"
                self.transcript.append({"type": "model_error", "ts": now_iso(), "reason": "model_error", "error": why})
                return StopReason.model_error, f"{self.agent.name} stopped: {why}"
            if self.world is None or not ended.turn_ended or self.world.done:
                return StopReason.done, None
            prompt = await self.next_turn()  # the user's next message, when the scenario has one
            if prompt is None:
                return StopReason.done, None
            session = self.state.session_id

    async def first_prompt(self) -> str:
        if self.world is None:
            return task_text(self.card, self.spec, self.rd.workspace)
        from labkube.agent.rg.world_session import SYSTEM as WORLD_SYSTEM

        notes = await self.pull()
        return "\n\n".join([WORLD_SYSTEM, WORLD_TOOLS_NOTE, *notes])

    async def pull(self, wait_s: float | None = None, want_user: bool = False) -> list[str]:
        """The world's pending notifications as rg-agent is shown them (waiting in simulated time when asked); with
        `want_user`, none unless the user wrote (the next turn starts with the user's message)."""
        from labkube.agent.rg.world_session import format_notification

        assert self.world is not None
        client = self.world.client
        pulled = await client.pull_notifications()
        if not pulled.notifications and wait_s and not pulled.world_stopped:
            await client.wait_for_notification(wait_s)
            pulled = await client.pull_notifications()
        self.world.seen.extend(pulled.notifications)
        if pulled.world_stopped or any(n.type == "environment_stop" for n in pulled.notifications):
            self.world.stopped = True
        if want_user and not any(n.type == "user_message" for n in pulled.notifications):
            return []
        return [format_notification(n) for n in pulled.notifications]

    async def next_turn(self) -> str | None:
        """The user's next message, when the scenario has another turn (the world jumps to it)."""
        from labkube.agent.rg.world_session import NEXT_TURN_WAIT_S

        notes = await self.pull(NEXT_TURN_WAIT_S, want_user=True)
        return "\n\n".join(notes) if notes and not self.world_stopped() else None

    def world_stopped(self) -> bool:
        return self.world is not None and self.world.stopped

    @property
    def workspace(self) -> Path:
        return self.rd.workspace.resolve()  # its host path (the sandbox binds it at SANDBOX_WORKSPACE)

    def command(self, prompt: str, session: str | None) -> tuple[list[str], ClaudeCodeEvents | CodexEvents]:
        ref = parse_model(self.spec.model)
        blocked = list(self.card.blocked_urls)
        route = self.route or GatewayRoute(self.gw.url, self.gw.config.token)
        world_server = None
        if self.world is not None:
            world_server = self.box.world_server() if self.box else world_mcp_command(self.world.client.base_url)
        if self.agent.name == "claude-code":
            settings = claude_setup(self.home, self.env, route, ref.name, blocked, world_server, self.box)
            return claude_command(self.exe, prompt, settings, session), ClaudeCodeEvents(self.rd.workspace)
        codex_setup(self.home, self.env, route, ref.name, blocked, world_server)
        sandboxed = self.box is not None
        seen = SANDBOX_WORKSPACE if sandboxed else self.workspace  # where the sandbox binds it, if it has one
        command = codex_command(self.exe, prompt, seen, ref.name, session, blocked, sandboxed)
        return command, CodexEvents(self.rd.workspace)

    async def start(self, command: list[str], stderr: Path) -> tuple[asyncio.subprocess.Process, SandboxStatus | None]:
        """Start the CLI: as it is, or in the run's sandbox behind the gateway's relay. A sandbox that could not be
        made raises SandboxFailed, with what bubblewrap said."""
        env, status_write, status = self.env, None, None
        said_from = stderr.stat().st_size if stderr.exists() else 0
        try:
            if self.box is not None:
                status_read, status_write = os.pipe()
                status = SandboxStatus(status_read)
                wrapped, inner = self.box.wrap(command), self.box.env(env)
                command, env = self.box.room.command(wrapped, self.workspace, inner, status_write)
            with stderr.open("ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *command,
                    cwd=self.workspace,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                    limit=64 * 1024 * 1024,
                    pass_fds=() if status_write is None else (status_write,),
                )
        except BaseException:
            if status is not None:
                status.close()
            raise
        finally:
            if status_write is not None:
                os.close(status_write)
        if status is None or await status.started():
            return proc, status
        kill_group(proc)
        await proc.wait()
        status.close()
        with stderr.open("rb") as err:
            err.seek(said_from)
            said = [line for line in err.read().decode(errors="replace").splitlines() if line.strip()]
        why = said[-1][:300] if said else f"bubblewrap exited {proc.returncode} and said nothing"
        raise SandboxFailed(f"the run's sandbox could not start {self.agent.name}: {why}")

    def sync(self, events: ClaudeCodeEvents | CodexEvents, final: bool = False) -> None:
        """The gateway's counts into the run's spend, the checkpoint and status.json (and, from a sidecar, into this
        container's series: its counts since the last look)."""
        gw, tracker, ckpt = self.gw, self.tracker, self.ckpt
        tracker.tick()
        # The calls its spend counts are in the transcript before the checkpoint takes its position.
        gateway_end = None
        if isinstance(gw, ModelGateway):
            gw.flush()
        if isinstance(gw, GatewayView):  # a pod's sidecar, appending to the transcript from its own container
            before = gw.state.spend.model_copy(deep=True)
            gateway_end = gw.checkpoint()
            after = gw.state.spend
            delta = Usage(**{k: max(0, getattr(after.usage, k) - getattr(before.usage, k)) for k in Usage.model_fields})
            if delta.total or after.usd > before.usd:
                self.telemetry.model_call(delta, max(0.0, after.usd - before.usd), None)
        spend = gw.state.spend
        tracker.spend.usage, tracker.spend.usd, tracker.spend.steps = spend.usage, spend.usd, spend.steps
        tracker.spend.unpriced, tracker.spend.partial_calls = list(spend.unpriced), spend.partial_calls
        self.telemetry.spend(tracker.spend)
        if gw.state.backoff_s > self._backoff_seen:
            tracker.exclude(gw.state.backoff_s - self._backoff_seen)
            self._backoff_seen = gw.state.backoff_s
        ckpt.spend = tracker.spend
        ckpt.step = spend.steps
        self.state.session_id = events.session_id or self.state.session_id
        ckpt.provider_state["cli"] = self.state.model_dump(mode="json")
        # This process's own writes end at its offset; the sidecar's may end after them.
        ckpt.transcript_offset = max(self.transcript.offset, gateway_end or 0)
        if not final:
            self.hooks.save_checkpoint(self.rd, ckpt)
            self.hooks.write_status(self.rd, self.spec, ckpt, RunPhase.running)
            self.telemetry.budgets(tracker)

    async def grade_if_due(self) -> None:
        interval = (
            None if self.card.gaia or self.card.gaia2 else self.spec.grade_interval_s or self.card.grading.interval_s
        )
        if not interval or self.tracker.spend.wall_seconds - self.ckpt.last_grade_at < interval:
            return
        grade = await asyncio.to_thread(self.hooks.take_grade, self.rd, self.card, self.ckpt)
        self.ckpt.score_curve.append(grade)
        self.ckpt.last_grade_at = self.tracker.spend.wall_seconds
        self.transcript.append({"type": "grade", "ts": now_iso(), **grade.model_dump(mode="json")})
        self.telemetry.grade(grade.score, completion_of(grade.subtasks))

    async def finish_reading(self, reader: asyncio.Task[None], timeout_s: float) -> None:
        """Wait for the reader of the CLI's events once the CLI has stopped. The run ends either way, so what stops
        the reader is logged with the run, not raised."""
        try:
            await asyncio.wait_for(reader, timeout_s)
        except TimeoutError:
            log.warning(
                "run %s: the agent's event stream still open %g s after it stopped", self.spec.run_id, timeout_s
            )
        except Exception as exc:  # the reader's own failure (a write to the raw log, a parser bug)
            log.warning("run %s: reading the agent's events failed: %s: %s", self.spec.run_id, type(exc).__name__, exc)

    async def invoke(self, prompt: str, session: str | None) -> Invocation:
        """One start of the CLI: to its exit, an interrupt at the end of the wall budget, or a SIGTERM."""
        rd, agent, transcript = self.rd, self.agent, self.transcript
        command, events = self.command(prompt, session)
        self.state.starts += 1
        transcript.append(
            {
                "type": "resume" if session or self.state.starts > 1 else "start",
                "ts": now_iso(),
                "run_id": self.spec.run_id,
                "step": self.ckpt.step,
                "model": self.spec.model,
                "seed": self.spec.seed,
                "agent": agent.name,
                "cli": {"package": agent.package, "version": agent.version, "reported": self.state.reported_version},
                "resumed_session": session,
                "prompt": prompt,
            }
        )
        rd.logs.mkdir(parents=True, exist_ok=True)
        proc, status = await self.start(command, rd.logs / f"{agent.name}.stderr")
        group = status.child_pid if status is not None else None  # the sandbox's own processes, the CLI's relay
        raw_log = (rd.logs / f"{agent.name}.jsonl").open("ab")
        last_text: list[str] = []
        turn_ended = False

        async def read_events() -> None:
            nonlocal turn_ended
            assert proc.stdout is not None
            async for line in proc.stdout:
                raw_log.write(line)
                raw_log.flush()
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                item = event.get("item") or {}
                if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                    last_text.append(str(item.get("text", "")))
                for record in events.feed(event, self.gw.state.spend.steps):
                    transcript.append(record)
                    if record["type"] == "tool_call":
                        self.telemetry.tool_call(record["tool"], bool(record["ok"]))
                        if record["tool"] == TURN_ENDING_TOOL and record["ok"]:
                            turn_ended = True
                            if self.world is not None:  # the world counts turns as the message reaches the user
                                self.world.turns_completed += 1

        reader = asyncio.create_task(read_events())
        stop: StopReason | None = None
        try:
            while proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), POLL_S)
                self.sync(events)
                if proc.returncode is None:
                    await self.grade_if_due()
                over = self.tracker.exceeded()
                if over is not None and over.kind is StopReason.time and proc.returncode is None:
                    stop = StopReason.time
                    transcript.append(
                        {
                            "type": "budget_stop",
                            "ts": now_iso(),
                            "reason": "time",
                            "detail": str(over),
                            "agent": agent.name,
                        }
                    )
                    await interrupt(proc, group=group)
        except asyncio.CancelledError:
            # SIGTERM to the run (preemption, a dead supervisor): the CLI stops, its session stays for the resume.
            await interrupt(proc, group=group)
            await self.finish_reading(reader, 5)
            self.sync(events)
            transcript.append({"type": "terminated", "ts": now_iso(), "step": self.ckpt.step})
            raise
        finally:
            kill_group(proc)
            await self.finish_reading(reader, 10)
            raw_log.close()
            if status is not None:
                status.close()
        self.sync(events, final=True)
        if isinstance(events, ClaudeCodeEvents) and events.result is not None:
            self.ckpt.end_summary = str(events.result.get("result") or "")
        elif last_text:
            self.ckpt.end_summary = last_text[-1]
        stop = stop or self.gw.state.stop_reason
        return Invocation(stop, proc.returncode, None if stop else events.failure(), turn_ended)


async def interrupt(
    proc: asyncio.subprocess.Process, grace_s: float = INTERRUPT_GRACE_S, group: int | None = None
) -> None:
    """A clean interrupt (SIGINT, as Ctrl-C), then SIGKILL to the CLI's whole group after `grace_s`. In the sandbox
    (`group`: its first process, whose group the CLI's relay is in) SIGINT goes to the relay, which passes it on to
    the CLI's group: bubblewrap itself would die of it, and the sandbox with it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group or proc.pid, signal.SIGINT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)
    kill_group(proc)
    await proc.wait()


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """Whatever the CLI's commands left running dies with it (in the sandbox: bubblewrap, and with it the sandbox's
    whole pid namespace)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
