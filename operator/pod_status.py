"""What a run's pod says, read from the pod object as the API returns it: plain functions, tested without a
cluster.

Whether it is starting or stuck (`pod_conditions`: `Scheduled`, `ImagePulled`, `PodReady` with the kubelet's or
scheduler's reason; `stuck_condition`), its exit code and attempt, whether the cluster took it away
(`disruption_of`: an eviction, a preemption, a node gone), whether an eviction was the run's own doing
(`self_caused_eviction`: its own storage past its limit, or past its request under node pressure; a crash, not a
disruption) and, once it ended (`PodEnd`), the reason a Run's `Resumed` condition gives for it. `pod_manifest`
builds the pods; this module reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from labkube.operator.k8s_grading import GRADE_CONTAINER, container_terminated, is_grading_pod
from labkube.operator.k8s_models import Condition, ConditionStatus
from labkube.operator.kube import parse_time
from labkube.operator.pod_manifest import LABEL_ATTEMPT
from labkube.run_spec import RunPhase
from labkube.run_spec import RunStatus as StoreStatus

__all__ = [
    "DISRUPTION_CONDITIONS",
    "DISRUPTION_REASONS",
    "IMAGE_PULL_REASONS",
    "TERMINAL",
    "PodEnd",
    "disruption_of",
    "ended",
    "failed_init_container",
    "live_phase",
    "pod_attempt",
    "pod_conditions",
    "pod_exit_code",
    "problem_message",
    "reason_of",
    "self_caused_eviction",
    "stuck_condition",
    "unseen_deletion",
]

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that are normal on the way to Running.
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
# Phases of a pod that has ended.
TERMINAL = frozenset({"Succeeded", "Failed"})


def _statuses(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def stuck_condition(pod: Mapping[str, Any]) -> tuple[str, bool, str, str] | None:
    """What keeps a pod from ever starting by itself: an image that cannot be pulled, or a container (the
    Gaia2 world sidecar, say) that keeps crashing. Given `image_pull_timeout_s`, the run fails with it."""
    return next(
        (
            c
            for c in pod_conditions(pod)
            if not c[1] and (c[0] == "ImagePulled" or (c[0] == "PodReady" and c[2] == "CrashLoopBackOff"))
        ),
        None,
    )


def failed_init_container(pod: Mapping[str, Any]) -> str | None:
    """The first init container that terminated with an error, as `container NAME: reason: message`."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated and int(terminated.get("exitCode", 0)) != 0:
            detail = terminated.get("message") or terminated.get("reason") or f"exit code {terminated['exitCode']}"
            return f"container {cs.get('name')}: {detail}"
    return None


def pod_exit_code(pod: Mapping[str, Any]) -> int | None:
    """The main container's exit code (the agent's, or a grading pod's `grade`), once it terminated."""
    terminated = container_terminated(pod, GRADE_CONTAINER if is_grading_pod(pod) else "agent")
    return int(terminated.get("exitCode", -1)) if terminated is not None else None


def pod_attempt(pod: Mapping[str, Any]) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, -1))
    except ValueError:
        return -1


def pod_conditions(pod: Mapping[str, Any]) -> list[tuple[str, bool, str, str]]:
    """What the pod says about starting: (type, ok, reason, message) for `Scheduled`,
    `ImagePulled` and `PodReady`, as far as the pod tells."""
    out: list[tuple[str, bool, str, str]] = []
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None:
        ok = scheduled.get("status") == "True"
        reason = scheduled.get("reason") or ("Scheduled" if ok else "Unschedulable")
        message = scheduled.get("message") or ""
        if reason == "SchedulingGated" and not message:
            message = "waiting for admission (a scheduling gate, e.g. Kueue's); queued, not stuck"
        out.append(("Scheduled", ok, reason, message))
    pull: tuple[str, bool, str, str] | None = None
    ready: tuple[str, bool, str, str] | None = None
    started = False
    for cs in _statuses(pod):
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in IMAGE_PULL_REASONS and pull is None:
            image = cs.get("image") or "?"
            detail = waiting.get("message") or reason
            pull = ("ImagePulled", False, reason, f"image {image} cannot be pulled: {detail}")
        elif reason and reason not in _STARTING_REASONS and reason not in IMAGE_PULL_REASONS and ready is None:
            ready = ("PodReady", False, reason, f"container {cs.get('name')}: {waiting.get('message') or reason}")
        if "running" in state or "terminated" in state:
            started = True
    if pull is not None:
        out.append(pull)
    elif started:
        out.append(("ImagePulled", True, "Pulled", ""))
    if ready is not None:
        out.append(ready)
    elif started:
        out.append(("PodReady", True, "Started", ""))
    return out


