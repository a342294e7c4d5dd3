"""A fake kubelet (and scheduler) for one node: it runs the pods the operator creates in `FakeKube`.

- Scheduling: a pod needing more GPUs than are free stays `Pending` with `PodScheduled=False`,
  reason `Unschedulable` and the scheduler's message; it is placed when GPUs free up. Pods with
  `schedulingGates` wait with reason `SchedulingGated`.
- Images: a container whose image is in `unpullable` waits with `ErrImagePull`, then
  `ImagePullBackOff`, and the pod stays `Pending`. A container without a `command` runs its image's
  entrypoint from `entrypoints` (image -> argv; `args` are appended); an unknown one fails to start.
- Containers: init containers in order, then the pod's one container (`agent`, or a grading pod's
  `grade`), run as local processes. The
  pod's volumes become local directories: a `persistentVolumeClaim` is `claims[claimName]` (the
  "shared volume"), an `emptyDir` a fresh directory; each mount's `subPath` is honoured, and paths
  under a mount point in the command, environment and working directory are rewritten.
  A `configMap` volume holds the ConfigMap's keys as files, and a change to the ConfigMap reaches the running pods'
  volumes at once (the real kubelet's sync takes up to a minute); a missing one fails the pod unless `optional`.
  `labkube ...` runs as `python -P -m labkube ...` of this interpreter; `python ...` (a command's or
  an exec probe's first word) is the ARE environment's python (`labkube.tasks.gaia2.world_python()`),
  the world image's. Secrets come from the API. A container's processes (its process group) are
  killed when it ends.
- Native sidecars (init containers with `restartPolicy: Always`, e.g. the Gaia2 `world`): started in
  their place among the init containers and left running; the next container starts once the
  sidecar's exec `startupProbe` succeeds (`initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`,
  `failureThreshold` honoured; no probe: at once). While it starts, `initContainerStatuses` shows it
  running with `started: false`. A sidecar whose probe fails `failureThreshold` times, or that exits
  before, is killed and fails the pod like a failed init container (real Kubernetes would restart it
  in `CrashLoopBackOff` and leave the pod `Pending`). A sidecar that exits once started (any exit code) is
  restarted while the pod runs, as the real kubelet restarts a container whose `restartPolicy` is `Always`: its
  status waits in `CrashLoopBackOff` for a back-off (`restart_backoff_s`, doubling up to `max_restart_backoff_s`;
  the real one is 10 s doubling to 300 s), then runs again with `restartCount` one higher, `lastState.terminated`
  holding the exit code, times and termination message of the run before, and `started: false` until its startup
  probe passes again (one that fails is killed and restarted once more); its termination-message file starts empty.
  Sidecars get SIGTERM (then SIGKILL after `grace_s`) once the agent has exited, and the pod ends only
  then (no more restarts); deleting, evicting or deadlining the pod, and leaving the kubelet, kill them too.
- Ports: every pod has its own network; here they share one. So the agents' metrics servers get
  `LABKUBE_METRICS_PORT=0`, and each sidecar's port a free local port: a world's `LABKUBE_WORLD_PORT`, a
  gateway's `--port` argument (and any command or probe argument equal to the old port) is replaced, and the
  agent's `LABKUBE_WORLD_URL` and `LABKUBE_GATEWAY_URL` are rewritten to the new port.
- Termination messages: a container's (a sidecar's too) `terminationMessagePath` is a file of its own (an environment
  value naming that path is rewritten to it); after the container ends, its first 4096 bytes become
  `state.terminated.message`, or, with `terminationMessagePolicy: FallbackToLogsOnError` and an empty
  file after a failure, the last 80 lines (at most 2048 bytes) of its log, as the real kubelet does.
- Claims are namespaced: `claims[(namespace, name)]` first, then `claims[name]` (one claim name in
  every namespace standing for the same volume only when a test says so); a claim the API holds and
  the test did not name (the operator's claim per run) is provisioned as a directory of its own, kept
  across the run's pods.
- Phases: `Pending` -> `Running` -> `Succeeded`/`Failed` from the agent's exit code (an init
  container that fails: `Failed`, with a pod `message` naming it, which real Kubernetes leaves to the
  container's status; the agent then stays `waiting`); `activeDeadlineSeconds` (from
  `startTime`, init containers included) ends the pod `Failed`/`DeadlineExceeded`; `evict()`
  terminates it `Failed`/`Evicted` with `DisruptionTarget=True` (reason `TerminationByKubelet`), as a
  node-pressure eviction; `preempt()` adds `DisruptionTarget=True` (e.g. `PreemptionByScheduler`) and deletes
  it; deleting the pod kills its processes.

Local storage (the kubelet's `localStorageEviction`, pkg/kubelet/eviction/eviction_manager.go; docs: "Local
ephemeral storage" under "Resource Management for Pods and Containers"): every `storage_poll_s` (0.5 s; None: never)
the kubelet measures each running pod as `du` does (allocated blocks, a hard link once): its emptyDir volumes that are
not `medium: Memory` (directories here), its container logs and termination-message files; what is written to a
claim is not the pod's. In the real kubelet's order, a pod is evicted when an emptyDir passes its `sizeLimit`
(message `Usage of EmptyDir volume "tmp" exceeds the limit "1Gi". `), when the total passes the sum of its
containers' `ephemeral-storage` limits (sidecars' included, plain init containers' as a maximum, the pod's limit as
`resource.PodLimits` computes it: `Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. `),
or when a container's logs pass its own limit (`Container agent exceeded its local ephemeral storage limit "10Gi".
`; here there is no writable layer to add). Such an eviction, as the real one, is `Failed`/`Evicted` with that
message and no `DisruptionTarget` condition (only node-pressure evictions carry one), and gives the containers 1 s
of grace (`immediateEvictionGracePeriodSeconds`). Paths an agent's commands name are not rewritten: its `HOME`
(the `tmp` emptyDir at `/tmp` in a run pod) is where it writes to fill it.

Isolation (`isolate=True`, opt-in): as above, every process runs as root on this machine's file system
and network, so a pod can read any path (another pod's volume included) and reach every local port;
that shows what a pod does, not that a run is confined. With `isolate`, each container instead runs
through `container.start_container` (its module docstring says what that models): a scratch root with
only the host's system, Python, venv and checkout read-only, plus `image_dirs` (standing in for what an
image would hold: e.g. the tests' tasks, which a run's `run.json` names by their path), read-only at
their own paths; the pod's user, groups, capabilities and read-only root; its own mount, PID, UTS, IPC
and network namespaces (only loopback up: nothing of this machine or beyond is reachable, as under a
default-deny NetworkPolicy); and only its volume mounts, at their real paths (claims as above, emptyDirs
as directories under the pod's root, memory emptyDirs as private tmpfs; volumes chowned to the pod's
runAsUser/fsGroup). No path is rewritten. Secrets are resolved from the API into plain values,
`LABKUBE_METRICS_PORT` is still 0, `labkube` is the venv's script and `python` the venv's python (the
image's PATH). The termination message file is bound at `terminationMessagePath` and read as above.
Eviction, deadlines, deletion and the kubelet's exit terminate a container's PID 1 (SIGTERM, SIGKILL
after the grace period; the kernel then kills the rest of its PID namespace). Native sidecars are
refused (the pod fails with a `StartError` naming the container): a pod's containers would need one
shared network namespace, and exec probes would have to run inside the sidecar's namespaces.

`simulate` replaces the agent process (the benchmark): an async function of the pod, its local
run directory and its container's termination-message file that returns the exit code. Then no
process runs at all: init containers succeed and sidecars start at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from container import ContainerError, ContainerProcess, start_container
from fakekube import FakeKube, ResKey, now_rfc3339

PODS: ResKey = ("", "v1", "pods")
CONFIG_MAPS: ResKey = ("", "v1", "configmaps")
NODES: ResKey = ("", "v1", "nodes")
NODE_NAME = "fake-node"
Simulate = Callable[[dict[str, Any], Path | None, Path], Awaitable[int]]  # (pod, run dir, termination file)
WORLD_PORT_ENV = "LABKUBE_WORLD_PORT"
WORLD_URL_ENV = "LABKUBE_WORLD_URL"
GATEWAY_URL_ENV = "LABKUBE_GATEWAY_URL"
SIDECAR_URL_ENVS = (WORLD_URL_ENV, GATEWAY_URL_ENV)  # the agent's addresses of its sidecars
_ENDED: weakref.WeakSet[asyncio.subprocess.Process] = weakref.WeakSet()  # process groups already killed
Proc = asyncio.subprocess.Process | ContainerProcess  # a container's main process: plain, or isolated


class StartError(Exception):
    """A container that cannot be started (no command, no such interpreter)."""


def _write_config_map(folder: Path, cm: dict[str, Any] | None) -> None:
    """The ConfigMap's keys into a pod's volume as the kubelet's atomic writer lays them out, not as plain files (a
    fake that wrote plain files let a reader that refuses links pass here and read nothing on a real node): the
    data in a timestamped folder `..<time>`, `..data` a link to it (swapped by a rename at each update), and each key
    a link to `..data/<key>`."""
    folder.mkdir(parents=True, exist_ok=True)
    data = (cm or {}).get("data") or {}
    version = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir()
    for key, value in data.items():
        (version / key).write_text(value, encoding="utf-8")
        (version / key).chmod(0o644)
    old = os.readlink(folder / "..data") if (folder / "..data").is_symlink() else None
    temp = folder / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    temp.symlink_to(version.name)
    os.replace(temp, folder / "..data")
    for key in data:
        if not (folder / key).is_symlink():
            (folder / key).symlink_to(f"..data/{key}")
    if old is not None:
        shutil.rmtree(folder / old, ignore_errors=True)


@dataclass
class PodState:
    namespace: str
    name: str
    pod: dict[str, Any]
    gpus: int
    bound: bool = False
    task: asyncio.Task[None] | None = None
    proc: Proc | None = None  # the agent
    sidecars: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    ports: dict[str, str] = field(default_factory=dict)  # a sidecar's port in the pod -> its local port
    stop: asyncio.Future[tuple[str, str]] | None = None  # (reason, message) of an eviction
    deleted: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    root: Path | None = None  # emptyDirs and logs
    start_time: str = ""
    init_statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    agent_status: dict[str, Any] = field(default_factory=dict)
    disruption: dict[str, Any] | None = None  # the DisruptionTarget condition of a pod taken away
    stop_grace_s: float | None = None  # the grace of an eviction that gives less than the kubelet's own
    keepers: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # sidecar name -> its restarter
    stopping: bool = False  # its sidecars are being stopped: none is restarted


class FakeKubelet:
    def __init__(
        self,
        api: FakeKube,
        *,
        claims: Mapping[str | tuple[str, str], Path],
        gpus: int = 2,
        unpullable: frozenset[str] = frozenset(),
        entrypoints: Mapping[str, Sequence[str]] | None = None,
        gpu_resource: str = "nvidia.com/gpu",
        grace_s: float = 5.0,
        simulate: Simulate | None = None,
        work: Path | None = None,
        isolate: bool = False,
        image_dirs: Sequence[Path] = (),
        storage_poll_s: float | None = 0.5,
        restart_backoff_s: float = 0.2,
        max_restart_backoff_s: float = 5.0,
    ) -> None:
        self.api = api
        self.claims = claims
        self.gpus = gpus
        self.unpullable = unpullable
        self.entrypoints = {image: list(argv) for image, argv in (entrypoints or {}).items()}
        self.gpu_resource = gpu_resource
        self.grace_s = grace_s
        self.simulate = simulate
        self.work = work or Path(tempfile.mkdtemp(prefix="kubelet-"))
        self.isolate = isolate
        self.image_dirs = [Path(d) for d in image_dirs]
        self.storage_poll_s = storage_poll_s
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.pods: dict[tuple[str, str], PodState] = {}
        self.queue: list[tuple[str, str]] = []  # pods waiting to be scheduled, in arrival order
        self.started: list[str] = []  # pod names whose agent started (in order)
        self.sidecars_started: list[tuple[str, str, int]] = []  # (pod, container, process group) in order
        self.phase_changes: list[tuple[float, str, str]] = []  # (monotonic time, pod, phase)
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._loop_task: asyncio.Task[None] | None = None
        self._storage_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._gone: list[PodState] = []  # deleted pods, whose processes may still be ending
        self._ports: set[int] = set()  # local ports handed to sidecars of live pods
        self.node_name = NODE_NAME  # the node new pods are bound to (`lose_node` replaces it)
        self.dead_nodes: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeKubelet:
        self.api.listeners.append(self._hear)
        self._register(self.node_name)
        for pod in self.api.objects(PODS):
            self._events.put_nowait(("ADDED", pod))
        self._loop_task = asyncio.create_task(self._loop())
        if self.storage_poll_s is not None and self.simulate is None:
            self._storage_task = asyncio.create_task(self._watch_storage())
        return self

    def _register(self, node: str) -> None:
        """The node, as the real kubelet registers it (Ready, its GPUs allocatable)."""
        if self.api.read_object(NODES, "", node) is not None:
            return
        self.api.create_object(NODES, "", {"metadata": {"name": node}, "spec": {}})
        allocatable = {"cpu": "64", "memory": "512Gi", "pods": "10000", self.gpu_resource: str(self.gpus)}
        now = now_rfc3339()
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                 "lastTransitionTime": now}  # fmt: skip
        self.api.set_status(
            NODES, "", node, {"capacity": allocatable, "allocatable": allocatable, "conditions": [ready]}
        )

    async def lose_node(self) -> str:
        """The node dies (its machine is gone) and another takes its place; the dead node's name is returned.

        As on a cluster: its pods' processes end at once and nothing reports it (no kubelet: their status stays as
        last posted, "Running"); the node controller marks the Node `Ready=Unknown` (`NodeStatusUnknown`, the
        last heartbeat the kubelet posted) and taints it `unreachable`; a graceful DELETE of its pods leaves them
        Terminating for ever (`FakeKube.awaits_kubelet`), as PodGC removes them only once the node is gone
        (`remove_node`) or tainted out-of-service. The replacement node (the same GPUs, a new name) runs every pod
        created from now on. Here the node controller acts at once; the real one waits `node-monitor-grace-period`
        (40 s) first."""
        dead = self.node_name
        self.dead_nodes.add(dead)
        self.api.awaits_kubelet = lambda pod: (pod.get("spec") or {}).get("nodeName") in self.dead_nodes
        heartbeat = now_rfc3339()
        for key, state in list(self.pods.items()):
            if (state.pod.get("spec") or {}).get("nodeName", dead) != dead or key in self.queue:
                continue
            del self.pods[key]
            state.deleted = True  # nothing of it is posted again
            self._gone.append(state)
            if state.task is not None:
                state.task.cancel()
            await self._kill(state, grace_s=0)
        node = self.api.read_object(NODES, "", dead) or {}
        status = dict(node.get("status") or {})
        status["conditions"] = [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": now_rfc3339(),
        }]  # fmt: skip
        self.api.set_status(NODES, "", dead, status)
        self.node_name = f"{NODE_NAME}-{len(self.dead_nodes) + 1}"
        self._register(self.node_name)
        self._schedule()
        return dead

    def remove_node(self, node: str) -> list[str]:
        """The dead Node object is deleted (by a person, or a cloud's node lifecycle), and PodGC force-deletes the
        pods bound to it, which vanish from the API while their last phase was "Running"; their names."""
        self.api.delete_object(NODES, "", node)
        gone = []
        for pod in self.api.objects(PODS):
            if (pod.get("spec") or {}).get("nodeName") == node:
                self.api.delete_object(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                gone.append(pod["metadata"]["name"])
        return gone

    async def __aexit__(self, *exc: object) -> None:
        self.api.listeners.remove(self._hear)
        for task in (self._loop_task, self._storage_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for state in [*self.pods.values(), *self._gone]:
            state.deleted = True
            await self._kill(state, grace_s=0.5)
            if state.task is not None:
                state.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await state.task
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        shutil.rmtree(self.work, ignore_errors=True)

    def _hear(self, type_: str, res: ResKey, obj: dict[str, Any]) -> None:
        if res == CONFIG_MAPS and type_ in ("ADDED", "MODIFIED"):
            self._project_config_map(obj)
        if res == PODS and type_ in ("ADDED", "DELETED"):
            self._events.put_nowait((type_, obj))
        elif res == PODS and type_ == "MODIFIED":  # a scheduling gate removed (Kueue admitting the pod)
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            state = self.pods.get(key)
            gates = (obj.get("spec") or {}).get("schedulingGates") or []
            if state is not None and key in self.queue and gates != (state.pod["spec"].get("schedulingGates") or []):
                # a new dict: the old one is also the event other listeners got
                state.pod = {**state.pod, "spec": {**state.pod["spec"], "schedulingGates": gates}}
                self._events.put_nowait(("RESCHEDULE", obj))

    async def _loop(self) -> None:
        while True:
            type_, pod = await self._events.get()
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            if type_ == "ADDED" and key not in self.pods:
                self.pods[key] = PodState(key[0], key[1], pod, _gpus(pod, self.gpu_resource))
                self.queue.append(key)
            elif type_ == "RESCHEDULE":
                pass  # _schedule below
            elif type_ == "DELETED" and key in self.pods:
                state = self.pods.pop(key)
                state.deleted = True
                self._gone.append(state)
                if key in self.queue:
                    self.queue.remove(key)
                if state.proc is None and state.task is not None:
                    state.task.cancel()  # waiting for an image, or still in its init containers
                killing = asyncio.create_task(self._kill(state))
                self._background.add(killing)
                killing.add_done_callback(self._background.discard)
            self._schedule()

    # -- scheduling ------------------------------------------------------------------------------

    def free_gpus(self) -> int:
        return self.gpus - sum(s.gpus for s in self.pods.values() if s.bound)

    def _schedule(self) -> None:
        for key in list(self.queue):
            state = self.pods[key]
            gates = state.pod["spec"].get("schedulingGates") or []
            if gates:
                self._pending(state, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
                continue
            if state.gpus > self.free_gpus():
                message = (
                    f"0/1 nodes are available: 1 Insufficient {self.gpu_resource}. "
                    "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
                )
                self._pending(state, "Unschedulable", message)
                continue
            self.queue.remove(key)
            state.bound = True
            state.pod = {**state.pod, "spec": {**state.pod["spec"], "nodeName": self.node_name}}
            self.api.bind_pod(state.namespace, state.name, self.node_name)
            state.task = asyncio.create_task(self._run(state))

    def _pending(self, state: PodState, reason: str, message: str) -> None:
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        if (state.status.get("conditions") or [{}])[0].get("reason") == reason:
            return
        self._set(state, {"phase": "Pending", "conditions": [{**condition, "lastTransitionTime": now_rfc3339()}]})

    def _set(self, state: PodState, status: dict[str, Any]) -> None:
        if state.deleted:
            return
        state.status = status
        if self.api.set_status(PODS, state.namespace, state.name, status) is not None:
            self.phase_changes.append((asyncio.get_running_loop().time(), state.name, status.get("phase", "")))

    def _publish(self, state: PodState, phase: str, reason: str = "", message: str = "") -> None:
        """The pod's status from its containers' statuses."""
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": state.start_time}],
            "startTime": state.start_time,
        }
        if state.disruption is not None:
            status["conditions"].append(state.disruption)
        if state.init_statuses:
            status["initContainerStatuses"] = [dict(s) for s in state.init_statuses.values()]
        status["containerStatuses"] = [dict(state.agent_status)]
        if reason:
            status["reason"] = reason
        if message:
            status["message"] = message
        self._set(state, status)

    # -- running ---------------------------------------------------------------------------------

    async def _run(self, state: PodState) -> None:
        try:
            await self._run_pod(state)
        finally:
            await self._kill(state, grace_s=0.5)  # a cancelled pod (deleted, or the kubelet stopping)
            for port in state.ports.values():
                self._ports.discard(int(port))
            if state.bound:
                state.bound = False
                self._schedule()

    async def _run_pod(self, state: PodState) -> None:
        pod = state.pod
        spec = pod["spec"]
        inits = spec.get("initContainers", [])
        agent = spec["containers"][0]  # the run's one container: `agent`, or a grading pod's `grade`
        state.start_time = now_rfc3339()  # activeDeadlineSeconds counts from here, init containers included
        state.init_statuses = {c["name"]: _container(c, {"waiting": {"reason": "PodInitializing"}}) for c in inits}
        state.agent_status = _container(agent, {"waiting": {"reason": "PodInitializing"}})
        self._publish(state, "Pending")
        bad = [c for c in [*inits, agent] if c.get("image") in self.unpullable]
        if bad:
            image = bad[0]["image"]
            for reason in ("ErrImagePull", "ImagePullBackOff"):
                message = (
                    f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
                    f'image "{image}": not found'
                    if reason == "ErrImagePull"
                    else f'Back-off pulling image "{image}"'
                )
                for c in bad:
                    waiting = _container(c, {"waiting": {"reason": reason, "message": message}})
                    if c is agent:
                        state.agent_status = waiting
                    else:
                        state.init_statuses[c["name"]] = waiting
                self._publish(state, "Pending")
                await asyncio.sleep(0.5)
            await asyncio.Event().wait()  # stays Pending until deleted
        state.root = self.work / f"{state.namespace}-{state.name}"
        state.root.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(state)
        state.ports = {port: str(self._free_port()) for port in _sidecar_ports(inits)}
        state.stop = asyncio.get_running_loop().create_future()
        work = asyncio.create_task(self._containers(state, inits, agent, mounts))
        try:
            done, _ = await asyncio.wait(
                {work, state.stop}, timeout=spec.get("activeDeadlineSeconds"), return_when=asyncio.FIRST_COMPLETED
            )
            if work in done:
                code, message = work.result()
                await self._stop_sidecars(state)
                if code is None:  # an init container failed
                    self._publish(state, "Failed", message=message)
                else:
                    self._publish(state, "Succeeded" if code == 0 else "Failed")
                return
            if state.stop.done():
                reason, message = state.stop.result()
            else:
                reason, message = "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
            if state.proc is None:  # still in its init containers
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
            else:
                await _terminate(state.proc, state.stop_grace_s or self.grace_s)
                await work  # the agent's exit code goes into its status
            await self._stop_sidecars(state, state.stop_grace_s)
            self._publish(state, "Failed", reason, message)
        finally:
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def _containers(
        self, state: PodState, inits: list[dict[str, Any]], agent: dict[str, Any], mounts: dict[str, Path]
    ) -> tuple[int | None, str]:
        """Init containers (sidecars started), then the agent: its exit code, or `None` and why the pod failed."""
        for c in inits:
            name = c["name"]
            try:
                if c.get("restartPolicy") == "Always":
                    problem = await self._start_sidecar(state, c, mounts)
                    if problem:
                        return None, f"init container {name} {problem}"
                    continue
                state.init_statuses[name] = _container(c, {"running": {"startedAt": now_rfc3339()}})
                self._publish(state, "Pending")
                code = await self._exec(state, c, mounts)
            except StartError as exc:
                state.init_statuses[name] = _terminated(c, 128, "StartError", str(exc))
                return None, f"init container {name} could not start: {exc}"
            state.init_statuses[name] = _terminated(c, code)
            if code != 0:
                return None, f"init container {name} failed (exit code {code})"
        state.agent_status = _container(agent, {"running": {"startedAt": now_rfc3339()}}, ready=True)
        self._publish(state, "Running")
        self.started.append(state.name)
        try:
            code = await self._exec(state, agent, mounts)
        except StartError as exc:
            state.agent_status = _terminated(agent, 128, "StartError", str(exc))
            return 128, ""
        state.agent_status = _terminated(agent, code, message=self.termination_message(state, agent, code))
        return code, ""

    async def _start_sidecar(self, state: PodState, c: dict[str, Any], mounts: dict[str, Path]) -> str:
        """Start sidecar `c` and wait for its startup probe: "" once started, else what went wrong."""
        name = c["name"]
        running = {"running": {"startedAt": now_rfc3339()}}
        proc = await self._spawn(state, c, mounts)
        if proc is None:  # simulated
            state.init_statuses[name] = {**_container(c, running, ready=True), "started": True}
            return ""
        state.sidecars[name] = proc
        self.sidecars_started.append((state.name, name, proc.pid))
        state.init_statuses[name] = {**_container(c, running), "started": False}
        self._publish(state, "Pending")
        problem = await self._startup_probe(state, c, mounts, proc)
        if problem:
            await _terminate(state.sidecars.pop(name), self.grace_s)
            state.init_statuses[name] = _terminated(c, _exit_code(proc), message=problem)
            return problem
        state.init_statuses[name] = {**_container(c, running, ready=True), "started": True}
        self._publish(state, "Pending")
        state.keepers[name] = asyncio.create_task(self._keep_sidecar(state, c, mounts, proc))
        return ""

    async def _keep_sidecar(
        self, state: PodState, c: dict[str, Any], mounts: dict[str, Path], proc: asyncio.subprocess.Process
    ) -> None:
        """Restart sidecar `c` each time it exits while the pod runs (the module docstring says how)."""
        name = c["name"]
        backoff = self.restart_backoff_s
        while True:
            await proc.wait()
            if state.stopping or state.deleted:
                return
            _kill_rest(proc)
            code = _exit_code(proc)
            previous = state.init_statuses.get(name) or {}
            last = _terminated(c, code, message=self.termination_message(state, c, code))["state"]
            if started_at := ((previous.get("state") or {}).get("running") or {}).get("startedAt"):
                last["terminated"]["startedAt"] = started_at
            restarts = int(previous.get("restartCount", 0)) + 1
            message = f"back-off {backoff:g}s restarting failed container={name} pod={state.name}_{state.namespace}"
            waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            kept = {"restartCount": restarts, "lastState": last, "started": False}
            state.init_statuses[name] = {**_container(c, waiting), **kept}
            self._publish(state, state.status.get("phase") or "Pending")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_restart_backoff_s)
            if state.stopping or state.deleted:
                return
            self._termination_file(state, c).write_bytes(b"")  # a new container: a new termination-message file
            spawn = asyncio.ensure_future(self._spawn(state, c, mounts))
            try:
                started = await asyncio.shield(spawn)
            except asyncio.CancelledError:  # stopping: hand the new process to whoever stops the sidecars
                with contextlib.suppress(Exception):
                    if isinstance(new := await spawn, asyncio.subprocess.Process):
                        state.sidecars[name] = new
                raise
            assert isinstance(started, asyncio.subprocess.Process)  # sidecars are neither simulated nor isolated
            proc = state.sidecars[name] = started
            self.sidecars_started.append((state.name, name, proc.pid))
            running = {"running": {"startedAt": now_rfc3339()}}
            state.init_statuses[name] = {**_container(c, running), **kept}
            self._publish(state, state.status.get("phase") or "Pending")
            if await self._startup_probe(state, c, mounts, proc):
                await _terminate(proc, self.grace_s)  # restarted again, after a longer back-off
                continue
            state.init_statuses[name] = {**_container(c, running, ready=True), **kept, "started": True}
            self._publish(state, state.status.get("phase") or "Pending")

    async def _halt_keepers(self, state: PodState) -> None:
        """No sidecar of the pod is restarted from now on."""
        state.stopping = True
        keepers = list(state.keepers.values())
        state.keepers.clear()
        for task in keepers:
            task.cancel()
        for task in keepers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _startup_probe(
        self, state: PodState, c: dict[str, Any], mounts: dict[str, Path], proc: asyncio.subprocess.Process
    ) -> str:
        probe = c.get("startupProbe")
        if not probe:
            return ""
        if "exec" not in probe:
            return "has a startup probe the fake kubelet cannot run (only exec probes)"
        period = float(probe.get("periodSeconds", 10))
        threshold = int(probe.get("failureThreshold", 3))
        timeout = float(probe.get("timeoutSeconds", 1))
        local = self._local(c, mounts)
        argv = self._argv(state, [local(a) for a in probe["exec"]["command"]])
        env = self._env(state, c, local)
        cwd = local(c.get("workingDir") or str(self.work))
        loop = asyncio.get_running_loop()
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        failures = 0
        while True:
            began = loop.time()
            if proc.returncode is not None:
                return f"exited (exit code {_exit_code(proc)}) before its startup probe succeeded"
            ok, output = await _probe(argv, env, cwd, timeout)
            if ok:
                return ""
            failures += 1
            if failures >= threshold:
                return f"did not start: its startup probe failed {failures} times, every {period:g}s: {output}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), max(0.0, began + period - loop.time()))

    async def _stop_sidecars(self, state: PodState, grace_s: float | None = None) -> None:
        """SIGTERM the sidecars, last started first (SIGKILL after the grace period), as Kubernetes does."""
        await self._halt_keepers(state)
        for name, proc in reversed(list(state.sidecars.items())):
            await _terminate(proc, self.grace_s if grace_s is None else grace_s)
            container = next(c for c in state.pod["spec"]["initContainers"] if c["name"] == name)
            code = _exit_code(proc)
            previous = state.init_statuses.get(name) or {}
            state.init_statuses[name] = {
                **_terminated(container, code, message=self.termination_message(state, container, code)),
                "restartCount": previous.get("restartCount", 0),
                **({"lastState": previous["lastState"]} if "lastState" in previous else {}),
            }

    def _volumes(self, state: PodState) -> dict[str, Path]:
        paths: dict[str, Path] = {}
        for volume in state.pod["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                paths[volume["name"]] = self._claim(state.namespace, claim)
            else:
                assert state.root is not None
                paths[volume["name"]] = state.root / "volumes" / volume["name"]
            paths[volume["name"]].mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                source = volume["configMap"]
                found = self.api.read_object(CONFIG_MAPS, state.namespace, source["name"])
                if found is None and not source.get("optional"):
                    raise StartError(f'configmap "{source["name"]}" not found')
                _write_config_map(paths[volume["name"]], found)
        return paths

    def _project_config_map(self, cm: dict[str, Any]) -> None:
        """A ConfigMap written after its pods started reaches their volumes, as the kubelet's sync brings it (there
        after up to a minute; here at once), each key's file replaced whole. A `subPath` mount would never see it."""
        meta = cm["metadata"]
        for state in self.pods.values():
            if state.namespace != meta.get("namespace") or state.root is None:
                continue
            for volume in state.pod["spec"].get("volumes", []):
                if (volume.get("configMap") or {}).get("name") == meta["name"]:
                    _write_config_map(state.root / "volumes" / volume["name"], cm)

    def _claim(self, namespace: str, name: str) -> Path:
        """The directory of a claim: one the test gave (`claims`), else one the API holds (a claim per run the
        operator created), provisioned on first use and kept across pods, as a storage class would."""
        given = self.claims.get((namespace, name)) or self.claims.get(name)
        if given is not None:
            return given
        if self.api.read_object(("", "v1", "persistentvolumeclaims"), namespace, name) is None:
            raise StartError(f'persistentvolumeclaim "{name}" not found')
        return self.work / "provisioned" / namespace / name

    def _free_port(self) -> int:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in self._ports:
                self._ports.add(port)
                return port

    def _local(self, container: dict[str, Any], volumes: dict[str, Path]) -> Callable[[str], str]:
        """Paths under the container's mount points, as local paths."""
        mounts = sorted(
            ((m["mountPath"], volumes[m["name"]] / m.get("subPath", "")) for m in container.get("volumeMounts", [])),
            key=lambda m: -len(m[0]),
        )
        for _, path in mounts:
            path.mkdir(parents=True, exist_ok=True)

        def local(text: str) -> str:
            for mount, path in mounts:
                if text == mount or text.startswith(mount + "/"):
                    return str(path) + text[len(mount) :]
            return text

        return local

    def _env(self, state: PodState, container: dict[str, Any], local: Callable[[str], str]) -> dict[str, str]:
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "RAY_AUTH_MODE") if k in os.environ}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = local(str(item["value"]))
            elif ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                secret = self.api.read_object(("", "v1", "secrets"), state.namespace, ref["name"]) or {}
                if ref["key"] in (secret.get("stringData") or {}):
                    env[item["name"]] = secret["stringData"][ref["key"]]
        path = container.get("terminationMessagePath")
        if path:
            for name, value in env.items():
                if value == path:
                    env[name] = str(self._termination_file(state, container))
        env["LABKUBE_METRICS_PORT"] = "0"  # every pod has its own network; here they share one
        if container.get("restartPolicy") == "Always" and env.get(WORLD_PORT_ENV) in state.ports:
            env[WORLD_PORT_ENV] = state.ports[env[WORLD_PORT_ENV]]
        for variable in SIDECAR_URL_ENVS:
            if variable in env:
                url = urlsplit(env[variable])
                if str(url.port) in state.ports:
                    netloc = f"{url.hostname}:{state.ports[str(url.port)]}"
                    env[variable] = url._replace(netloc=netloc).geturl()
        return env

    def _argv(self, state: PodState, words: list[str], sidecar: bool = True) -> list[str]:
        """The local command line: `labkube` is this interpreter, `python` the ARE environment's."""
        if not words:
            raise StartError("no command to run")
        if sidecar:
            words = [state.ports.get(w, w) for w in words]
        if words[0] == "labkube":
            return [sys.executable, "-P", "-m", "labkube", *words[1:]]
        if words[0] == "python":
            from labkube.tasks.gaia2 import world_python

            try:
                return [str(world_python()), *words[1:]]
            except Exception as exc:  # the ARE environment is not set up
                raise StartError(str(exc)) from None
        return words

    async def _spawn(self, state: PodState, container: dict[str, Any], volumes: dict[str, Path]) -> Proc | None:
        """Start the container's process (`None` when simulated), its output in the pod's `logs/`."""
        if self.isolate and self.simulate is None:
            return await self._spawn_isolated(state, container, volumes)
        local = self._local(container, volumes)
        env = self._env(state, container, local)
        cwd = local(container.get("workingDir") or str(self.work))
        Path(cwd).mkdir(parents=True, exist_ok=True)
        if self.simulate is not None:
            return None
        # An image's entrypoint is a path on this machine, not in the pod: no mount rewriting (a checkout
        # under /tmp would otherwise land in the pod's /tmp emptyDir).
        command = [local(a) for a in container.get("command", [])] or self.entrypoints.get(container.get("image", ""))
        if not command:
            raise StartError(f"no command, and image {container.get('image')} has no entrypoint known here")
        sidecar = container.get("restartPolicy") == "Always"
        argv = self._argv(state, [*command, *(local(a) for a in container.get("args", []))], sidecar)
        assert state.root is not None
        logs = state.root / "logs"
        logs.mkdir(exist_ok=True)
        with (
            (logs / f"{container['name']}.out").open("ab") as out,
            (logs / f"{container['name']}.err").open("ab") as err,
        ):
            return await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    async def _spawn_isolated(
        self, state: PodState, container: dict[str, Any], volumes: dict[str, Path]
    ) -> ContainerProcess:
        """Start the container through `container.start_container`: its own root, user, PID and network
        namespaces, only its volume mounts (at their real paths: nothing is rewritten)."""
        name = container["name"]
        if container.get("restartPolicy") == "Always":
            raise StartError(
                f"the isolated fake kubelet does not run native sidecars ({name}): the pod's containers would "
                "need one shared network namespace and its exec probes to run inside the sidecar; use isolate=False"
            )
        spec = state.pod["spec"]
        volume_specs = spec.get("volumes", [])
        memory = {v["name"] for v in volume_specs if (v.get("emptyDir") or {}).get("medium") == "Memory"}
        command = container.get("command") or self.entrypoints.get(container.get("image", ""))
        if not command:
            raise StartError(f"no command, and image {container.get('image')} has no entrypoint known here")
        env = [item for item in self._isolated_env(state, container) if item["name"] != "LABKUBE_METRICS_PORT"]
        env.append({"name": "LABKUBE_METRICS_PORT", "value": "0"})  # as in shared-network mode
        assert state.root is not None
        meta = state.pod["metadata"]
        proc = start_container(
            {**container, "command": list(command), "env": env},
            spec,
            {volume: path for volume, path in volumes.items() if volume not in memory},  # those: tmpfs
            log_dir=state.root / "logs",
            pod_meta={k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations") if k in meta},
            image_dirs=self.image_dirs,
            termination_file=self._termination_file(state, container),
            own_network=True,
        )
        try:
            return await proc.start()
        except ContainerError as exc:
            raise StartError(str(exc)) from None

    def _isolated_env(self, state: PodState, container: dict[str, Any]) -> list[dict[str, Any]]:
        """The container's `env`, secrets resolved from the API into plain values (a missing one left out, as
        `_env` does), for the container runner, which resolves only `value`s and `fieldRef`s."""
        env: list[dict[str, Any]] = []
        for item in container.get("env", []):
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                env.append(item)
                continue
            secret = self.api.read_object(("", "v1", "secrets"), state.namespace, ref["name"]) or {}
            if ref["key"] in (secret.get("stringData") or {}):
                value = str(secret["stringData"][ref["key"]])
                env.append({"name": item["name"], "value": value.replace("$", "$$")})  # no $(VAR) expansion
        return env

    def _termination_file(self, state: PodState, container: dict[str, Any]) -> Path:
        assert state.root is not None
        path = state.root / "termination" / container["name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        return path

    def termination_message(self, state: PodState, container: dict[str, Any], code: int) -> str:
        """What the API shows as the container's `state.terminated.message`."""
        if not container.get("terminationMessagePath") or state.root is None:
            return ""
        message = self._termination_file(state, container).read_bytes()[:4096].decode(errors="replace")
        if not message and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            logs = state.root / "logs"
            text = "".join(
                (logs / f"{container['name']}.{stream}").read_text(errors="replace")
                for stream in ("out", "err")
                if (logs / f"{container['name']}.{stream}").exists()
            )
            message = "\n".join(text.splitlines()[-80:])[-2048:]
        return message

    async def _exec(self, state: PodState, container: dict[str, Any], volumes: dict[str, Path]) -> int:
        """Run the container to its end: its exit code (128 + signal when killed)."""
        proc = await self._spawn(state, container, volumes)
        main = container is state.pod["spec"]["containers"][0]
        if proc is None:  # no processes at all: init containers succeed, the agent is simulated
            if not main or self.simulate is None:
                return 0
            run_dir = self._env(state, container, self._local(container, volumes)).get("LABKUBE_RUN_DIR")
            termination = self._termination_file(state, container)
            return await self.simulate(state.pod, Path(run_dir) if run_dir else None, termination)
        if main:
            state.proc = proc
        try:
            await proc.wait()
        finally:
            _kill_rest(proc)  # what its commands left behind (or all of it, when cancelled)
        return _exit_code(proc)

    async def _kill(self, state: PodState, grace_s: float | None = None) -> None:
        """Terminate the agent, then the sidecars."""
        await self._halt_keepers(state)
        grace = self.grace_s if grace_s is None else grace_s
        if state.proc is not None:
            await _terminate(state.proc, grace)
        for proc in reversed(list(state.sidecars.values())):
            await _terminate(proc, grace)

    # -- what tests do to pods -------------------------------------------------------------------

    def evict(
        self, name: str, namespace: str = "default", message: str = "The node was low on resource: memory."
    ) -> None:
        """Evict a running pod as the kubelet does under node pressure (Kubernetes >= 1.26): condition
        `DisruptionTarget=True` (reason `TerminationByKubelet`), its processes terminated, `Failed`/`Evicted`."""
        state = self.pods[(namespace, name)]
        assert state.stop is not None and not state.stop.done(), f"pod {name} is not running"
        state.disruption = _disruption("TerminationByKubelet", message)
        state.stop.set_result(("Evicted", message))

    async def _watch_storage(self) -> None:
        """Evict the running pods that pass a local-storage limit of their own (the module docstring says how)."""
        assert self.storage_poll_s is not None
        while True:
            await asyncio.sleep(self.storage_poll_s)
            for state in list(self.pods.values()):
                if state.stop is None or state.stop.done() or state.root is None or state.deleted:
                    continue
                try:
                    message = await asyncio.to_thread(_storage_violation, state.pod, state.root)
                except (OSError, ValueError):  # a quantity the API would have refused; a pod going away
                    continue
                if message and not state.stop.done() and not state.deleted:
                    state.stop_grace_s = 1.0  # immediateEvictionGracePeriodSeconds
                    state.stop.set_result(("Evicted", message))

    def preempt(self, name: str, namespace: str = "default", reason: str = "PreemptionByScheduler") -> None:
        """Take a pod away as the scheduler's preemption (or Kueue, or a drain through the Eviction API) does: add
        `DisruptionTarget=True` with `reason` to its status, then delete it."""
        state = self.pods[(namespace, name)]
        state.disruption = _disruption(reason, f"{reason}: the pod was taken away to make room")
        current = self.api.read_object(PODS, namespace, name)
        if current is not None:
            status = current.get("status") or {}
            conditions = [*(status.get("conditions") or []), state.disruption]
            self.api.set_status(PODS, namespace, name, {**status, "conditions": conditions})
        self.api.delete_object(PODS, namespace, name)

    def running(self) -> list[str]:
        return [s.name for s in self.pods.values() if s.status.get("phase") == "Running"]

    def log(self, pod: str, container: str, stream: str = "out", namespace: str = "default") -> str:
        """What a container of a pod wrote to stdout (`out`) or stderr (`err`), while the kubelet runs."""
        path = self.work / f"{namespace}-{pod}" / "logs" / f"{container}.{stream}"
        return path.read_text(errors="replace") if path.exists() else ""


async def _probe(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[bool, str]:
    """Run an exec probe: whether it succeeded, and the last line of its output."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        return False, f"command timed out after {timeout:g}s"
    finally:
        _killpg(proc, signal.SIGKILL)
        await proc.wait()
    lines = [line.strip() for line in output.decode(errors="replace").splitlines() if line.strip()]
    return proc.returncode == 0, lines[-1] if lines else f"exit code {proc.returncode}"


def _killpg(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_rest(proc: Proc) -> None:
    """SIGKILL what is left of an ended container's process group, once: later, with the group empty, its
    id may be another process's (pid_max can be as low as 32768). An isolated container: SIGKILL its PID 1
    if it still runs (the kernel kills the rest of its PID namespace), and release it."""
    if isinstance(proc, ContainerProcess):
        proc.close()
    elif proc not in _ENDED:
        _ENDED.add(proc)
        _killpg(proc, signal.SIGKILL)


async def _terminate(proc: Proc, grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`, and kill what is left of it. An isolated
    container: the same to its PID 1 (`ContainerProcess.terminate`), whose end ends its PID namespace."""
    if isinstance(proc, ContainerProcess):
        try:
            if proc.returncode is None:
                await proc.terminate(grace_s)
        finally:
            proc.close()
        return
    if proc.returncode is None:
        _killpg(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            _killpg(proc, signal.SIGKILL)
            await proc.wait()
    _kill_rest(proc)


def _exit_code(proc: Proc) -> int:
    if isinstance(proc, ContainerProcess):
        code = proc.exit_code
        assert code is not None
        return code
    returncode = proc.returncode
    assert returncode is not None
    return 128 - returncode if returncode < 0 else returncode


def _sidecar_ports(inits: list[dict[str, Any]]) -> list[str]:
    """The ports the pod's sidecars listen on: a world's `LABKUBE_WORLD_PORT`, a gateway's `--port` argument."""
    ports: list[str] = []
    for c in inits:
        if c.get("restartPolicy") != "Always":
            continue
        ports += [
            str(item["value"]) for item in c.get("env", []) if item.get("name") == WORLD_PORT_ENV and "value" in item
        ]
        words = [str(w) for w in [*c.get("command", []), *c.get("args", [])]]
        ports += [port for flag, port in pairwise(words) if flag == "--port"]
    return ports


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def _quantity(text: object) -> int:
    """A resource quantity ("10Gi", "500M", "1e3", "1.5Gi") in bytes, rounded up."""
    match = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?", str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    scale = 1e-3 if match[2] == "m" else {**_BINARY, **_DECIMAL}.get(match[2] or "", 1)
    return math.ceil(float(match[1]) * scale)


def _format_quantity(n: int) -> str:
    """Bytes as the API prints a binary quantity: the largest suffix that divides it ("8Mi", "10Gi")."""
    for suffix, size in reversed(_BINARY.items()):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _disk_usage(path: Path) -> int:
    """The disk a directory tree holds, as `du` counts it: allocated blocks, a hard-linked file once."""
    total, seen, stack = 0, set(), [path]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def _storage_limit(c: dict[str, Any]) -> int | None:
    limit = ((c.get("resources") or {}).get("limits") or {}).get("ephemeral-storage")
    return _quantity(limit) if limit is not None else None


def _pod_storage_limit(spec: dict[str, Any]) -> int | None:
    """The pod's ephemeral-storage limit as `resource.PodLimits` computes it: its containers' and sidecars' limits
    summed, at least each plain init container's; None when no container sets one."""
    inits = spec.get("initContainers", [])
    running = [*spec.get("containers", []), *(c for c in inits if c.get("restartPolicy") == "Always")]
    limits = [limit for c in running if (limit := _storage_limit(c)) is not None]
    plain = [limit for c in inits if c.get("restartPolicy") != "Always" and (limit := _storage_limit(c)) is not None]
    if not limits and not plain:
        return None
    return max([sum(limits), *plain])


def _storage_violation(pod: dict[str, Any], root: Path) -> str | None:
    """The kubelet's eviction message for a pod past a local-storage limit of its own spec, else None: an emptyDir
    past its `sizeLimit`, the pod past its containers' total limit, a container's logs past its own limit (in
    `localStorageEviction`'s order, its messages)."""
    spec = pod["spec"]
    disk = [v for v in spec.get("volumes", []) if "emptyDir" in v and (v["emptyDir"] or {}).get("medium") != "Memory"]
    used = {v["name"]: _disk_usage(root / "volumes" / v["name"]) for v in disk}
    for volume in disk:
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        if size is not None and 0 < _quantity(size) < used[volume["name"]]:
            return (
                f'Usage of EmptyDir volume "{volume["name"]}" exceeds the limit "{_format_quantity(_quantity(size))}". '
            )
    logs = {
        c["name"]: sum(_disk_usage_file(root / "logs" / f"{c['name']}.{stream}") for stream in ("out", "err"))
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]
    }
    limit = _pod_storage_limit(spec)
    if limit is not None and sum(used.values()) + sum(logs.values()) > limit:
        return f"Pod ephemeral local storage usage exceeds the total limit of containers {_format_quantity(limit)}. "
    for c in spec.get("containers", []):
        own = _storage_limit(c)
        if own and logs[c["name"]] > own:
            return f'Container {c["name"]} exceeded its local ephemeral storage limit "{_format_quantity(own)}". '
    return None


def _disk_usage_file(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _gpus(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in pod["spec"].get("containers", []):
        total += int(((c.get("resources") or {}).get("requests") or {}).get(resource, 0))
    return total


def _disruption(reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }


def _container(c: dict[str, Any], state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    return {"name": c["name"], "image": c.get("image", ""), "ready": ready, "restartCount": 0, "state": state}


def _terminated(c: dict[str, Any], code: int, reason: str = "", message: str = "") -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "finishedAt": now_rfc3339(),
    }
    if message:
        terminated["message"] = message
    return _container(c, {"terminated": terminated})
