"""The transcript held against the gateway's record of the tool calls the model issued (`agent/gateway/record.py`).

On a cluster the transcript is on the agent's volume: the agent's commands can erase a line (`cat oracle/...`) or
add one. Every model call of an rg-agent run passes through the pod's gateway sidecar, which writes the tool calls of
each answer to a folder the agent's container does not mount, before the answer reaches the agent. The grading pod
compares the two, matching tool calls by name and arguments (as multisets: the same command run twice is two calls):

- A tool call the model issued that the transcript does not show is missing, unless it is one of the calls of the
  last answer a pod's gateway gave: a pod that ended (a crash, a kill, a resume) after the model answered and before
  the harness checkpointed loses that answer's lines when the next pod truncates the transcript at the checkpoint
  (`transcript.truncate(ckpt.transcript_offset)`), and the calls after `end_task` in the last answer never run. In
  rg-agent one answer's calls run, and are written, before the next model call; a checkpoint follows every step. So
  an honest transcript lacks at most the calls of each pod's last answer; any other missing call was erased.
- A tool call the transcript shows that no answer on record issued was added (the harness writes only the calls the
  model issued, each after the gateway recorded it).

A vendor CLI's transcript is written by the harness from the CLI's event stream (`agent/scaffolds/cli_events.py`),
so its calls are matched in the CLI's vocabulary (`VOCABULARIES`):

- Claude Code: every `tool_use` the model issued, by its name and input, against the transcript's `native_tool` and
  `native_args` (the same block, as the CLI printed it), a subagent's calls included. Server tools (`srvtoolu_`
  ids: Anthropic runs them, not the CLI) are not the agent's calls.
- Codex: its shell calls (`exec_command`, `shell`, `shell_command`, `local_shell_call`), by the command they run,
  against the transcript's `command_execution` lines. A patch, a plan update or an MCP call is not compared: the
  CLI turns one patch into a line per file, and names its MCP tools its own way.

Both are `transcript_edited` violations. Every tool call the gateway recorded and the transcript does not show,
excused or not, is given to the rules and the inspector with the transcript's calls (`GatewayCall.as_tool_call`): a
command that is only in the gateway's record is still seen (a call that never ran is seen as issued, with no output
and no process window). A call whose arguments were not a JSON object is matched by its tool's name alone.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labkube.agent.gateway.record import CALLS_FILE
from labkube.agent.scaffolds.cli_events import canonical, inner_command

RECORD_LIMIT = 256 << 20  # bytes of calls.jsonl read at most (the gateway's own file; a bound all the same)
NOT_IN_TRANSCRIPT = "(not in the transcript: from the gateway's record of the model's answers)"


@dataclass
class GatewayCall:
    """One tool call of one answer the gateway recorded."""

    ts: datetime
    pod: str
    seq: int
    step: int
    name: str
    arguments: Any
    last_of_pod: bool = False  # one of the calls of the last answer that pod's gateway gave
    id: str = ""

    @property
    def args(self) -> dict[str, Any]:
        return self.arguments if isinstance(self.arguments, dict) else {"__raw_arguments__": self.arguments}

    def as_tool_call(self, agent: str = "rg-agent", workspace: Path | None = None) -> Any:
        """The call as the rules read a transcript's (rg-agent's tools), with the CLI's own name and arguments."""
        from labkube.integrity.evidence import ToolCall

        tool, args = self.name, self.args
        if agent == "claude-code":
            tool, args = canonical(self.name, self.args, workspace or Path("/workspace"))
        elif agent == "codex" and self.name in CODEX_SHELL_TOOLS:
            tool, args = "bash", {"command": codex_command(self.arguments)}
        native = (self.name, self.arguments) if agent != "rg-agent" else (None, None)
        return ToolCall(self.step, tool, args, False, NOT_IN_TRANSCRIPT, self.ts, self.ts, *native)


@dataclass
class TranscriptCheck:
    """What the comparison found: calls the model issued that the transcript does not show (`missing`: not excused;
    `unrun`: of a pod's last answer), and transcript calls that no answer issued (`added`)."""

    missing: list[GatewayCall] = field(default_factory=list)
    unrun: list[GatewayCall] = field(default_factory=list)
    added: list[Any] = field(default_factory=list)  # evidence.ToolCall
    answers: int = 0
    agent: str = "rg-agent"
    workspace: Path | None = None

    @property
    def not_in_transcript(self) -> list[GatewayCall]:
        return sorted([*self.missing, *self.unrun], key=lambda c: c.seq)

    def unseen_calls(self) -> list[Any]:
        """The recorded calls the transcript does not show, as the rules read calls (`evidence.ToolCall`)."""
        return [c.as_tool_call(self.agent, self.workspace) for c in self.not_in_transcript]


