"""`labkube operator`: kopf handlers for the `Campaign` and `Run` resources.

    Campaign ──owns──▶ Run ──owns──▶ Pod <run>-<attempt>   (+ PVC <run>-runs in per-run claim mode)

- A **daemon per Campaign** (`run_campaign`) reads the spec (`crds.campaign_resource_spec`),
  expands it with the CLI's `expand_runs`, writes the campaign directory on the runs volume
  (`<runsRoot>/<campaign>/`, the results store's layout), creates one `Run` per run
  (`crds.build_run_resource`: owned by the Campaign), and hands the unfinished runs to the Ray
  campaign driver (`driver.drive`) with a `K8sBackend`: the same driver as `labkube run`, whose
  supervisors create and follow each run's pod (`k8s_backend`). Ray bounds concurrency (slots)
  and GPUs; the campaign's GPU-hour cap holds back runs that would start past it. The daemon keeps
  `Campaign.status` (phase, runs by phase, progress, GPU-hours) current and ends when every run is
  final (or held by the cap).
- **Restart safety**: stopping the operator cancels the daemons and kills the Ray supervisors; the
  pods keep running. On start, every daemon begins again: runs whose Run status is final are skipped
  and their results and GPU ledgers rebuilt from the statuses (`k8s_record`: the runs root may be empty), and
  each supervisor adopts its run's newest pod (`Run.status.podName`/`attempts`,
  and the pods' `labkube.dev/run` label) instead of creating one. Pod names are
  `<run>-<attempt>`, so a create that races a restart answers 409 and is adopted too.
- **Deletion**: kopf's finalizer on a Campaign runs `campaign_deleted`, which deletes its Runs, their
  pods and the claims it created (claim-per-run mode), and waits until they are gone. The campaign
  directory on the runs volume is kept.
  Runs have no finalizer: a Run deleted on its own takes its pods and claim with it through their
  owner references (the cluster's garbage collector), and a finalizer would cost every Run two more
  patches (kopf's finalizer and its last-handled annotation) during a campaign's start.

Handlers are registered on a registry built by `build_registry(runtime, ray_ctx)`, so the
operator's configuration reaches them without module globals; `labkube operator` passes it to
`kopf.run`, tests to `kopf.testing.KopfRunner(..., registry=...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labkube.budgets import rounded_usd
from labkube.campaign import CampaignSpec, expand_runs
from labkube.model_ref import UnknownModel, parse_model
from labkube.operator.admission import admission_violations, write_admitted
from labkube.operator.crds import (
    API_VERSION,
    GROUP,
    LABEL_CAMPAIGN,
    VERSION,
    SchemaError,
    build_run_resource,
    campaign_crd,
    campaign_resource_spec,
    run_name,
    run_resource_spec,
    validate_resource,
)
from labkube.operator.driver import HELD, DriverError, RayContext, drive
from labkube.operator.k8s_backend import K8sBackend, raw_json, retrying
from labkube.operator.k8s_grading import report_of
from labkube.operator.k8s_ledger import PodLedger, ledger_path
from labkube.operator.k8s_models import (
    POLICY_PLURALS,
    CampaignPhase,
    CampaignStatus,
    Condition,
    ConditionStatus,
    OperatorConfig,
    RunCounts,
    RunResourceSpec,
    RunStatus,
    set_condition,
)
from labkube.operator.k8s_record import restore_from_statuses
from labkube.operator.kube import KubeError, KubeTarget, answered, api_client, connection_info
from labkube.operator.leader import LeaseElector
from labkube.operator.pod_manifest import LABEL_RUN, pvc_name
from labkube.operator.replica import LEADING, ReplicaState, heartbeat, leader_family, serve_health
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec
from labkube.store import CampaignDir, StoreError, read_model
from labkube.task_card import TaskCard

if TYPE_CHECKING:
    import kopf
    from kubernetes.client import ApiClient

__all__ = [
    "CampaignExists",
    "ClusterApi",
    "OperatorError",
    "OperatorMetrics",
    "OperatorRuntime",
    "build_registry",
    "campaign_resource",
    "campaign_status",
    "check_runs_root",
    "plan_resource_campaign",
    "read_campaign",
    "run_campaign",
    "run_operator",
    "run_rows",
    "submit_campaign",
]

T = TypeVar("T")
log = logging.getLogger("labkube.operator")

DEFAULT_RUNS_ROOT = Path("/runs")
RAY_CONNECT_PATIENCE_S = 120.0


class OperatorRuntime(BaseModel):
    """Everything the handlers need: the chart's config file plus how this process reaches things."""

    model_config = ConfigDict(extra="forbid")

    config: OperatorConfig
    kube: KubeTarget = Field(default_factory=KubeTarget)
    runs_root: Path = Field(
        default=DEFAULT_RUNS_ROOT,
        description="Campaign directories, `<runs_root>/<namespace>/<campaign>/` (the chart's operator.runsRoot).",
    )
    namespace: str | None = Field(
        default=None, description="The operator's own namespace, whose shared runs claim it mounts at runs_root."
    )
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
        description="This replica's name in the leader lease (its pod name and a random suffix).",
    )
    status_interval_s: float = Field(default=2.0, gt=0, description="How often Campaign.status is refreshed.")
    poll_seconds: float = Field(default=2.0, gt=0, description="How often a supervisor reads status.json.")
    max_attempts: int = Field(default=3, ge=1, description="Failed pods (crashes) per run before giving up.")
    max_disruptions: int = Field(
        default=20, ge=0, description="Pods per run the cluster may take away (evictions, preemptions) on top."
    )
    image_pull_timeout_s: float = Field(default=600.0, gt=0)

    def campaign_root(self, namespace: str, name: str) -> Path:
        """Campaigns of the same name in two namespaces are two campaigns: the namespace is in the path."""
        return self.runs_root / namespace / name

    def backend(self, namespace: str) -> K8sBackend:
        return K8sBackend(
            kube=self.kube,
            namespace=namespace,
            operator_namespace=self.namespace,
            runs=self.config.runs,
            max_attempts=self.max_attempts,
            max_disruptions=self.max_disruptions,
            delete_finished_pods=self.config.delete_finished_pods,
            poll_seconds=self.poll_seconds,
            image_pull_timeout_s=self.image_pull_timeout_s,
        )


