"""The Ray campaign driver.

Runs are supervised by asyncio coroutines inside a few Ray actors (not one
process per run), so thousands of runs can be in flight. Concurrency is bounded
through Ray resources: each run holds a placement-group bundle of one
`labkube_run_slot` (plus its GPUs) while it runs. `ray.init()` on this machine
by default; `ray_address` connects to an existing cluster (KubeRay: Ray Client,
`ray://<cluster>-head-svc:10001`, with the cluster's token in RAY_AUTH_TOKEN).

On a cluster whose nodes declare `labkube_supervisor` (the workers of the chart's
RayCluster), supervisor actors run only there, spread over them; when a node dies
its actors are replaced on the others and their runs re-attach to their pods.
Run pods' GPUs are the `labkube_pod_gpu` resource (the cluster's allocatable GPUs,
declared by the operator's embedded Ray or on the RayCluster's head), not Ray's
own `GPU`: supervisors need none, the pods do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from labkube.control import ControlFile, control_path
from labkube.interventions import pause_line
from labkube.operator.driver_errors import HELD, DriverError
from labkube.operator.kube import short_error
from labkube.operator.lean_head import lean_head
from labkube.operator.warm import warm_workers
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec, RunStatus
from labkube.store import CampaignDir, read_model, utcnow, write_model

if TYPE_CHECKING:
    from labkube.operator.zygote_handoff import ZygoteHandoff
    from labkube.tasks.gaia2.world_process import WorldHandoff

log = logging.getLogger(__name__)

SLOT = "labkube_run_slot"
SUPERVISOR = "labkube_supervisor"  # a node resource: the nodes that host supervisor actors
POD_GPU = "labkube_pod_gpu"  # GPUs of the Kubernetes cluster that run pods may hold at once
RUNS_PER_ACTOR = 1000  # one actor's event loop keeps up with this many runs (benchmarks/operator_scale.py)
MAX_ACTORS = 64
# The head's start, as the first run waits for it. A Ray process that connects to a socket of its node (the raylet's
# object manager to its object store, a worker or the driver to the raylet) before it listens tries again after
# `raylet_client_connect_timeout_milliseconds`: 1 s by default, which a busy 2-core machine's start met in about a
# third of `labkube run`s; asked every 20 ms here, as long as before in all (10 x 1 s). And the raylet answers the
# first driver's registration only once the worker it prestarts has imported Ray and registered (0.4-0.7 s), unless
# `prestart_worker_first_driver` is off: the driver then starts its supervisors meanwhile, and the prestarted worker
# still hosts the first of them. Task events (what Ray's dashboard and state API show; labkube reads neither) are
# off: the driver's `ray.shutdown` waited 0.25 s for its last flush of them, and every actor call recorded some. The
# supervisors' worker keeps the driver's priority: Ray renices its workers to 15, under the agents and their commands,
# which on a busy machine would starve the runs' control plane (deadlines, checkpoints, the next run's start).
HEAD_SYSTEM_CONFIG = MappingProxyType(
    {
        "raylet_client_connect_timeout_milliseconds": 20,
        "raylet_client_num_connect_attempts": 500,
        "prestart_worker_first_driver": False,
        "task_events_report_interval_ms": 0,
        "worker_niceness": 0,
    }
)


@ray.remote(num_cpus=0, max_concurrency=10_000)
class SupervisorActor:
    """Hosts many run supervisors as coroutines, and what they keep warm (`operator/warm.py`)."""

    def __init__(self) -> None:
        from labkube.operator.warm import WarmWorker

        self.warm = WarmWorker()
        self.admission: asyncio.Semaphore | None = None
        self.closing = False

    async def supervise(
        self, run_dir: str, env: dict[str, str] | None = None, backend: dict | None = None, admit: int | None = None
    ) -> dict | None:
        """The run's final result. With `admit`, at most that many of this actor's runs go at once; the others wait
        here, and none starts once `close()` was called (None)."""
        from labkube.operator.supervisor import supervise_run

        async with self._admission(admit):
            if self.closing:
                return None
            warm = self.warm if backend is None and warm_workers() else None
            result = await supervise_run(run_dir, env, backend, warm)
        return result.model_dump(mode="json")

    def _admission(self, admit: int | None) -> contextlib.AbstractAsyncContextManager[Any]:
        if admit is None:
            return contextlib.nullcontext()
        if self.admission is None:
            self.admission = asyncio.Semaphore(admit)
        return self.admission

    async def warm_up(
        self, slots: int, campaign_root: str, worlds: int, fork_agents: bool, adopt: list[WorldHandoff] | None = None
    ) -> None:
        await self.warm.warm_up(slots, Path(campaign_root), worlds, fork_agents, adopt)

    async def start_zygote(self, handoff: ZygoteHandoff | None = None) -> None:
        """The zygote `handoff` offers (the driver started it while Ray started), else one of this actor's own."""
        if handoff is None or not await self.warm.zygote.adopt(handoff):
            await self.warm.zygote.start()

    async def close(self) -> None:
        self.closing = True
        await self.warm.close()

    def ping(self) -> bool:
        return True