def read_gateway_calls(folder: Path) -> tuple[list[GatewayCall], int] | None:
    """The tool calls in `folder/calls.jsonl`, in order, each marked when it belongs to its pod's last answer, and the
    number of answers; None when there is no record (no file: the run had no recording gateway)."""
    try:
        with (folder / CALLS_FILE).open("rb") as f:
            data = f.read(RECORD_LIMIT)
    except (FileNotFoundError, NotADirectoryError):
        return None
    answers: list[dict[str, Any]] = []
    for raw in data.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line cut by a killed gateway
        if isinstance(line, dict) and isinstance(line.get("tool_calls"), list):
            answers.append(line)
    last_of_pod = {str(a.get("pod", "")): i for i, a in enumerate(answers)}
    calls = []
    for i, answer in enumerate(answers):
        try:
            ts = datetime.fromisoformat(str(answer.get("ts")))
        except ValueError:
            ts = datetime.now(UTC)
        for call in answer["tool_calls"]:
            if not isinstance(call, dict):
                continue
            calls.append(
                GatewayCall(
                    ts=ts,
                    pod=str(answer.get("pod", "")),
                    seq=int(answer.get("seq") or 0),
                    step=int(answer.get("step") or 0),
                    name=str(call.get("name") or ""),
                    arguments=call.get("arguments"),
                    last_of_pod=last_of_pod[str(answer.get("pod", ""))] == i,
                    id=str(call.get("id") or ""),
                )
            )
    return calls, len(answers)


CODEX_SHELL_TOOLS = ("exec_command", "shell", "shell_command", "local_shell_call", "container.exec")
ANTHROPIC_SERVER_TOOL = "srvtoolu_"  # the id of a call Anthropic's servers ran (web search, code execution)

Key = tuple[str, str | None]


def _key(name: str, args: Any) -> Key:
    """A call as it is matched: its tool and its arguments (None for arguments that were not a JSON object, or that
    the harness could not read: matched by the tool alone)."""
    if not isinstance(args, dict) or "__raw_arguments__" in args:
        return name, None
    return name, json.dumps(args, sort_keys=True, default=str)


def codex_command(arguments: Any) -> str:
    """The command a Codex shell call runs, as its `command_execution` line in the transcript has it."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    if not isinstance(arguments, dict):
        return str(arguments)
    command = arguments.get("cmd", arguments.get("command", ""))
    # a list is run as it is, and the CLI's line shows it less a shell wrapper; a string is given to a shell by the
    # CLI, whose wrapper its line drops: the string is the command
    return inner_command(command) if isinstance(command, list) else str(command)


def gateway_key(call: GatewayCall, agent: str) -> Key | None:
    """How `agent`'s transcript would show this recorded call; None: the transcript has no line for it to match."""
    if agent == "claude-code":
        return None if call.id.startswith(ANTHROPIC_SERVER_TOOL) else _key(call.name, call.arguments)
    if agent == "codex":
        return ("bash", codex_command(call.arguments)) if call.name in CODEX_SHELL_TOOLS else None
    return _key(call.name, call.arguments)


def transcript_key(call: Any, agent: str) -> Key | None:
    """The key of a transcript call (`evidence.ToolCall`) in `agent`'s vocabulary; None: not compared."""
    if agent == "claude-code":
        return _key(str(call.native_tool), call.native_args) if call.native_tool else _key(call.tool, call.args)
    if agent == "codex":
        return ("bash", call.command) if call.native_tool == "command_execution" else None
    return _key(call.tool, call.args)


def compare(
    gateway: list[GatewayCall], transcript: list[Any], answers: int = 0, agent: str = "rg-agent",
    workspace: Path | None = None,
) -> TranscriptCheck:  # fmt: skip
    """Match the gateway's calls with the transcript's (`evidence.ToolCall`s), in the vocabulary of the run's
    `agent`: the calls that must be there first, then the excused ones with what is left, so that an excused call
    never takes a line a later call needs. `workspace`: where a CLI's absolute paths are made relative for the rules."""
    keyed = [(c, transcript_key(c, agent)) for c in transcript]
    left = Counter(k for _, k in keyed if k is not None)
    check = TranscriptCheck(answers=answers, agent=agent, workspace=workspace)

    def take(key: Key) -> bool:
        if key[1] is None:  # unreadable arguments: any transcript call of that tool
            for k in left:
                if k[0] == key[0] and left[k] > 0:
                    left[k] -= 1
                    return True
            return False
        if left[key] > 0:
            left[key] -= 1
            return True
        return False

    compared = [(c, k) for c in gateway if (k := gateway_key(c, agent)) is not None]
    for call, key in [(c, k) for c, k in compared if not c.last_of_pod]:
        if not take(key):
            check.missing.append(call)
    for call, key in [(c, k) for c, k in compared if c.last_of_pod]:
        if not take(key):
            check.unrun.append(call)
    for call, key in keyed:  # in order: the transcript's calls that no recorded answer issued
        if key is not None and left[key] > 0:
            left[key] -= 1
            check.added.append(call)
    return check