class OperatorMetrics:
    """Every driven campaign's series (`CampaignTelemetry`, one registry each) on one `/metrics`."""

    def __init__(self, replica: ReplicaState | None = None) -> None:
        self.campaigns: dict[tuple[str, str], Any] = {}
        self.replica = replica  # `labkube_operator_leader`, served by every replica, leading or not

    def telemetry(self, namespace: str, name: str, gpu_hours_cap: float | None) -> Any:
        from prometheus_client import CollectorRegistry

        from labkube.operator.telemetry import CampaignTelemetry

        key = (namespace, name)
        if key not in self.campaigns:
            self.campaigns[key] = CampaignTelemetry(name, gpu_hours_cap, registry=CollectorRegistry())
        return self.campaigns[key]

    def drop(self, namespace: str, name: str) -> None:
        self.campaigns.pop((namespace, name), None)

    def collect(self) -> Any:
        """One family per metric (one `# HELP`), each campaign's samples labelled with its `namespace`: two campaigns
        of one name in two namespaces are two series."""
        from prometheus_client.metrics_core import Metric

        if self.replica is not None:
            yield leader_family(self.replica)
        merged: dict[str, Metric] = {}
        for (namespace, _), telemetry in list(self.campaigns.items()):
            for family in telemetry.m.registry.collect():
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                into.samples.extend(s._replace(labels={**s.labels, "namespace": namespace}) for s in family.samples)
        yield from merged.values()

    def serve(self, port: int) -> object:
        from prometheus_client import CollectorRegistry

        from labkube.metrics import serve

        registry = CollectorRegistry()
        registry.register(self)  # type: ignore[arg-type]
        return serve(port, registry)


class CampaignSpecError(ValueError):
    """A Campaign that cannot run as written (the message names the field and the fix)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class OperatorError(RuntimeError):
    """The operator cannot start here (the message says what to change)."""


class CampaignExists(ValueError):
    """`labkube run --backend k8s`: a different Campaign of that name exists."""


# -- the API from the operator process ----------------------------------------------------------


def _status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class ClusterApi:
    """The `kubernetes` client, called from the event loop through a small thread pool."""

    def __init__(self, target: KubeTarget) -> None:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.client = api_client(target, pool_size=32)
        self.core = CoreV1Api(self.client)
        self.custom = CustomObjectsApi(self.client)
        self.executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="labkube-operator")
        self.policed: set[str] = set()  # namespaces whose run-pod NetworkPolicies are in place

    async def call(self, fn: Callable[..., T], *args: Any, conflicts: bool = False, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        work = partial(answered, fn, *args, **kwargs)
        return await retrying(lambda: loop.run_in_executor(self.executor, work), conflicts=conflicts)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    async def runs_of(self, namespace: str, campaign: str) -> list[dict[str, Any]]:
        listing = await self.call(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "runs",
            label_selector=f"{LABEL_CAMPAIGN}={campaign}",
        )
        return list(cast(dict[str, Any], listing).get("items") or [])

    async def create_run(self, obj: dict[str, Any]) -> bool:
        """Create a Run; False when it exists already (a restarted operator)."""
        try:
            await self.call(
                self.custom.create_namespaced_custom_object, GROUP, VERSION, obj["metadata"]["namespace"], "runs", obj
            )
        except Exception as exc:
            if _status_of(exc) == 409:
                return False
            raise
        return True

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self.call(
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"status": status},
                conflicts=True,  # a merge patch of the status: safe to send again
            )
        except Exception as exc:
            if _status_of(exc) != 404:
                raise

    async def delete_run(self, namespace: str, name: str) -> None:
        try:
            await self.call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, "runs", name)
        except Exception as exc:
            if _status_of(exc) != 404:
                raise

    async def ensure_policies(self, namespace: str, policies: Sequence[Mapping[str, Any]]) -> None:
        """Put the chart's run-pod network policies (a NetworkPolicy; a CiliumNetworkPolicy for host names) into
        `namespace` before any run pod exists there, once per operator process and namespace; an existing one is
        brought back to the chart's spec."""
        if namespace in self.policed or not policies:
            return
        for policy in policies:
            body = {**policy, "metadata": {**policy.get("metadata", {}), "namespace": namespace}}
            group, _, version = str(body["apiVersion"]).rpartition("/")
            plural = POLICY_PLURALS[(body["apiVersion"], body["kind"])]  # OperatorConfig checked the kinds
            name = body["metadata"]["name"]
            try:
                await self.call(self.custom.create_namespaced_custom_object, group, version, namespace, plural, body)
            except Exception as exc:
                if _status_of(exc) != 409:
                    raise
                patch = {"metadata": {"labels": body["metadata"].get("labels", {})}, "spec": body["spec"]}
                await self.call(
                    self.custom.patch_namespaced_custom_object, group, version, namespace, plural, name, patch
                )
        self.policed.add(namespace)

    async def delete_run_objects(self, namespace: str, run: str, *, claim: bool) -> int:
        """Delete a Run's pods, and its claim when the operator made one (`claim`: a claim per run; in emptyDir and
        shared-claim modes there is none, and the chart grants no right to delete claims); returns how many pods
        there were."""
        resp = await self.call(
            self.core.list_namespaced_pod, namespace, label_selector=f"{LABEL_RUN}={run}", _preload_content=False
        )
        pods = raw_json(resp).get("items") or []
        for pod in pods:
            try:
                await self.call(
                    self.core.delete_namespaced_pod, pod["metadata"]["name"], namespace, _preload_content=False
                )
            except Exception as exc:  # gone already (404) is the aim; anything else is logged, the rest go on
                if _status_of(exc) != 404:
                    name = pod["metadata"]["name"]
                    log.warning("run %s: deleting pod %s: %s", run, name, str(exc).splitlines()[0][:200])
        if not claim:
            return len(pods)
        try:
            await self.call(
                self.core.delete_namespaced_persistent_volume_claim, pvc_name(run), namespace, _preload_content=False
            )
        except Exception as exc:
            if _status_of(exc) not in (404, 405):
                log.warning("run %s: deleting its claim: %s", run, str(exc).splitlines()[0][:200])
        return len(pods)


