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

Live control (`k8s_control`, docs/live-control.md): the Run's `spec.interventions`, read from one Run watch per
campaign (`kube_session.RunWatcher`), are copied into the run's ConfigMap, which the agent container mounts. A pause
ends the agent's pod (the agent exits by itself at its next step, or the pod is deleted after
`runs.pauseGraceSeconds`, or at once with `now`), and the run returns `Paused` and not final, its pod time closed;
a cancel deletes the pod and grades the run as it stands (`cancelled`); an extend past what the running pod can hold
(its deadline, its gateway's limits) moves the run to a new pod. None of these counts as a crash or a disruption.

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

The pieces: `PodRun` here decides which pod comes next (start, follow, outcome); its base `PodRunRecord`
(`pod_run_record`) keeps the Run's status, the GPU ledger and the result; `pod_status` reads pods;
`kube_session` is the API as a process's supervisors share it (calls in turns, one pod watch per campaign).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal, TypeVar

from labkube.agent.gateway.ledger import GatewayReport
from labkube.agent.harness.agent_main import DISK_FULL_EXIT
from labkube.budgets import Budgets, Spend, StopReason, spend_floor
from labkube.control import PAUSED_EXIT
from labkube.interventions import Intervention, RunControl
from labkube.operator.crds import API_VERSION, GROUP, VERSION
from labkube.operator.k8s_control import (
    PAUSED,
    appended,
    checkpoint_due,
    config_map_name,
    control_config_map,
    control_of,
    paused_condition,
)
from labkube.operator.k8s_grading import (
    LABEL_FINALIZE,
    agent_ended_reason,
    gateway_report_of,
    grading_manifest,
    is_grading_pod,
    world_verdict_of,
)
from labkube.operator.k8s_ledger import restore_ledger
from labkube.operator.k8s_models import K8sBackend
from labkube.operator.kube import (
    backoff_delay,
    largest_node_gpus,
    list_pages,
    parse_time,
    quota_refusal,
    raw_json,
    status_of,
)
from labkube.operator.kube_session import session_for
from labkube.operator.pod_manifest import (
    build_pod_manifest,
    build_pvc_manifest,
    build_records_pvc_manifest,
    has_gateway,
)
from labkube.operator.pod_run_record import NotAdmitted, PodRunRecord, RunGone
from labkube.operator.pod_status import (
    TERMINAL,
    PodEnd,
    disruption_of,
    failed_init_container,
    node_loss,
    pod_attempt,
    pod_exit_code,
    problem_message,
    reason_of,
    self_caused_eviction,
    stuck_condition,
    unseen_deletion,
)
from labkube.operator.run_failure import harness_failure, last_error_line
from labkube.result import RunResult
from labkube.run_spec import ClusterAccount, RunPhase
from labkube.store import RunDir, utcnow, write_model

__all__ = ["K8sBackend", "Outcome", "PodRun", "supervise_pod"]

log = logging.getLogger("labkube.operator.k8s")

T = TypeVar("T")

QUOTA_FIRST_DELAY_S = 2.0  # a full quota frees when pods end: minutes, not the API server's seconds
EVENT_COMPONENT = "labkube-operator"
# Start-up reasons that are no trouble: no Warning event for them (Kueue's gate is queueing, not a fault).
QUIET_REASONS = frozenset({"SchedulingGated", "PodCreated"})


Outcome = Literal["deadline", "disk_full", "disrupted", "lost", "world"]


class PodRun(PodRunRecord):
    """Supervision of one run on the cluster (see the module docstring): the record it keeps is its base's."""

    # what the supervisor adds to the scheduler's word on a pod: a run needing more GPUs than any one node has
    gpu_shortfall: str | None = None
    _nodes_checked: str | None = None  # the pod whose Unschedulable state the node list was read for
    _announced: set[tuple[str, str]] | None = None  # (pod, reason) of the Warning events sent
    _control: RunControl | None = None  # the Run's interventions as last folded
    _control_rv: str | None = None  # the resourceVersion of the Run they were folded from
    _control_written: str | None = None  # the control JSON the run's ConfigMap holds
    _stopping: str | None = None  # the agent pod deleted for a pause, a cancel or an extend
    _refreshing: str | None = None  # the agent pod deleted to start again with extended budgets
    _pod_budgets: Budgets | None = None  # the budgets the current agent pod was built with (None: adopted)

    # -- live control (k8s_control) ----------------------------------------------------------------

    def live_control(self) -> RunControl:
        """The Run's interventions as the shared Run watch has them (as the Run was last read until it has it)."""
        cached = self.run_watch.get(self.name)
        source = cached if cached is not None else self.owner
        rv = (source.get("metadata") or {}).get("resourceVersion")
        if self._control is None or rv is None or rv != self._control_rv:
            self._control = control_of(source, self.spec.run_id)
            self._control_rv = rv
        return self._control

    async def sync_control(self) -> None:
        """Keep the run's ConfigMap (what its agent container reads: extends, messages, a pause to take at the next
        step) equal to the Run's interventions. A ConfigMap that cannot be written is logged: the pod's deletion
        still pauses or cancels the run, and the harness saves its last step on SIGTERM."""
        control = self.live_control()
        body = control.model_dump_json()
        if body == self._control_written:
            return
        cm = control_config_map(control, self.name, self.namespace, self.owner)
        core = self.session.core
        try:
            try:
                await self.api(core.patch_namespaced_config_map, cm["metadata"]["name"], self.namespace,
                               {"data": cm["data"]}, _preload_content=False)  # fmt: skip
            except Exception as exc:
                if status_of(exc) != 404:
                    raise
                await self.api(core.create_namespaced_config_map, self.namespace, cm, _preload_content=False)
        except Exception as exc:
            log.warning("run %s: ConfigMap %s not written: %s", self.name, config_map_name(self.name), str(exc)[:200])
            return
        self._control_written = body

    async def steer_pod(self, name: str) -> None:
        """Act on agent pod `name` for the Run's interventions: a cancel, or a pause with `now`, deletes it at once
        (SIGTERM: the agent keeps its last step's checkpoint); any other pause gives the agent
        `runs.pauseGraceSeconds` from the pause's time to reach its next step, save and exit (76) by itself, then
        deletes it. A pause that outlives the operator is measured from its own time, not the new leader's start."""
        await self.sync_control()
        control = self.live_control()
        paused = control.paused
        if control.cancelled is None and paused is None:
            if self.outgrown(control) and self._stopping != name:
                self._stopping = self._refreshing = name
                log.info("run %s: budgets extended past what pod %s can hold: resuming in a new pod", self.name, name)
                await self.delete_pod(name)
            return
        if paused is not None and control.cancelled is None and not paused.now:
            at = paused.at if paused.at.tzinfo is not None else paused.at.replace(tzinfo=UTC)
            waited = (datetime.now(UTC) - at).total_seconds()
            if waited < self.backend.runs.pause_grace_seconds:
                return
        if self._stopping != name:
            self._stopping = name
            await self.delete_pod(name)

    def outgrown(self, control: RunControl) -> bool:
        """Whether an extend raised a budget the running agent pod cannot take: its time (a pod's
        activeDeadlineSeconds cannot be raised), or the dollars or tokens its gateway sidecar enforces from the spec
        it started with. The harness takes the others (steps, anything lowered) at its next step."""
        old = self._pod_budgets
        if old is None:
            return False
        new = control.budgets(self.resource.budgets)
        fields = ["wall_hours", *(["usd", "tokens"] if has_gateway(self.resource) else [])]
        for field in fields:
            was, now = getattr(old, field), getattr(new, field)
            if was is not None and now is not None and now > was:
                return True
        return False

    async def pause(self, paused: Intervention) -> RunResult:
        """The Run shows `Paused` (condition `Paused`: who and why), no pod of it is left (an agent pod that saved and
        exited is deleted too), its GPU time is closed in the ledger, and the result is not final (`PAUSED`): the
        driver frees its slot and GPUs, and the campaign daemon hands it back once resumed."""
        await self.delete_pods()
        reason, message = paused_condition(paused)
        self.status.phase = RunPhase.paused
        self.condition("Paused", True, reason, message)
        self.track(None)
        self.note(message)
        await self.publish()
        log.info("run %s: %s", self.name, message)
        return RunResult.of_run(self.spec, status=RunPhase.paused, error=PAUSED + message)

    def cancelled_result(self, control: RunControl) -> RunResult:
        """A run cancelled without grading (`grade: false`): final, outcome `cancelled`, charged with what the operator
        saw (the gateways' spend, the pods' time), nothing graded."""
        cancel = control.cancelled
        spend = (self.status.cluster_spend or Spend()).model_copy(update={"wall_seconds": self.ledger.seconds()})
        result = RunResult.of_run(
            self.spec,
            status=RunPhase.finished,
            stop_reason=StopReason.cancelled,
            spend=spend,
            finished_at=utcnow(),
            interventions=control.interventions,
            message=cancel.describe() if cancel is not None else None,
        )
        write_model(self.rd.result_json, result)
        return result

    # -- pods -----------------------------------------------------------------------------------

    async def create_pod(self, manifest: dict[str, Any]) -> str:
        name = manifest["metadata"]["name"]
        try:
            resp = await self.past_quota(
                f"pod {name}",
                lambda: self.api(
                    self.session.core.create_namespaced_pod, self.namespace, manifest, _preload_content=False
                ),
            )
            self.watcher.seen(raw_json(resp))
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            # 409: a pod of this attempt was created before a restart; adopt it.
            resp = await self.api(self.session.core.read_namespaced_pod, name, self.namespace, _preload_content=False)
            self.watcher.seen(raw_json(resp))
        return name

    async def ensure_claim(self) -> None:
        """In claim-per-run mode, the run's claim and its gateway record's (an existing one, 409, is kept)."""
        for build in (build_pvc_manifest, build_records_pvc_manifest):
            pvc = build(self.resource, self.backend.runs, owner=self.owner)
            if pvc is None:
                return
            create = partial(
                self.api,
                self.session.core.create_namespaced_persistent_volume_claim,
                self.namespace,
                pvc,
                _preload_content=False,
            )
            try:
                await self.past_quota(f"claim {pvc['metadata']['name']}", create)
            except Exception as exc:
                if status_of(exc) != 409:
                    raise

    async def past_quota(self, what: str, create: Callable[[], Awaitable[T]]) -> T:
        """`create()`, again while a ResourceQuota refuses it (403 `exceeded quota`: `quota_refusal`), with capped
        exponential back-off and jitter, for as long as the run's own deadline allows (`patience`, as for an API
        outage). Meanwhile the Run is `Pending` with `Scheduled=False`, reason `QuotaExceeded` and the API server's
        message, and one Warning event says so. The wait holds no turn of the session: the Runs' status patches
        and the other runs' creations go on."""
        give_up_at = time.monotonic() + self.patience()
        attempt = 0
        while True:
            try:
                created = await create()
            except Exception as exc:
                refusal = quota_refusal(exc)
                delay = backoff_delay(attempt, QUOTA_FIRST_DELAY_S)
                if refusal is None or time.monotonic() + delay > give_up_at:
                    raise
                if attempt == 0 or attempt % 10 == 0:
                    log.warning("run %s: %s refused by a quota (%s); trying again", self.name, what, refusal[:300])
                self.status.phase = RunPhase.pending
                self.condition("Scheduled", False, "QuotaExceeded", f"{what} not created: {refusal}")
                self.note(problem_message(self.status.conditions))
                await self.publish()
                await self.announce(what)
                await asyncio.sleep(delay)
                attempt += 1
                continue
            if attempt:
                log.info("run %s: %s created after %d quota refusal(s)", self.name, what, attempt)
                self.condition("Scheduled", False, "PodCreated", f"{what} created; waiting for the scheduler")
            return created

    # -- what the Run shows while its pod does not start -----------------------------------------

    def condition(self, type_: str, ok: bool, reason: str, message: str = "") -> None:
        """The base's, with the scheduler's `Unschedulable` made plain when no node has the GPUs the run needs."""
        if type_ == "Scheduled" and not ok and reason == "Unschedulable" and self.gpu_shortfall:
            message = self.gpu_shortfall + (f" ({message})" if message else "")
        super().condition(type_, ok, reason, message)

    async def check_gpu_fit(self, pod: Mapping[str, Any]) -> None:
        """Once per pod the scheduler finds Unschedulable, for a run that needs GPUs: read the nodes and, when the
        largest Ready one has fewer allocatable GPUs than the run needs, say so in the `Scheduled` condition
        (`needs N GPUs, largest node has M`): no amount of waiting places it. Nothing is said when the nodes cannot
        be read (no RBAC to list them): the scheduler's message stands."""
        name = pod["metadata"]["name"]
        needs = self.spec.gpus or 0
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        if needs <= 0 or scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
            return
        if self._nodes_checked == name:
            return
        self._nodes_checked = name
        try:
            listing = await self.session.call(
                list_pages, self.session.core.list_node, _request_timeout=30, patience_s=60.0
            )
        except Exception as exc:
            log.info("run %s: nodes not read (%s)", self.name, (str(exc).splitlines() or [repr(exc)])[0][:200])
            return
        largest = largest_node_gpus(listing.get("items") or [], self.backend.runs.gpu_resource_name)
        self.gpu_shortfall = f"needs {needs} GPUs, largest node has {largest}" if needs > largest else None

    async def announce(self, subject: str) -> None:
        """A Kubernetes Event (core/v1, type Warning) on the Run for its first unmet start-up condition, once per
        pod (`subject`) and reason: `kubectl describe run` and `kubectl get events` show why the run waits. An
        event that cannot be written is logged, never the run's failure."""
        kinds = ("Scheduled", "ImagePulled", "PodReady")
        problem = next((c for c in self.status.conditions if c.type in kinds and c.status == "False"), None)
        if problem is None or problem.reason in QUIET_REASONS:
            return
        if self._announced is None:
            self._announced = set()
        if (subject, problem.reason) in self._announced:
            return
        self._announced.add((subject, problem.reason))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = self.owner.get("metadata") or {}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.name}.{time.time_ns():x}"[-253:], "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": "Run",
                "name": self.name,
                "namespace": self.namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": problem.reason,
            "message": (f"{subject}: {problem.message}" if problem.message else subject)[:1024],
            "type": "Warning",
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": EVENT_COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.session.call(
                self.session.core.create_namespaced_event,
                self.namespace,
                event,
                _preload_content=False,
                patience_s=30.0,
            )
        except Exception as exc:
            log.warning("run %s: event %s not written: %s", self.name, problem.reason, str(exc)[:200])

    def resume_for(self, attempt: int) -> bool:
        ws = self.backend.runs.workspace
        if self.backend.shared:
            return self.rd.checkpoint_json.exists()
        return ws.mode == "pvc" and attempt > 0  # a claim per run keeps the checkpoint; emptyDir does not

    def manifest(self, attempt: int, finalize: StopReason | None) -> dict[str, Any]:
        # the budgets as extended so far: the pod's deadline, its gateway's limits and the harness's run.json
        budgets = self.live_control().budgets(self.resource.budgets)
        resource = self.resource.model_copy(update={"budgets": budgets})
        if finalize is None:
            self._pod_budgets = budgets
        pod = build_pod_manifest(
            resource,
            self.backend.runs,
            owner=self.owner,
            attempt=attempt,
            resume=self.resume_for(attempt),
            spent_wall_seconds=self.ledger.seconds(),  # the API's pod times, not the run's own account
            cluster_spend=self.status.cluster_spend,  # the gateways' reports, not the run's checkpoint
        )
        if finalize is not None:
            account = ClusterAccount(
                spend=self.status.cluster_spend,
                wall_seconds=self.ledger.seconds(),
                attempts=self.status.attempts,
                budget_stop=self.status.budget_stop,
                interventions=self.live_control().interventions,
            )
            pod = grading_manifest(
                pod,
                finalize,
                self.backend.runs.grading_deadline_seconds,
                world_verdict=self.status.world_verdict,
                account=account,
            )
        return pod

    async def start_pod(self, attempt: int, finalize: StopReason | None) -> str:
        if time.monotonic() - self.read_at > 1.0:  # never start a pod for a Run that is being deleted
            run = await self.read_run()
            if run is None or (run.get("metadata") or {}).get("deletionTimestamp"):
                raise RunGone(self.name)
        await self.ensure_claim()
        if finalize is None:
            await self.sync_control()  # the pod starts with the interventions made so far
        name = await self.create_pod(self.manifest(attempt, finalize))
        if finalize is None:  # a grading pod is no attempt of the agent's
            self.status.attempts = attempt + 1
        self.status.pod_name = name
        self.status.phase = RunPhase.starting
        await self.publish(name)
        return name

    async def follow(self, name: str, agent: bool = True) -> PodEnd:
        """Until pod `name` ends; status is published on every change and every `poll_seconds`; an `agent` pod is
        ended for a pause or a cancel (`steer_pod`)."""
        stuck_since: float | None = None
        while True:
            if agent:
                await self.steer_pod(name)
            seen = self.watcher.version(name)
            pod = self.watcher.get(name)
            if pod is None:
                # Not in the cache of a synced watch: gone (a pod we just created is put there at once).
                gone = self.watcher.deleted.pop(name, None)
                if gone is None:
                    return PodEnd(None)
                if not gone.observed and (gone.last.get("status") or {}).get("phase") in TERMINAL:
                    return PodEnd(gone.last)  # it ended, then went while the watch was down: as if seen ending
                return PodEnd(None, last=gone.last, unobserved=not gone.observed)
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                return PodEnd(pod)
            lost = await self.pod_loss(pod)
            if lost is not None:
                why, ended_at = lost
                await self.delete_pod(name, force=True)  # no kubelet will confirm it: gone from the API now
                return PodEnd(None, last=pod, lost=why, ended_at=ended_at)
            await self.check_gpu_fit(pod)
            await self.publish(name)
            await self.announce(name)
            pod = self.watcher.get(name) or pod
            stuck = stuck_condition(pod)
            if stuck is None:
                stuck_since = None
            else:
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since > self.backend.pull_give_up_s:
                    await self.delete_pod(name)
                    return PodEnd(pod, gave_up=stuck[3])
            await self.watcher.wait(name, self.backend.poll_seconds, since=seen)

    async def pod_loss(self, pod: Mapping[str, Any], gone: bool = False) -> tuple[str, datetime | None] | None:
        """Whether `pod` is lost (`runs.podLostAfterSeconds`, the margin): its node has gone, or has not been Ready
        for longer than the margin, or the pod is still Terminating that long past its grace period (a dead node's
        kubelet never confirms it). Why, and when the cluster last saw it run (its node's last heartbeat; else the
        end of its grace period). `gone`: the pod has disappeared from the API already (PodGC removes the pods of a
        deleted node while they are "Running"): any node that is not Ready lost it. None: not lost, or unknown (the
        nodes cannot be read)."""
        margin = float(self.backend.runs.pod_lost_after_seconds)
        now = datetime.now(UTC)
        name = pod["metadata"]["name"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        loss = await self.node_loss_of(node_name, 0.0 if gone else margin, now, fresh=gone) if node_name else None
        if loss is not None:
            # a deleted node's last heartbeat is the one last read from it, if it ever was
            return f"pod {name} was lost: {loss[0]}", loss[1] or self.session.node_heartbeats.get(node_name)
        deleting = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
        if not gone and deleting is not None and (now - deleting).total_seconds() > margin:
            return (
                f"pod {name} was lost: still Terminating {margin:.0f} s past the end of its grace period "
                f"({deleting.isoformat()}); no kubelet confirmed its end",
                deleting,
            )
        return None

    async def node_loss_of(
        self, node_name: str, margin_s: float, now: datetime, fresh: bool
    ) -> tuple[str, datetime | None] | None:
        """`node_loss` of the Node as the API answers; None also when it cannot be read (its state is unknown, and
        the session says so once in the log): the pod is then judged by its own deletion alone."""
        try:
            node = await self.session.node(node_name, fresh=fresh)
        except Exception:
            return None
        return node_loss(node_name, node, margin_s, now)

    def outcome(self, end: PodEnd) -> tuple[Outcome, str]:
        if end.lost is not None:
            return "disrupted", f"{end.lost}: counted as the cluster's doing, not a crash"
        pod = end.pod
        # An eviction the run caused (its own storage past its limit, or past its request under node pressure) is a
        # crash, not a free disruption: else an agent could buy resumes, each from a checkpoint it wrote.
        own = self_caused_eviction(pod if pod is not None else end.last)
        if own is not None:
            return "lost", (
                f"pod {self.status.pod_name} was evicted by the kubelet because {own}: "
                "the run's own doing, counted as a crash, not a disruption"
            )
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

    def count_spend(self, report: GatewayReport | None) -> bool:
        """Take an ended pod's gateway report into the Run's status; whether the status changed. The record never goes
        down: a report below it (a gateway that started from an older record) changes nothing."""
        if report is None:
            return False
        spend = spend_floor(self.status.cluster_spend, report.spend)
        stop = self.status.budget_stop or report.stop_reason
        if spend == self.status.cluster_spend and stop == self.status.budget_stop:
            return False
        self.status.cluster_spend, self.status.budget_stop = spend, stop
        return True

    # -- the whole run --------------------------------------------------------------------------

    async def run(self) -> RunResult:
        run = await self.read_run()
        if run is None:
            return self.detached("its Run resource does not exist")
        self.owner = run
        self.generation = (run.get("metadata") or {}).get("generation")
        self.adopt(run.get("status"))  # the status as stored: the base of this supervisor's patches
        root = self.rd.root.parent.parent
        self.ledger = restore_ledger(root, self.spec.run_id, self.spec.gpus, self.status)
        done = self.recorded_result()
        if done is not None:
            return await self.finish(done)

        await self.watcher.synced.wait()
        await self.run_watch.synced.wait()
        control = self.live_control()
        held = next((c for c in self.status.conditions if c.type == "Paused" and c.status == "True"), None)
        if held is not None and control.paused is None:
            last = next((i for i in reversed(control.interventions) if i.kind in ("resume", "extend", "cancel")), None)
            self.condition("Paused", False, "Resumed", f"resumed: {last.describe()}" if last else "resumed")
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
                if grading is None:
                    control = self.live_control()
                    if control.cancelled is not None:
                        if not control.cancelled.grade or self.status.attempts == 0:  # nothing ran: none to grade
                            return await self.finish(self.cancelled_result(control))
                        grading = StopReason.cancelled
                        self.condition("Cancelled", True, "Cancelled", control.cancelled.describe())
                    elif control.paused is not None:
                        return await self.pause(control.paused)
                if grading is None and (self.status.crashes >= limit or self.status.disruptions > disruptions):
                    grading = StopReason.killed
                current = await self.start_pod(next_attempt, grading)
                next_attempt += 1
            end = await self.follow(current, agent=grading is None)
            if end.pod is None and end.lost is None and end.last is not None:
                # gone while it ran: with its node (PodGC removes a deleted node's pods), or deleted
                lost = await self.pod_loss(end.last, gone=True)
                if lost is not None:
                    end = replace(end, lost=lost[0], ended_at=lost[1])
            self.track_end(end)
            verdict = world_verdict_of(end.pod or end.last) if grading is None else None
            if verdict is not None and verdict != self.status.world_verdict:
                self.status.world_verdict = verdict  # recorded before a grading pod is given it
                await self.publish()
            if grading is None and self.count_spend(gateway_report_of(end.pod or end.last)):
                await self.publish()  # recorded before the next pod, or the grading pod, is given it
            if end.gave_up is not None:
                return await self.fail(end.gave_up)
            if grading is None and await self.at_usage_checkpoint(end):
                current = None  # paused until a person resumes or extends it: the top of the loop pauses it
                continue
            if grading is None and self.steered_end(end):
                current = None  # the run is paused or cancelled: the top of the loop says which
                continue
            kind, why = self.outcome(end)
            if grading is not None:  # the pod that ended graded the run: its report is the result
                done = self.graded(end)
                if done is not None:
                    return await self.finish(done)
                if kind == "disrupted" and self.status.disruptions < disruptions:
                    self.status.disruptions += 1
                    self.condition("Resumed", True, reason_of(end), f"{why}; grading the run again")
                    current = None
                    continue
                return await self.fail(f"{why}; grading the stopped run did not produce a result (see logs/)")
            if kind == "disk_full":
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
                        reason_of(end),
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
                        "Resumed", True, reason_of(end), f"{why}; {how} (attempt {self.status.crashes + 1} of {limit})"
                    )
            current = None

    async def at_usage_checkpoint(self, end: PodEnd) -> bool:
        """An agent that exited for a pause no one made stopped at a usage checkpoint (`k8s_control.checkpoint_due`):
        recorded on the Run, which pauses it until a person resumes or extends it."""
        control = self.live_control()
        seen = (self.status.cluster_spend or Spend()).model_copy(update={"wall_seconds": self.ledger.seconds()})
        made = checkpoint_due(control, pod_exit_code(end.pod) if end.pod is not None else None, seen, self.spec)
        if made is None:
            return False
        await self.api(
            self.session.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, "runs", self.name,
            appended(made), _content_type="application/json-patch+json",
        )  # fmt: skip
        # the Run watch brings the patched Run shortly; until then this supervisor knows what it appended
        self._control = RunControl(run_id=self.spec.run_id, interventions=[*control.interventions, made])
        return True

    def steered_end(self, end: PodEnd) -> bool:
        """Whether the agent pod that ended was ended for the Run's interventions (or saved and exited for a pause
        resumed since): then it is neither a crash nor a disruption. An agent that ended its loop by itself (exit 0
        or 1) before a pause reached it is graded as usual."""
        code = pod_exit_code(end.pod) if end.pod is not None else None
        control = self.live_control()
        if control.cancelled is not None:
            return True
        name = ((end.pod or end.last or {}).get("metadata") or {}).get("name")
        if control.paused is None and name is not None and name == self._refreshing:
            self._refreshing = None
            self.condition("Resumed", True, "BudgetsExtended", f"pod {name} ended for extended budgets; resuming")
            return True
        if control.paused is not None:
            return agent_ended_reason(code) is None or bool((end.pod or {}).get("status", {}).get("reason"))
        if code == PAUSED_EXIT:
            self.condition("Resumed", True, "Resumed", "the agent saved and exited for a pause that was resumed since")
            return True
        return False

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


async def supervise_pod(run_dir: str, backend: Mapping[str, Any] | K8sBackend) -> RunResult:
    """Drive one run to a final state with pods (see the module docstring)."""
    cfg = backend if isinstance(backend, K8sBackend) else K8sBackend.model_validate(backend)
    try:
        run = PodRun(session_for(cfg.kube), cfg, RunDir(run_dir))
    except NotAdmitted as exc:
        return harness_failure(RunDir(run_dir), str(exc))
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
