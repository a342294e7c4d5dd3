"""Launching a campaign on the local backend: validate everything, then write, then drive."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from labkube import interrupts
from labkube.agent.rg.web import backend_from_env
from labkube.campaign import CampaignSpec, expand_runs
from labkube.metrics import serve
from labkube.model_ref import parse_model
from labkube.operator.telemetry import CampaignTelemetry
from labkube.operator.warm import EarlyWorlds, early_world_count, forks_agent, warm_workers
from labkube.operator.zygote_handoff import STOP_WAIT_S, EarlyZygote
from labkube.report import LiveRows
from labkube.result import RunResult
from labkube.run_spec import RunSpec
from labkube.sandbox import sandbox_problem
from labkube.settings import ENV_CACHE, LOCAL_GPUS
from labkube.storage_full import StorageFull, storage_full_line
from labkube.store import STOPPED, STOPPED_DISK_FULL, CampaignDir, mark_stopped
from labkube.task_card import TaskCard
from labkube.tasks import resolve_campaign_tasks
from labkube.tasks.manifest import keep_task_manifests, pin_task_digests

if TYPE_CHECKING:
    from labkube.operator.driver import RayContext
    from labkube.tasks.gaia2.world_process import WorldHandoff


T = TypeVar("T")


class CampaignError(ValueError):
    """Bad input found before anything was written."""


def run_env(extra: dict[str, str] | None) -> dict[str, str] | None:
    """What the supervisors pass on to each run besides their own environment: the caller's task-environment
    cache (Ray's worker processes have the environment Ray started with, not this process's)."""
    env = dict(extra or {})
    cache = ENV_CACHE.raw()
    if cache is not None:
        env[ENV_CACHE.name] = cache
    return env or None


def check_api_keys(models: list[str], api_key_env: dict[str, str]) -> None:
    from labkube.agent.providers.registry import header_safe_key, required_key_variable

    for m in models:
        var = required_key_variable(m, parse_model(m), api_key_env)
        try:
            key = header_safe_key(var, os.environ.get(var) or "") if var else None
        except ValueError as exc:
            raise CampaignError(f"model {m}: {exc}") from None
        if var and key is None:
            raise CampaignError(f"model {m}: {var} is not set; export it (or use --model oracle for a dry run)")


def plan_campaign(spec: CampaignSpec, out: Path) -> tuple[CampaignDir, list[RunSpec], dict[str, list[TaskCard]]]:
    """Everything that can fail on bad input, with nothing written yet."""
    cards = resolve_campaign_tasks(spec.tasks, spec.task_overlays)
    world_models = [m for m in (spec.judge_model, spec.inspector_model, spec.gaia2_a2a_model) if m]
    check_api_keys([*spec.models, *world_models], spec.api_key_env)
    try:
        backend_from_env()
    except ValueError as exc:
        raise CampaignError(str(exc)) from None
    if spec.sandbox == "bwrap":
        problem = sandbox_problem()
        if problem is not None:
            raise CampaignError(f"no local sandbox: {problem}")
    for m in spec.models:
        if parse_model(m).provider == "oracle":
            missing = [c.ref for cs in cards.values() for c in cs if not (c.oracle or c.gaia or c.gaia2)]
            if missing:
                raise CampaignError(f"model oracle: task {missing[0]} ships no reference solution")
    for m in spec.models:
        ref = parse_model(m)
        if ref.provider == "cheat":
            for card in (c for cs in cards.values() for c in cs):
                if not (Path(card.path) / "oracle" / "cheats" / f"{ref.name}.yaml").exists():
                    raise CampaignError(f"model {m}: task {card.ref} ships no such scripted cheat")
        if ref.provider == "replay":
            check_replay(m, Path(ref.name).expanduser())
    runs = expand_runs(spec, cards)
    check_dollar_budgets(runs, spec.prices)
    cdir = CampaignDir(out)
    cdir.check_compatible(spec)
    every_card = [c for cs in cards.values() for c in cs]
    runs = pin_task_digests(runs, every_card, lambda run_id: _pinned_digest(cdir, run_id))
    return cdir, runs, cards


def _pinned_digest(cdir: CampaignDir, run_id: str) -> str | None:
    """The task digest a resumed campaign pinned when it first started (its run.json, outside every agent's reach)."""
    recorded = cdir.run_spec(run_id)
    return recorded.task_digest if recorded is not None else None


def check_dollar_budgets(runs: list[RunSpec], prices: dict[str, tuple[float, ...]]) -> None:
    """A dollar budget on a model with no price could be neither kept nor reported: refused unless the campaign
    gives the price."""
    from labkube.agent.pricing import has_price

    for run in runs:
        judge = run.judge_model
        if run.gaia2_judge_budget_usd is not None and judge and not has_price(judge, prices):
            raise CampaignError(
                f"judge model {judge}: labkube's price table does not know it, so the judge's dollar budget cannot "
                f'be kept: give its price in a campaign file (prices: {{"{judge}": [input, output, cached input]}}, '
                "USD per million tokens) or drop --gaia2-judge-budget-usd"
            )
        if run.budgets.usd is not None and not has_price(run.model, prices):
            raise CampaignError(
                f"model {run.model}: labkube's price table does not know it, so a dollar budget cannot be kept: "
                f'give its price in a campaign file (prices: {{"{run.model}": [input, output, cached input]}}, USD '
                "per million tokens; labkube campaign run FILE) or drop the dollar budget (--budget-usd, budgets.usd)"
            )


def check_replay(model: str, transcript: Path) -> None:
    """A `replay:` model's transcript is there and holds tool calls, or the campaign is refused before it starts."""
    from labkube.agent.providers.scripted import PlanError, replay_provider

    try:
        replay_provider(transcript)
    except (PlanError, OSError) as exc:
        reason = str(exc).removeprefix("replay: ") if isinstance(exc, PlanError) else f"cannot read {transcript}"
        raise CampaignError(
            f"model {model}: {reason}; replay takes a recorded run's transcript.jsonl "
            "(campaigns/NAME/runs/RUN-ID/transcript.jsonl)"
        ) from None


def pending_runs(cdir: CampaignDir, runs: list[RunSpec]) -> list[RunSpec]:
    return [r for r in runs if not cdir.is_finished(r.run_id)]


def launch(
    spec: CampaignSpec,
    out: Path,
    ray_address: str | None = None,
    on_start: Callable[[CampaignDir, list[RunSpec], list[RunSpec]], None] | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    ray_ctx: RayContext | None = None,
    metrics_port: int | None = None,
    on_end: Callable[[], None] | None = None,
) -> list[RunResult]:
    """Run the campaign into `out`; finished runs are skipped, unfinished ones resume.

    With `metrics_port`, the campaign's series and every run's are served on that one port while
    the campaign runs. `on_end` is called once every run is final (not when the campaign is interrupted or fails),
    while the Ray this started shuts down: `labkube run` draws its final table meanwhile.

    A full, over-quota or read-only disk met anywhere (here, in a supervisor, in an agent) stops the campaign as an
    interrupt does, unfinished runs left to resume, and raises `StorageFull` with its one line.
    """
    try:
        return _launch(spec, out, ray_address, on_start, on_result, on_tick, ray_ctx, metrics_port, on_end)
    except Exception as exc:
        line = storage_full_line(exc, out)
        if line is None:
            raise
        stop_after_a_full_disk(CampaignDir(out))
        raise StorageFull(line) from None


def _launch(
    spec: CampaignSpec,
    out: Path,
    ray_address: str | None,
    on_start: Callable[[CampaignDir, list[RunSpec], list[RunSpec]], None] | None,
    on_result: Callable[[RunResult], None] | None,
    on_tick: Callable[[], None] | None,
    ray_ctx: RayContext | None,
    metrics_port: int | None,
    on_end: Callable[[], None] | None,
) -> list[RunResult]:
    cdir, runs, cards = plan_campaign(spec, out)
    with cdir.lock():  # one writer per campaign directory: no run is driven (and graded) twice
        cdir.check_compatible(spec)  # another writer may have written it while we planned
        todo = pending_runs(cdir, runs)
        done_ids = frozenset(r.run_id for r in runs) - {r.run_id for r in todo}
        cdir.write_campaign(spec, runs, keep=done_ids)
        keep_task_manifests(cdir.root, todo, [c for cs in cards.values() for c in cs])
        if on_start is not None:
            on_start(cdir, runs, todo)
        if not todo:
            if on_end is not None:
                on_end()
            return [r for r in (cdir.result(x.run_id) for x in runs) if r is not None]

        interrupts.check()  # before anything is started
        metrics = CampaignMetrics(cdir, spec, runs, metrics_port) if metrics_port is not None else None

        def tick() -> None:
            if metrics is not None:
                metrics.tick()
            if on_tick is not None:
                on_tick()

        # On a Ray this process starts, the supervisors live on this machine: their first worlds and their agent
        # zygote start now, while Ray does (importing ARE, the agent's imports and starting Ray take a second or more
        # each), and they adopt them.
        local = ray_ctx is None and ray_address is None
        early = EarlyWorlds(early_world_count(todo, spec.concurrency) if local else 0, cdir.root)
        zygote = EarlyZygote(local and warm_workers() and any(forks_agent(r) for r in todo))
        try:
            # Ray's import (half a second of CPU) only now: the worlds and the zygote import meanwhile.
            from labkube.operator.driver import connect, drive, shutdown

            ctx = ray_ctx or connect(ray_address, spec.concurrency, num_gpus=_local_gpus())
        except BaseException:
            early.close()
            zygote.close()
            raise
        results: list[RunResult] | None = None

        def supervisors_up() -> list[WorldHandoff]:
            """The worlds to adopt, asked for once the supervisors are up: what was started warming stops warming."""
            zygote.end_warming()
            return early.handoffs()

        try:
            interrupts.check()  # one that came while Ray started: no run starts
            run_until_interrupted(
                drive(
                    todo,
                    cdir.root,
                    ctx,
                    spec.concurrency,
                    on_result,
                    tick,
                    env=run_env(metrics.env if metrics else None),
                    on_waiting=metrics.telemetry.waiting_for_gpus if metrics else None,
                    gpu_hours_cap=spec.gpu_hours_cap,
                    early_worlds=supervisors_up,
                    early_zygote=zygote.handoff(),
                )
            )
            results = []
        finally:
            # Ray's shutdown mostly waits (its driver's gRPC threads end on a 250 ms poll): the rest of the end runs
            # meanwhile, and nothing returns before Ray has stopped.
            stopping = threading.Thread(target=shutdown, args=(ctx,), name="ray-shutdown")
            if ray_ctx is None:
                stopping.start()
            try:
                early.close()
                if results is not None:  # every run is final
                    results = [r for r in (cdir.result(x.run_id) for x in runs) if r is not None]
                    if on_end is not None:
                        on_end()
            finally:
                if ray_ctx is None:
                    stopping.join()
            # Once its supervisor is gone (its actor's worker ends with Ray), it has exited; when interrupted, the runs'
            # agents may still hold it (they are ended next: `stop_unfinished`).
            zygote.close(patience_s=0.0 if interrupts.pending() is not None else STOP_WAIT_S)
            if metrics is not None:
                metrics.tick(force=True)
                metrics.close()
        return results or []


def run_until_interrupted(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, with `main` cancelled when a signal asks the command to stop (labkube/interrupts.py):
    its own clean-up runs (the supervisors are closed and killed), then Interrupted is raised."""

    async def interruptible() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        with interrupts.waking(lambda: loop.call_soon_threadsafe(task.cancel)):
            return await main

    try:
        return asyncio.run(interruptible())
    except asyncio.CancelledError:
        interrupts.check()
        raise


def stop_after_a_full_disk(cdir: CampaignDir) -> None:
    """After a full disk stopped the campaign (Ray shut down): end what its unfinished runs left running and, where
    there is room to say so, mark them stopped. Their files are kept as they are: each resumes from its checkpoint,
    or, left half-prepared, is prepared again from the start."""
    if not cdir.root.is_dir():
        return
    with contextlib.suppress(OSError):  # the status files may not fit either; the runs resume all the same
        stop_unfinished(cdir, STOPPED_DISK_FULL)


def stop_unfinished(cdir: CampaignDir, message: str = STOPPED) -> int:
    """After an interrupted `launch` (Ray shut down): end whatever the unfinished runs left running (their
    containment: cgroup and run token), then mark them stopped; the number marked."""
    from labkube.agent.containment import end_leftovers

    for run_id in cdir.run_ids():
        if cdir.run_dir(run_id).is_dir() and not cdir.is_finished(run_id):
            end_leftovers(cdir.run_dir(run_id))
    return mark_stopped(cdir, message)


class CampaignMetrics:
    """One `/metrics` endpoint for a local campaign: its own series plus every run's (multiprocess files)."""

    def __init__(self, cdir: CampaignDir, spec: CampaignSpec, runs: list[RunSpec], port: int) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        from labkube.operator.telemetry import ControlFileCounts

        self.rows = LiveRows(cdir)
        self.directory = cdir.root / "metrics"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.env = {"LABKUBE_METRICS_DIR": str(self.directory)}
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(self.directory))
        self.telemetry = CampaignTelemetry(spec.name, spec.gpu_hours_cap, registry=self.registry)
        self.gpus = {r.run_id: r.gpus for r in runs}
        self.interventions = ControlFileCounts(cdir.root)
        self._updated_at, self._cost = -math.inf, 0.0
        # Counted before the first scrape: a resumed campaign's earlier interventions would otherwise show as a rise
        # from 0 (an annotation for each at the restart).
        self.tick(force=True)
        self.server = serve(port, self.registry)

    def tick(self, force: bool = False) -> None:
        """Update the campaign's series from every run's files; at most ~5% of the time (with hundreds of short runs
        a read of them all each half second took a core the runs needed)."""
        now = time.monotonic()
        if not force and now - self._updated_at < max(0.5, 20 * self._cost):
            return
        self.telemetry.update(self.rows.rows(), self.gpus, interventions=self.interventions.counts())
        self._updated_at, self._cost = now, time.monotonic() - now

    def close(self) -> None:
        self.server.shutdown()  # type: ignore[attr-defined]
        self.server.server_close()  # type: ignore[attr-defined]


def _local_gpus() -> int | None:
    """Fake logical GPUs for testing schedules on CPU machines (`LABKUBE_LOCAL_GPUS`)."""
    return LOCAL_GPUS.read()
