"""Supervising one run: start its sandbox, resume it after a crash, grade it after a time-out."""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from labkube.budgets import StopReason
from labkube.control import PAUSED_EXIT, add_interventions, run_control
from labkube.interventions import usage_checkpoint
from labkube.operator.agent_zygote import AgentZygote
from labkube.operator.local_sandbox import SandboxExit, run_local
from labkube.operator.run_failure import harness_failure, last_error_line
from labkube.operator.warm import WarmWorker, forks_agent, uses_world
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec, RunStatus
from labkube.storage_full import StorageFull, line_for
from labkube.store import RunDir, read_model, utcnow, write_model
from labkube.tasks.environment import SetupError

MAX_ATTEMPTS = 3
GRADE_ALLOWANCE_S = 900.0  # the agent's own final grading, after its time budget


def _final(rd: RunDir) -> RunResult | None:
    result = read_model(rd.result_json, RunResult)
    return result if result is not None and result.final else None


def _time_limit(rd: RunDir, spec: RunSpec) -> float | None:
    """The run's time budget in seconds, as extended (`labkube runs extend --hours`)."""
    return run_control(rd.root.parent.parent, spec.run_id).budgets(spec.budgets).wall_seconds


def _deadline(rd: RunDir, spec: RunSpec) -> float | None:
    """Seconds the run's agent may still take: its time budget left, and its final grading."""
    limit = _time_limit(rd, spec)
    if limit is None:
        return None
    status = read_model(rd.status_json, RunStatus)
    spent = status.spend.wall_seconds if status else 0.0
    return max(0.0, limit - spent) + GRADE_ALLOWANCE_S


def _extended_by(rd: RunDir, spec: RunSpec) -> Callable[[], float | None]:
    """Asked when the deadline passes: the seconds a person added to the run's time since it was last asked (None:
    none, the deadline stands)."""
    granted = {"limit": _time_limit(rd, spec)}

    def more() -> float | None:
        limit, before = _time_limit(rd, spec), granted["limit"]
        granted["limit"] = limit
        if limit is None:
            return 3600.0 if before is not None else None  # the limit was lifted: ask again in an hour
        return limit - before if before is not None and limit > before else None

    return more


async def supervise_run(
    run_dir: str, env: dict[str, str] | None = None, backend: dict | None = None, warm: WarmWorker | None = None
) -> RunResult:
    """Drive one run to a final state; a finished run is returned as it is. With `backend` (a
    `K8sBackend` as JSON) the run's agent runs in a pod (`k8s_backend.supervise_pod`). With `warm` (the
    worker's `WarmWorker`), a Gaia2 run gets a warm world and a scripted agent is forked from the zygote."""
    if backend is not None:
        from labkube.operator.k8s_backend import supervise_pod

        return await supervise_pod(run_dir, backend)
    rd = RunDir(run_dir)
    done = _final(rd)
    if done is not None:
        return done
    spec = rd.spec()
    control = run_control(rd.root.parent.parent, spec.run_id)
    if control.paused is not None and control.cancelled is None:  # paused before it (re)started: nothing to start
        return RunResult.of_run(spec, status=RunPhase.paused)
    if not rd.status_json.exists():
        write_model(rd.status_json, RunStatus(run_id=spec.run_id, phase=RunPhase.starting, updated_at=utcnow()))
    try:
        env = await task_environment(rd, spec, env)
    except SetupError as exc:
        return harness_failure(rd, str(exc), StopReason.setup_error, exc.log_tail)
    zygote = warm.zygote if warm is not None and forks_agent(spec) else None
    # A Gaia2 run cannot resume (its world is gone with its agent): a run with a checkpoint needs no world.
    lease = None
    if warm is not None and uses_world(spec) and not rd.checkpoint_json.exists():
        lease = await warm.lease_world(rd.root.parent.parent)
    if lease is None:
        result, _clean = await _attempts(rd, spec, env, zygote)
        return result
    healthy = False
    try:
        result, clean = await _attempts(rd, spec, {**(env or {}), **lease.env}, zygote)
        healthy = clean and result.final and result.stop_reason is not StopReason.world_error
        return result
    finally:
        assert warm is not None
        warm.return_world(lease, rd.logs, healthy)


async def _attempts(
    rd: RunDir, spec: RunSpec, env: dict[str, str] | None, zygote: AgentZygote | None
) -> tuple[RunResult, bool]:
    """The run's agent until it leaves a final result (resumed after a crash, at most MAX_ATTEMPTS), then the
    result; `clean` when every attempt's agent exited by itself (not killed, not past its deadline)."""
    exit_: SandboxExit | None = None
    limits = card_limits(spec)
    clean = True
    for _attempt in range(MAX_ATTEMPTS):
        extra = ("--resume",) if rd.checkpoint_json.exists() else ()
        exit_ = await run_local(
            rd.root,
            *extra,
            deadline_s=_deadline(rd, spec),
            env=env,
            zygote=zygote,
            deadline_now=_extended_by(rd, spec),
            **limits,
        )
        if exit_.returncode == PAUSED_EXIT:
            return paused(rd, spec), True
        clean = clean and exit_.returncode in (0, 1) and not exit_.timed_out
        done = _final(rd)
        if done is not None:
            return done, clean
        stop_on_a_full_disk(rd, spec, exit_)
        if exit_.timed_out:
            break
    reason = StopReason.time if exit_ and exit_.timed_out else StopReason.killed
    ended = await run_local(
        rd.root, "--finalize", reason.value, deadline_s=GRADE_ALLOWANCE_S, env=env, zygote=zygote, **limits
    )
    done = _final(rd)
    if done is not None:
        return done, False
    stop_on_a_full_disk(rd, spec, ended)
    return harness_failure(rd, f"agent exited {exit_.returncode if exit_ else '?'} without a result; see logs/"), False