# -- plain functions -----------------------------------------------------------------------------


def plan_resource_campaign(body: Mapping[str, Any]) -> tuple[CampaignSpec, list[RunSpec], dict[str, TaskCard]]:
    """The campaign a resource describes, its runs and each run's task card. Raises
    `CampaignSpecError` with a reason for the Campaign's condition."""
    from labkube.tasks import OverlayError, TaskError, resolve_campaign_tasks

    name = (body.get("metadata") or {}).get("name", "?")
    try:
        spec = campaign_resource_spec(body).to_campaign_spec()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(["spec", *(str(p) for p in err["loc"])])
        message = " ".join(err["msg"].removeprefix("Value error, ").split())
        raise CampaignSpecError("InvalidSpec", f"Campaign {name}: {where}: {message}") from None
    except (SchemaError, UnknownModel) as exc:
        raise CampaignSpecError("InvalidSpec", str(exc)) from None
    try:  # the overlays are checked here, against the tasks they apply to: the cards the runs' pods load
        cards = resolve_campaign_tasks(spec.tasks, spec.task_overlays)
    except TaskError as exc:
        reason = "InvalidOverlay" if isinstance(exc, OverlayError) else "UnknownTask"
        raise CampaignSpecError(reason, f"Campaign {name}: {' '.join(str(exc).split())}") from None
    for model in spec.models:
        if parse_model(model).provider == "oracle":
            missing = [c.ref for cs in cards.values() for c in cs if not (c.oracle or c.gaia or c.gaia2)]
            if missing:
                raise CampaignSpecError(
                    "NoReferenceSolution",
                    f"Campaign {name}: model oracle: task {missing[0]} ships no reference solution",
                )
    try:
        runs = expand_runs(spec, cards)
    except ValueError as exc:
        raise CampaignSpecError("InvalidSpec", f"Campaign {name}: {exc}") from None
    by_ref = {c.ref: c for cs in cards.values() for c in cs}
    return spec, runs, {r.run_id: by_ref[r.task] for r in runs}


def campaign_status(
    runs: Sequence[Mapping[str, Any]],
    *,
    previous: CampaignStatus,
    generation: int | None,
    held: int = 0,
    cap: float | None = None,
    done: bool = False,
) -> CampaignStatus:
    """`Campaign.status` from its Runs' statuses."""
    statuses = [RunStatus.model_validate(r.get("status") or {}) for r in runs]
    counts = RunCounts.of([s.phase for s in statuses])
    started = any(s.phase != RunPhase.pending for s in statuses)
    phase = CampaignPhase.finished if done else CampaignPhase.running if started else CampaignPhase.pending
    conditions = list(previous.conditions)
    if held:
        conditions = set_condition(
            conditions,
            "GpuHoursCapReached",
            True,
            "GpuHoursCapReached",
            f"{held} run(s) not started: the GPU-hour cap ({cap:g} h) is used up",
            observed_generation=generation,
        )
    conditions = set_condition(
        conditions,
        "Ready",
        done,
        "Finished" if done else "Running" if started else "Pending",
        f"{counts.progress} runs final" + (f", {held} held by the GPU-hour cap" if held else ""),
        observed_generation=generation,
    )
    return CampaignStatus(
        phase=phase,
        runs=counts,
        progress=counts.progress,
        gpu_hours_used=round(sum(s.gpu_hours for s in statuses), 6),
        observed_generation=generation,
        conditions=conditions,
    )