# Pod condition types that mark a pod taken away by the cluster (an eviction, a preemption, a node going away),
# and pod reasons that say the same: `DisruptionTarget` (Kubernetes >= 1.26, with reasons such as
# `PreemptionByScheduler`, `TerminationByKubelet`, `EvictionByEvictionAPI`, `DeletionByTaintManager`,
# `DeletionByPodGC`), Kueue's `TerminationTarget` (`StoppedByKueue`, `Preempted`).
DISRUPTION_CONDITIONS = frozenset({"DisruptionTarget", "TerminationTarget"})
DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "Terminated", "Shutdown", "NodeShutdown", "NodeLost"})


def disruption_of(pod: Mapping[str, Any] | None) -> str | None:
    """Why the cluster took the pod away (the condition's or the pod's reason), or None for anything else: a crash,
    a failed container, a pod deleted by hand."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") in DISRUPTION_CONDITIONS and condition.get("status") == "True":
            return str(condition.get("reason") or condition["type"])
    reason = status.get("reason") or ""
    return reason if reason in DISRUPTION_REASONS else None


# The kubelet's eviction messages (pkg/kubelet/eviction/helpers.go; docs: "Node-pressure Eviction",
# https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/). Its local-storage check
# (`localStorageEviction`, every housekeeping pass) evicts a pod whose own usage passes a limit its own spec set:
# phase `Failed`, reason `Evicted`, one of these messages, and no `DisruptionTarget` condition (`evictPod` is given
# none there; only node-pressure evictions get `TerminationByKubelet`).
_OWN_LIMIT = re.compile(
    r"Pod ephemeral local storage usage exceeds the total limit of containers \S+\.(?=\s|$)"
    r'|Container \S+ exceeded its local ephemeral storage limit "[^"]*"\.'
    r'|Usage of EmptyDir volume "[^"]*" exceeds the limit "[^"]*"\.'
)
# A node-pressure eviction's message ("The node was low on resource: ephemeral-storage. Threshold quantity: ...,
# available: .... ") names each container that used more of the starved resource than it requested: "Container
# agent was using 12Gi, which exceeds its request of 10Gi. " (older kubelets), "Container agent was using 12Gi,
# request is 10Gi, has larger consumption of ephemeral-storage. " (newer).
_OVER_REQUEST = re.compile(
    r"Container (?P<name>\S+) was using (?P<usage>[^,\s]+), "
    r"(?:which exceeds its request of (?P<old>\S+?)|request is (?P<new>[^,\s]+), has larger consumption of \S+?)"
    r"\.(?=\s|$)"
)


def self_caused_eviction(pod: Mapping[str, Any] | None) -> str | None:
    """Why the kubelet's eviction of `pod` was the run's own doing, as a clause ("it used more local storage than its
    own spec allows ..."), or None: not evicted by the kubelet, or evicted for the node's sake within its requests.

    Two kinds are the run's own, so they count as crashes, not disruptions (an agent could otherwise buy itself
    resumes for free, each from a checkpoint it wrote): an eviction for passing a local-storage limit of the pod's own
    spec (the pod's total ephemeral-storage limit, a container's, an emptyDir's `sizeLimit`: whichever container
    wrote it, the run's pod did), and a node-pressure eviction (`DisruptionTarget`, `TerminationByKubelet`) whose
    message says the pod's main container (`agent`, or a grading pod's `grade`) used more than it requested. A
    node-pressure eviction of a pod within its requests, preemptions and drains are the cluster's doing."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    by_kubelet = [
        c
        for c in status.get("conditions") or []
        if c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == "TerminationByKubelet"
    ]
    if status.get("reason") != "Evicted" and not by_kubelet:
        return None
    main = GRADE_CONTAINER if is_grading_pod(pod) else "agent"
    for message in [str(status.get("message") or ""), *(str(c.get("message") or "") for c in by_kubelet)]:
        if (own := _OWN_LIMIT.search(message)) is not None:
            return f"it used more local storage than its own spec allows (the kubelet: {own.group(0)!r})"
        for over in _OVER_REQUEST.finditer(message):
            if over["name"] == main:
                request = over["old"] or over["new"]
                return (
                    f"under node pressure its container {main} was using {over['usage']}, more than its request of "
                    f"{request} (the kubelet: {over.group(0)!r})"
                )
    return None


