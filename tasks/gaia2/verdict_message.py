"""ARE's verdict as a Kubernetes termination message: how a pod's world sidecar tells the operator what it judged;
and the names of the settings and the header that the world and labkube both read (the world imports no labkube).

Standalone (stdlib only) like world_health.py: the world process imports it from the same folder in ARE's
virtualenv, and labkube imports it as `labkube.tasks.gaia2.verdict_message`.

On a cluster the agent's container writes the run's checkpoint, so a verdict copied there is the agent's word.
The world container is one the agent never ran in; what it writes to its own termination-message file only it can
write, and the kubelet hands it to the API when the container ends. The message keeps every field of the verdict;
only the free-text rationale (and the match details) are cut to fit Kubernetes' 4096 bytes.
"""

from __future__ import annotations

import json
from typing import Any

VERDICT_FILE_VARIABLE = "LABKUBE_WORLD_VERDICT_FILE"  # where the world writes its verdict (a pod: /dev/termination-log)
ONE_SCENARIO_VARIABLE = "LABKUBE_WORLD_ONE_SCENARIO"  # "1": the world refuses a second POST /scenario
# A pod's world sidecar writes its control token to this file (on a memory volume the agent container and the gateway
# sidecar mount read-only), once per pod, and removes it at the first request that carries the token: the agent's
# harness loading the scenario (agent/harness/sandbox_process.py), before any command of the agent runs.
CONTROL_FILE_VARIABLE = "LABKUBE_WORLD_CONTROL_FILE"
CONTROL_ENV = "LABKUBE_WORLD_CONTROL"  # "1": the world makes a control token (labkube's own worlds and pods' sidecars)
CONTROL_HEADER = "X-Labkube-World-Control"  # the request header that carries it
# The grading pod's environment: "operator" says a verdict comes only from the second variable, the world sidecar's
# termination message as the operator read it from the API (none: the world judged nothing).
WORLD_VERDICT_SOURCE = "LABKUBE_WORLD_VERDICT_FROM"
WORLD_VERDICT_VARIABLE = "LABKUBE_WORLD_VERDICT"
MESSAGE_LIMIT = 4096  # bytes the kubelet keeps of a termination message
_KEY = "labkube.world_verdict/v1"


def verdict_report(verdict: dict[str, Any]) -> str:
    """`verdict` (the body of POST /finish, /oracle or /are_agent) as a termination message of at most 4096 bytes."""
    body = dict(verdict)
    for cut in (None, 1200, 300, 0):
        if cut is not None:
            body["matches"] = None
            rationale = body.get("rationale")
            if isinstance(rationale, str) and len(rationale) > cut:
                body["rationale"] = rationale[:cut] + " [cut to fit the termination message]" if cut else None
        text = json.dumps({_KEY: body}, separators=(",", ":"), default=str)
        if len(text.encode()) <= MESSAGE_LIMIT:
            return text
    essentials = {k: body.get(k) for k in ("scenario_id", "success", "exception", "oracle", "judge_usd")}
    return json.dumps({_KEY: essentials}, separators=(",", ":"), default=str)[:MESSAGE_LIMIT]


def verdict_from_report(message: str | None) -> dict[str, Any] | None:
    """The verdict in a world container's termination message; None when there is none (the world never judged,
    or the message is something else)."""
    if not message:
        return None
    try:
        parsed = json.loads(message)
    except ValueError:
        return None
    verdict = parsed.get(_KEY) if isinstance(parsed, dict) else None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("success"), bool):
        return None
    return verdict
