"""The campaign daemon: what the operator does for one Campaign resource while it leads (`run_campaign`).

It reads the spec (`crds.campaign_resource_spec`, checked by `plan_resource_campaign`: the tasks, their overlays,
reference solutions for the oracle model), refuses what the tenancy rules forbid (`admission`), expands it with the
CLI's `expand_runs`, writes the campaign directory on the runs volume (`<runsRoot>/<namespace>/<campaign>/`, the
results store's layout) after restoring what the Run statuses record (`k8s_record`: the API is the record, the
directory a cache), creates one `Run` per run (`crds.build_run_resource`: owned by the Campaign), and hands the
unfinished runs to the Ray campaign driver (`driver.drive`) with a `K8sBackend`: the same driver as `labkube run`,
whose supervisors create and follow each run's pod (`k8s_backend`). Ray bounds concurrency (slots) and GPUs; the
campaign's GPU-hour cap holds back runs that would start past it (their Runs get a `Started=False` condition). The
daemon keeps `Campaign.status` (phase, runs by phase, progress, GPU-hours; `campaign_status`) and the campaign's
metrics current, and ends when every run is final (or held by the cap), or at once when the replica is fenced.

Live control (`k8s_control`): a run its supervisor returned paused has given back its slot and GPUs; the campaign
goes on while any run is paused, and a run whose Run is resumed (or cancelled) since is driven again, in a drive of
its own, once the campaign's concurrency leaves room. `spec.suspend` pauses every unfinished run by appending to its
Run (`follow_suspend`), and unsuspending resumes those.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from labkube.campaign import CampaignSpec, expand_runs
from labkube.model_ref import UnknownModel, parse_model
from labkube.operator.admission import admission_violations, read_admitted, write_admitted
from labkube.operator.cluster_api import ClusterApi
from labkube.operator.crds import SchemaError, build_run_resource, campaign_resource_spec, run_name, run_resource_spec
from labkube.operator.driver import HELD, DriverError, RayContext, drive
from labkube.operator.k8s_control import PAUSED, control_of
from labkube.operator.k8s_grading import report_of
from labkube.operator.k8s_ledger import PodLedger, ledger_path
from labkube.operator.k8s_models import (
    CampaignPhase,
    CampaignStatus,
    Condition,
    RunCounts,
    RunResourceSpec,
    RunStatus,
    set_condition,
    status_patch,
)
from labkube.operator.k8s_record import restore_from_statuses
from labkube.operator.kube import short_error
from labkube.operator.telemetry import OperatorMetrics
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec
from labkube.sandbox import SandboxMode
from labkube.store import CampaignDir, StoreError, read_model
from labkube.task_card import TaskCard

if TYPE_CHECKING:
    import kopf

    from labkube.operator.k8s_operator import OperatorRuntime

__all__ = ["CampaignSpecError", "campaign_status", "plan_resource_campaign", "run_campaign"]

log = logging.getLogger("labkube.operator")


class CampaignSpecError(ValueError):
    """A Campaign that cannot run as written (the message names the field and the fix)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
        # On a cluster each run's pod is its room, whatever the resource says of a local sandbox.
        runs = [r.model_copy(update={"sandbox": SandboxMode.pod}) for r in expand_runs(spec, cards)]
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
    live: Mapping[str, Any] | None = None,
) -> None:
    """Drive one Campaign resource to the end (the daemon's body; see the module docstring). When `fenced` is set
    (this replica lost the leader lease), stop driving at once, as when the operator stops: pods keep running for
    the new leader to adopt. `live`: the Campaign as kopf keeps it current (its `spec.suspend` is followed)."""
    import kopf

    meta = body.get("metadata") or {}
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
    generation = meta.get("generation")
    status = CampaignStatus.model_validate(body.get("status") or {})
    if status.phase in (CampaignPhase.finished, CampaignPhase.failed) and status.observed_generation == generation:
        return  # done before this operator started

    async def fail(reason: str, message: str) -> None:
        await api.patch_status(
            "campaigns",
            namespace,
            name,
            status_patch(status.to_status(), _failed_status(status, generation, reason, message).to_status()),
        )
        raise kopf.PermanentError(message)

    try:
        spec, runs, cards = await asyncio.to_thread(plan_resource_campaign, body)
    except CampaignSpecError as exc:
        await fail(exc.reason, str(exc))
        return
    from labkube.tasks import TaskError
    from labkube.tasks.manifest import keep_task_manifests, pin_task_digests

    try:  # the digest admitted when the campaign first started, else the task hashed now
        pinned_before = functools.partial(_admitted_digest, runtime.campaign_root(namespace, name))
        runs = await asyncio.to_thread(pin_task_digests, runs, cards.values(), pinned_before)
    except TaskError as exc:
        await fail("UnknownTask", f"Campaign {name}: {exc}")
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
        keep_task_manifests(cdir.root, [r for r in runs if r.run_id not in finished], cards.values())
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
    paused: dict[str, RunSpec] = {}  # runs whose supervisor returned them paused, until a resume or a cancel
    marks: list[asyncio.Task[None]] = []
    telemetry = metrics.telemetry(namespace, name, spec.gpu_hours_cap) if metrics is not None else None
    gpus = {r.run_id: r.gpus for r in runs}
    by_id = {r.run_id: r for r in runs}
    seen: list[Mapping[str, Any]] = []  # the Runs as the last refresh read them
    appended: dict[str, int] = {}  # Run -> its interventions' count when a suspend or an unsuspend was appended
    starting: set[str] = set()  # runs driven again, whose Runs may not show it yet

    def on_result(result: RunResult) -> None:
        if not result.final and (result.error or "").startswith(PAUSED):
            paused[result.run_id] = by_id[result.run_id]
            return
        if not result.final and (result.error or "").startswith(HELD):
            held[result.run_id] = result.error or ""
            marks.append(asyncio.create_task(_mark_held(api, namespace, spec.name, result, generation)))

    async def refresh(done: bool = False) -> CampaignStatus:
        nonlocal status
        # kopf's index of Runs (fed by its watch) when the daemon has one; a LIST only without it (and at the end).
        objs = list(runs_index.get((namespace, name), [])) if runs_index is not None and not done else None
        if objs is None:
            objs = await api.runs_of(namespace, name)
        seen[:] = objs
        new = campaign_status(
            objs, previous=status, generation=generation, held=len(held), cap=spec.gpu_hours_cap, done=done
        )
        if telemetry is not None:  # before the status: whoever sees the campaign Finished sees it in /metrics too
            from labkube.operator.k8s_ledger import campaign_ledger_totals
            from labkube.report import report_rows

            rows = await asyncio.to_thread(report_rows, cdir)
            gpu_seconds, lost = await asyncio.to_thread(campaign_ledger_totals, cdir.root, list(gpus))
            from labkube.operator.telemetry import interventions_by_kind

            telemetry.update(rows, gpus, gpu_seconds, pods_lost=lost, interventions=interventions_by_kind(objs))
        if _strip_times(new.to_status()) != _strip_times(status.to_status()):
            await api.patch_status("campaigns", namespace, name, status_patch(status.to_status(), new.to_status()))
        status = new
        return new

    backend = runtime.backend(namespace).model_dump(mode="json")

    def start(runs_now: list[RunSpec]) -> asyncio.Task[list[RunResult]]:
        return asyncio.create_task(
            drive(
                runs_now,
                cdir.root,
                ray_ctx,
                spec.concurrency,
                on_result,
                on_waiting=telemetry.waiting_for_gpus if telemetry is not None else None,
                backend=backend,
                gpu_hours_cap=spec.gpu_hours_cap,
            )
        )

    # A paused run's supervisor has returned (its slot and GPUs freed): the campaign goes on while any run is paused,
    # and a run resumed (or cancelled) is driven again, in a drive of its own.
    drives = [start(todo)]
    stopping = asyncio.ensure_future(_either(stopped, fenced))
    try:
        while (paused or not all(d.done() for d in drives)) and not stopping.done():
            try:
                await refresh()
            except Exception as exc:  # the API unreachable, a conflict: retried on the next tick, and said
                why = short_error(exc)
                log.warning("campaign %s/%s: refreshing its status: %s", namespace, name, why)
            if live is not None:
                try:
                    await follow_suspend(api, live, seen, appended)
                except Exception as exc:  # said, and tried again on the next tick
                    log.warning("campaign %s/%s: following spec.suspend: %s", namespace, name, short_error(exc))
            # at most as many as the campaign's concurrency leaves room for (the others on a later tick)
            room = spec.concurrency - _busy(seen, starting)
            if released := _released(seen, paused)[: max(0, room)]:
                logger.info(f"campaign {name}: run(s) {', '.join(released)} resumed or cancelled; driving them again")
                starting.update(released)
                drives.append(start([paused.pop(i) for i in released]))
            if any(d.done() and d.exception() is not None for d in drives if not d.cancelled()):
                break
            going = [d for d in drives if not d.done()]
            await asyncio.wait([*going, stopping], timeout=runtime.status_interval_s)
    finally:
        stopping.cancel()
        for driving in drives:
            if driving.done():
                continue
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
        for driving in drives:
            if not driving.cancelled():
                driving.result()
    except DriverError as exc:  # e.g. Ray workers dying: not the spec's fault; try again (pods are adopted)
        conditions = set_condition(
            status.conditions, "Ready", False, "DriverError", str(exc), observed_generation=generation
        )
        await api.patch_status(
            "campaigns", namespace, name, {"conditions": [c.model_dump(mode="json") for c in conditions]}
        )
        raise kopf.TemporaryError(f"campaign {name}: {exc}", delay=30) from None
    await asyncio.gather(*marks, return_exceptions=True)
    if not shared:  # a shared volume's result.json may be an agent's: only a grading pod's report is final there
        await _publish_final_results(api, namespace, name, runs, cdir)
    final = await refresh(done=True)
    logger.info(f"campaign {name}: finished ({final.progress} runs final); results in {cdir.root}")