def live_phase(pod: Mapping[str, Any] | None, store: StoreStatus | None) -> RunPhase:
    """The Run's phase while its pod lives: `Pending` while it has no pod or its pod waits for something outside it
    (a node with room, a scheduling gate, an image that cannot be pulled: the `Scheduled` or `ImagePulled`
    condition says which), `Starting` while the pod starts, then the harness's own phase."""
    if pod is None:
        return RunPhase.pending
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Running":
        if store is not None and store.phase in (RunPhase.running, RunPhase.grading):
            return store.phase
        return RunPhase.running
    waiting = [t for t, ok, _, _ in pod_conditions(pod) if not ok and t in ("Scheduled", "ImagePulled")]
    return RunPhase.pending if waiting else RunPhase.starting


def problem_message(conditions: list[Condition]) -> str:
    """The first unmet start-up condition, as one line for `status.json`."""
    for c in conditions:
        if c.type in ("Scheduled", "ImagePulled", "PodReady") and c.status == ConditionStatus.false:
            return f"{c.reason}: {c.message}" if c.message else c.reason
    return ""


@dataclass
class PodEnd:
    pod: dict[str, Any] | None  # None: the pod disappeared (deleted, preempted)
    gave_up: str | None = None  # a reason to stop without retrying
    last: dict[str, Any] | None = None  # a disappeared pod's last state (from the watch's DELETED event)
    unobserved: bool = False  # it disappeared while the watch was down (found missing when it listed again)
    lost: str | None = None  # why the pod is lost (its node died or went): a disruption, not the run's doing
    ended_at: datetime | None = None  # a lost pod's end: when the cluster last saw it run (its node's last heartbeat)


def ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def unseen_deletion(end: PodEnd) -> bool:
    """A pod deleted while the watch was down whose last seen state was not already being deleted. Its final state
    (a `DisruptionTarget` condition, say) was never seen; nothing of the run's can delete a pod (run pods hold no
    service-account token), so it was the cluster (a preemption, an eviction, a node drained) or a person. It counts
    as a disruption: the run resumes without using up a crash attempt. A pod last seen being deleted without a
    disruption condition was deleted by hand, as a watched deletion without one is."""
    if not end.unobserved or end.pod is not None:
        return False
    return not ((end.last or {}).get("metadata") or {}).get("deletionTimestamp")


def reason_of(end: PodEnd) -> str:
    if end.lost is not None:
        return "PodLost"
    if self_caused_eviction(end.pod if end.pod is not None else end.last) is not None:
        return "SelfCausedEviction"
    if (disrupted := disruption_of(end.pod if end.pod is not None else end.last)) is not None:
        return disrupted
    if unseen_deletion(end):
        return "DeletedWhileUnwatched"
    if end.pod is None:
        return "PodDeleted"
    reason = (end.pod.get("status") or {}).get("reason")
    return str(reason) if reason else "PodFailed"


def node_loss(
    name: str, node: Mapping[str, Any] | None, margin_s: float, now: datetime
) -> tuple[str, datetime | None] | None:
    """Whether node `name` (its Node object; None: the API has none) has gone, or has not been Ready for more than
    `margin_s`: why, in words, and when the cluster last heard from it (its `Ready` condition's
    `lastHeartbeatTime`; None when unknown). None: the node is Ready, or not yet long enough."""
    if node is None:
        return f"its node {name} is gone (the Node object was deleted)", None
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "True":
        return None
    since = parse_time(ready.get("lastTransitionTime"))
    if since is None or (now - since).total_seconds() <= margin_s:
        return None
    heartbeat = parse_time(ready.get("lastHeartbeatTime"))
    detail = ": ".join(str(x) for x in (ready.get("reason"), ready.get("message")) if x)
    state = "NotReady" if ready.get("status") == "False" else "not reporting (Ready Unknown)"
    return f"its node {name} has been {state} since {since.isoformat()}{f' ({detail})' if detail else ''}", heartbeat
