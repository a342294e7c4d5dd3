"""`labkube operator`: kopf handlers for the `Campaign` and `Run` resources.

    Campaign ──owns──▶ Run ──owns──▶ Pod <run>-<attempt>   (+ PVC <run>-runs in per-run claim mode)

- A **daemon per Campaign** (`campaign_daemon.run_campaign`) checks and expands the spec, writes the
  campaign directory, creates one `Run` per run and hands the unfinished runs to the Ray campaign
  driver, whose supervisors create and follow each run's pod (`k8s_backend`); it keeps
  `Campaign.status` current and ends when every run is final (or held by the GPU-hour cap).
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
operator's configuration reaches them without module globals; `labkube operator` (`run_operator`: health and
metrics from the start, the leader lease, Ray, then kopf while leading) passes it to `kopf.run`, tests to
`kopf.testing.KopfRunner(..., registry=...)`. Their API calls go through `cluster_api`; the operator's
`/metrics` is `telemetry.OperatorMetrics`; `labkube run --backend k8s` submits a Campaign with `k8s_submit`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from labkube.operator.campaign_daemon import run_campaign
from labkube.operator.cluster_api import ClusterApi
from labkube.operator.crds import GROUP, LABEL_CAMPAIGN, VERSION, crds_problem
from labkube.operator.driver import PodGpus, RayContext, connect, pod_gpus, shutdown
from labkube.operator.driver_errors import DriverError
from labkube.operator.k8s_backend import K8sBackend
from labkube.operator.k8s_models import OperatorConfig
from labkube.operator.kube import (
    REQUEST_TIMEOUT,
    KubeError,
    KubeTarget,
    allocatable_gpus,
    api_client,
    backoff_delay,
    check_reachable,
    connection_info,
    last_answer,
    node_gpu_figures,
    short_error,
)
from labkube.operator.leader import LeaseElector
from labkube.operator.replica import LEADING, ReplicaState, heartbeat, serve_health
from labkube.operator.telemetry import OperatorMetrics

if TYPE_CHECKING:
    import kopf

__all__ = [
    "OperatorError",
    "OperatorRuntime",
    "build_registry",
    "check_runs_root",
    "cluster_gpus",
    "run_operator",
    "wait_for_current_crds",
]

log = logging.getLogger("labkube.operator")

DEFAULT_RUNS_ROOT = Path("/runs")
RAY_CONNECT_PATIENCE_S = 120.0
CRD_RECHECK_S = 10.0
API_WINDOW_LEASES = 2.0  # /healthz fails after this many lease durations without an answer from the API server


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
    image_pull_timeout_s: float | None = Field(
        default=None, gt=0, description="Overrides the chart's runs.imagePullTimeoutSeconds (tests); None: the chart's."
    )

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


class OperatorError(RuntimeError):
    """The operator cannot start here (the message says what to change)."""


# -- the handlers ---------------------------------------------------------------------------------


def build_registry(
    runtime: OperatorRuntime,
    ray_ctx: RayContext,
    metrics: OperatorMetrics | None = None,
    fenced: threading.Event | None = None,
    read_node_gpus: bool = True,
) -> kopf.OperatorRegistry:
    """kopf handlers bound to this runtime (see the module docstring); campaign series go to `metrics`; campaign
    daemons stop driving once `fenced` is set (the leader lease is lost); `read_node_gpus`: the run pods' GPUs
    (`driver.PodGpus`) are the nodes' allocatable ones, read as leading starts and every `NODE_GPUS_EVERY_S` (off:
    the figure the operator was given, `--gpus`)."""
    import kopf

    registry = kopf.OperatorRegistry()
    api = ClusterApi(runtime.kube)
    driving: set[tuple[str, str]] = set()  # campaigns whose daemon (and Ray supervisors) still run
    background: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry, id="node_gpus")
    async def node_gpus(**_: Any) -> None:
        gate = pod_gpus(ray_ctx)
        if read_node_gpus:
            await refresh_node_gpus(runtime, gate)  # before any campaign takes GPUs: a new leader's own reading
            background.append(asyncio.create_task(keep_node_gpus(runtime, gate)))

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.level = logging.WARNING  # Kubernetes Events for problems, not for every handler
        settings.watching.server_timeout = 300
        # bounded, as every call of the `kubernetes` client is (`kube.REQUEST_TIMEOUT`): a watch outlives its
        # server-side timeout by a minute, any other request has a minute in all
        settings.networking.connect_timeout = REQUEST_TIMEOUT[0]
        settings.networking.request_timeout = 2 * REQUEST_TIMEOUT[1]
        settings.watching.connect_timeout = REQUEST_TIMEOUT[0]
        settings.watching.client_timeout = settings.watching.server_timeout + 60

    @kopf.on.cleanup(registry=registry)
    def close(**_: Any) -> None:
        for task in background:
            task.cancel()
        api.close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        try:
            return connection_info(runtime.kube)
        except KubeError as exc:
            raise kopf.LoginError(str(exc)) from None

    @kopf.index(GROUP, VERSION, "runs", registry=registry, id="runs_by_campaign")
    def runs_by_campaign(
        namespace: str | None, labels: kopf.Labels, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]] | None:
        """Every Run's status and interventions by (namespace, campaign), kept current by kopf's one watch of Runs."""
        campaign = labels.get(LABEL_CAMPAIGN)
        if not campaign:
            return None
        mine = {"run_id": spec.get("run_id"), "interventions": list(spec.get("interventions") or [])}
        return {(namespace or "default", campaign): {"metadata": {"name": name}, "spec": mine, "status": dict(status)}}

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
            await run_campaign(
                dict(body), runtime, api, ray_ctx, stopped, logger, metrics, fenced, runs_by_campaign, live=body
            )
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
                await api.delete_run_objects(
                    namespace, run["metadata"]["name"], uid=run["metadata"]["uid"], claim=claim
                )
        if runs:
            raise kopf.TemporaryError(f"waiting for {len(runs)} Run(s) of campaign {name} to be deleted", delay=1)
        if metrics is not None:
            metrics.drop(namespace, name)
        logger.info(f"campaign {name}: runs and pods deleted; results kept in {runtime.campaign_root(namespace, name)}")

    return registry


def run_operator(
    runtime: OperatorRuntime, *, gpus: int | None = None, max_runs: int = 1000, verbose: bool = False
) -> None:
    """`labkube operator`: serve `/healthz` and `/metrics` from the start (`replica`), wait for the API (`wait_for`:
    logged, and 503 on `/healthz`, as are the node list and Ray later; `/healthz` also fails after two lease
    durations without an answer from the API), refuse to lead
    while the installed CRDs are older than this operator (`wait_for_current_crds`), win the leader lease, start (or
    join) Ray, run kopf while leading. Losing the lease (the API unreachable past the renew deadline, or another
    replica took it) fences this replica: kopf stops, its campaign daemons and supervisors end (pods keep running),
    and it stands by for the lease again in the same process, healthy, so an API outage is waited out rather than
    crashed through. SIGTERM/SIGINT: stop driving, release the lease (a standby takes it at
    once), exit."""
    import kopf

    kopf.configure(verbose=verbose or runtime.config.log_level == "debug", log_prefix=True)
    window_s = API_WINDOW_LEASES * runtime.config.leader_election.lease_s
    replica = ReplicaState(api_window_s=window_s, answered_at=last_answer)
    metrics = OperatorMetrics(replica)
    server = metrics.serve(runtime.config.metrics_port)
    ctx: RayContext | None = None
    terminating = threading.Event()
    _on_signals(terminating)
    try:
        with serve_health(runtime.config.health_port, replica):
            client = api_client(runtime.kube)
            check_runs_root(runtime.runs_root)
            where = f"the Kubernetes API at {runtime.kube.describe()}"
            wait_for(where, lambda: check_reachable(client, runtime.kube), replica, terminating.is_set)
            if terminating.is_set():
                return
            pinging = threading.Thread(
                target=_keep_answered, args=(client, window_s / 3, terminating), name="labkube-api-ping", daemon=True
            )
            pinging.start()
            ctx = _lead_while_leader(
                runtime, client, replica, metrics, gpus=gpus, max_runs=max_runs, terminating=terminating
            )
    finally:
        server.shutdown()  # type: ignore[attr-defined]
        if ctx is not None:
            shutdown(ctx)


def _lead_while_leader(
    runtime: OperatorRuntime,
    client: Any,
    replica: ReplicaState,
    metrics: OperatorMetrics,
    *,
    gpus: int | None,
    max_runs: int,
    terminating: threading.Event | None = None,
) -> RayContext | None:
    """Stand by, lead, and stand by again after every fence, until SIGTERM/SIGINT (`terminating`); returns the Ray
    context (to shut down) when one was made."""
    import kopf

    election = runtime.config.leader_election
    elector = None
    if election.enabled:
        if runtime.namespace is None:
            raise OperatorError(
                "leader election needs the operator's namespace: set LABKUBE_OPERATOR_NAMESPACE "
                "(the chart does), or leaderElection.enabled: false for a single replica"
            )
        elector = LeaseElector(client, runtime.namespace, runtime.identity, election)
    terminating = terminating or threading.Event()
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
        if not wait_for_current_crds(client, replica, terminating):
            break
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
            ctx = _connect_ray(runtime, client, replica, gpus, max_runs, (fenced, terminating))
            _on_signals(terminating)  # ray.init installed its own SIGTERM handler, which aborts the process
        if ctx is not None and not fenced.is_set() and not terminating.is_set():
            replica.now(LEADING, leader=True)
            registry = build_registry(runtime, ctx, metrics, fenced, read_node_gpus=gpus is None)
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
        metrics.drop_all()  # a replica that drives nothing serves no campaign's series (the leader serves them)
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


def _connect_ray(
    runtime: OperatorRuntime,
    client: Any,
    replica: ReplicaState,
    gpus: int | None,
    max_runs: int,
    stop_on: tuple[threading.Event, ...],
) -> RayContext | None:
    """Read the cluster's GPUs (unless given) and start or join Ray, each waited for until it answers (`wait_for`);
    None once one of `stop_on` is set (the lease lost, or SIGTERM)."""

    def stop() -> bool:
        return any(e.is_set() for e in stop_on)

    def gpu_count() -> int | None:
        return cluster_gpus(client, runtime.config.runs.gpu_resource_name)

    pod_gpus = gpus if gpus is not None else wait_for("the node list", gpu_count, replica, stop)
    if stop():
        return None

    def join() -> RayContext:
        return connect(
            runtime.config.ray_address,
            max_runs,
            private=not runtime.config.ray_address,
            pod_gpus=pod_gpus,
            patience_s=RAY_CONNECT_PATIENCE_S,  # a RayCluster installed with the chart may still be starting
        )

    where = f"Ray at {runtime.config.ray_address or 'this machine (embedded)'}"
    ctx: RayContext | None = wait_for(where, join, replica, stop, errors=(DriverError,))
    return ctx


def wait_for(
    what: str,
    attempt: Callable[[], Any],
    replica: ReplicaState,
    stop: Callable[[], bool],
    *,
    errors: tuple[type[BaseException], ...] = (Exception,),
    first_delay_s: float = 1.0,
    cap_s: float = 30.0,
) -> Any:
    """`attempt()`'s result once it succeeds; None once `stop()` says so (callers ask it). Until then this replica
    waits and tries again with capped back-off (start-up without the API, the node list or Ray is waited out, not
    exited): it logs "waiting for <what>: <reason>" once per new reason, and `/healthz` answers 503 with that line."""
    said = None
    tries = 0
    while not stop():
        try:
            result = attempt()
        except errors as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            if status := getattr(exc, "status", None):  # an ApiException: its first line is only "(503)"
                reason = f"the API answered {status} {getattr(exc, 'reason', None) or ''}".strip()
            line = f"waiting for {what}: {reason}"
            if line != said:
                log.error("%s; trying again", line)
                said = line
            replica.refuse(line)
            deadline = time.monotonic() + backoff_delay(tries, first_delay_s, cap_s)
            tries += 1
            while not stop() and time.monotonic() < deadline:
                time.sleep(0.1)
            continue
        if said is not None:
            log.info("%s answers: going on", what)
            replica.now(f"{what} answers; going on", leader=False)
        return result
    return None


def _keep_answered(client: Any, every_s: float, stop: threading.Event) -> None:
    """Ask the API server for its version whenever nothing else of this process had an answer for `every_s`, so
    `/healthz` (`ReplicaState.api_silent`) tells a replica that can reach the API from one that cannot, even one
    with nothing to do (leader election off, no campaign). Every call is bounded (`kube.REQUEST_TIMEOUT`)."""
    from kubernetes.client import VersionApi

    while not stop.wait(max(0.2, every_s / 2)):
        if time.monotonic() - last_answer() < every_s:
            continue
        try:
            VersionApi(client).get_code()
        except Exception as exc:  # silence is what /healthz reports; the lease loop logs the outage
            log.debug("kubernetes API: %s", short_error(exc))


def wait_for_current_crds(
    client: Any, replica: ReplicaState, stop: threading.Event, every_s: float = CRD_RECHECK_S
) -> bool:
    """Until the installed CRDs hold what this operator writes (True), or `stop` is set (False). Until then this
    replica refuses to lead, before it stands by for the lease (an older replica with CRDs of its own age leads on):
    it says why in one error line naming `labkube crds apply` (again only when the reason changes), `/healthz`
    answers 503 with that line, and it checks again every `every_s`, so it goes on once the CRDs are applied."""
    said = None
    while not stop.is_set():
        wait_s = every_s
        try:
            problem = crds_problem(client)
        except Exception as exc:  # the API unreachable or refusing: not leading on CRDs nobody checked
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            problem = f"waiting for the API to check the installed CRDs ({first}); not leading until it can"
            wait_s = min(every_s, 2.0)
        if problem is None:
            if said is not None:
                log.info("the installed CRDs hold what this operator writes: going on")
            return True
        if problem != said:
            log.error("%s", problem)
            said = problem
        if problem.startswith("waiting for the API"):
            # an outage, not a refusal: /healthz stays 200 while the API answers at all (errors included) and
            # fails once it has not answered for its window (`ReplicaState.api_silent`), as everywhere else
            replica.now(problem, leader=False)
        else:
            replica.refuse(problem)
        deadline = time.monotonic() + wait_s
        while not stop.is_set() and time.monotonic() < deadline:
            stop.wait(0.2)
    return False


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
        if terminating.is_set():  # a SIGTERM came between Ray's start and these handlers
            stop()

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


NODE_GPUS_EVERY_S = 60.0  # how often the leader reads the nodes' allocatable GPUs again


async def refresh_node_gpus(runtime: OperatorRuntime, gate: PodGpus) -> None:
    """Read the nodes' allocatable GPUs (in all, and the largest node's) into `gate`; the figures stay as they were
    when the nodes cannot be read (said in the log)."""
    resource = runtime.config.runs.gpu_resource_name

    def read() -> tuple[int, int] | None:
        client = api_client(runtime.kube)
        try:
            return node_gpu_figures(client, resource)
        finally:
            client.close()

    try:
        figures = await asyncio.to_thread(read)
    except Exception as exc:
        log.warning("nodes not read for their GPUs (%s); keeping %g in all, %g on the largest node",
                    short_error(exc), gate.total, gate.largest)  # fmt: skip
        return
    if figures is None:
        return  # no right to list nodes: said at start-up (`cluster_gpus`)
    total, largest = figures
    if (total, largest) != (gate.total, gate.largest):
        log.info("the cluster has %d allocatable %s, at most %d on one node; Ray hands them to runs",
                 total, resource, largest)  # fmt: skip
    await gate.update(total, largest)


async def keep_node_gpus(runtime: OperatorRuntime, gate: PodGpus) -> None:
    while True:
        await asyncio.sleep(NODE_GPUS_EVERY_S)
        await refresh_node_gpus(runtime, gate)


def cluster_gpus(client: Any, resource: str) -> int | None:
    """The cluster's allocatable GPUs, so Ray (not a queue of Pending pods) holds back runs beyond them. Read at
    start-up: a node added later counts after the operator restarts (a leader change does it too)."""
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