SUSPEND_BY = "Campaign spec.suspend"


async def follow_suspend(
    api: ClusterApi, campaign: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], appended: dict[str, int]
) -> None:
    """`spec.suspend` as a Job has it: while true, every unfinished Run not paused or cancelled gets a pause by
    `SUSPEND_BY`; once false, every Run whose pause in force is that one gets a resume. Stateless (read from the
    Runs), so a new leader carries it on. `appended`: Runs appended to whose new entry the Runs as read
    (`runs`, kopf's index) may not show yet, by their count of interventions then."""
    from labkube.interventions import Intervention, InterventionKind

    meta = campaign.get("metadata") or {}
    suspend = bool((campaign.get("spec") or {}).get("suspend"))
    for obj in runs:
        name = str((obj.get("metadata") or {}).get("name"))
        spec = obj.get("spec") or {}
        count = len(spec.get("interventions") or [])
        if appended.get(name, -1) >= count or RunStatus.model_validate(obj.get("status") or {}).phase.final:
            continue
        control = control_of(obj)
        paused = control.paused
        if control.cancelled is not None:
            continue
        if suspend and paused is None:
            kind, why = InterventionKind.pause, f"Campaign {meta.get('name')} suspended"
        elif not suspend and paused is not None and paused.by == SUSPEND_BY:
            kind, why = InterventionKind.resume, f"Campaign {meta.get('name')} no longer suspended"
        else:
            continue
        made = Intervention(kind=kind, by=SUSPEND_BY, reason=why)
        await api.append_intervention(str(meta.get("namespace") or "default"), name, made.model_dump(mode="json"))
        appended[name] = count


