"""labkube tools as an MCP server over stdio, so third-party agent CLIs (Claude Code, Codex) can call them.

A `Tool`'s name, description and JSON-schema parameters become the MCP tool; read tools carry
`readOnlyHint`. A call runs `Tool.__call__`, which checks the arguments against the schema, so a
`ToolError` (bad arguments, or the tool's own refusal) comes back as a tool result with `isError`
and the message, for the model to act on. Any other exception is a harness error: it is logged to
stderr and the client gets a JSON-RPC error.

Built on the official MCP SDK's low-level server (`mcp.server.lowlevel.Server`), which speaks both
the initialize handshake and the per-request protocol (2026-07-28), whichever the client opens with.
While it serves, `stdio_server` points fd 1 at stderr: stdout carries nothing but the protocol.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from labkube.agent.rg.tool import Tool, ToolError

__all__ = ["mcp_server", "serve_stdio", "serve_world"]

log = logging.getLogger(__name__)


def mcp_server(tools: list[Tool], name: str = "labkube") -> Server[Any]:
    """An MCP server (not yet running) whose tools/list and tools/call serve `tools`."""
    by_name = {t.name: t for t in tools}
    listed = types.ListToolsResult(
        tools=[
            types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.parameters,
                annotations=types.ToolAnnotations(read_only_hint=t.access == "read"),
            )
            for t in tools
        ]
    )

    async def list_tools(_ctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return listed

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = by_name.get(params.name)
        try:
            if tool is None:
                raise ToolError(f"no tool named {params.name!r}; the tools are {', '.join(by_name)}")
            text = await tool(dict(params.arguments or {}))
        except ToolError as exc:
            return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
        except Exception:
            log.exception("tool %s failed", params.name)
            raise
        return types.CallToolResult(content=[types.TextContent(text=text)])

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(tools: list[Tool], name: str = "labkube") -> None:
    """Serve `tools` over this process's stdin and stdout until the client closes stdin."""
    server = mcp_server(tools, name)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_world(url: str) -> None:
    """Serve a running world's tools (its apps', `wait_for_notification`, `get_current_time`) over stdio.

    The world must have its scenario loaded already; the run's agent process loads it and judges it
    afterwards, so this neither loads nor finishes one. `end_task` is left out: a CLI ends by itself.

    Raises:
        WorldFailure: the world cannot be reached or has no scenario loaded.
    """
    from labkube.agent.rg.tools import ToolContext
    from labkube.agent.rg.workspace import Workspace
    from labkube.agent.rg.world_session import WorldSession, world_tools
    from labkube.tasks.gaia2 import WorldClient

    session = WorldSession(WorldClient(url))
    try:
        with tempfile.TemporaryDirectory(prefix="labkube-world-mcp-") as scratch:
            ctx = ToolContext(workspace=Workspace(scratch))  # the world's tools never touch it
            tools = [t for t in await world_tools(session, ctx) if t.name != "end_task"]
            log.info("serving %d tools of the world at %s", len(tools), url)
            await serve_stdio(tools, name="world")
    finally:
        await session.close()
