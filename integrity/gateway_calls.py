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

    @property
    def args(self) -> dict[str, Any]:
        return self.arguments if isinstance(self.arguments, dict) else {"__raw_arguments__": self.arguments}

    def as_tool_call(self) -> Any:
        from labkube.integrity.evidence import ToolCall

        return ToolCall(self.step, self.name, self.args, False, NOT_IN_TRANSCRIPT, self.ts, self.ts)


@dataclass
class TranscriptCheck:
    """What the comparison found: calls the model issued that the transcript does not show (`missing`: not excused;
    `unrun`: of a pod's last answer), and transcript calls that no answer issued (`added`)."""

    missing: list[GatewayCall] = field(default_factory=list)
    unrun: list[GatewayCall] = field(default_factory=list)
    added: list[Any] = field(default_factory=list)  # evidence.ToolCall
    answers: int = 0

    @property
    def not_in_transcript(self) -> list[GatewayCall]:
        return sorted([*self.missing, *self.unrun], key=lambda c: c.seq)


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
                )
            )
    return calls, len(answers)


def _key(name: str, args: Any) -> tuple[str, str | None]:
    """A call as it is matched: its tool and its arguments (None for arguments that were not a JSON object, or that
    the harness could not read: matched by the tool alone)."""
    if not isinstance(args, dict) or "__raw_arguments__" in args:
        return name, None
    return name, json.dumps(args, sort_keys=True, default=str)


def compare(gateway: list[GatewayCall], transcript: list[Any], answers: int = 0) -> TranscriptCheck:
    """Match the gateway's calls with the transcript's (`evidence.ToolCall`s): the calls that must be there first,
    then the excused ones with what is left, so that an excused call never takes a line a later call needs."""
    left = Counter(_key(c.tool, c.args) for c in transcript)
    check = TranscriptCheck(answers=answers)

    def take(call: GatewayCall) -> bool:
        key = _key(call.name, call.arguments)
        if key[1] is None:  # unreadable arguments: any transcript call of that tool
            for k in left:
                if k[0] == call.name and left[k] > 0:
                    left[k] -= 1
                    return True
            return False
        if left[key] > 0:
            left[key] -= 1
            return True
        return False

    for call in [c for c in gateway if not c.last_of_pod]:
        if not take(call):
            check.missing.append(call)
    for call in [c for c in gateway if c.last_of_pod]:
        if not take(call):
            check.unrun.append(call)
    for call in transcript:  # in order: the transcript's calls that no recorded answer issued
        key = _key(call.tool, call.args)
        if left[key] > 0:
            left[key] -= 1
            check.added.append(call)
    return check