def _failed_status(previous: CampaignStatus, generation: int | None, reason: str, message: str) -> CampaignStatus:
    conditions = set_condition(previous.conditions, "Ready", False, reason, message, observed_generation=generation)
    return previous.model_copy(
        update={"phase": CampaignPhase.failed, "observed_generation": generation, "conditions": conditions}
    )


def _strip_times(status: dict[str, Any]) -> dict[str, Any]:
    return {**status, "conditions": [{**c, "lastTransitionTime": None} for c in status.get("conditions", [])]}


# -- the campaign daemon -------------------------------------------------------------------------


async def run_campaign(
    body: Mapping[str, Any],
    runtime: OperatorRuntime,
    api: ClusterApi,
    ray_ctx: RayContext,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger | logging.LoggerAdapter,  # type: ignore[type-arg]
    metrics: OperatorMetrics | None = None,
    fenced: threading.Event | None = None,
    runs_index: Mapping[tuple[str, str], Any] | None = None,
) -> None:
    """Drive one Campaign resource to the end (the daemon's body; see the module docstring). When `fenced` is set
    (this replica lost the leader lease), stop driving at once, as when the operator stops: pods keep running for
    the new leader to adopt."""
    import kopf

    meta = body.get("metadata") or {}
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
    generation = meta.get("generation")
    status = CampaignStatus.model_validate(body.get("status") or {})
    if status.phase in (CampaignPhase.finished, CampaignPhase.failed) and status.observed_generation == generation:
        return  # done before this operator started

    async def fail(reason: str, message: str) -> None:
        await api.patch_status(
            "campaigns", namespace, name, _failed_status(status, generation, reason, message).to_status()
        )
        raise kopf.PermanentError(message)

    try:
        spec, runs, cards = await asyncio.to_thread(plan_resource_campaign, body)
    except CampaignSpecError as exc:
        await fail(exc.reason, str(exc))
        return
    admitted = [run_resource_spec(r, cards[r.run_id], body) for r in runs]
    refused = admission_violations(admitted, runtime.config.runs, runtime.config.tenancy)
    if refused:
        await fail("Forbidden", f"Campaign {name}: " + "; ".join(refused))
        return
    cdir = CampaignDir(runtime.campaign_root(namespace, name))
    shared = runtime.backend(namespace).shared
    recorded = await api.runs_of(namespace, name)  # the API is the record; the campaign directory a cache
    try:
        cdir.check_compatible(spec)
        finished = restore_from_statuses(cdir, runs, recorded, shared=shared)
        cdir.write_campaign(spec, runs, keep=frozenset(i for i in finished if cdir.run_spec(i) is not None))
        write_admitted(cdir.root, admitted)
    except (StoreError, OSError) as exc:
        await fail("ResultsStoreConflict", f"Campaign {name}: {exc}")
        return
    await api.ensure_policies(namespace, runtime.config.run_policies)

    # a new leader finds the Runs listed above: creating them again is a thousand 409s before any pod is adopted
    existing = {str(r["metadata"]["name"]) for r in recorded}
    missing = [r for r in runs if run_name(name, r.run_id) not in existing]
    created = await _create_runs(api, body, missing, cards, admitted)
    if created:
        logger.info(f"campaign {name}: created {created} Run(s); results go to {cdir.root}")
    todo = [r for r in runs if r.run_id not in finished]
    held: dict[str, str] = {}
    marks: list[asyncio.Task[None]] = []
    telemetry = metrics.telemetry(namespace, name, spec.gpu_hours_cap) if metrics is not None else None
    gpus = {r.run_id: r.gpus for r in runs}

    def on_result(result: RunResult) -> None:
        if not result.final and (result.error or "").startswith(HELD):
            held[result.run_id] = result.error or ""
            marks.append(asyncio.create_task(_mark_held(api, namespace, spec.name, result, generation)))

    async def refresh(done: bool = False) -> CampaignStatus:
        nonlocal status
        # kopf's index of Runs (fed by its watch) when the daemon has one; a LIST only without it (and at the end).
        objs = list(runs_index.get((namespace, name), [])) if runs_index is not None and not done else None
        if objs is None:
            objs = await api.runs_of(namespace, name)
        new = campaign_status(
            objs, previous=status, generation=generation, held=len(held), cap=spec.gpu_hours_cap, done=done
        )
        if telemetry is not None:  # before the status: whoever sees the campaign Finished sees it in /metrics too
            from labkube.report import report_rows

            telemetry.update(await asyncio.to_thread(report_rows, cdir), gpus)
        if _strip_times(new.to_status()) != _strip_times(status.to_status()):
            await api.patch_status("campaigns", namespace, name, new.to_status())
        status = new
        return new

    backend = runtime.backend(namespace).model_dump(mode="json")
    driving = asyncio.create_task(
        drive(
            todo,
            cdir.root,
            ray_ctx,
            spec.concurrency,
            on_result,
            on_waiting=telemetry.waiting_for_gpus if telemetry is not None else None,
            backend=backend,
            gpu_hours_cap=spec.gpu_hours_cap,
        )
    )
    stopping = asyncio.ensure_future(_either(stopped, fenced))
    try:
        while not driving.done() and not stopping.done():
            try:
                await refresh()
            except Exception as exc:  # the API unreachable, a conflict: retried on the next tick, and said
                why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                log.warning("campaign %s/%s: refreshing its status: %s", namespace, name, why)
            await asyncio.wait([driving, stopping], timeout=runtime.status_interval_s)
    finally:
        stopping.cancel()
        if not driving.done():
            driving.cancel()
            try:
                await driving
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # the drive failed as it was being stopped: said, not raised over the stop
                log.warning("campaign %s/%s: its drive ended with %s: %s", namespace, name, type(exc).__name__, exc)
    if stopped.is_set() or (fenced is not None and fenced.is_set()):
        return
    try:
        driving.result()
    except DriverError as exc:  # e.g. Ray workers dying: not the spec's fault; try again (pods are adopted)
        conditions = set_condition(
            status.conditions, "Ready", False, "DriverError", str(exc), observed_generation=generation
        )
        await api.patch_status(
            "campaigns", namespace, name, status.model_copy(update={"conditions": conditions}).to_status()
        )
        raise kopf.TemporaryError(f"campaign {name}: {exc}", delay=30) from None
    await asyncio.gather(*marks, return_exceptions=True)
    if not shared:  # a shared volume's result.json may be an agent's: only a grading pod's report is final there
        await _publish_final_results(api, namespace, name, runs, cdir)
    final = await refresh(done=True)
    logger.info(f"campaign {name}: finished ({final.progress} runs final); results in {cdir.root}")


