"""The vendor CLIs' event streams as labkube transcript lines.

Claude Code (`claude -p --output-format stream-json --verbose`) and Codex (`codex exec --json`) print one JSON
event per line. Their tool calls become `tool_call` lines in rg-agent's vocabulary (`bash`, `write_file`,
`replace`, `read_file`, `search`, `web_browser`, `web_search`), with workspace-relative paths, so the trajectory
viewer, the integrity audit and the analyses read them as they read rg-agent's; the CLI's own name and arguments
stay beside them (`native_tool`, `native_args`). Model calls are not taken from here: the gateway records those
from the provider's answers.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from labkube.agent.transcript import now_iso
from labkube.sandbox import SANDBOX_WORKSPACE

# Claude Code's tools -> (rg-agent's tool, {its argument: ours})
CLAUDE_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "Bash": ("bash", {"command": "command"}),
    "Write": ("write_file", {"file_path": "path", "content": "content"}),
    "Edit": ("replace", {"file_path": "path", "old_string": "old_string", "new_string": "new_string"}),
    "MultiEdit": ("replace", {"file_path": "path"}),
    "NotebookEdit": ("write_file", {"notebook_path": "path", "new_source": "content"}),
    "Read": ("read_file", {"file_path": "path"}),
    "Grep": ("search", {"pattern": "pattern", "path": "path"}),
    "Glob": ("search", {"pattern": "pattern", "path": "path"}),
    "WebFetch": ("web_browser", {"url": "url"}),
    "WebSearch": ("web_search", {"query": "query"}),
}
PATH_ARGS = ("path",)


def relative(path: Any, workspace: Path) -> Any:
    """A path inside the workspace (at its host path, or at `/workspace`, where the run's sandbox binds it) as
    rg-agent writes it (relative); anything else as it is."""
    if not isinstance(path, str) or not path.startswith("/"):
        return path
    normal = Path(os.path.normpath(path))
    if normal.is_relative_to(SANDBOX_WORKSPACE) and not workspace.resolve().is_relative_to(SANDBOX_WORKSPACE):
        return str(normal.relative_to(SANDBOX_WORKSPACE)) or "."
    try:
        return str(Path(path).resolve().relative_to(workspace.resolve())) or "."
    except ValueError:
        return path


WORLD_MCP_PREFIX = "mcp__world__"  # Claude Code's name for a tool of the `world` MCP server (a Gaia2 world's app)


def canonical(native: str, args: dict[str, Any], workspace: Path) -> tuple[str, dict[str, Any]]:
    if native.startswith(WORLD_MCP_PREFIX):  # the world's own tool name, as rg-agent's transcript has it
        return native.removeprefix(WORLD_MCP_PREFIX), dict(args)
    tool, names = CLAUDE_TOOLS.get(native, (native.lower(), {}))
    if native == "Bash" and args.get("run_in_background"):
        tool = "start_async"
    ours = {names[k]: v for k, v in args.items() if k in names} if names else dict(args)
    for key in PATH_ARGS:
        if key in ours:
            ours[key] = relative(ours[key], workspace)
    return tool, ours


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


class ClaudeCodeEvents:
    """Claude Code's stream-json: `system/init` (session, model, version), `assistant` messages whose `tool_use`
    blocks are calls, `user` messages whose `tool_result` blocks are their outputs, and a final `result`."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.session_id: str | None = None
        self.version: str | None = None
        self.result: dict[str, Any] | None = None
        self._pending: dict[str, tuple[str, dict[str, Any], str, str | None]] = {}

    def feed(self, event: dict[str, Any], step: int) -> list[dict[str, Any]]:
        kind = event.get("type")
        self.session_id = event.get("session_id") or self.session_id
        out: list[dict[str, Any]] = []
        if kind == "system" and event.get("subtype") == "init":
            self.version = event.get("claude_code_version") or self.version
        elif kind == "assistant":
            # a subagent's calls (`parent_tool_use_id`: the Task call that started it) are the run's actions too
            parent = event.get("parent_tool_use_id")
            for block in (event.get("message") or {}).get("content") or []:
                if block.get("type") == "tool_use":
                    call = (block.get("name", "?"), block.get("input") or {}, now_iso(), parent)
                    self._pending[block.get("id", "")] = call
        elif kind == "user":
            for block in (event.get("message") or {}).get("content") or []:
                if not isinstance(block, dict) or block.get("type") != "tool_result":
                    continue
                call_id = block.get("tool_use_id", "")
                native, args, started, parent = self._pending.pop(call_id, ("?", {}, now_iso(), None))
                tool, ours = canonical(native, args, self.workspace)
                ok, output = not block.get("is_error"), _text(block.get("content"))
                line = tool_line(step, call_id, tool, ours, ok, output, native, args, started)
                if parent:
                    line["parent_call_id"] = parent
                out.append(line)
        elif kind == "result":
            self.result = event
            out.append(
                {
                    "type": "agent_result",
                    "ts": now_iso(),
                    "agent": "claude-code",
                    "subtype": event.get("subtype"),
                    "is_error": bool(event.get("is_error")),
                    "result": str(event.get("result", ""))[:4000],
                    "num_turns": event.get("num_turns"),
                    "session_id": self.session_id,
                }
            )
        return out

    def failure(self) -> str | None:
        """The CLI's own account of why it stopped, when it stopped on an error (its `subtype` says "success" even
        then: `is_error` tells). No final event at all means it was interrupted."""
        if self.result is None:
            return "it ended without its final result event (interrupted)"
        if not self.result.get("is_error"):
            return None
        return str(self.result.get("result") or self.result.get("terminal_reason") or "error")


def inner_command(command: Any) -> str:
    """Codex runs `/bin/bash -lc '<command>'`: the command the model asked for."""
    if isinstance(command, list):
        parts = [str(p) for p in command]
    else:
        try:
            parts = shlex.split(str(command))
        except ValueError:
            return str(command)
    if len(parts) == 3 and parts[0].endswith(("bash", "sh", "zsh")) and parts[1] in ("-lc", "-c"):
        return parts[2]
    return " ".join(parts) if isinstance(command, list) else str(command)


class CodexEvents:
    """Codex's `exec --json`: `thread.started` (the session), `item.started`/`item.completed` for commands, file
    changes, web searches and messages, `turn.completed` with usage, `turn.failed` and `error`."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.session_id: str | None = None
        self.version: str | None = None
        self.errors: list[str] = []
        self.turn_failure: str | None = None
        self.completed_turns = 0
        self._started: dict[str, str] = {}

    def feed(self, event: dict[str, Any], step: int) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "thread.started":
            self.session_id = event.get("thread_id") or self.session_id
        elif kind == "item.started":
            self._started[(event.get("item") or {}).get("id", "")] = now_iso()
        elif kind == "item.completed":
            return self._item(event.get("item") or {}, step)
        elif kind == "turn.completed":
            self.completed_turns += 1
            self.turn_failure = None
        elif kind in ("error", "turn.failed"):
            message = str(event.get("message") or (event.get("error") or {}).get("message") or kind)
            if kind == "turn.failed":
                self.turn_failure = message
            if not self.errors or self.errors[-1] != message:
                self.errors.append(message)
                return [{"type": "agent_error", "ts": now_iso(), "agent": "codex", "error": message}]
        return []

    def _item(self, item: dict[str, Any], step: int) -> list[dict[str, Any]]:
        kind, item_id = item.get("type"), item.get("id", "")
        started = self._started.pop(item_id, now_iso())
        if kind == "command_execution":
            command = inner_command(item.get("command", ""))
            ok = item.get("exit_code") == 0 and item.get("status") == "completed"
            output = str(item.get("aggregated_output", ""))
            if item.get("exit_code") not in (0, None):
                output = f"{output}\n(exit code {item.get('exit_code')})".lstrip()
            return [tool_line(step, item_id, "bash", {"command": command}, ok, output, kind, item, started)]
        if kind == "file_change":
            lines = []
            for change in item.get("changes") or []:
                path = relative(change.get("path"), self.workspace)
                tool = "delete_file" if change.get("kind") == "delete" else "write_file"
                ok = item.get("status") == "completed"
                lines.append(
                    tool_line(step, item_id, tool, {"path": path}, ok, change.get("kind", ""), kind, change, started)
                )
            return lines
        if kind == "web_search":
            return [
                tool_line(step, item_id, "web_search", {"query": item.get("query", "")}, True, "", kind, item, started)
            ]
        if kind == "mcp_tool_call":
            server = item.get("server", "mcp")
            name = str(item.get("tool", "?")) if server == "world" else f"{server}.{item.get('tool', '?')}"
            ok = item.get("status") == "completed"
            return [
                tool_line(
                    step,
                    item_id,
                    name,
                    item.get("arguments") or {},
                    ok,
                    str(item.get("result", "")),
                    kind,
                    item,
                    started,
                )
            ]
        if kind == "error":  # a warning inside a turn (e.g. unknown model metadata); the turn goes on
            return [{"type": "agent_warning", "ts": now_iso(), "agent": "codex", "warning": str(item.get("message"))}]
        return []

    def failure(self) -> str | None:
        """Why the last turn failed, if it did (an `error` event alone may be a retry in progress)."""
        return self.turn_failure


def tool_line(
    step: int,
    call_id: str,
    tool: str,
    args: dict[str, Any],
    ok: bool,
    output: str,
    native: str,
    native_args: Any,
    started: str,
) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "step": step,
        "ts": now_iso(),
        "started": started,
        "call_id": call_id,
        "tool": tool,
        "access": None,
        "args": args,
        "ok": ok,
        "output": output,
        "native_tool": native,
        "native_args": native_args,
    }
