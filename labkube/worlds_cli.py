"""`labkube worlds setup|serve` and `labkube world-mcp`: Gaia2's worlds (Meta's ARE in a virtualenv of its own, a
world process serving scenarios over HTTP, and a world's tools served to an agent CLI over MCP)."""

from __future__ import annotations

import os
import sys

import click

from labkube.cli_checks import UsageFailure, console


@click.group("worlds")
def worlds() -> None:
    """Gaia2 worlds: Meta's ARE in an environment of its own."""


@worlds.command("setup")
@click.option("--force", is_flag=True, help="Recreate the environment even if it is ready.")
def worlds_setup(force: bool) -> None:
    """Create (once) the virtualenv that runs ARE world processes; safe to run again."""
    from labkube.tasks.gaia2 import ARE_VERSION, WorldEnvError, setup_world_env

    try:
        with console.status(f"installing meta-agents-research-environments {ARE_VERSION} ..."):
            venv = setup_world_env(force=force)
    except WorldEnvError as exc:
        raise UsageFailure(str(exc)) from None
    console.print(f"ARE {ARE_VERSION} world environment ready: {venv}")


@worlds.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    envvar="LABKUBE_WORLD_PORT",
    default=0,
    help="Port (0: a free one). Default: $LABKUBE_WORLD_PORT, as the chart sets it in the world sidecar.",
)
@click.option("--log-level", default="WARNING", show_default=True)
def worlds_serve(host: str, port: int, log_level: str) -> None:
    """Serve Gaia2 scenarios over HTTP (the world process; the sidecar image's entrypoint).

    The first line on stdout is `LISTENING <port>`; the protocol is in docs/gaia2-world-protocol.md."""
    from labkube.tasks.gaia2 import WorldEnvError, world_python
    from labkube.tasks.gaia2.world_process import world_command

    try:
        python = world_python()
    except WorldEnvError as exc:
        raise UsageFailure(str(exc)) from None
    sys.stdout.flush()
    os.execv(python, world_command(python, host, port, log_level))


@click.command("world-mcp")
@click.option(
    "--world-url",
    envvar="LABKUBE_WORLD_URL",
    required=True,
    help="The running world, its scenario loaded (default: $LABKUBE_WORLD_URL).",
)
@click.option("--log-level", default="WARNING", show_default=True)
def world_mcp(world_url: str, log_level: str) -> None:
    """Serve a Gaia2 world's tools to an agent CLI as an MCP server on stdio (Claude Code's --mcp-config, Codex's
    [mcp_servers]). It neither loads nor judges the scenario: the run's agent process does.

    Stdout carries only the MCP protocol; logs go to stderr."""
    import asyncio
    import logging

    from labkube.agent.rg.world_errors import WorldFailure
    from labkube.agent.scaffolds.mcp_bridge import serve_world

    logging.basicConfig(stream=sys.stderr, level=log_level.upper(), format="world-mcp %(levelname)s %(message)s")
    try:
        asyncio.run(serve_world(world_url))
    except WorldFailure as exc:
        raise UsageFailure(f"world-mcp: {exc} (is the world at {world_url} up, with a scenario loaded?)") from None