BUSY = frozenset({RunPhase.starting, RunPhase.running, RunPhase.grading})


def _busy(runs: Sequence[Mapping[str, Any]], starting: set[str]) -> int:
    """Runs that hold a slot of the campaign's concurrency: with a pod, or driven again and not yet showing it (no
    longer `Paused`: then they count by their phase). `starting` is pruned of those."""
    busy = 0
    for obj in runs:
        run_id = str((obj.get("spec") or {}).get("run_id") or "")
        phase = RunStatus.model_validate(obj.get("status") or {}).phase
        if run_id in starting and phase is not RunPhase.paused:
            starting.discard(run_id)
        busy += phase in BUSY or run_id in starting
    return busy


def _released(runs: Sequence[Mapping[str, Any]], paused: Mapping[str, RunSpec]) -> list[str]:
    """The paused runs whose Run is paused no more (a resume, or a cancel, was appended since): to drive again."""
    if not paused:
        return []
    found = []
    for obj in runs:
        run_id = str((obj.get("spec") or {}).get("run_id") or "")
        if run_id not in paused:
            continue
        control = control_of(obj, run_id)
        if control.paused is None or control.cancelled is not None:
            found.append(run_id)
    return sorted(found)


def _admitted_digest(campaign_root: Path, run_id: str) -> str | None:
    """The task digest the operator admitted for a run when its campaign first started (the campaign directory's
    `admitted/`, which no tenant or agent writes; a Run's own spec is a tenant's to edit)."""
    admitted = read_admitted(campaign_root, run_id)
    return admitted.task_digest if admitted is not None else None


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
                await api.patch_status(
                    "runs", meta["namespace"], meta["name"], status_patch({}, RunStatus().to_status())
                )

    await asyncio.gather(*(one(r) for r in runs))
    return created


async def _publish_final_results(
    api: ClusterApi, namespace: str, campaign: str, runs: list[RunSpec], cdir: CampaignDir
) -> None:
    """A Run whose result the operator recorded (from its grading pod's report) but whose status is not final (its
    supervisor's last status patch was lost: the API kept refusing it, or the operator stopped right after the
    result) gets its final status from the result, as `PodRun.finish` would have written it. Only without a
    shared volume, where the operator's run directory is its own."""
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
                "gpu_hours": round(ledger.gpu_hours(), 6) if ledger is not None else status.gpu_hours,
                "stop_reason": result.stop_reason,
                "outcome": result.outcome,
                "report": report_of(result),
                "pod_times": ledger.to_status() if ledger is not None else status.pod_times,
            }
        )
        final.show_spend(result.spend)
        log.warning("run %s: its final status was not published; publishing it from result.json", run.run_id)
        patch = status_patch(status.to_status(), final.to_status())  # what the result changes, nothing else
        await api.patch_status("runs", namespace, run_name(campaign, run.run_id), patch)


async def _mark_held(api: ClusterApi, namespace: str, campaign: str, result: RunResult, generation: int | None) -> None:
    conditions: list[Condition] = set_condition([], "Started", False, "GpuHoursCapReached", result.error or "")
    status = RunStatus(phase=RunPhase.pending, conditions=conditions)
    # the phase and why, nothing else: the Run's pod times, GPU-hours and spend stay as recorded
    patch = {k: v for k, v in status.to_status().items() if k in ("phase", "conditions")}
    await api.patch_status("runs", namespace, run_name(campaign, result.run_id), patch)
