"""The record side of a run supervised on the cluster (`k8s_backend.PodRun`'s base class): what it reads, keeps
and writes, as against which pod it starts next.

- the Run resource: read it, patch its status when it changed (`publish`, in a turn before pod creations), with
  the API's patience bounded by the run's own deadline; a patch holds only the fields this supervisor changed
  (`status_patch`), and what the API server answered with is what counts as recorded (`stored`);
- the GPU ledger: pod start and finish times as the API reports them (`track`: the Run's `status.podTimes`, and
  the operator's own `<campaign>/pods/`);
- the run's `status.json` while no agent writes it (`note`: why its pod does not start), and the live score,
  tokens and dollars from it when the volume is shared (`refresh`), read in a thread with a time-out
  (`read_store_status`): there the file is the agent's to replace;
- result intake: the result a final Run status records (`recorded_result`), or a grading pod's termination
  message (`graded`), never anything the agent's own pod says (`k8s_grading`);
- once the result is recorded (`finish`): the run's ended pods deleted, and with `runs.workspace.keepFinished:
  false` the claim the operator made for it (`release_claim`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from labkube.operator.admission import read_admitted
from labkube.operator.crds import GROUP, VERSION, run_name
from labkube.operator.k8s_grading import graded_result, is_grading_pod, report_of, result_from_status
from labkube.operator.k8s_ledger import (
    LIVE_STEP_S,
    PodLedger,
    PodTime,
    last_seen_running,
    ledger_path,
    pod_time,
)
from labkube.operator.k8s_models import RunResourceSpec, RunStatus, set_condition, status_patch, unrecorded
from labkube.operator.kube import PATIENCE_S, raw_json, short_error, status_of
from labkube.operator.kube_session import STATUS_FIRST, KubeSession
from labkube.operator.pod_manifest import pvc_name, records_pvc_name
from labkube.operator.pod_status import TERMINAL, PodEnd, ended, live_phase, pod_conditions, problem_message
from labkube.operator.run_failure import harness_failure
from labkube.result import RunResult
from labkube.run_spec import RunPhase
from labkube.run_spec import RunStatus as StoreStatus
from labkube.store import RunDir, read_model, utcnow, write_model

if TYPE_CHECKING:
    from labkube.operator.k8s_backend import K8sBackend

__all__ = ["NotAdmitted", "PodRunRecord", "RunGone"]

log = logging.getLogger("labkube.operator.k8s")

T = TypeVar("T")

# Bounds on reading what labkube wrote to the run folder, where on a shared claim the agent can put anything under
# the same name. status.json and result.json are a few kilobytes (a result's score curve: a few hundred).
STATUS_LIMIT = 1 << 20
RESULT_LIMIT = 64 << 20
STORE_READ_TIMEOUT_S = 5.0


class NotAdmitted(RuntimeError):
    """A run directory without the spec the operator admitted (never built from the Run resource)."""


class RunGone(RuntimeError):
    """The Run resource was deleted while it was supervised."""


class PodRunRecord:
    """One run's record as its supervisor keeps it (see the module docstring); `PodRun` adds its pods."""

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
        self.run_watch = session.runs(self.namespace, self.spec.campaign)  # the Run's interventions as they come
        self.status = RunStatus()
        # What this supervisor last wrote (or read, `adopt`): the base its status patches are the difference from,
        # so a patch carries only what it changed. `stored`: the status as the API server last answered it.
        self.published: dict[str, Any] | None = None
        self.stored: dict[str, Any] = {}
        self.dropped: set[str] = set()  # fields the API server dropped from a patch, said once each
        self.owner: dict[str, Any] = {}
        self.generation: int | None = None
        self.last_message = ""
        self.read_at = -1e9  # when the Run was last read
        self.store: StoreStatus | None = None  # status.json as last read (`read_store_status`)
        self._store_read: asyncio.Future[StoreStatus | None] | None = None

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
            if status_of(exc) == 404:
                return None
            raise

    async def publish(self, pod_name: str | None = None) -> None:
        """Patch the Run's status if it changed. With `pod_name`, the status is refreshed from that pod as the cache
        has it when the patch's turn comes (during a campaign's start, patches queue behind each other's)."""
        if pod_name is not None:
            self.store = await self.read_store_status()
        self._refresh_from(pod_name)
        if not status_patch(self.published or {}, self._status_body()):
            return  # nothing new: no turn taken, so the Runs that have something to say go first
        async with self.session.turns.take(STATUS_FIRST):
            self._refresh_from(pod_name)  # where the pod is now, after the wait for a turn
            await self._patch_status()

    async def read_store_status(self) -> StoreStatus | None:
        """The run's `status.json` on the shared volume (None with a claim per run: the file is not the operator's
        to read there), read off the event loop, where every run of this actor is supervised. On a shared claim the
        agent can put anything under that name: a FIFO or a link is refused without blocking and a file larger than
        any status is refused unread (`read_regular`), but a read can still wait (a hung NFS server): after
        `STORE_READ_TIMEOUT_S` the last status read is kept, and no second read starts while one waits."""
        if not self.backend.shared:
            return None
        if self._store_read is None or self._store_read.done():
            self._store_read = asyncio.ensure_future(
                asyncio.to_thread(read_model, self.rd.status_json, StoreStatus, STATUS_LIMIT)
            )
        try:
            return await asyncio.wait_for(asyncio.shield(self._store_read), STORE_READ_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "run %s: reading %s took more than %.0f s; its last status is kept",
                self.name,
                self.rd.status_json,
                STORE_READ_TIMEOUT_S,
            )
            return self.store

    def _refresh_from(self, pod_name: str | None) -> None:
        """The status from pod `pod_name` as cached; a pod gone from the cache is the caller's to handle."""
        if pod_name is not None and (pod := self.watcher.get(pod_name)) is not None:
            self.refresh(pod)

    def adopt(self, stored: Mapping[str, Any] | None) -> None:
        """Take the Run's status as read from the API (a supervisor starting, or taking over): its fields are this
        supervisor's from now on, and the base of its patches."""
        self.status = RunStatus.model_validate(stored or {})
        self.stored = dict(stored or {})
        self.published = self.status.to_status()

    def _status_body(self) -> dict[str, Any]:
        body = self.status.to_status()
        body["observedGeneration"] = self.generation
        return body

    async def _patch_status(self) -> None:
        """Patch the fields that changed since this supervisor's last patch (`status_patch`: never a null for a
        field it did not clear), and keep what the API server answered: a field it dropped (a Run CRD older than
        this operator prunes what it does not declare, and answers 200) is said, once, as an error naming the fix."""
        body = self._status_body()
        patch = status_patch(self.published or {}, body)
        if not patch:
            return
        try:
            resp = await self.api(
                self.session.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                self.namespace,
                "runs",
                self.name,
                {"status": patch},
                _preload_content=False,
                in_turn=True,
                conflicts=True,
            )
        except Exception as exc:
            if status_of(exc) == 404:
                raise RunGone(self.name) from None
            log.warning("run %s: status patch failed: %s", self.name, short_error(exc))
            return
        self.published = body
        self.stored = dict(raw_json(resp).get("status") or {})
        if dropped := [k for k in unrecorded({k: body[k] for k in patch}, self.stored) if k not in self.dropped]:
            self.dropped.update(dropped)
            message = (
                f"the API server dropped status field(s) {', '.join(dropped)} of Run {self.name} and answered "
                f"200: its CRD is older than this operator; upgrade the CRDs with `labkube crds apply`"
            )
            log.error("run %s: %s", self.name, message)
            self.condition("Recorded", False, "CRDOutdated", message)

    # -- once the result is recorded ------------------------------------------------------------

    async def delete_pods(self) -> None:
        """Delete the run's ended pods once its result is recorded (their GPU time is in the ledger): a finished
        campaign leaves no pod behind, and the pod caches stay small."""
        for pod in self.watcher.of_run(self.name):
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                await self.delete_pod(pod["metadata"]["name"])

    async def delete_pod(self, name: str, force: bool = False) -> None:
        """Delete pod `name`; `force`: at once (`gracePeriodSeconds: 0`), for a pod whose node is dead, whose kubelet
        would never confirm a graceful deletion (its containers may still run if the node comes back)."""
        grace = {"grace_period_seconds": 0} if force else {}
        try:
            await self.api(
                self.session.core.delete_namespaced_pod, name, self.namespace, _preload_content=False, **grace
            )
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    async def release_claim(self) -> None:
        """Delete the run's own claim once its result is recorded (`runs.workspace.keepFinished: false`): only in
        claim-per-run mode, only the claim the operator made for this Run (owned by it; the DELETE is conditional on
        the claim's uid), and only once every pod of the run has ended (its grading pod, whose report the result
        is). The workspace, transcript and checkpoints go with it, and the gateway's record with its own claim; the
        result stays in the Run's status."""
        if not self.backend.runs.workspace.claim_per_run:
            return
        await self.watcher.synced.wait()
        if live := [p["metadata"]["name"] for p in self.watcher.of_run(self.name) if not ended(p)]:
            log.warning("run %s: claim kept: pod(s) %s of the run still running", self.name, ", ".join(live))
            return
        for name in (pvc_name(self.name), records_pvc_name(self.name)):  # the run's claim, its gateway record's
            await self._release(name)

    async def _release(self, name: str) -> None:
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
            if status_of(exc) != 404:  # gone already is the aim
                log.warning("run %s: deleting its claim %s: %s", self.name, name, short_error(exc))

    # -- the store (shared runs volume) ------------------------------------------------------

    def store_status(self) -> StoreStatus | None:
        """status.json as `publish` last read it (`read_store_status`), never read here: this runs on the loop."""
        return self.store if self.backend.shared else None

    def recorded_result(self) -> RunResult | None:
        """The run's result when its Run status is final (the API is the record; a file on the runs volume is
        not: in shared-claim mode the agent could have written it). The copy on disk is used when it is the
        one the status records (the same `finished_at`: it holds the score curve), else the status's report."""
        if not self.status.phase.final:
            return None
        reported = result_from_status(self.status, self.spec.run_id)
        cached = read_model(self.rd.result_json, RunResult, RESULT_LIMIT)
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
            full = read_model(self.rd.result_json, RunResult, RESULT_LIMIT)
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
        # a running pod's share moves once a minute: a GPU run's status is not patched at every poll for it
        self.status.gpu_hours = round(self.ledger.gpu_hours(live_step_s=LIVE_STEP_S), 6)
        self.status.pod_times = self.ledger.to_status()

    def track_end(self, end: PodEnd) -> None:
        """`track` for a pod that ended: one that went without a terminal phase (deleted, lost with its node) has
        its interval closed when the cluster last saw it run (`end.ended_at`, its node's last heartbeat, else
        `last_seen_running`), and a lost one is marked so (`PodTime.lost`, counted by
        `labkube_campaign_run_pods_lost_total`)."""
        if end.pod is not None or end.last is None:
            self.track(end.pod)
            return
        name = end.last["metadata"]["name"]
        known = self.ledger.pods.get(name) or pod_time(end.last)
        if known is not None and (known.end is None or end.lost is not None):
            ended = end.ended_at or last_seen_running(end.last)
            closed = max(known.start, min(ended, known.end or ended))
            self.ledger.pods[name] = PodTime(start=known.start, end=closed, lost=end.lost)
            write_model(self.ledger_file, self.ledger)
        self.track(None)

    def note(self, message: str) -> None:
        """Put `message` into status.json while no agent writes it (the pod has not started)."""
        if message == self.last_message:
            return
        self.last_message = message
        # On a shared claim, the status `publish` read off the loop; with a claim per run, the operator's own file.
        current = self.store if self.backend.shared else read_model(self.rd.status_json, StoreStatus, STATUS_LIMIT)
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
            self.status.show_spend(store.spend)
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
        self.status.show_spend(result.spend)
        self.track(None)
        self.status.stop_reason = result.stop_reason
        self.status.outcome = result.outcome
        if result.is_error and result.outcome is not None:  # what `kubectl describe` and `labkube run` show
            last = (result.error or "").strip().splitlines()[-1:] or [result.outcome.value]
            self.condition("Measured", False, result.outcome.value, last[0][-300:])
        self.status.report = report_of(result)
        await self.publish()
        if missing := unrecorded(self._status_body(), self.stored):
            # Not what the server holds (dropped, another writer's since, a patch that failed): sent again, once.
            self.published = {**(self.published or {}), **dict.fromkeys(missing)}
            await self.publish()
        # Recorded: the API server answered with every field of the result, not merely took the patch.
        missing = unrecorded(self._status_body(), self.stored)
        recorded = not missing
        if missing:
            outdated = bool(self.dropped.intersection(missing))
            log.error(
                "run %s: its result is not recorded: the Run's status holds no %s; its pods are kept (%s)",
                self.name,
                ", ".join(missing),
                "the Run CRD is older than this operator: upgrade the CRDs with `labkube crds apply`"
                if outdated
                else "the status patch did not go through",
            )
        elif any(c.type == "Recorded" and c.status != "True" for c in self.status.conditions):
            self.condition("Recorded", True, "Recorded", "the API server holds the run's result")
            await self.publish()
        if self.backend.delete_finished_pods and recorded:
            await self.delete_pods()
        if recorded and not self.backend.runs.workspace.keep_finished:
            await self.release_claim()
        return result

    async def fail(self, message: str) -> RunResult:
        return await self.finish(harness_failure(self.rd, message))