@dataclass
class RayContext:
    started_here: bool
    slots: bool  # whether the cluster has our slot resource
    gpus: float = 0.0  # Ray's GPU resource: GPUs of this machine for local runs
    extra: dict = field(default_factory=dict)
    pod_gpus: float = 0.0  # POD_GPU: the Kubernetes cluster's GPUs for run pods (0: the scheduler alone bounds them)
    supervisor_node_ids: tuple[str, ...] = ()  # alive nodes that declare SUPERVISOR

    @property
    def supervisor_nodes(self) -> int:
        return len(self.supervisor_node_ids)

    slot_count: float = 0.0  # SLOT: runs supervised at once in all


def _context(started_here: bool) -> RayContext:
    res = ray.cluster_resources()
    nodes = alive_supervisor_nodes()
    return RayContext(
        started_here,
        SLOT in res,
        res.get("GPU", 0.0),
        pod_gpus=res.get(POD_GPU, 0.0),
        supervisor_node_ids=nodes,
        slot_count=res.get(SLOT, 0.0),
    )


_POD_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def pod_slots(ctx: RayContext) -> asyncio.Semaphore | None:
    """The SLOT bound for runs in pods, counted in this process (the operator drives every campaign from one event
    loop), not by a placement group per run: at 5,000 runs, creating and removing a placement group per run kept
    Ray's raylet busy and slowed pod creation to ~20 a second (benchmarks/operator_scale.py). GPUs stay Ray's."""
    if not ctx.slots:
        return None
    loop = asyncio.get_running_loop()
    if loop not in _POD_SLOTS:
        _POD_SLOTS[loop] = asyncio.Semaphore(max(1, int(ctx.slot_count)))
    return _POD_SLOTS[loop]


class PodGpus:
    """The Kubernetes cluster's GPUs for run pods, counted in this process (the operator drives every campaign from one
    event loop) so that Ray, not a queue of Pending pods, holds back GPU runs beyond them. Its figures are the
    allocatable GPUs of the Ready, schedulable nodes, in all (`total`) and on the largest (`largest`), which the
    operator reads when it starts leading and again on a schedule (`update`): a node added, lost or drained changes
    them. A run needing more GPUs than the largest node has holds none: no node can place its pod, which waits with
    the scheduler's reason (`needs N GPUs, largest node has M`) without keeping GPUs from runs that fit. Unknown
    figures (no right to list nodes) or none: the scheduler alone bounds the runs."""

    def __init__(self, total: float, largest: float | None = None) -> None:
        self.total = total
        self.largest = total if largest is None else largest
        self.used = 0.0
        self.changed = asyncio.Condition()

    def applies(self, gpus: float) -> bool:
        return bool(gpus) and self.total > 0 and gpus <= self.largest

    async def take(self, gpus: float) -> float:
        """Wait until `gpus` are free and hold them; what is held (0: the gate does not apply to this run)."""
        async with self.changed:
            await self.changed.wait_for(lambda: not self.applies(gpus) or self.used + gpus <= self.total)
            if not self.applies(gpus):
                return 0.0
            self.used += gpus
            return gpus

    async def give(self, gpus: float) -> None:
        if gpus:
            async with self.changed:
                self.used -= gpus
                self.changed.notify_all()

    async def update(self, total: float, largest: float) -> None:
        async with self.changed:
            self.total, self.largest = total, largest
            self.changed.notify_all()


