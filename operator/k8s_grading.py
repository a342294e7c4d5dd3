"""Result intake on a cluster: a run's result comes from a grading pod, never from the agent's own pod.

The agent's shell commands run as the same user, in the same container, as whatever writes that container's
termination message and the run's `result.json`: anything the agent's pod reports is the agent's word. So the
operator reads only the agent pod's exit code and the cluster's own conditions (an eviction, a deadline) from it:

- exit code 0 or 1 (the agent says its loop ended): the operator starts a grading pod;
- the pod's `activeDeadlineSeconds` passed: a grading pod (`time`);
- anything else (137 for an OOM kill, a planted termination message included): a crash or a disruption, and
  the next pod resumes; when the attempts run out, a grading pod (`killed`).

The grading pod (`<run>-<attempt>-grade`, label `labkube.dev/finalize`) starts after the agent's pod has ended,
so none of the agent's processes are left. It mounts the run's volume, re-writes `run.json` from the spec the
operator admitted (the `prepare` init container), and runs `labkube agent --finalize REASON` in a container
named `grade` that the agent never ran in: the task's pristine grader (protected files restored), the final
grade, the integrity audit, `result.json`. It has no API keys, no model gateway and no Gaia2 world. Its
termination message is the run's result; the operator accepts it only from the grading pod it created.

A Gaia2 run is judged by ARE in the pod's `world` sidecar, a container the agent never ran in. The world writes its
verdict to its own termination-message file (`tasks/gaia2/verdict_message.py`); when the agent's pod ends, the
operator reads it from the API, records it in the Run's status (`worldVerdict`) and gives it to the grading pod
(`LABKUBE_WORLD_VERDICT`, with `LABKUBE_WORLD_VERDICT_FROM=operator`), whose grader takes no other: the copy in the
checkpoint is on the agent's volume. No verdict reported (the world never judged, or died first): a `world_error`.
The world serves only the scenario its harness loaded before the agent started (a second load is refused), so the
agent's shell, which reaches its port, cannot swap in an oracle run.

A workspace must outlive the agent's pod for this: `runs.workspace.mode: pvc` (a claim per run, or the shared
claim). An `emptyDir` workspace is refused (`OperatorConfig`, and the chart's `labkube.validateConfig`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from labkube.agent.gateway.ledger import CLUSTER_SPEND_VARIABLE, GatewayReport, report_from_message
from labkube.agent.gateway.record import RECORDS_VARIABLE
from labkube.agent.harness.entrypoint import GRADED_BY_OPERATOR_VARIABLE
from labkube.budgets import StopReason, spend_floor
from labkube.control import CONTROL_FILE_VARIABLE as RUN_CONTROL_VARIABLE
from labkube.operator.crds import dns_label
from labkube.operator.k8s_models import RunStatus
from labkube.operator.pod_manifest import (
    GATEWAY_RECORDS_MOUNT,
    GATEWAY_TMP,
    RUN_CONTROL,
    WORLD_CONTROL,
)
from labkube.result import RunResult, result_from_report, termination_report
from labkube.run_spec import CLUSTER_ACCOUNT_VARIABLE, ClusterAccount
from labkube.tasks.gaia2.verdict_message import (
    CONTROL_FILE_VARIABLE,
    WORLD_VERDICT_SOURCE,
    WORLD_VERDICT_VARIABLE,
    verdict_from_report,
)

__all__ = [
    "GRADE_CONTAINER",
    "LABEL_FINALIZE",
    "agent_ended_reason",
    "container_terminated",
    "gateway_report_of",
    "graded_result",
    "grading_manifest",
    "grading_pod_name",
    "is_grading_pod",
    "result_from_status",
    "world_verdict_of",
]

LABEL_FINALIZE = "labkube.dev/finalize"
GRADE_CONTAINER = "grade"
# Variables of the agent container that a grading pod does not get: the gateway's and the world's addresses, the
# key hand-over, the metrics port (nothing scrapes a grading pod), and the word that the grading is left to it.
_AGENT_ONLY_ENV = frozenset(
    {
        "LABKUBE_WORLD_URL",
        "LABKUBE_GATEWAY_URL",
        "LABKUBE_GATEWAY_TOKEN_FILE",
        "LABKUBE_STDIN_VARS",
        CONTROL_FILE_VARIABLE,
        GRADED_BY_OPERATOR_VARIABLE,
        CLUSTER_SPEND_VARIABLE,  # the account (`CLUSTER_ACCOUNT_VARIABLE`) holds the spend as of the grading
        RUN_CONTROL_VARIABLE,  # the account holds the interventions as of the grading
    }
)
# Sidecars the agent talked to: a grading pod has neither (no key, no world; Gaia2's verdict comes from the operator,
# which read it from the world sidecar's termination message).
GATEWAY_CONTAINER = "gateway"
_AGENT_SIDECARS = frozenset({"world", GATEWAY_CONTAINER})


def grading_pod_name(run: str, attempt: int) -> str:
    return dns_label(f"{run}-{attempt}-grade")


def is_grading_pod(pod: Mapping[str, Any]) -> bool:
    return LABEL_FINALIZE in (((pod.get("metadata") or {}).get("labels")) or {})


def grading_manifest(
    pod: dict[str, Any],
    reason: StopReason,
    deadline_s: int,
    world_verdict: str | None = None,
    account: ClusterAccount | None = None,
) -> dict[str, Any]:
    """The agent pod `pod` (as built for this attempt) turned into the pod that grades the stopped run. A Gaia2 run's
    grader is given the verdict its world sidecar reported (`world_verdict`, that container's termination message),
    and told to take no other: the checkpoint's copy is the agent's to write. The grader charges the run with the
    operator's `account` (the gateways' spend, the API's pod times), never the checkpoint's."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    command = [a for a in agent["command"] if a != "--resume"] + ["--finalize", reason.value]
    env = [
        e
        for e in agent.get("env", [])
        if e["name"] not in _AGENT_ONLY_ENV and "secretKeyRef" not in (e.get("valueFrom") or {})
    ]
    if account is not None:
        env.append({"name": CLUSTER_ACCOUNT_VARIABLE, "value": account.model_dump_json()})
    if any(c["name"] == "world" for c in spec.get("initContainers", [])):
        env.append({"name": WORLD_VERDICT_SOURCE, "value": "operator"})
        if world_verdict:
            env.append({"name": WORLD_VERDICT_VARIABLE, "value": world_verdict})
    mounts = [m for m in agent.get("volumeMounts", []) if m["name"] not in ("gateway", WORLD_CONTROL, RUN_CONTROL)]
    # The gateway's record of the model's tool calls (`agent/gateway/record.py`), read-only, for the audit to hold the
    # transcript against: the gateway sidecar's mount, which the agent's container never had.
    gateway = next((c for c in spec.get("initContainers", []) if c["name"] == GATEWAY_CONTAINER), None)
    records = next(
        (m for m in (gateway or {}).get("volumeMounts", []) if m["mountPath"] == GATEWAY_RECORDS_MOUNT), None
    )
    if records is not None:
        mounts.append({**records, "readOnly": True})
        env.append({"name": RECORDS_VARIABLE, "value": GATEWAY_RECORDS_MOUNT})
    grade = {**agent, "name": GRADE_CONTAINER, "command": command, "env": env, "volumeMounts": mounts}
    grade.pop("ports", None)
    spec["containers"] = [grade]
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c["name"] not in _AGENT_SIDECARS]
    spec["volumes"] = [
        v for v in spec.get("volumes", []) if v["name"] not in ("gateway", GATEWAY_TMP, WORLD_CONTROL, RUN_CONTROL)
    ]
    spec["activeDeadlineSeconds"] = max(60, deadline_s)
    meta = pod["metadata"]
    attempt = int(meta["labels"].get("labkube.dev/attempt", 0))
    run = meta["labels"]["labkube.dev/run"]
    meta["name"] = grading_pod_name(run, attempt)
    meta["labels"][LABEL_FINALIZE] = reason.value
    return pod