async def _either(stopped: kopf.DaemonStopped, fenced: threading.Event | None, every_s: float = 0.5) -> None:
    """Until the daemon is stopped or this replica is fenced."""
    while not stopped.is_set():
        if fenced is not None and fenced.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), every_s)


async def _create_runs(
    api: ClusterApi,
    campaign: Mapping[str, Any],
    runs: list[RunSpec],
    cards: dict[str, TaskCard],
    admitted: list[RunResourceSpec],
) -> int:
    """Create the Runs that do not exist yet (with a Pending status); returns how many were new."""
    limit = asyncio.Semaphore(16)
    created = 0
    specs = {a.run_id: a for a in admitted}

    async def one(run: RunSpec) -> None:
        nonlocal created
        obj = build_run_resource(run, cards[run.run_id], campaign, specs[run.run_id])
        async with limit:
            if await api.create_run(obj):
                created += 1
                meta = obj["metadata"]
                await api.patch_status("runs", meta["namespace"], meta["name"], RunStatus().to_status())

    await asyncio.gather(*(one(r) for r in runs))
    return created


async def _publish_final_results(
    api: ClusterApi, namespace: str, campaign: str, runs: list[RunSpec], cdir: CampaignDir
) -> None:
    """A Run whose result the operator recorded (from its grading pod's report) but whose status is not final (its
    supervisor's last status patch was lost: the API kept refusing it, or the operator stopped right after the
    result) gets its final status from the result, as `PodRun.finish` would have written it. Only without a
    shared volume, where the operator's run directory is its own."""
    from labkube.operator.crds import run_name

    objs = {o["metadata"]["name"]: o for o in await api.runs_of(namespace, campaign)}
    for run in runs:
        obj = objs.get(run_name(campaign, run.run_id))
        status = RunStatus.model_validate((obj or {}).get("status") or {})
        if obj is None or status.phase.final:
            continue
        result = cdir.result(run.run_id)
        if result is None or not result.final:
            continue
        ledger = read_model(ledger_path(cdir.root, run.run_id), PodLedger)
        final = status.model_copy(
            update={
                "phase": result.status,
                "score": result.score,
                "tokens": result.spend.usage.total,
                "cost_usd": rounded_usd(result.spend.cost_usd),
                "gpu_hours": round(ledger.gpu_hours(), 6) if ledger is not None else status.gpu_hours,
                "stop_reason": result.stop_reason,
                "outcome": result.outcome,
                "report": report_of(result),
                "pod_times": ledger.to_status() if ledger is not None else status.pod_times,
            }
        )
        log.warning("run %s: its final status was not published; publishing it from result.json", run.run_id)
        await api.patch_status("runs", namespace, run_name(campaign, run.run_id), final.to_status())


async def _mark_held(api: ClusterApi, namespace: str, campaign: str, result: RunResult, generation: int | None) -> None:
    from labkube.operator.crds import run_name

    conditions: list[Condition] = set_condition([], "Started", False, "GpuHoursCapReached", result.error or "")
    status = RunStatus(phase=RunPhase.pending, conditions=conditions, observed_generation=None)
    await api.patch_status("runs", namespace, run_name(campaign, result.run_id), status.to_status())


# -- the handlers ---------------------------------------------------------------------------------


