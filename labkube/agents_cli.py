"""`labkube agent`, `labkube agents install` and `labkube gateway`: what a sandbox runs for one run (the agent room's
`agent_process`, which the agent zygote's children call too), the third-party agent CLIs, and a run's metering
gateway (a pod's sidecar)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from labkube.cli_checks import UsageFailure, console
from labkube.hardening import not_dumpable


@click.group("agents")
def agents() -> None:
    """Third-party agent CLIs (Claude Code, Codex) run by --agent."""


@agents.command("install")
@click.argument("names", nargs=-1, type=click.Choice(["claude-code", "codex"]))
def agents_install(names: tuple[str, ...]) -> None:
    """Install the pinned CLIs from npm into the CLI cache ($LABKUBE_CLI_CACHE); safe to run again."""
    from rich.table import Table

    from labkube.agent.scaffolds.cli_install import CLI_AGENTS, InstallError, ensure_installed, reported_version

    table = Table("agent", "package", "reports", "executable")
    for name in names or tuple(CLI_AGENTS):
        agent = CLI_AGENTS[name]
        try:
            with console.status(f"installing {agent.pinned} ..."):
                exe = ensure_installed(agent)
        except InstallError as exc:
            raise UsageFailure(str(exc)) from None
        table.add_row(name, agent.pinned, reported_version(exe), str(exe))
    console.print(table)


@click.command("gateway")
@click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (the pod's loopback).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port (0: a free one).")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("/gateway/token"),
    show_default=True,
    help="Where to write the run token (a volume shared with the agent container only).",
)
def gateway(run_dir: Path, host: str, port: int, token_file: Path) -> None:
    """Serve the run's model gateway (a pod's `gateway` sidecar; locally, `labkube agent` runs it in-process).

    The run's spec comes from $LABKUBE_RUN_SPEC (the pod manifest sets it), never from the run folder's run.json,
    which the agent's container can write. The first line on stdout is `LISTENING <url>`;
    docs/third-party-agents.md says what it does."""
    not_dumpable()  # this process holds the provider's key (labkube/hardening.py)
    import uvloop

    from labkube.agent.gateway import GatewayError, serve_run_gateway
    from labkube.agent.gateway.sidecar import gateway_run_spec
    from labkube.agent.providers.provider import ProviderError
    from labkube.store import StoreError

    try:
        # libuv's loop: beside asyncio's, up to 0.3 ms less added to a call and 6-11% less CPU, one at a time
        # (docs/third-party-agents.md). Not for `labkube agent`, whose commands are subprocesses: uvloop's inherit
        # the loop's descriptors.
        spec = gateway_run_spec()
        uvloop.run(serve_run_gateway(run_dir, host, port, token_file, spec))
    except (GatewayError, ProviderError, StoreError) as exc:
        raise UsageFailure(str(exc)) from None


@click.command("agent")
@click.option("--run-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint.")
@click.option("--finalize", "finalize_reason", default=None, help="Only grade the stopped run (reason: time, killed).")
def agent(run_dir: Path, resume: bool, finalize_reason: str | None) -> None:
    """Run one run's agent in this process (what a sandbox executes)."""
    not_dumpable()  # before the harness's imports; agent_process says it again for the zygote's children
    from labkube.agent.harness.sandbox_process import agent_process

    sys.exit(agent_process(run_dir, resume, finalize_reason))