_POD_GPUS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PodGpus] = weakref.WeakKeyDictionary()


def pod_gpus(ctx: RayContext | None = None) -> PodGpus:
    """This event loop's `PodGpus`, made from `ctx.pod_gpus` (the figure read at start) when it has none yet."""
    loop = asyncio.get_running_loop()
    if loop not in _POD_GPUS:
        _POD_GPUS[loop] = PodGpus(ctx.pod_gpus if ctx is not None else 0.0)
    return _POD_GPUS[loop]


def _use_token(token: str) -> None:
    """Token authentication for this process and the Ray processes it starts. Ray reads the mode and the token
    when it is imported (this module imports it): without a refresh the driver keeps "disabled" and sends no
    token to a GCS that requires one (found by the as-installed operator test)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect(
    address: str | None,
    concurrency: int,
    num_gpus: int | None = None,
    *,
    private: bool = False,
    pod_gpus: int | None = None,
    patience_s: float = 0.0,
) -> RayContext:
    """Start Ray on this machine, or connect to `address`; a dead cluster is a one-line error.

    `private` (the operator's embedded Ray): token authentication on, with a fresh random token that only
    this process and its children hold, and the node's address on the loopback. Ray 2.60 still listens on
    every interface for its gRPC ports, so the chart's NetworkPolicy admits nothing but the operator's
    metrics and health ports; the token stops whatever gets past a policy (docs/kubernetes.md, "Security
    model"). The embedded node hosts the supervisors (SUPERVISOR) and declares `pod_gpus` as POD_GPU.
    With `address`, a RAY_AUTH_TOKEN in the environment (the chart maps the cluster's Secret there) turns
    token authentication on. `labkube run` on a workstation starts Ray with token authentication and a fresh
    token, unless RAY_AUTH_MODE=disabled says otherwise; a cluster it connects to without a token is as it is."""
    init_args: dict[str, object] = {}
    resources = {SLOT: float(concurrency)}
    if pod_gpus:
        resources[POD_GPU] = float(pod_gpus)
    if private and not address:
        import secrets

        _use_token(os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32))
        init_args["_node_ip_address"] = "127.0.0.1"
        init_args["num_cpus"] = 0  # supervisors take no CPU resource: no idle worker is prestarted
        resources[SUPERVISOR] = float(MAX_ACTORS)
    elif address and os.environ.get("RAY_AUTH_TOKEN"):
        _use_token(os.environ["RAY_AUTH_TOKEN"])
    elif not address and os.environ.get("RAY_AUTH_MODE", "token") != "disabled":
        import secrets

        # The Ray labkube starts on this machine takes a fresh token only this process and its children hold (the
        # agent's commands get no RAY_ variable: agent/rg/tools.py), so nothing else on the machine can start work in
        # it; RAY_AUTH_MODE=disabled opts out.
        _use_token(os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32))
        init_args["num_cpus"] = 1
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # No run or supervisor takes a CPU resource (runs hold SLOT): one CPU makes Ray prestart the one worker the
        # supervisor actor lives in, not one idle interpreter per core.
        if not address:
            init_args["num_cpus"] = 1
    if ray.is_initialized():
        return _context(False)
    try:
        with python_signal_handlers():
            _connect(address, patience_s, resources, num_gpus, init_args)
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
        where = address or "this machine"
        raise DriverError(f"cannot start or reach Ray at {where}: {short_error(exc)}") from None
    return _context(not address)


@contextlib.contextmanager
def python_signal_handlers() -> Iterator[None]:
    """Ray's start installs C handlers for SIGINT and SIGTERM in this process (SIGTERM's aborts it): the handlers
    Python had are put back afterwards (SIGHUP's too), so Ctrl-C, SIGTERM and SIGHUP still interrupt `labkube run`
    (labkube/interrupts.py: its runs are marked stopped). Only in the main thread, where Python's handlers live.

    A process that handles SIGTERM itself keeps its handler while Ray starts, too: `ray.init` first sets one of its
    own (`sys.exit(15)`, then its node's, which exits 1), and a SIGTERM in that second ended `labkube run` with 15
    and no word, its runs left Running."""
    import signal
    import threading

    import ray._private.utils as ray_utils

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    rays_own = ray_utils.set_sigterm_handler
    handles_sigterm = callable(kept[signal.SIGTERM])
    if handles_sigterm:
        ray_utils.set_sigterm_handler = lambda _handler: None
        # Ray's core worker also installs a C failure handler for SIGTERM while it starts, which prints a
        # `*** SIGTERM received` dump: a SIGTERM then waits, blocked, until Python's handler is back (the threads
        # Ray starts meanwhile keep it blocked, so it comes to this one)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = rays_own
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)
        if handles_sigterm:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _connect(
    address: str | None, patience_s: float, resources: dict[str, float], num_gpus: int | None, init_args: dict[str, Any]
) -> None:
    if address:
        _connect_patiently(address, patience_s)
    else:
        with lean_head():
            ray.init(
                address="local",  # a new instance, never one a `ray start` on this machine left in /tmp/ray
                resources=resources,
                num_gpus=num_gpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
                _system_config=dict(HEAD_SYSTEM_CONFIG),  # a copy: Ray adds its session's spilling path
                **init_args,
            )


def _listening(address: str, timeout_s: float = 3.0) -> None:
    """One bounded TCP connect to the address's host and port: Ray's own first connect retries for minutes when
    nothing listens (GCS address) or for about 35 s (Ray Client). Raises ConnectionError when nothing answers."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port (e.g. "auto"): left to ray.init
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc.strerror or exc})") from None


def _connect_patiently(address: str, patience_s: float) -> None:
    """Connect to an existing cluster, trying again for `patience_s` (the operator: a RayCluster head that is still
    starting, or a Ray Client server slow to start this driver's own server on a loaded node, answers with an
    initialisation failure the next try does not meet). Then the last error stands."""
    import time

    deadline = time.monotonic() + patience_s
    delay, attempt = 1.0, 1
    while True:
        try:
            _listening(address)
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            return
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            ray.shutdown()  # a no-op unless the failed init left a half-open client or node behind
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # the whole patience is spent (never less: a head may come up in its last second)
                raise
            log.warning("Ray at %s: attempt %d failed (%s); trying again", address, attempt, short_error(exc))
            time.sleep(min(delay, remaining))
            delay, attempt = min(delay * 2, 10.0), attempt + 1


def shutdown(ctx: RayContext) -> None:
    if ctx.started_here and ray.is_initialized():
        ray.shutdown()


async def _reserve(run: RunSpec, ctx: RayContext, strict: bool = True) -> PlacementGroup | None:
    """A placement group holding the run's slot and GPUs. With `strict=False` (pods on Kubernetes) the GPUs are
    the cluster's, which `PodGpus` counts in this process: none here."""
    bundle: dict[str, float] = {}
    # Pods count their slot in `pod_slots`; on a Ray this driver started, nothing else takes slots, so the driver's
    # own bound on runs in flight is the slot (a placement group per short run cost a few hundred ms of raylet time).
    if ctx.slots and strict and not (ctx.started_here and not run.gpus):
        bundle[SLOT] = 1.0
    if run.gpus and strict:
        if run.gpus > ctx.gpus:
            raise DriverError(f"run {run.run_id} needs {run.gpus} GPUs; the Ray cluster has {ctx.gpus:g}")
        bundle["GPU"] = float(run.gpus)
    if not bundle:
        return None
    pg = placement_group([bundle], strategy="PACK")
    await pg.ready()
    return pg


ACTOR_RESTARTS = 3


@ray.remote(num_cpus=0)
def _gpu_ids() -> list[str]:
    return [str(i) for i in ray.get_gpu_ids()]


async def allocated_gpus(pg: PlacementGroup, gpus: int) -> str:
    """The GPU indices Ray gave the run's placement group, as CUDA_VISIBLE_DEVICES: a probe task in the bundle
    asks Ray which of the node's GPUs are its (a bundle keeps the same GPUs while it lives)."""
    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    ids = await _gpu_ids.options(num_gpus=gpus, scheduling_strategy=strategy).remote()
    return ",".join(ids)


def alive_supervisor_nodes() -> tuple[str, ...]:
    """The ids of the alive nodes that declare SUPERVISOR, in a stable order."""
    return tuple(
        sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and SUPERVISOR in (n.get("Resources") or {}))
    )


def new_supervisor(ctx: RayContext, idx: int = 0, replacing: bool = False) -> Any:
    """Supervisor actor `idx`: on the SUPERVISOR nodes when the cluster has any, actor i on the i-th of them (Ray's
    SPREAD is best-effort and put two of two actors on one node under load, so one node's death took every run's
    supervisor). The affinity is soft: a full or dead node's share goes elsewhere. A replacement picks among the
    nodes alive now."""
    if not ctx.supervisor_node_ids:
        return SupervisorActor.options(scheduling_strategy="SPREAD").remote()
    nodes = (alive_supervisor_nodes() if replacing else ()) or ctx.supervisor_node_ids
    strategy = NodeAffinitySchedulingStrategy(node_id=nodes[idx % len(nodes)], soft=True)
    return SupervisorActor.options(resources={SUPERVISOR: 0.001}, scheduling_strategy=strategy).remote()


def actor_count(ctx: RayContext, concurrency: int, runs: int) -> int:
    """Enough actors for the runs in flight (RUNS_PER_ACTOR each), and at least one per supervisor node, so a
    node's death takes only its share."""
    wanted = max(math.ceil(min(concurrency, runs) / RUNS_PER_ACTOR), ctx.supervisor_nodes)
    return max(1, min(MAX_ACTORS, runs, wanted))


async def supervise_on(
    actors: list,
    idx: int,
    run_dir: str,
    env: dict[str, str] | None,
    backend: dict | None = None,
    stopping: asyncio.Event | None = None,
    ctx: RayContext | None = None,
    admit: int | None = None,
) -> dict:
    """Supervise on actor `idx`; if that actor's process dies, replace it and supervise again (the run
    resumes from its checkpoint: its orphaned agent checkpoints and exits by itself). Once `stopping` is set
    (the campaign ends or is stopped, and the driver kills its actors), no actor is replaced. With `admit`, the
    actor starts at most that many runs at once and queues the rest (`SupervisorActor.supervise`)."""
    for attempt in range(ACTOR_RESTARTS + 1):
        actor = actors[idx]
        try:
            data = await actor.supervise.remote(run_dir, env, backend, admit)
            if data is None:  # the actor was closing: the campaign is ending, and this run did not start
                raise asyncio.CancelledError
            return data
        except ray.exceptions.RayActorError:
            if stopping is not None and stopping.is_set():
                raise asyncio.CancelledError from None
            if attempt == ACTOR_RESTARTS:
                raise DriverError(f"the Ray worker supervising {run_dir} died {attempt + 1} times") from None
            if actors[idx] is actor:
                actors[idx] = new_supervisor(ctx, idx, replacing=True) if ctx is not None else SupervisorActor.remote()
    raise AssertionError("unreachable")


async def drive(
    runs: list[RunSpec],
    campaign_root: Path,
    ctx: RayContext,
    concurrency: int,
    on_result: Callable[[RunResult], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    on_waiting: Callable[[int], None] | None = None,
    backend: dict | None = None,
    gpu_hours_cap: float | None = None,
    early_worlds: Callable[[], list[WorldHandoff]] | None = None,
    early_zygote: ZygoteHandoff | None = None,
) -> list[RunResult]:
    """Supervise every run to a final state; returns results in the order of `runs`.

    `early_worlds` gives the worlds this process started while Ray started (`warm.EarlyWorlds`), for the
    supervisors to adopt; the first supervisor adopts `early_zygote` (`zygote_handoff.EarlyZygote`).

    `backend` (a `k8s_backend.K8sBackend` as JSON) runs each agent in a pod instead of a local
    process. With `gpu_hours_cap`, a run needing GPUs starts only while the campaign's GPU-hours
    (GPUs x charged wall time, from every run's status.json) are below the cap; the others get a
    non-final result whose `error` says why, and that message in their status.json.
    """
    if not runs:
        return []
    n_actors = actor_count(ctx, concurrency, len(runs))
    from labkube.operator.warm import forks_agent

    actors = [new_supervisor(ctx, i) for i in range(n_actors)]
    if backend is None and warm_workers() and any(forks_agent(r) for r in runs):
        for i, actor in enumerate(actors):  # the zygote's imports overlap the rest of the warm-up
            actor.start_zygote.remote(early_zygote if i == 0 else None)
    await asyncio.gather(*(a.ping.remote() for a in actors))
    if backend is None and warm_workers():
        adopt = await asyncio.to_thread(early_worlds) if early_worlds is not None else []
        await warm_up(actors, runs, concurrency, campaign_root, adopt)
    # On a Ray this process started, with one supervisor and no GPU to reserve, up to `concurrency` more runs wait in
    # the supervisor's own queue, which admits `concurrency` at once: a finished run's slot goes to the next run
    # there, without the round trip to this driver and back (3-4 ms of a 60-ms Gaia2 oracle run on 2 cores).
    queue_in_actor = backend is None and ctx.started_here and n_actors == 1 and not any(r.gpus for r in runs)
    admit = concurrency if queue_in_actor else None
    limit = asyncio.Semaphore(2 * concurrency if queue_in_actor else concurrency)
    meter = GpuHoursMeter(campaign_root, runs, pods=backend is not None) if gpu_hours_cap is not None else None

    waiting = 0

    slots = pod_slots(ctx) if backend is not None else None
    cluster_gpus = pod_gpus(ctx) if backend is not None else None

    async def one(i: int, run: RunSpec) -> RunResult:
        """The run to a final result: while it is paused (`labkube runs pause`), it waits here holding no slot and no
        GPU, and starts again from its checkpoint once resumed."""
        while True:
            if backend is None:
                await wait_while_paused(campaign_root, run)
            result = await one_start(i, run)
            if result.status is not RunPhase.paused:
                return result

    async def one_start(i: int, run: RunSpec) -> RunResult:
        nonlocal waiting
        async with limit, slots or contextlib.nullcontext():
            waiting += 1 if run.gpus else 0
            if on_waiting is not None:
                on_waiting(waiting)
            held = 0.0
            try:
                pg = await _reserve(run, ctx, strict=backend is None)
                if cluster_gpus is not None:
                    held = await cluster_gpus.take(run.gpus)
            finally:
                waiting -= 1 if run.gpus else 0
                if on_waiting is not None:
                    on_waiting(waiting)
            if meter is not None and gpu_hours_cap is not None and run.gpus and meter.used() >= gpu_hours_cap:
                if pg is not None:
                    remove_placement_group(pg)
                if cluster_gpus is not None:
                    await cluster_gpus.give(held)
                why = f"{HELD}the campaign's GPU-hour cap ({gpu_hours_cap:g} h) is used up"
                held = hold_run(campaign_root, run, why)
                if on_result is not None:
                    on_result(held)
                return held
            try:
                run_dir = str(campaign_root / "runs" / run.run_id)
                run_env = env
                if backend is None:  # locally: the run sees only its own GPUs, and none when it asked for none
                    own = await allocated_gpus(pg, run.gpus) if run.gpus and pg is not None else ""
                    run_env = {**(env or {}), "CUDA_VISIBLE_DEVICES": own}
                data = await supervise_on(actors, i % n_actors, run_dir, run_env, backend, stopping, ctx, admit)
            finally:
                if pg is not None:
                    remove_placement_group(pg)
                if cluster_gpus is not None:
                    await cluster_gpus.give(held)
        result = RunResult.model_validate(data)
        if on_result is not None and result.status is not RunPhase.paused:
            on_result(result)
        return result

    async def tick() -> None:
        while on_tick is not None:
            on_tick()
            await asyncio.sleep(0.5)

    ticker = asyncio.create_task(tick())
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(runs)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        # One run's failure, or the campaign being stopped, ends every supervisor of the campaign: none keeps
        # going on an actor that is about to be killed, and none starts a new actor (no orphans).
        stopping.set()
        ticker.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if backend is None:
            await close_warm(actors)
        for a in actors:
            ray.kill(a)


async def warm_up(
    actors: list, runs: list[RunSpec], concurrency: int, campaign_root: Path, adopt: list[WorldHandoff] | None = None
) -> None:
    """Each supervisor starts what its share of the runs in flight reuses: Gaia2 worlds and the agent zygote. The
    worlds in `adopt` are shared out among them first."""
    from labkube.operator.warm import forks_agent, uses_world

    slots = math.ceil(min(concurrency, len(runs)) / len(actors))
    worlds = min(slots, sum(1 for r in runs if uses_world(r)))
    fork_agents = any(forks_agent(r) for r in runs)
    adopt = adopt or []
    if worlds or fork_agents or adopt:
        await asyncio.gather(
            *(
                a.warm_up.remote(slots, str(campaign_root), worlds, fork_agents, adopt[i :: len(actors)])
                for i, a in enumerate(actors)
            )
        )


async def close_warm(actors: list) -> None:
    """Stop the supervisors' worlds and zygotes before their actors are killed (a world would otherwise notice its
    parent gone a second later and stop by itself)."""
    closing = asyncio.gather(*(a.close.remote() for a in actors), return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(closing, timeout=10)


class GpuHoursMeter:
    """GPU-hours a campaign's runs have used (re-read at most once a second). Every run of the campaign
    directory counts, including those finished before this driver started.

    Locally: GPUs x charged wall time from each run's status.json. On a cluster (`pods`): the pod times the
    API reported (`k8s_ledger.PodLedger`, in the operator's own `<campaign>/pods/`), never a file a run can
    write."""

    def __init__(self, campaign_root: Path, runs: list[RunSpec], ttl_s: float = 1.0, *, pods: bool = False) -> None:
        self.root = campaign_root
        cdir = CampaignDir(campaign_root)
        specs = [cdir.run_spec(run_id) for run_id in cdir.run_ids()]
        self.gpus = {s.run_id: s.gpus for s in [*specs, *runs] if s is not None and s.gpus}
        self.pods = pods
        self.ttl_s = ttl_s
        self._at = -math.inf
        self._value = 0.0

    def used(self) -> float:
        import time

        now = time.monotonic()
        if now - self._at >= self.ttl_s:
            self._value, self._at = self._read(), now
        return self._value

    def _read(self) -> float:
        if self.pods:
            from labkube.operator.k8s_ledger import PodLedger, ledger_path

            ledgers = [read_model(ledger_path(self.root, run_id), PodLedger) for run_id in self.gpus]
            return sum(ledger.gpu_hours() for ledger in ledgers if ledger is not None)
        total = 0.0
        for run_id, gpus in self.gpus.items():
            status = read_model(self.root / "runs" / run_id / "status.json", RunStatus)
            if status is not None:
                total += gpus * status.spend.wall_seconds
        return total / 3600.0


PAUSED_POLL_S = 0.5


async def wait_while_paused(campaign_root: Path, run: RunSpec) -> None:
    """Until the run's control (labkube/control.py) no longer holds it paused (resumed, extended past its usage
    checkpoint, or cancelled: its agent then grades it as it stands); its status says it is paused meanwhile."""
    said = False
    file = ControlFile(control_path(campaign_root, run.run_id), run.run_id)
    while True:
        # read here, not in a thread: a run that is not paused must reach its slot in the order the runs were given;
        # a stat while nothing changed (a drained campaign of a thousand runs waits in a thousand of these loops)
        control = file.read()
        pause = control.paused
        if pause is None or control.cancelled is not None:
            return
        if not said:
            path = campaign_root / "runs" / run.run_id / "status.json"
            status = read_model(path, RunStatus) or RunStatus(run_id=run.run_id)
            update = {"phase": RunPhase.paused, "message": pause_line(pause), "updated_at": utcnow()}
            write_model(path, status.model_copy(update=update))
            said = True
        await asyncio.sleep(PAUSED_POLL_S)


def hold_run(campaign_root: Path, run: RunSpec, message: str) -> RunResult:
    """A run the driver does not start: its status.json says why; its result is not final."""
    path = campaign_root / "runs" / run.run_id / "status.json"
    status = read_model(path, RunStatus) or RunStatus(run_id=run.run_id)
    write_model(path, status.model_copy(update={"message": message, "updated_at": utcnow()}))
    return RunResult(
        run_id=run.run_id, task=run.task, model=run.model, seed=run.seed, status=RunPhase.pending, error=message
    )