def paused(rd: RunDir, spec: RunSpec) -> RunResult:
    """The run's agent paused (labkube runs pause, or a usage checkpoint it crossed, which is recorded here: the
    harness never writes its own control): a result that is not final, with the run's phase Paused."""
    campaign_root = rd.root.parent.parent
    control = run_control(campaign_root, spec.run_id)
    status = read_model(rd.status_json, RunStatus) or RunStatus(run_id=spec.run_id)
    if control.paused is None and control.cancelled is None:
        due = control.due_checkpoint(status.spend, spec.pause_every_usd, spec.pause_every_hours)
        if due:
            checkpoint = usage_checkpoint(due, spec.pause_every_usd, spec.pause_every_hours)
            add_interventions(campaign_root, {spec.run_id: checkpoint})
    return RunResult.of_run(spec, status=RunPhase.paused, message=status.message or None)


def stop_on_a_full_disk(rd: RunDir, spec: RunSpec, exit_: SandboxExit) -> None:
    """An agent that stopped on a full, over-quota or read-only disk (DISK_FULL_EXIT) failed for the machine, not
    for the run: no result is written (the run resumes as it was once there is space), and the campaign stops with
    the agent's one line (`StorageFull`)."""
    # Here only (an agent that left no result): the agent's modules are 150 ms of imports the supervisor's first run
    # would otherwise wait for.
    from labkube.agent.harness.agent_main import DISK_FULL_EXIT

    if exit_.returncode == DISK_FULL_EXIT:
        why = last_error_line(rd) or line_for(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(rd.root)))
        raise StorageFull(f"run {spec.run_id}: {why}")


def card_limits(spec: RunSpec) -> dict[str, float]:
    """The task card's memory and CPUs, as the run's cgroup limits (a pod gets the same as its limit and request)."""
    from labkube.tasks import TaskError

    overlay = json.dumps(spec.task_overlay, sort_keys=True) if spec.task_overlay is not None else None
    try:
        return dict(_card_limits(spec.task, spec.task_path, spec.task_id, spec.family, overlay))
    except (TaskError, OSError):  # the agent meets the same error and ends the run with it, in the run's own words
        return {}


@functools.lru_cache(maxsize=1024)
def _card_limits(
    task: str, task_path: str, task_id: str | None, family: str, overlay: str | None
) -> tuple[tuple[str, float], ...]:
    """Read once per task (and GAIA question) while the supervisor lives, not once per run: a campaign's seeds share
    their card. A card that cannot be read is not kept (the error is raised each time)."""
    from labkube.tasks import card_for_run

    card = card_for_run(task, task_path, task_id, family, json.loads(overlay) if overlay is not None else None)
    return (("memory_gb", card.resources.memory_gb), ("cpus", card.resources.cpus))


async def task_environment(rd: RunDir, spec: RunSpec, env: dict[str, str] | None) -> dict[str, str] | None:
    """Build (or reuse) the task's environment before the agent starts; `env` for the agent with it named. Its time
    goes to `setup.json` (and the result's `setup_seconds`), not to the run's budget: the agent is not running."""
    from labkube.tasks import card_for_run
    from labkube.tasks.environment import CACHE_VARIABLE, ENV_VARIABLE, ensure_env

    if spec.family != "researchgym":
        return env
    card = card_for_run(spec.task, spec.task_path, spec.task_id, spec.family, spec.task_overlay)
    status = read_model(rd.status_json, RunStatus) or RunStatus(run_id=spec.run_id)
    write_model(rd.status_json, status.model_copy(update={"message": "building the task environment"}))

    def progress(line: str) -> None:
        with (rd.logs / "setup.log").open("a") as out:
            out.write(line + "\n")

    rd.logs.mkdir(parents=True, exist_ok=True)
    if spec.gpus and shutil.which("nvidia-smi"):  # what the run's GPUs were at setup, for whoever reads the logs
        smi = await asyncio.create_subprocess_exec(
            "nvidia-smi",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        out, _ = await smi.communicate()
        progress("$ nvidia-smi\n" + out.decode(errors="replace"))
    cache = (env or {}).get(CACHE_VARIABLE)
    built = await asyncio.to_thread(ensure_env, card, root=Path(cache) if cache else None, progress=progress)
    write_model(rd.status_json, status.model_copy(update={"message": ""}))
    if built is None:
        return env
    write_model(rd.root / "setup.json", built)
    return {**(env or {}), ENV_VARIABLE: str(built.path)}