def build_registry(
    runtime: OperatorRuntime,
    ray_ctx: RayContext,
    metrics: OperatorMetrics | None = None,
    fenced: threading.Event | None = None,
) -> kopf.OperatorRegistry:
    """kopf handlers bound to this runtime (see the module docstring); campaign series go to `metrics`; campaign
    daemons stop driving once `fenced` is set (the leader lease is lost)."""
    import kopf

    registry = kopf.OperatorRegistry()
    api = ClusterApi(runtime.kube)
    driving: set[tuple[str, str]] = set()  # campaigns whose daemon (and Ray supervisors) still run

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.level = logging.WARNING  # Kubernetes Events for problems, not for every handler
        settings.watching.server_timeout = 300

    @kopf.on.cleanup(registry=registry)
    def close(**_: Any) -> None:
        api.close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        try:
            return connection_info(runtime.kube)
        except KubeError as exc:
            raise kopf.LoginError(str(exc)) from None

    @kopf.index(GROUP, VERSION, "runs", registry=registry, id="runs_by_campaign")
    def runs_by_campaign(
        namespace: str | None, labels: kopf.Labels, name: str, status: kopf.Status, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]] | None:
        """Every Run's status by (namespace, campaign), kept current by kopf's one watch of Runs."""
        campaign = labels.get(LABEL_CAMPAIGN)
        if not campaign:
            return None
        return {(namespace or "default", campaign): {"metadata": {"name": name}, "status": dict(status)}}

    @kopf.daemon(
        GROUP, VERSION, "campaigns", registry=registry, backoff=5, cancellation_backoff=10, cancellation_timeout=20
    )
    async def campaign(
        body: kopf.Body,
        name: str,
        namespace: str | None,
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        runs_by_campaign: kopf.Index[tuple[str, str], dict[str, Any]],
        **_: Any,
    ) -> None:
        key = (namespace or "default", name)
        driving.add(key)
        try:
            if fenced is not None and fenced.is_set():
                return  # not the leader any more: the new one drives this campaign
            await run_campaign(dict(body), runtime, api, ray_ctx, stopped, logger, metrics, fenced, runs_by_campaign)
        finally:
            driving.discard(key)

    @kopf.on.delete(GROUP, VERSION, "campaigns", registry=registry)
    async def campaign_deleted(name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
        namespace = namespace or "default"
        if (namespace, name) in driving:  # first stop supervising, so no supervisor replaces a deleted pod
            raise kopf.TemporaryError(f"campaign {name}: waiting for its supervisors to stop", delay=1)
        runs = await api.runs_of(namespace, name)
        for run in runs:
            if not (run.get("metadata") or {}).get("deletionTimestamp"):
                await api.delete_run(namespace, run["metadata"]["name"])
                # its pods and claim now, not when the garbage collector gets to them
                claim = runtime.config.runs.workspace.claim_per_run
                await api.delete_run_objects(namespace, run["metadata"]["name"], claim=claim)
        if runs:
            raise kopf.TemporaryError(f"waiting for {len(runs)} Run(s) of campaign {name} to be deleted", delay=1)
        if metrics is not None:
            metrics.drop(namespace, name)
        logger.info(f"campaign {name}: runs and pods deleted; results kept in {runtime.campaign_root(namespace, name)}")

    return registry


def run_operator(
    runtime: OperatorRuntime, *, gpus: int | None = None, max_runs: int = 1000, verbose: bool = False
) -> None:
    """`labkube operator`: serve `/healthz` and `/metrics` from the start (`replica`), reach the API, win the leader
    lease, start (or join) Ray, run kopf while leading. Losing the lease (the API unreachable past the renew
    deadline, or another replica took it) fences this replica: kopf stops, its campaign daemons and supervisors end
    (pods keep running), and it stands by for the lease again in the same process, healthy, so an API outage is
    waited out rather than crashed through. SIGTERM/SIGINT: stop driving, release the lease (a standby takes it at
    once), exit."""
    import kopf

    from labkube.operator.kube import check_reachable

    kopf.configure(verbose=verbose or runtime.config.log_level == "debug", log_prefix=True)
    replica = ReplicaState()
    metrics = OperatorMetrics(replica)
    server = metrics.serve(runtime.config.metrics_port)
    ctx: RayContext | None = None
    try:
        with serve_health(runtime.config.health_port, replica):
            client = api_client(runtime.kube)
            check_reachable(client, runtime.kube)
            check_runs_root(runtime.runs_root)
            ctx = _lead_while_leader(runtime, client, replica, metrics, gpus=gpus, max_runs=max_runs)
    finally:
        server.shutdown()  # type: ignore[attr-defined]
        if ctx is not None:
            from labkube.operator.driver import shutdown

            shutdown(ctx)


def _lead_while_leader(
    runtime: OperatorRuntime,
    client: Any,
    replica: ReplicaState,
    metrics: OperatorMetrics,
    *,
    gpus: int | None,
    max_runs: int,
) -> RayContext | None:
    """Stand by, lead, and stand by again after every fence, until SIGTERM/SIGINT; returns the Ray context (to
    shut down) when one was made."""
    import kopf

    from labkube.operator.driver import connect

    election = runtime.config.leader_election
    elector = None
    if election.enabled:
        if runtime.namespace is None:
            raise OperatorError(
                "leader election needs the operator's namespace: set LABKUBE_OPERATOR_NAMESPACE "
                "(the chart does), or leaderElection.enabled: false for a single replica"
            )
        elector = LeaseElector(client, runtime.namespace, runtime.identity, election)
    terminating = threading.Event()
    ctx: RayContext | None = None
    while not terminating.is_set():
        _on_signals(terminating)  # kopf's own handlers replace these while it runs, and are removed after it
        lost = threading.Event()  # the lease was lost: fence, and stand by again
        fenced = threading.Event()  # stop driving (the lease lost, or SIGTERM): campaign daemons end within a second
        # kopf waits for a threading.Event stop flag in a thread of its loop's default executor, which the loop joins
        # when it closes: the flag must be set however kopf stops (fenced, or SIGTERM: the cleanup below), or kopf.run
        # never returns.
        stop_flag = threading.Event()
        done_leading = threading.Event()
        holding = None
        if elector is not None:
            replica.now("standing by for the leader lease", leader=False)
            if not asyncio.run(elector.acquire(terminating)):
                break
            holding = threading.Thread(
                target=_hold,
                args=(elector, replica, lost, fenced, stop_flag, done_leading),
                name="labkube-lease",
                daemon=True,
            )
            holding.start()
        if ctx is None:
            replica.now("leading; connecting to Ray", leader=True)
            pod_gpus = gpus if gpus is not None else cluster_gpus(client, runtime.config.runs.gpu_resource_name)
            ctx = connect(
                runtime.config.ray_address,
                max_runs,
                private=not runtime.config.ray_address,
                pod_gpus=pod_gpus,
                patience_s=RAY_CONNECT_PATIENCE_S,  # a RayCluster installed with the chart may still be starting
            )
        if not fenced.is_set() and not terminating.is_set():
            replica.now(LEADING, leader=True)
            registry = build_registry(runtime, ctx, metrics, fenced)
            stopped = _stopped(replica, elector, lost, stop_flag, done_leading, holding)
            kopf.on.cleanup(registry=registry, id="stopped_driving")(stopped)
            kopf.on.startup(registry=registry, id="heartbeat")(_beating(replica))
            kopf.on.startup(registry=registry, id="on_sigterm")(_signals_stop_driving(terminating, fenced, stop_flag))
            kopf.run(
                registry=registry,
                standalone=True,
                clusterwide=not runtime.config.namespaces,
                namespaces=runtime.config.namespaces,
                stop_flag=stop_flag,
            )
        # kopf has stopped: every campaign daemon ended and killed its supervisors, so this replica acts no more
        _on_signals(terminating)  # kopf removed its handlers: a second SIGTERM must not kill the clean-up below
        done_leading.set()
        if holding is not None:
            holding.join()
        if not lost.is_set() or terminating.is_set():  # SIGTERM/SIGINT, or kopf ended on its own
            terminating.set()
            if elector is not None:
                replica.now("shutting down; releasing the leader lease", leader=False)
                asyncio.run(elector.release())
            break
        log.error(
            "%s lost the leader lease %s/%s: fenced (driving nothing); standing by until the API answers again "
            "(the leader adopts the running pods)",
            runtime.identity,
            runtime.namespace,
            election.lease_name,
        )
        replica.now("fenced: lost the leader lease; standing by", leader=False)
    return ctx


def _hold(
    elector: LeaseElector,
    replica: ReplicaState,
    lost: threading.Event,
    fenced: threading.Event,
    stop_flag: threading.Event,
    done: threading.Event,
) -> None:
    """The lease thread: renew until `done`; on losing the lease, fence at once (campaign daemons stop driving
    within a second) and stop kopf, which may take longer while the API is down."""

    def on_lost() -> None:
        lost.set()
        fenced.set()
        replica.now("fenced: lost the leader lease; stopping", leader=False)
        stop_flag.set()

    asyncio.run(elector.hold(on_lost, done))


def _signals_stop_driving(
    terminating: threading.Event, fenced: threading.Event, stop_flag: threading.Event
) -> Callable[..., Any]:
    """Replaces kopf's SIGTERM/SIGINT handlers (a startup activity runs after kopf installed them): the campaign
    daemons stop driving at once (within their 0.5 s poll) rather than when kopf's shutdown reaches them, then kopf
    stops, then the lease is released (`_stopped`)."""

    async def on_sigterm(**_: Any) -> None:
        import signal

        def stop() -> None:
            terminating.set()
            fenced.set()
            stop_flag.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)

    return on_sigterm


