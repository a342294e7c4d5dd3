"""A vendor CLI (Claude Code, Codex) whole inside the run's sandbox, and its two ways out: unix sockets.

The CLI, its commands and its MCP clients run in the run's bubblewrap sandbox (`agent/run_sandbox.py`): the
workspace and the CLI's config home (`<run>/cli-home`) read-write, the CLI's npm installation and the helpers below
read-only, no network but the sandbox's own `lo`. What it needs from outside comes through folders of unix sockets
bound in (`<run>/sandbox/sockets/`):

- `gateway.sock`: the run's model gateway (`ModelGateway.listen_unix`: same routes, same token check). The CLIs speak
  HTTP over TCP only, so the CLI is started by `sandbox_relay.py forward`, which listens on the sandbox's own
  127.0.0.1:SANDBOX_GATEWAY_PORT (the CLI's base URL), passes each connection on to the socket, and runs the CLI.
- `proxy.sock` (a task with `network: proxy`): the run's outbound HTTP(S) proxy (agent/sandbox_proxy.py), the same
  one rg-agent's commands get. The same relay listens on the sandbox's 127.0.0.1:SANDBOX_PROXY_PORT for it too, and
  the CLI's environment names that port as every client's proxy, with the sandbox's loopback (the gateway's relay)
  left out of it (`NO_PROXY`).
- `world.sock` (Gaia2): the world's tools and nothing else of the world. Per connection, `labkube world-mcp` (the
  MCP bridge) runs here, outside, with the connection as its stdin and stdout (`WorldToolsSocket`); inside, the CLI's
  MCP server is `sandbox_relay.py stdio`, which only pipes its stdio to that socket. The world's HTTP port (its
  clock control, `/finish`, `/oracle`, the judge) stays on the host's loopback, out of the sandbox's reach, and the
  bridge serves tools/list and tools/call only (agent/scaffolds/mcp_bridge.py).

labkube's package is hidden in the sandbox, so the helpers run there (`sandbox_relay.py`, Claude Code's URL hook
`cli_hook.py` and the `blocked_urls.py` it imports) are standalone copies in `<run>/sandbox/bin/`, bound read-only
and run with the base interpreter every sandbox sees (`install_helpers`, as for rg-agent's relay to its proxy). Files
the harness writes into the agent-writable config home (`write_home_file`) follow no link the agent may have put there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from labkube.agent.gateway.wire import unix_listener
from labkube.agent.rg.workspace import Workspace
from labkube.agent.run_sandbox import (
    HELPERS_DIR,
    PROXY_VARIABLES,
    RELAY,
    SANDBOX_DIR,
    SANDBOX_PROXY_PORT,
    SOCKETS_DIR,
    ProxyRoute,
    RunRoom,
    install_helpers,
    run_room,
    sandbox_python,
)
from labkube.run_spec import RunSpec
from labkube.sandbox import sandbox_started
from labkube.store import RunDir

__all__ = [
    "SANDBOX_GATEWAY_PORT",
    "CliSandbox",
    "SandboxStatus",
    "WorldToolsSocket",
    "cli_sandbox",
    "write_home_file",
]

log = logging.getLogger(__name__)

SANDBOX_GATEWAY_PORT = 8787  # the relay's port on the sandbox's own loopback (a network of its own: always free)
HERE = Path(__file__).resolve().parent
HELPERS = (RELAY, HERE / "cli_hook.py", HERE.parent / "blocked_urls.py")
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CliSandbox:
    """Where a CLI runs in the run's sandbox (`room`) and how it reaches out of it."""

    room: RunRoom  # its own proxy left out: the CLI's relay forwards the proxy's port beside the gateway's
    sockets: Path
    helpers: Path
    proxy: ProxyRoute | None = None  # a `network: proxy` task's way out, served by the harness at proxy.socket

    @property
    def gateway_socket(self) -> Path:
        return self.sockets / "gateway.sock"

    @property
    def world_socket(self) -> Path:
        return self.sockets / "world.sock"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{SANDBOX_GATEWAY_PORT}"

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` (the CLI) started behind the relay to the gateway (and to the proxy, where the task has one), in
        the sandbox: `-I -S`, as rg-agent's relay (the `.pth` files of site-packages cost more than the relay)."""
        relay = [sandbox_python(), "-I", "-S", str(self.helpers / "sandbox_relay.py"), "forward"]
        routes = [str(self.gateway_socket), str(SANDBOX_GATEWAY_PORT)]
        if self.proxy is not None:
            routes += [str(self.proxy.socket), str(SANDBOX_PROXY_PORT)]
        return [*relay, *routes, "--", *argv]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The CLI's environment in the sandbox: with a proxy, every client's proxy is the relay's port, but not for
        the sandbox's own loopback, where the gateway's relay listens."""
        if self.proxy is None:
            return env
        direct = "127.0.0.1,localhost"
        return {**env, **dict.fromkeys(PROXY_VARIABLES, self.proxy.url), "NO_PROXY": direct, "no_proxy": direct}

    def world_server(self) -> list[str]:
        """The CLI's MCP server for the world's tools: stdio piped to `world.sock`."""
        return [sandbox_python(), "-I", str(self.helpers / "sandbox_relay.py"), "stdio", str(self.world_socket)]

    def bridge_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment of the world's MCP bridge, which runs outside the sandbox: the CLI's (no keys), but with a
        HOME of its own and no user site, never the agent-writable config home, whose planted `usercustomize.py` or
        configuration would run or be read out here."""
        home = self.helpers.parent / "bridge-home"
        home.mkdir(exist_ok=True)
        return {**env, "HOME": str(home), "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}

    def hook(self, blocked_file: Path) -> str:
        """Claude Code's PreToolUse hook command: the standalone copy of cli_hook.py (`-s -E`, not `-I`: it imports
        blocked_urls.py from its own folder)."""
        return shlex.join([sandbox_python(), "-s", "-E", str(self.helpers / "cli_hook.py"), str(blocked_file)])


def cli_sandbox(
    spec: RunSpec,
    rd: RunDir,
    home: Path,
    install: Path,
    gpu_minors: list[int] | None = None,
    outbound_proxy: bool = False,
) -> CliSandbox | None:
    """The CLI's room in the run's sandbox, or None where the run has none (`--sandbox none`, a pod). `gpu_minors`:
    the run's GPUs' device numbers, as for rg-agent's commands (None: every GPU node, when the run holds GPUs).
    `outbound_proxy` (a `network: proxy` task): the CLI reaches the run's proxy, which the harness serves at
    `box.proxy.socket`."""
    base = rd.root / SANDBOX_DIR
    sockets, helpers = base / SOCKETS_DIR, base / HELPERS_DIR
    room = run_room(
        spec,
        rd.root,
        rd.workspace,
        gpu_minors=gpu_minors,
        read_only=(install, helpers),
        writable=(home.resolve(),),
        sockets=(sockets,),
        outbound_proxy=outbound_proxy,
    )
    if not room.sandboxed:
        return None
    sockets.mkdir(parents=True, exist_ok=True)
    install_helpers(rd.root, HELPERS)
    return CliSandbox(replace(room, proxy=None), sockets, helpers, room.proxy)


def write_home_file(home: Path, relative: str, text: str) -> Path:
    """Write a file the harness puts in the CLI's config home, which the agent can write too: no link on the way is
    followed, and one the agent left in the file's place is replaced, not written through."""
    ws = Workspace(home)
    ws.unlink(relative, missing_ok=True)
    ws.write_bytes(relative, text.encode(), exclusive=True)
    return home / relative


@dataclass
class SandboxStatus:
    """bubblewrap's JSON status stream (`--json-status-fd`): its first line names the sandbox's first process once
    the sandbox is made; none comes when bubblewrap fails. It is read to its end (bubblewrap writes the command's
    exit there too, and a closed pipe would kill it)."""

    fd: int
    child_pid: int | None = None
    _transport: asyncio.ReadTransport | None = field(default=None, init=False)
    _reader: asyncio.StreamReader = field(default_factory=asyncio.StreamReader, init=False)

    async def started(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(self.fd, "rb", buffering=0)
        self._transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self._reader), pipe)
        try:
            line = await asyncio.wait_for(self._reader.readline(), timeout_s)
        except TimeoutError:
            return False
        if not sandbox_started(line):
            return False
        with contextlib.suppress(ValueError, TypeError):
            self.child_pid = int(json.loads(line)["child-pid"])
        return True

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        else:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class WorldToolsSocket:
    """The world's tools for a CLI in the sandbox: a unix socket whose every connection is served by the MCP bridge
    (`command`, `labkube world-mcp`) run here, outside the sandbox, the connection its stdin and stdout."""

    def __init__(self, path: Path, command: list[str], env: dict[str, str], stderr: Path) -> None:
        self.path, self.command, self.env, self.stderr = path, command, env, stderr
        self._listener: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._bridges: list[asyncio.subprocess.Process] = []

    async def start(self) -> WorldToolsSocket:
        self._listener = unix_listener(self.path)
        self._task = asyncio.create_task(self._accept(self._listener))
        return self

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            with conn:  # the bridge holds its own copy once started
                conn.setblocking(True)  # its stdin and stdout share the descriptor's flags
                try:
                    with self.stderr.open("ab") as err:
                        bridge = await asyncio.create_subprocess_exec(
                            *self.command,
                            stdin=conn.fileno(),
                            stdout=conn.fileno(),
                            stderr=err,
                            env=self.env,
                            start_new_session=True,
                        )
                except OSError as exc:
                    log.warning("the world's MCP bridge did not start: %s", exc)
                    continue
            self._bridges = [b for b in self._bridges if b.returncode is None]
            self._bridges.append(bridge)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            self.path.unlink(missing_ok=True)
        for bridge in self._bridges:
            if bridge.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(bridge.pid, signal.SIGKILL)
            await bridge.wait()
        self._bridges = []