def container_terminated(pod: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """Container `name`'s `state.terminated` (a container, or an init container such as a sidecar), once it ended."""
    status = pod.get("status") or {}
    for cs in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]:
        if cs.get("name") == name:
            return (cs.get("state") or {}).get("terminated")
    return None


def world_verdict_of(pod: Mapping[str, Any] | None) -> str | None:
    """The verdict an agent pod's world sidecar wrote as its termination message (None: it judged nothing). Only
    the world container can write that file; the agent's own container and volume are not read for it."""
    if pod is None or is_grading_pod(pod):
        return None
    message = (container_terminated(pod, "world") or {}).get("message")
    return message if verdict_from_report(message) is not None else None


def gateway_report_of(pod: Mapping[str, Any] | None) -> GatewayReport | None:
    """What an agent pod's gateway sidecar counted, from its termination messages (the one it ended with, and the one
    before the kubelet restarted it): a file only that container writes. None: it reported nothing (no gateway, or
    none that ended with a report)."""
    if pod is None or is_grading_pod(pod):
        return None
    status = pod.get("status") or {}
    reports = []
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if cs.get("name") != GATEWAY_CONTAINER:
            continue
        for state in (cs.get("state"), cs.get("lastState")):
            report = report_from_message(((state or {}).get("terminated") or {}).get("message"))
            if report is not None:
                reports.append(report)
    if not reports:
        return None
    stops = [r.stop_reason for r in reports if r.stop_reason is not None]
    return GatewayReport(
        spend=spend_floor(*(r.spend for r in reports)),
        stop_reason=stops[0] if stops else None,
        calls=max(r.calls for r in reports),
    )


def agent_ended_reason(code: int | None) -> StopReason | None:
    """What an agent pod's exit code asks for: grading (0 or 1: its loop ended), or None (a crash: resume)."""
    if code == 0:
        return StopReason.done
    if code == 1:
        return StopReason.error
    return None


def graded_result(pod: Mapping[str, Any], run_id: str) -> RunResult | None:
    """The result in a grading pod's termination message (the `grade` container's); None from any other pod, or
    when the message is not a final result of this run."""
    if not is_grading_pod(pod):
        return None
    result = result_from_report((container_terminated(pod, GRADE_CONTAINER) or {}).get("message"))
    if result is None or result.run_id != run_id or not result.final:
        return None
    return result


def result_from_status(status: RunStatus, run_id: str) -> RunResult | None:
    """The result a Run's final status records (its grading report), for a leader that has no copy on disk."""
    if not status.phase.final or not status.report:
        return None
    result = result_from_report(status.report)
    return result if result is not None and result.run_id == run_id and result.final else None


def report_of(result: RunResult) -> str:
    """`result` as the Run status records it (the termination report: at most 4096 bytes)."""
    return termination_report(result)