def _beating(replica: ReplicaState) -> Callable[..., Any]:
    async def start_heartbeat(**_: Any) -> None:
        heartbeat(replica)

    return start_heartbeat


def _stopped(
    replica: ReplicaState,
    elector: LeaseElector | None,
    lost: threading.Event,
    stop_flag: threading.Event,
    done_leading: threading.Event,
    holding: threading.Thread | None,
) -> Callable[..., Any]:
    """kopf's cleanup: it runs once kopf has stopped its daemons (each ended its supervisors) and watchers, so this
    replica acts no more. On SIGTERM the lease is released here rather than when kopf's loop has wound down (which
    can wait seconds more for stray tasks): the hand-over of a rolling upgrade takes the standby's next try."""

    async def stopped_driving(**_: Any) -> None:
        stop_flag.set()
        if lost.is_set() or elector is None:
            return
        done_leading.set()
        if holding is not None:
            await asyncio.to_thread(holding.join)
        replica.now("shutting down; releasing the leader lease", leader=False)
        await elector.release()

    return stopped_driving


def _on_signals(terminating: threading.Event) -> None:
    """SIGTERM/SIGINT while not leading: stop standing by (nothing to hand over)."""
    import signal

    def handle(*_: Any) -> None:
        terminating.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


def cluster_gpus(client: Any, resource: str) -> int | None:
    """The cluster's allocatable GPUs, so Ray (not a queue of Pending pods) holds back runs beyond them. Read at
    start-up: a node added later counts after the operator restarts (a leader change does it too)."""
    from labkube.operator.kube import allocatable_gpus

    found = allocatable_gpus(client, resource)
    if found is None:
        log.warning(
            "cannot list nodes (RBAC): GPU runs are bounded by the Kubernetes scheduler alone; "
            "grant `list nodes` or pass --gpus N"
        )
    elif found:
        log.info("the cluster has %d allocatable %s; Ray hands them to runs", found, resource)
    else:
        log.info("the cluster has no allocatable %s: GPU runs get their pods and wait for the scheduler", resource)
    return found


