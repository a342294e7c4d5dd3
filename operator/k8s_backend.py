"""The Kubernetes sandbox backend: one run's agent in a pod, supervised from a Ray actor.

The Ray campaign driver (`driver.drive`) hands every supervisor the run directory and a
`K8sBackend`; `supervise_pod` then drives the run to a final state:

1. read the `Run` resource: its status is the record across operator restarts and failovers (`attempts`,
   `podName`, `podTimes`, and once final the result's report); a final status ends supervision at once;
2. adopt the newest pod of the run if there is one, else create `<run>-<attempt>` with
   `pod_manifest.build_pod_manifest` (a create that answers 409 adopts the existing pod, so a
   supervisor that died between the create and the status patch never makes a second pod);
3. follow the pod through one shared watch per process (`PodWatcher`) and the run's
   `status.json` on the shared runs volume, patching `Run.status` (phase, score, tokens, dollars,
   GPU-hours, conditions) whenever something changed;
4. when the agent's pod ends: exit code 0 or 1, a deadline, or the last allowed attempt is followed by a
   grading pod (`k8s_grading`: `labkube agent --finalize REASON` in a pod of its own, without keys) whose
   termination message is the run's result; anything else (an eviction, a preemption, a deletion, an OOM
   kill) is replaced by a pod that resumes from the checkpoint (`--resume`), at most `max_attempts` crashes;
5. the result goes into the Run's status first, and only then are the run's ended pods deleted (and, with
   `runs.workspace.keepFinished: false`, the claim the operator made for the run).

Problems that keep a pod from starting become conditions with the kubelet's or scheduler's reason:
`Scheduled=False` (`Unschedulable`, `SchedulingGated` for Kueue), `ImagePulled=False`
(`ErrImagePull`, `ImagePullBackOff`, ...), `PodReady=False` (e.g. `CreateContainerConfigError`).
The same reason goes into the run's `status.json` `message`, which `labkube status` shows.

What the operator learns of a run, and from where (docs/kubernetes.md, "Storage"):

- the outcome: the grading pod's termination message (`labkube.result.termination_report`), in every
  namespace and workspace mode; never anything the agent's own pod says beyond its exit code (`k8s_grading`);
- live score, tokens and dollars: the run's `status.json`, only when the volume is shared;
- GPU time: pod start and finish times as the API reports them (`k8s_ledger.PodLedger`, recorded in the
  Run's `status.podTimes` and cached in the operator's own `<campaign>/pods/`), never a file the run can write;
- what to build the pod from: the admitted spec (`admission`), never the Run resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from labkube.agent.harness.entrypoint import DISK_FULL_EXIT
from labkube.budgets import StopReason, rounded_usd
from labkube.operator.admission import read_admitted
from labkube.operator.crds import GROUP, LABEL_CAMPAIGN, VERSION, run_name
from labkube.operator.k8s_grading import (
    GRADE_CONTAINER,
    LABEL_FINALIZE,
    agent_ended_reason,
    container_terminated,
    graded_result,
    grading_manifest,
    is_grading_pod,
    report_of,
    result_from_status,
    world_verdict_of,
)
from labkube.operator.k8s_ledger import PodLedger, ledger_path, pod_time, restore_ledger
from labkube.operator.k8s_models import (
    Condition,
    ConditionStatus,
    PodOptions,
    RunResourceSpec,
    RunStatus,
    set_condition,
)
from labkube.operator.kube import KubeTarget, answered, api_client
from labkube.operator.pod_manifest import (
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_RUN,
    build_pod_manifest,
    build_pvc_manifest,
    pvc_name,
)
from labkube.result import RunResult
from labkube.run_spec import RunPhase
from labkube.run_spec import RunStatus as StoreStatus
from labkube.store import RunDir, read_model, utcnow, write_model

__all__ = [
    "IMAGE_PULL_REASONS",
    "LABEL_FINALIZE",
    "TRANSIENT",
    "K8sBackend",
    "PodLedger",
    "PodWatcher",
    "ledger_path",
    "pod_conditions",
    "pod_exit_code",
    "raw_json",
    "retrying",
    "supervise_pod",
]

log = logging.getLogger("labkube.operator.k8s")

RUN_SELECTOR = f"app.kubernetes.io/managed-by=labkube-operator,{LABEL_COMPONENT}=run"
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that are normal on the way to Running.
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
_TERMINAL = frozenset({"Succeeded", "Failed"})

T = TypeVar("T")


class K8sBackend(BaseModel):
    """What every run supervisor of one campaign needs to run pods (JSON: crosses into Ray actors)."""

    model_config = ConfigDict(extra="forbid")

    kube: KubeTarget
    namespace: str
    operator_namespace: str | None = Field(
        default=None, description="Where the operator runs: its runs root holds that namespace's shared claim."
    )
    runs: PodOptions
    max_attempts: int = Field(
        default=3, ge=1, description="Pods per run that may fail (crash, error) before it is finalized as killed."
    )
    max_disruptions: int = Field(
        default=20,
        ge=0,
        description="Pods per run the cluster may take away (evictions, preemptions, reclaimed nodes) on top: "
        "they resume from the checkpoint and use up no crash attempt.",
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="How often status.json is read while a pod runs.")
    delete_finished_pods: bool = Field(
        default=True, description="Delete a run's ended pods once its result is recorded (their logs go with them)."
    )
    image_pull_timeout_s: float = Field(
        default=600.0, gt=0, description="A run whose image cannot be pulled for this long fails."
    )

    @property
    def shared(self) -> bool:
        """Whether the operator sees the run directories the pods write: the shared claim of its own namespace,
        which it mounts (a claim is namespaced: another namespace's claim of that name is another volume)."""
        ws = self.runs.workspace
        return ws.mode == "pvc" and ws.existing_claim is not None and self.namespace == self.operator_namespace


# -- plain functions over manifests and pods (tested without a cluster) --------------------------


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


def live_phase(pod: Mapping[str, Any] | None, store: StoreStatus | None) -> RunPhase:
    """The Run's phase while its pod lives."""
    if pod is None:
        return RunPhase.pending
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Running":
        if store is not None and store.phase in (RunPhase.running, RunPhase.grading):
            return store.phase
        return RunPhase.running
    return RunPhase.starting


def problem_message(conditions: list[Condition]) -> str:
    """The first unmet start-up condition, as one line for `status.json`."""
    for c in conditions:
        if c.type in ("Scheduled", "ImagePulled", "PodReady") and c.status == ConditionStatus.false:
            return f"{c.reason}: {c.message}" if c.message else c.reason
    return ""


# -- the API, from a Ray worker ------------------------------------------------------------------


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What supervisors read of a watched pod: its metadata and status. Its spec (containers, their env with the run
    spec, volumes, affinity) is most of its size and is never read from the cache; at 5,000 Runs every supervisor
    process caches every pod of the campaign (benchmarks/operator_scale.py)."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    spec = pod.get("spec") or {}
    return {
        "metadata": meta,
        "spec": {"nodeName": spec["nodeName"]} if "nodeName" in spec else {},
        "status": pod.get("status") or {},
    }


class PodWatcher:
    """One list+watch of the run pods of one campaign (label selector: this operator's run pods of that campaign),
    shared by all supervisors of the campaign in this process: the cache holds nothing else.

    A thread runs the (blocking) `kubernetes` client's list and watch and hands each event to the
    event loop; supervisors read the cache (`get`, `of_run`) and `wait` for a pod to change.

    When the watch cannot resume (410 Gone after the API server compacted or restarted), it lists again: a cached
    pod the new list lacks was deleted in the gap, and no DELETED event will say how. It goes to `deleted` with the
    last state seen (`DeletedPod(observed=False)`), which supervisors classify as a watched deletion's
    (`PodRun.outcome`), unless it was `seen` in an API answer after the list was asked for (just created).
    """

    def __init__(
        self, session: KubeSession, namespace: str, loop: asyncio.AbstractEventLoop, campaign: str | None = None
    ) -> None:
        self.session = session
        self.selector = RUN_SELECTOR + (f",{LABEL_CAMPAIGN}={campaign}" if campaign else "")
        self.namespace = namespace
        self.loop = loop
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: dict[str, DeletedPod] = {}  # pod name -> how it went, for pods deleted since
        self.synced = asyncio.Event()
        self._seen_at: dict[str, float] = {}  # pods `seen` in an API answer, and when: a re-list older keeps them
        self._bells: dict[str, asyncio.Event] = {}
        self._versions: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"labkube-pods-{namespace}", daemon=True)
        self._thread.start()

    def get(self, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)

    def of_run(self, run: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN) == run]

    def seen(self, pod: dict[str, Any]) -> None:
        """Record a pod the API just returned (it reaches the watch soon; do not wait for it)."""
        name = pod["metadata"]["name"]
        if name not in self.pods:
            self.pods[name] = slim_pod(pod)
            self._seen_at[name] = time.monotonic()
            self._ring(name)

    def version(self, name: str) -> int:
        """How many times pod `name` has changed in this cache: what `wait` compares with."""
        return self._versions.get(name, 0)

    async def wait(self, name: str, timeout: float, since: int) -> None:
        """Until pod `name` changes after `version(name)` was `since` (at once if it already has: a change that
        came while the caller was busy is not lost), or `timeout` seconds."""
        if self.version(name) != since:
            return
        bell = self._bells.setdefault(name, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bell.wait(), timeout)

    def close(self) -> None:
        self._stop.set()

    def _ring(self, name: str) -> None:
        self._versions[name] = self._versions.get(name, 0) + 1
        bell = self._bells.pop(name, None)
        if bell is not None:
            bell.set()

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "reset":
            items, listed_at = payload
            old = self.pods
            self.pods = {p["metadata"]["name"]: slim_pod(p) for p in items}
            for name in self.pods:
                self._seen_at.pop(name, None)
            for name, last in old.items():
                if name in self.pods:
                    continue
                if self._seen_at.get(name, -math.inf) >= listed_at:
                    self.pods[name] = last  # created after the list was asked for: the watch brings it
                else:
                    # Deleted while the watch was down (an API outage, a 410 after compaction): no DELETED event
                    # will come, so what was last seen of it stands for how it went.
                    self._forget(name, DeletedPod(last, observed=False))
            for name in old.keys() | self.pods.keys():
                self._ring(name)
            self.synced.set()
            return
        obj = slim_pod(payload)
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
            # its last state tells whether the cluster took it away (DisruptionTarget)
            self._forget(name, DeletedPod(obj, observed=True))
        else:
            self.pods[name] = obj
        self._ring(name)

    def _forget(self, name: str, gone: DeletedPod) -> None:
        self._seen_at.pop(name, None)
        self.deleted[name] = gone
        if len(self.deleted) > 10_000:
            self.deleted.pop(next(iter(self.deleted)))

    def _post(self, kind: str, payload: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
            self.loop.call_soon_threadsafe(self._apply, kind, payload)

    def _run(self) -> None:
        from kubernetes.client import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        core = self.session.core
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listed_at = time.monotonic()
                    listing = raw_json(
                        core.list_namespaced_pod(
                            self.namespace, label_selector=self.selector, _preload_content=False, _request_timeout=30
                        )
                    )
                    rv = str(listing["metadata"]["resourceVersion"])
                    self._post("reset", (listing.get("items") or [], listed_at))
                resp: Any = core.list_namespaced_pod(
                    self.namespace,
                    label_selector=self.selector,
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=50,
                    _preload_content=False,
                    _request_timeout=(10, 70),
                )
                try:
                    for line in iter_resp_lines(resp):
                        if self._stop.is_set():
                            break
                        if not line or line.isspace():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = None if obj.get("code") == 410 else rv
                            if rv is not None:
                                time.sleep(1.0)
                            break
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            self._post(event["type"], obj)
                finally:
                    resp.close()
                    resp.release_conn()
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                log.warning("pod watch in %s: %s %s; retrying", self.namespace, exc.status, exc.reason)
                self._stop.wait(1.0)
            except Exception as exc:  # connection errors: the API server restarts, the network blips
                if self._stop.is_set():
                    return
                log.warning("pod watch in %s: %s; retrying", self.namespace, str(exc).splitlines()[0][:200])
                self._stop.wait(1.0)


API_CALLS = 20  # concurrent API calls of one process's session (threads of its pool)
STATUS_FIRST, OTHER_CALLS = 0, 1


class Turns:
    """At most `n` holders at once; a waiting holder of a lower `priority` goes first (then first come, first
    served). Status patches go before pod creations: while a campaign starts, a Run's status follows its pod
    instead of queueing behind the creation of a thousand others."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self.arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def take(self, priority: int) -> AsyncIterator[None]:
        if self.free > 0 and not self.waiting:
            self.free -= 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self.waiting, (priority, next(self.arrivals), turn))
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # handed over as it was cancelled: pass it on
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self.waiting:
            _, _, turn = heapq.heappop(self.waiting)
            if not turn.done():
                turn.set_result(None)
                return
        self.free += 1


class KubeSession:
    """The API clients of one process for one target, a thread pool for their blocking calls, and one
    `PodWatcher` per namespace. Calls take turns (`Turns`): a status patch waits for a turn, not in the pool's
    queue, and is built when its turn comes, so a Run whose pod moved on while it waited sends where the pod is
    now, one patch instead of two; and status patches go before pod creations."""

    def __init__(self, target: KubeTarget, loop: asyncio.AbstractEventLoop) -> None:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.client = api_client(target, pool_size=API_CALLS + 8)
        self.core = CoreV1Api(self.client)
        self.custom = CustomObjectsApi(self.client)
        self.loop = loop
        self.executor = ThreadPoolExecutor(max_workers=API_CALLS, thread_name_prefix="labkube-kube")
        self.turns = Turns(API_CALLS)
        self.watchers: dict[str, PodWatcher] = {}

    async def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        in_turn: bool = False,
        conflicts: bool = False,
        patience_s: float | None = None,
        **kwargs: Any,
    ) -> T:
        """`fn(...)` in the pool, retried (`retrying`), in a turn of its own unless the caller holds one."""
        work = partial(answered, fn, *args, **kwargs)

        async def attempt() -> T:
            return await self.loop.run_in_executor(self.executor, work)

        if in_turn:
            return await retrying(attempt, conflicts=conflicts, patience_s=patience_s)
        async with self.turns.take(OTHER_CALLS):
            return await retrying(attempt, conflicts=conflicts, patience_s=patience_s)

    def pods(self, namespace: str, campaign: str | None = None) -> PodWatcher:
        key = f"{namespace}/{campaign or ''}"
        if key not in self.watchers:
            self.watchers[key] = PodWatcher(self, namespace, self.loop, campaign)
        return self.watchers[key]


_SESSIONS: dict[tuple[str, int], KubeSession] = {}


def session_for(target: KubeTarget) -> KubeSession:
    """This process's session for `target` on the running loop (created on first use)."""
    loop = asyncio.get_running_loop()
    key = (target.model_dump_json(), id(loop))
    if key not in _SESSIONS:
        _SESSIONS[key] = KubeSession(target, loop)
    return _SESSIONS[key]


def raw_json(resp: object) -> dict[str, Any]:
    """The body of a `_preload_content=False` response (a urllib3 response, whatever the annotation says)."""
    return cast(dict[str, Any], json.loads(cast(Any, resp).data))


def _status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


TRANSIENT = frozenset({429, 500, 502, 503, 504})
PATIENCE_S = 3600.0  # how long a call without a deadline of its own waits out the API (a control-plane upgrade)
BACKOFF_CAP_S = 30.0


def backoff_delay(attempt: int, first_s: float = 0.5, cap_s: float = BACKOFF_CAP_S) -> float:
    """Capped exponential back-off with jitter: uniformly between half and all of min(cap, first x 2^attempt),
    so the supervisors of a thousand runs do not come back to a recovering API server in one burst."""
    ceiling = min(cap_s, first_s * 2.0**attempt)
    return random.uniform(ceiling / 2, ceiling)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks for (`Retry-After`), if it says."""
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    patience_s: float | None = None,
    first_delay_s: float = 0.5,
    conflicts: bool = False,
) -> T:
    """`call()`, again after a connection error, a 429/5xx or a 410 (the API server restarting, throttling, a
    control-plane upgrade), for as long as `patience_s` allows (the caller's own deadline: a run's time budget;
    default an hour), with capped exponential back-off and jitter, or the `Retry-After` the server asks for.
    Other API errors (404, 409, 422, ...) are the caller's. A create retried after a lost answer answers 409,
    which the callers treat as "exists". With `conflicts`, a 409 Conflict is retried too: for writes that are
    safe to repeat as they are (a merge patch of a status carries no resourceVersion)."""
    give_up_at = time.monotonic() + (PATIENCE_S if patience_s is None else patience_s)
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            status = _status_of(exc)
            transient = status in TRANSIENT or status == 410 or (conflicts and status == 409)
            transient = transient or (status is None and _is_connection_error(exc))
            delay = max(backoff_delay(attempt, first_delay_s), retry_after(exc) or 0.0)
            if not transient or time.monotonic() + delay > give_up_at:
                raise
            if attempt < 3 or attempt % 10 == 0:  # a long outage logs a line every few minutes, not every try
                log.warning("kubernetes API: %s; retrying in %.1fs", str(exc).splitlines()[0][:200], delay)
            await asyncio.sleep(delay)
            attempt += 1


def _is_connection_error(exc: BaseException) -> bool:
    import urllib3.exceptions

    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


class NotAdmitted(RuntimeError):
    """A run directory without the spec the operator admitted (never built from the Run resource)."""


class RunGone(RuntimeError):
    """The Run resource was deleted while it was supervised."""


@dataclass(frozen=True)
class DeletedPod:
    last: dict[str, Any]  # the DELETED event's object, or what was last seen of a pod a re-list no longer had
    observed: bool  # False: deleted while the watch was down, so its final state was never seen


@dataclass
class PodEnd:
    pod: dict[str, Any] | None  # None: the pod disappeared (deleted, preempted)
    gave_up: str | None = None  # a reason to stop without retrying
    last: dict[str, Any] | None = None  # a disappeared pod's last state (from the watch's DELETED event)
    unobserved: bool = False  # it disappeared while the watch was down (found missing when it listed again)


Outcome = Literal["deadline", "disk_full", "disrupted", "lost", "world"]


class PodRun:
    """Supervision of one run on the cluster (see the module docstring)."""

    def __init__(self, session: KubeSession, backend: K8sBackend, rd: RunDir) -> None:
        self.session = session
        self.backend = backend
        self.rd = rd
        admitted = read_admitted(rd.root.parent.parent, rd.root.name)
        if admitted is None:
            raise NotAdmitted(f"run {rd.root.name}: no admitted spec in {rd.root.parent.parent / 'admitted'}")
        self.resource: RunResourceSpec = admitted
        self.spec = admitted.to_run_spec()
        self.ledger_file = ledger_path(rd.root.parent.parent, self.spec.run_id)
        self.ledger = read_model(self.ledger_file, PodLedger) or PodLedger(run_id=self.spec.run_id, gpus=self.spec.gpus)
        self.name = run_name(self.spec.campaign, self.spec.run_id)
        self.namespace = backend.namespace
        self.watcher = session.pods(self.namespace, self.spec.campaign)
        self.status = RunStatus()
        self.published: dict[str, Any] | None = None
        self.owner: dict[str, Any] = {}
        self.generation: int | None = None
        self.last_message = ""
        self.read_at = -1e9  # when the Run was last read

    # -- the API ------------------------------------------------------------------------------

    def patience(self) -> float:
        """How long this run waits out an unavailable API: what is left of its own deadline (time budget plus the
        grace for final grading, less the pod time spent), at least five minutes; an hour without a time budget."""
        wall = self.spec.budgets.wall_seconds
        if wall is None:
            return PATIENCE_S
        return max(300.0, wall + self.backend.runs.deadline_grace_seconds - self.ledger.seconds())

    async def api(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.session.call(fn, *args, patience_s=self.patience(), **kwargs)

    async def read_run(self) -> dict[str, Any] | None:
        try:
            found = await self.api(
                self.session.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, "runs", self.name
            )
            self.read_at = time.monotonic()
            return cast(dict[str, Any], found)
        except Exception as exc:
            if _status_of(exc) == 404:
                return None
            raise

    async def publish(self, pod_name: str | None = None) -> None:
        """Patch the Run's status if it changed. With `pod_name`, the status is refreshed from that pod as the cache
        has it when the patch's turn comes (during a campaign's start, patches queue behind each other's)."""
        self._refresh_from(pod_name)
        if self._status_body() == self.published:
            return  # nothing new: no turn taken, so the Runs that have something to say go first
        async with self.session.turns.take(STATUS_FIRST):
            self._refresh_from(pod_name)  # where the pod is now, after the wait for a turn
            await self._patch_status()

    def _refresh_from(self, pod_name: str | None) -> None:
        """The status from pod `pod_name` as cached; a pod gone from the cache is the caller's to handle."""
        if pod_name is not None and (pod := self.watcher.get(pod_name)) is not None:
            self.refresh(pod)

    def _status_body(self) -> dict[str, Any]:
        body = self.status.to_status()
        body["observedGeneration"] = self.generation
        return body

    async def _patch_status(self) -> None:
        body = self._status_body()
        if body == self.published:
            return
        try:
            await self.api(
                self.session.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                self.namespace,
                "runs",
                self.name,
                {"status": body},
                _preload_content=False,
                in_turn=True,
                conflicts=True,
            )
        except Exception as exc:
            if _status_of(exc) == 404:
                raise RunGone(self.name) from None
            log.warning("run %s: status patch failed: %s", self.name, str(exc).splitlines()[0][:200])
            return
        self.published = body

    async def create_pod(self, manifest: dict[str, Any]) -> str:
        name = manifest["metadata"]["name"]
        try:
            resp = await self.api(
                self.session.core.create_namespaced_pod, self.namespace, manifest, _preload_content=False
            )
            self.watcher.seen(raw_json(resp))
        except Exception as exc:
            if _status_of(exc) != 409:
                raise
            # 409: a pod of this attempt was created before a restart; adopt it.
            resp = await self.api(self.session.core.read_namespaced_pod, name, self.namespace, _preload_content=False)
            self.watcher.seen(raw_json(resp))
        return name

    async def delete_pods(self) -> None:
        """Delete the run's ended pods once its result is recorded (their GPU time is in the ledger): a finished
        campaign leaves no pod behind, and the pod caches stay small."""
        for pod in self.watcher.of_run(self.name):
            if (pod.get("status") or {}).get("phase") in _TERMINAL:
                await self.delete_pod(pod["metadata"]["name"])

    async def delete_pod(self, name: str) -> None:
        try:
            await self.api(self.session.core.delete_namespaced_pod, name, self.namespace, _preload_content=False)
        except Exception as exc:
            if _status_of(exc) != 404:
                raise

    async def release_claim(self) -> None:
        """Delete the run's own claim once its result is recorded (`runs.workspace.keepFinished: false`): only in
        claim-per-run mode, only the claim the operator made for this Run (owned by it; the DELETE is conditional on
        the claim's uid), and only once every pod of the run has ended (its grading pod, whose report the result
        is). The workspace, transcript and checkpoints go with it; the result stays in the Run's status."""
        if not self.backend.runs.workspace.claim_per_run:
            return
        await self.watcher.synced.wait()
        if live := [p["metadata"]["name"] for p in self.watcher.of_run(self.name) if not _ended(p)]:
            log.warning("run %s: claim kept: pod(s) %s of the run still running", self.name, ", ".join(live))
            return
        name = pvc_name(self.name)
        try:
            resp = await self.api(
                self.session.core.read_namespaced_persistent_volume_claim, name, self.namespace, _preload_content=False
            )
            claim = raw_json(resp)
            run_uid = (self.owner.get("metadata") or {}).get("uid")
            owners = claim["metadata"].get("ownerReferences") or []
            if not any(o.get("kind") == "Run" and o.get("uid") == run_uid for o in owners):
                log.warning("run %s: claim %s is not the one the operator made for this Run; kept", self.name, name)
                return
            await self.api(
                self.session.core.delete_namespaced_persistent_volume_claim,
                name,
                self.namespace,
                body={"preconditions": {"uid": claim["metadata"]["uid"]}},
                _preload_content=False,
            )
        except Exception as exc:
            if _status_of(exc) != 404:  # gone already is the aim
                log.warning("run %s: deleting its claim %s: %s", self.name, name, str(exc).splitlines()[0][:200])

    async def ensure_claim(self) -> None:
        pvc = build_pvc_manifest(self.resource, self.backend.runs, owner=self.owner)
        if pvc is None:
            return
        try:
            await self.api(
                self.session.core.create_namespaced_persistent_volume_claim,
                self.namespace,
                pvc,
                _preload_content=False,
            )
        except Exception as exc:
            if _status_of(exc) != 409:
                raise

    # -- the store (shared runs volume) ------------------------------------------------------

    def store_status(self) -> StoreStatus | None:
        return read_model(self.rd.status_json, StoreStatus) if self.backend.shared else None

    def recorded_result(self) -> RunResult | None:
        """The run's result when its Run status is final (the API is the record; a file on the runs volume is
        not: in shared-claim mode the agent could have written it). The copy on disk is used when it is the
        one the status records (the same `finished_at`: it holds the score curve), else the status's report."""
        if not self.status.phase.final:
            return None
        reported = result_from_status(self.status, self.spec.run_id)
        cached = read_model(self.rd.result_json, RunResult)
        mine = cached is not None and cached.final and cached.run_id == self.spec.run_id
        if cached is not None and mine and (reported is None or cached.finished_at == reported.finished_at):
            return cached
        if reported is not None:
            return reported
        return RunResult(  # recorded by an operator that kept no report in the status
            run_id=self.spec.run_id,
            task=self.spec.task,
            model=self.spec.model,
            agent=self.spec.agent,
            seed=self.spec.seed,
            status=self.status.phase,
            stop_reason=self.status.stop_reason,
            outcome=self.status.outcome,
            score=self.status.score,
            error="only the Run's status is known of this result (recorded by an earlier operator version)",
        )

    def graded(self, end: PodEnd) -> RunResult | None:
        """The result of a grading pod that ended (its termination message, which only the grading pod the
        operator started can write), recorded in the operator's run directory. With a shared volume the grading
        pod's own `result.json`, which it wrote after every agent process of the run was gone, is taken when it
        is the one reported."""
        if end.pod is None:
            return None
        result = graded_result(end.pod, self.spec.run_id)
        if result is None:
            return None
        if self.backend.shared:
            full = read_model(self.rd.result_json, RunResult)
            if full is not None and full.final and full.run_id == result.run_id:
                return full if full.finished_at == result.finished_at else result
            return result
        write_model(self.rd.result_json, result)
        return result

    def track(self, pod: Mapping[str, Any] | None) -> None:
        """Record the pod's GPU time in the ledger and the status (`podTimes`: the ledger's record)."""
        if pod is not None:
            name = pod["metadata"]["name"]
            seen = pod_time(pod)
            if seen is not None and self.ledger.pods.get(name) != seen:
                self.ledger.pods[name] = seen
                write_model(self.ledger_file, self.ledger)
        self.status.gpu_hours = round(self.ledger.gpu_hours(), 6)
        self.status.pod_times = self.ledger.to_status()

    def note(self, message: str) -> None:
        """Put `message` into status.json while no agent writes it (the pod has not started)."""
        if message == self.last_message:
            return
        self.last_message = message
        current = read_model(self.rd.status_json, StoreStatus)
        if current is not None and current.phase.final:
            return
        base = current or StoreStatus(run_id=self.spec.run_id, phase=RunPhase.starting)
        write_model(self.rd.status_json, base.model_copy(update={"message": message, "updated_at": utcnow()}))

    # -- status ---------------------------------------------------------------------------------

    def condition(self, type_: str, ok: bool, reason: str, message: str = "") -> None:
        self.status.conditions = set_condition(
            self.status.conditions, type_, ok, reason, message, observed_generation=self.generation
        )

    def refresh(self, pod: dict[str, Any] | None) -> None:
        store = self.store_status()
        self.status.phase = live_phase(pod, store)
        if pod is not None and is_grading_pod(pod) and self.status.phase is RunPhase.running:
            self.status.phase = RunPhase.grading
        if store is not None:
            self.status.score = store.score
            self.status.tokens = store.spend.usage.total
            self.status.cost_usd = rounded_usd(store.spend.cost_usd)
        self.track(pod)
        if pod is not None:
            for type_, ok, reason, message in pod_conditions(pod):
                self.condition(type_, ok, reason, message)
            if (pod.get("status") or {}).get("phase") == "Pending":
                self.note(problem_message(self.status.conditions))

    async def finish(self, result: RunResult) -> RunResult:
        """Record `result` in the Run's status, then (once the API has it) delete the run's ended pods: a new
        leader learns the result from the status, or from the grading pod that is still there."""
        for pod in self.watcher.of_run(self.name):
            self.track(pod)
        self.status.phase = result.status
        self.status.score = result.score
        self.status.tokens = result.spend.usage.total
        self.status.cost_usd = rounded_usd(result.spend.cost_usd)
        self.track(None)
        self.status.stop_reason = result.stop_reason
        self.status.outcome = result.outcome
        if result.is_error and result.outcome is not None:  # what `kubectl describe` and `labkube run` show
            last = (result.error or "").strip().splitlines()[-1:] or [result.outcome.value]
            self.condition("Measured", False, result.outcome.value, last[0][-300:])
        self.status.report = report_of(result)
        await self.publish()
        recorded = self.published == self._status_body()
        if self.backend.delete_finished_pods and recorded:
            await self.delete_pods()
        if recorded and not self.backend.runs.workspace.keep_finished:
            await self.release_claim()
        return result

    async def fail(self, message: str) -> RunResult:
        from labkube.operator.supervisor import _harness_failure

        return await self.finish(_harness_failure(self.rd, message))

    # -- pods -----------------------------------------------------------------------------------

    def resume_for(self, attempt: int) -> bool:
        ws = self.backend.runs.workspace
        if self.backend.shared:
            return self.rd.checkpoint_json.exists()
        return ws.mode == "pvc" and attempt > 0  # a claim per run keeps the checkpoint; emptyDir does not

    def manifest(self, attempt: int, finalize: StopReason | None) -> dict[str, Any]:
        pod = build_pod_manifest(
            self.resource,
            self.backend.runs,
            owner=self.owner,
            attempt=attempt,
            resume=self.resume_for(attempt),
            spent_wall_seconds=self.ledger.seconds(),  # the API's pod times, not the run's own account
        )
        if finalize is not None:
            pod = grading_manifest(
                pod, finalize, self.backend.runs.deadline_grace_seconds, world_verdict=self.status.world_verdict
            )
        return pod

    async def start_pod(self, attempt: int, finalize: StopReason | None) -> str:
        if time.monotonic() - self.read_at > 1.0:  # never start a pod for a Run that is being deleted
            run = await self.read_run()
            if run is None or (run.get("metadata") or {}).get("deletionTimestamp"):
                raise RunGone(self.name)
        await self.ensure_claim()
        name = await self.create_pod(self.manifest(attempt, finalize))
        if finalize is None:  # a grading pod is no attempt of the agent's
            self.status.attempts = attempt + 1
        self.status.pod_name = name
        self.status.phase = RunPhase.starting
        await self.publish(name)
        return name

    async def follow(self, name: str) -> PodEnd:
        """Until pod `name` ends; status is published on every change and every `poll_seconds`."""
        stuck_since: float | None = None
        while True:
            seen = self.watcher.version(name)
            pod = self.watcher.get(name)
            if pod is None:
                # Not in the cache of a synced watch: gone (a pod we just created is put there at once).
                gone = self.watcher.deleted.pop(name, None)
                if gone is None:
                    return PodEnd(None)
                if not gone.observed and (gone.last.get("status") or {}).get("phase") in _TERMINAL:
                    return PodEnd(gone.last)  # it ended, then went while the watch was down: as if seen ending
                return PodEnd(None, last=gone.last, unobserved=not gone.observed)
            if (pod.get("status") or {}).get("phase") in _TERMINAL:
                return PodEnd(pod)
            await self.publish(name)
            pod = self.watcher.get(name) or pod
            stuck = stuck_condition(pod)
            if stuck is None:
                stuck_since = None
            else:
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since > self.backend.image_pull_timeout_s:
                    await self.delete_pod(name)
                    return PodEnd(pod, gave_up=stuck[3])
            await self.watcher.wait(name, self.backend.poll_seconds, since=seen)

    def outcome(self, end: PodEnd) -> tuple[Outcome, str]:
        pod = end.pod
        if pod is None:
            disrupted = disruption_of(end.last)
            if disrupted is not None:
                return "disrupted", f"pod {self.status.pod_name} was deleted by the cluster ({disrupted})"
            if unseen_deletion(end):
                last = ((end.last or {}).get("status") or {}).get("phase") or "unknown"
                return "disrupted", (
                    f"pod {self.status.pod_name} was deleted while the pod watch was down (last seen {last}, "
                    "not being deleted): counted as the cluster's doing, not a crash (an agent cannot delete its pod)"
                )
            return "lost", f"pod {self.status.pod_name} disappeared (deleted)"
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        reason = status.get("reason") or ""
        code = pod_exit_code(pod)
        if reason == "DeadlineExceeded":
            return "deadline", f"pod {name} passed its activeDeadlineSeconds"
        if code == DISK_FULL_EXIT:
            return "disk_full", f"pod {name}: disk full on the runs volume"
        disrupted = disruption_of(pod)
        if disrupted is not None:
            detail = status.get("message") or ""
            return "disrupted", f"pod {name} was taken away ({disrupted}{': ' + detail if detail else ''})"
        if reason:
            detail = status.get("message") or ""
            return "lost", f"pod {name} {reason.lower()}{': ' + detail if detail else ''}"
        if code is None and (failed := failed_init_container(pod)):
            kind: Outcome = "world" if failed.startswith("container world:") else "lost"
            return kind, f"pod {name} failed before the agent started: {failed}"
        return "lost", f"pod {name} ended ({status.get('phase')}, exit code {code}) without a result"

    # -- the whole run --------------------------------------------------------------------------

    async def run(self) -> RunResult:
        run = await self.read_run()
        if run is None:
            return self.detached("its Run resource does not exist")
        self.owner = run
        self.generation = (run.get("metadata") or {}).get("generation")
        self.status = RunStatus.model_validate(run.get("status") or {})
        root = self.rd.root.parent.parent
        self.ledger = restore_ledger(root, self.spec.run_id, self.spec.gpus, self.status)
        self.published = None
        done = self.recorded_result()
        if done is not None:
            return await self.finish(done)

        await self.watcher.synced.wait()
        pods = sorted(self.watcher.of_run(self.name), key=pod_attempt)
        current = pods[-1]["metadata"]["name"] if pods else None
        grading: StopReason | None = None  # set: the current (or next) pod grades the stopped run
        if pods and is_grading_pod(pods[-1]):
            grading = StopReason(pods[-1]["metadata"]["labels"][LABEL_FINALIZE])
        next_attempt = max(self.status.attempts, pod_attempt(pods[-1]) + 1 if pods else 0)
        if current is not None:
            self.status.pod_name = current
            if grading is None:
                self.status.attempts = next_attempt
        limit, disruptions = self.backend.max_attempts, self.backend.max_disruptions
        while True:
            if current is None:
                if grading is None and (self.status.crashes >= limit or self.status.disruptions > disruptions):
                    grading = StopReason.killed
                current = await self.start_pod(next_attempt, grading)
                next_attempt += 1
            end = await self.follow(current)
            self.track(end.pod)
            verdict = world_verdict_of(end.pod or end.last) if grading is None else None
            if verdict is not None and verdict != self.status.world_verdict:
                self.status.world_verdict = verdict  # recorded before a grading pod is given it
                await self.publish()
            if end.gave_up is not None:
                return await self.fail(end.gave_up)
            kind, why = self.outcome(end)
            if grading is not None:  # the pod that ended graded the run: its report is the result
                done = self.graded(end)
                if done is not None:
                    return await self.finish(done)
                if kind == "disrupted" and self.status.disruptions < disruptions:
                    self.status.disruptions += 1
                    self.condition("Resumed", True, _reason_of(end), f"{why}; grading the run again")
                    current = None
                    continue
                return await self.fail(f"{why}; grading the stopped run did not produce a result (see logs/)")
            if kind == "disk_full":
                from labkube.operator.supervisor import last_error_line

                return await self.fail(last_error_line(self.rd) or why)
            ended = agent_ended_reason(pod_exit_code(end.pod)) if end.pod is not None and kind == "lost" else None
            if ended is not None and not (end.pod or {}).get("status", {}).get("reason"):
                # The agent's loop ended (exit 0 or 1). What its pod says about the result is its own word: the
                # run is graded in a pod of its own.
                grading = ended
                current = None
                continue
            how = "resuming from the checkpoint" if self.resume_for(next_attempt) else "starting over"
            if kind == "deadline":
                grading = StopReason.time
                self.condition("Resumed", False, "DeadlineExceeded", f"{why}; grading the run as it stands")
            elif kind == "disrupted":
                # Evictions, preemptions and reclaimed nodes are not the run's fault: they do not use up crash
                # attempts; a larger cap of their own (and the time budget) bounds them.
                self.status.disruptions += 1
                if self.status.disruptions > disruptions:
                    grading = StopReason.killed
                    self.condition(
                        "Resumed", False, "DisruptionsExhausted", f"{why}; {disruptions} disruptions, grading the run"
                    )
                else:
                    self.condition(
                        "Resumed",
                        True,
                        _reason_of(end),
                        f"{why}; {how} (disruption {self.status.disruptions} of at most {disruptions}; "
                        f"crashes {self.status.crashes} of {limit})",
                    )
            else:
                self.status.crashes += 1
                if self.status.crashes >= limit:
                    # a Gaia2 world that never came up is the world's failure, not a run killed from outside
                    grading = StopReason.world_error if kind == "world" else StopReason.killed
                    self.condition(
                        "Resumed", False, "AttemptsExhausted", f"{why}; {limit} pods failed, grading the run"
                    )
                else:
                    self.condition(
                        "Resumed", True, _reason_of(end), f"{why}; {how} (attempt {self.status.crashes + 1} of {limit})"
                    )
            current = None

    def detached(self, why: str) -> RunResult:
        """A run this supervisor cannot drive (its Run is gone): not final, so nothing is recorded."""
        return RunResult(
            run_id=self.spec.run_id,
            task=self.spec.task,
            model=self.spec.model,
            agent=self.spec.agent,
            seed=self.spec.seed,
            status=RunPhase.pending,
            error=f"run {self.name}: {why}",
        )


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in _TERMINAL


def unseen_deletion(end: PodEnd) -> bool:
    """A pod deleted while the watch was down whose last seen state was not already being deleted. Its final state
    (a `DisruptionTarget` condition, say) was never seen; nothing of the run's can delete a pod (run pods hold no
    service-account token), so it was the cluster (a preemption, an eviction, a node drained) or a person. It counts
    as a disruption: the run resumes without using up a crash attempt. A pod last seen being deleted without a
    disruption condition was deleted by hand, as a watched deletion without one is."""
    if not end.unobserved or end.pod is not None:
        return False
    return not ((end.last or {}).get("metadata") or {}).get("deletionTimestamp")


def _reason_of(end: PodEnd) -> str:
    if (disrupted := disruption_of(end.pod if end.pod is not None else end.last)) is not None:
        return disrupted
    if unseen_deletion(end):
        return "DeletedWhileUnwatched"
    if end.pod is None:
        return "PodDeleted"
    reason = (end.pod.get("status") or {}).get("reason")
    return str(reason) if reason else "PodFailed"


async def supervise_pod(run_dir: str, backend: Mapping[str, Any] | K8sBackend) -> RunResult:
    """Drive one run to a final state with pods (see the module docstring)."""
    cfg = backend if isinstance(backend, K8sBackend) else K8sBackend.model_validate(backend)
    try:
        run = PodRun(session_for(cfg.kube), cfg, RunDir(run_dir))
    except NotAdmitted as exc:
        from labkube.operator.supervisor import _harness_failure

        return _harness_failure(RunDir(run_dir), str(exc))
    try:
        return await run.run()
    except RunGone:
        return run.detached("its Run resource was deleted")
    except Exception as exc:  # the API down past the run's own deadline, or a bug: this run fails, not its campaign
        log.exception("run %s: supervision failed", run.name)
        why = f"supervising its pod failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
        try:
            return await run.fail(why)
        except RunGone:
            return run.detached("its Run resource was deleted")
