"""The gateway's own record of the tool calls the model issued (`calls.jsonl`), kept where the agent's container
cannot write: on a cluster, a folder of the namespace's shared claim that only the `gateway` sidecar mounts
read-write and the grading pod's `grade` container read-only (`operator/pod_manifest.py`). The grading pod's audit
compares it with the run's transcript, which the agent's container can edit (`integrity/gateway_calls.py`).

One JSON line per answered model call (a call the provider answered without an error), written before the answer's
last bytes go to the agent:

    {"ts": ISO 8601, "pod": the pod's name, "seq": the gateway's call count, "step": its count of answered calls,
     "tool_calls": [{"id": ..., "name": ..., "arguments": ...}]}

the tool calls as `CallDigest.message()` reads them from the answer. Nothing secret: no key, no token, no request.
`RECORDS_VARIABLE` names the folder (set by the pod manifest on the gateway container only); unset, nothing is
recorded (a local run, a gateway in a scaffold)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORDS_VARIABLE = "LABKUBE_GATEWAY_RECORDS"  # the folder of `calls.jsonl`: the gateway's (rw), the grader's (ro)
RECORD_POD_VARIABLE = "LABKUBE_GATEWAY_RECORD_POD"  # the pod the gateway serves, written with each line
CALLS_FILE = "calls.jsonl"


def records_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The records' folder this container was given (`RECORDS_VARIABLE`); None: no record."""
    value = (os.environ if environ is None else environ).get(RECORDS_VARIABLE)
    return Path(value) if value else None


class CallRecord:
    """Appends one line per answered call to `<folder>/calls.jsonl`. A line that cannot be written (a full claim) is
    kept and written before the next one, so that the record stays in order; the failure is logged."""

    def __init__(self, folder: Path, pod: str = "") -> None:
        self.path = folder / CALLS_FILE
        self.pod = pod
        self._waiting: list[str] = []

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> CallRecord | None:
        env = os.environ if environ is None else environ
        folder = records_dir(env)
        return None if folder is None else cls(folder, env.get(RECORD_POD_VARIABLE, ""))

    def append(self, ts: str, seq: int, step: int, tool_calls: list[dict[str, Any]]) -> None:
        calls = [
            {"id": c.get("id") or "", "name": c.get("name") or "", "arguments": c.get("arguments")} for c in tool_calls
        ]
        line = {"ts": ts, "pod": self.pod, "seq": seq, "step": step, "tool_calls": calls}
        self._waiting.append(json.dumps(line, default=str) + "\n")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "a") as f:
                f.write("".join(self._waiting))
            self._waiting = []
        except OSError as exc:
            logging.getLogger(__name__).warning("labkube gateway: could not write its call record: %s", exc)