def check_runs_root(root: Path) -> None:
    """Create the runs root, or say in one line why it cannot be used (`OperatorError`)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".labkube-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise OperatorError(
            f"runs root {root}: {why} (uid {os.getuid()}); mount a writable volume there "
            "(the chart mounts one at operator.runsRoot) or point operator.runsRoot at one"
        ) from None


# -- `labkube run --backend k8s` -------------------------------------------------------------------


def campaign_resource(spec: CampaignSpec, namespace: str) -> dict[str, Any]:
    """The Campaign object for a CLI campaign (checked against the CRD's schema)."""
    body = spec.model_dump(mode="json", exclude={"name", "backend"}, exclude_defaults=True)
    body["tasks"] = list(spec.tasks)
    body["backend"] = "k8s"
    obj = {
        "apiVersion": API_VERSION,
        "kind": "Campaign",
        "metadata": {"name": spec.name, "namespace": namespace},
        "spec": body,
    }
    validate_resource(obj, campaign_crd())
    return obj


def submit_campaign(client: ApiClient, spec: CampaignSpec, namespace: str) -> tuple[dict[str, Any], bool]:
    """Create the Campaign (or find the same one); returns (object, created). Raises `KubeError`
    when the CRD is missing and `CampaignExists` when a different campaign has the name."""
    from kubernetes.client import ApiException, CustomObjectsApi

    custom = CustomObjectsApi(client)
    obj = campaign_resource(spec, namespace)
    try:
        made = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", obj)
        return cast(dict[str, Any], made), True
    except ApiException as exc:
        if exc.status == 404:
            raise KubeError(
                f"the Campaign resource is not installed in the cluster (CRD campaigns.{GROUP}): "
                "helm install labkube helm/labkube"
            ) from None
        if exc.status != 409:
            raise KubeError(f"creating Campaign {spec.name} in {namespace}: {exc.status} {exc.reason}") from None
    existing = cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", spec.name)
    )
    theirs = campaign_resource_spec(existing).to_campaign_spec().model_dump(exclude={"concurrency", "backend"})
    if theirs != spec.model_dump(exclude={"concurrency", "backend"}):
        raise CampaignExists(
            f"Campaign {spec.name} already exists in namespace {namespace} with a different spec: "
            f"choose another --name, or `kubectl delete lkc {spec.name} -n {namespace}` (its results are kept)"
        )
    return existing, False


def read_campaign(client: ApiClient, namespace: str, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The Campaign object (None once deleted) and its Runs."""
    from kubernetes.client import ApiException, CustomObjectsApi

    custom = CustomObjectsApi(client)
    try:
        campaign = cast(
            dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", name)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None, []
        raise
    runs = cast(
        dict[str, Any],
        custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "runs", label_selector=f"{LABEL_CAMPAIGN}={name}"
        ),
    )
    return campaign, list(runs.get("items") or [])


def run_rows(runs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per Run for a status table: run id, phase, score, tokens, dollars, attempts, message."""
    rows = []
    for run in runs:
        status = RunStatus.model_validate(run.get("status") or {})
        problem = next((c for c in status.conditions if c.status == ConditionStatus.false), None)
        rows.append(
            {
                "run_id": (run.get("spec") or {}).get("run_id", run["metadata"]["name"]),
                "phase": status.phase.value,
                "score": status.score,
                "tokens": status.tokens,
                "cost_usd": status.cost_usd,
                "attempts": status.attempts,
                "pod": status.pod_name or "",
                "message": f"{problem.reason}: {problem.message}" if problem else "",
            }
        )
    return sorted(rows, key=lambda r: r["run_id"])
