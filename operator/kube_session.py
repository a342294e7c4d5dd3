"""The API as the run supervisors of one process share it: one `KubeSession` per API target and event loop, and
one `PodWatcher` per campaign.

A Ray worker process holds the supervisors of many runs. They share the session's thread pool for the blocking
`kubernetes` client, taking turns (`Turns`: at most `API_CALLS` calls at once, Run status patches before pod
creations), and they read their pods from one list+watch per campaign instead of each polling the API server
(benchmarks/operator_scale.py drives thousands of Runs through it). Every call is retried the same way
(`kube.retrying`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from labkube.operator.crds import GROUP, LABEL_CAMPAIGN, VERSION
from labkube.operator.kube import (
    KubeTarget,
    answered,
    api_client,
    list_pages,
    parse_time,
    raw_json,
    retrying,
    short_error,
)
from labkube.operator.pod_manifest import LABEL_COMPONENT, LABEL_RUN

__all__ = [
    "API_CALLS",
    "OTHER_CALLS",
    "RUN_SELECTOR",
    "STATUS_FIRST",
    "DeletedPod",
    "KubeSession",
    "PodWatcher",
    "RunWatcher",
    "Turns",
    "session_for",
    "slim_pod",
]

log = logging.getLogger("labkube.operator.k8s")

RUN_SELECTOR = f"app.kubernetes.io/managed-by=labkube-operator,{LABEL_COMPONENT}=run"
NODE_READ_EVERY_S = 10.0  # how old a Node read may be before a supervisor's check reads it again

T = TypeVar("T")


@dataclass(frozen=True)
class DeletedPod:
    last: dict[str, Any]  # the DELETED event's object, or what was last seen of a pod a re-list no longer had
    observed: bool  # False: deleted while the watch was down, so its final state was never seen


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
        self.selector = self.selector_for(campaign)
        self.namespace = namespace
        self.loop = loop
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: dict[str, DeletedPod] = {}  # pod name -> how it went, for pods deleted since
        self.synced = asyncio.Event()
        self._seen_at: dict[str, float] = {}  # pods `seen` in an API answer, and when: a re-list older keeps them
        self._bells: dict[str, asyncio.Event] = {}
        self._versions: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"labkube-{self.plural}-{namespace}", daemon=True)
        self._thread.start()

    plural = "pods"

    @staticmethod
    def selector_for(campaign: str | None) -> str:
        return RUN_SELECTOR + (f",{LABEL_CAMPAIGN}={campaign}" if campaign else "")

    @staticmethod
    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        return slim_pod(obj)

    def list_call(self, **kwargs: Any) -> Any:
        return self.session.core.list_namespaced_pod(self.namespace, **kwargs)

    def get(self, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)

    def of_run(self, run: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN) == run]

    def seen(self, pod: dict[str, Any]) -> None:
        """Record a pod the API just returned (it reaches the watch soon; do not wait for it)."""
        name = pod["metadata"]["name"]
        if name not in self.pods:
            self.pods[name] = self.slim(pod)
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
            self.pods = {p["metadata"]["name"]: self.slim(p) for p in items}
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
        obj = self.slim(payload)
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

        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listed_at = time.monotonic()
                    listing = list_pages(self.list_call, label_selector=self.selector, _request_timeout=30)
                    rv = str(listing["metadata"]["resourceVersion"])
                    self._post("reset", (listing.get("items") or [], listed_at))
                resp: Any = self.list_call(
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
                log.warning("%s watch in %s: %s %s; retrying", self.plural, self.namespace, exc.status, exc.reason)
                self._stop.wait(1.0)
            except Exception as exc:  # connection errors: the API server restarts, the network blips
                if self._stop.is_set():
                    return
                log.warning("%s watch in %s: %s; retrying", self.plural, self.namespace, short_error(exc))
                self._stop.wait(1.0)


class RunWatcher(PodWatcher):
    """One list+watch of the Runs of one campaign, shared by its supervisors in this process as `PodWatcher` is: what
    a supervisor reads of its Run while the run goes on (`spec.interventions`: a pause, a cancel, an extend), without
    a GET per run and poll. The cache keeps each Run's metadata, interventions and phase, nothing else."""

    plural = "runs"

    @staticmethod
    def selector_for(campaign: str | None) -> str:
        return f"{LABEL_CAMPAIGN}={campaign}" if campaign else LABEL_CAMPAIGN

    @staticmethod
    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
        return {
            "metadata": meta,
            "spec": {"interventions": (obj.get("spec") or {}).get("interventions") or []},
            "status": {"phase": (obj.get("status") or {}).get("phase")},
        }

    def list_call(self, **kwargs: Any) -> Any:
        return self.session.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "runs", **kwargs)


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
        # node name -> (monotonic time read, the Node object; None: it does not exist): one read per node per
        # `NODE_READ_EVERY_S` for every run of this process (`node`)
        self.node_reads: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self.node_reads_failed = False  # said once in the log (no RBAC to read nodes: pods are never judged lost)
        self.node_heartbeats: dict[str, datetime] = {}  # each node's last `Ready` heartbeat read, kept once it is gone

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

    async def node(self, name: str, fresh: bool = False) -> dict[str, Any] | None:
        """The Node `name` as the API last answered (read again when older than `NODE_READ_EVERY_S`, or `fresh`);
        None: it does not exist. An error other than 404 (no RBAC, an API outage) raises: its state is unknown."""
        now = time.monotonic()
        cached = self.node_reads.get(name)
        if cached is not None and now - cached[0] < NODE_READ_EVERY_S and not fresh:
            return cached[1]
        try:
            resp = await self.call(
                self.core.read_node, name, _preload_content=False, _request_timeout=30, patience_s=30.0
            )
            node: dict[str, Any] | None = raw_json(resp)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                if not self.node_reads_failed:
                    self.node_reads_failed = True
                    log.warning("nodes cannot be read (%s): a dead node's pods are noticed only once deleted",
                                short_error(exc))  # fmt: skip
                raise
            node = None
        self.node_reads[name] = (time.monotonic(), node)
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        if (heartbeat := parse_time(ready.get("lastHeartbeatTime"))) is not None:
            self.node_heartbeats[name] = heartbeat
        return node

    def pods(self, namespace: str, campaign: str | None = None) -> PodWatcher:
        key = f"{namespace}/{campaign or ''}"
        if key not in self.watchers:
            self.watchers[key] = PodWatcher(self, namespace, self.loop, campaign)
        return self.watchers[key]

    def runs(self, namespace: str, campaign: str) -> RunWatcher:
        key = f"runs:{namespace}/{campaign}"
        if key not in self.watchers:
            self.watchers[key] = RunWatcher(self, namespace, self.loop, campaign)
        return self.watchers[key]  # type: ignore[return-value]


_SESSIONS: dict[tuple[str, int], KubeSession] = {}


def session_for(target: KubeTarget) -> KubeSession:
    """This process's session for `target` on the running loop (created on first use)."""
    loop = asyncio.get_running_loop()
    key = (target.model_dump_json(), id(loop))
    if key not in _SESSIONS:
        _SESSIONS[key] = KubeSession(target, loop)
    return _SESSIONS[key]
