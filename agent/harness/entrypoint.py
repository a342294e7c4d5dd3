"""`labkube agent`: the process a sandbox runs for one run (a local subprocess or a pod).

It prepares the workspace, runs the loop under the run's budgets (resuming from
the checkpoint when asked), grades the workspace periodically and at the end,
and writes `result.json`. SIGTERM saves the checkpoint and exits without a
result, so the run can resume; `--finalize` grades a stopped run as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labkube.agent.budget import BudgetTracker
from labkube.agent.checkpoint import Checkpoint
from labkube.agent.containment import end_the_rest_of_the_container
from labkube.agent.harness.gpu import gpu_minor_numbers, read_gpu_use, start_gpu_meter
from labkube.agent.harness.steering import RunPaused, Steering, make_before_step, record_interventions
from labkube.agent.jobs import JobManager
from labkube.agent.messages import Message
from labkube.agent.prompts import initial_messages
from labkube.agent.providers.provider import ModelClient, ProviderError
from labkube.agent.providers.registry import make_provider
from labkube.agent.rg.loop import AgentRun, estimate_tokens, run_loop
from labkube.agent.rg.tools import ToolContext, tools_for
from labkube.agent.rg.web import web_tools
from labkube.agent.rg.workspace import Workspace
from labkube.agent.rg.world_errors import WorldFailure
from labkube.agent.rg.world_session import world_tools
from labkube.agent.run_sandbox import run_room
from labkube.agent.scaffolds.are_default import run_are_default
from labkube.agent.telemetry import RunTelemetry, start_telemetry
from labkube.agent.transcript import JsonlLog, now_iso, read_jsonl
from labkube.budgets import Budgets, StopReason, spend_floor
from labkube.control import read_control, run_control_path
from labkube.interventions import Intervention, RunControl
from labkube.model_ref import parse_model
from labkube.result import Grade, Outcome, RunResult, completion_of, outcome_for
from labkube.run_spec import CLI_AGENTS, CLUSTER_ACCOUNT_VARIABLE, ClusterAccount, RunPhase, RunSpec, RunStatus
from labkube.sandbox import SandboxMode
from labkube.storage_full import storage_error
from labkube.store import RunDir, read_model, set_aside_planted, utcnow, write_model
from labkube.task_card import NetworkAccess, TaskCard
from labkube.tasks import (
    GradeOutcome,
    PinnedTask,
    PristineTask,
    card_for_run,
    grade_run,
    grade_runs_in_workspace,
    prepare_run_workspace,
)
from labkube.tasks.gaia2.verdict_message import WORLD_VERDICT_SOURCE, WORLD_VERDICT_VARIABLE, verdict_from_report
from labkube.tasks.manifest import record_if_intact
from labkube.tasks.scoring import primary_scores
from labkube.tasks.workspace import record_git

if TYPE_CHECKING:
    from labkube.integrity import WorkspaceChanges

from labkube.agent.harness.gaia2_run import gaia2_grade, judge_failure, start_gaia2

log = logging.getLogger(__name__)


class AgentError(RuntimeError):
    pass


def write_status(rd: RunDir, spec: RunSpec, ckpt: Checkpoint, phase: RunPhase, message: str = "") -> None:
    last = ckpt.score_curve[-1] if ckpt.score_curve else None
    score = last.score if last else None
    if not message and last is not None and last.error and not phase.final:
        message = f"last grading failed (the run goes on): {last.error}"
    elif not message and last is not None and last.warnings and not phase.final:
        message = f"last grading: {'; '.join(last.warnings)}"
    write_model(
        rd.status_json,
        RunStatus(
            run_id=spec.run_id,
            phase=phase,
            step=ckpt.step,
            score=score,
            spend=ckpt.spend,
            stop_reason=ckpt.stop_reason,
            message=message,
            updated_at=utcnow(),
            attempts=ckpt.resumes + 1,
        ),
    )


def save_checkpoint(rd: RunDir, ckpt: Checkpoint) -> None:
    write_model(rd.checkpoint_json, ckpt)


def take_grade(rd: RunDir, card: TaskCard, ckpt: Checkpoint, final: bool = False) -> Grade:
    """Grade the run now, from the pristine task its campaign pinned (the grader's files at every grading, every
    file at the `final` one): a task that changed since is not graded."""
    spec = rd.spec()
    pinned = PinnedTask(spec.task_digest, rd.root, whole=final)
    if card.gaia2 is not None:
        changed = pinned.changes(card)
        if changed is None:
            return gaia2_grade(ckpt)
        outcome = GradeOutcome.not_graded(card, changed, task_changed=True)
    else:
        sandboxed = spec.sandbox is SandboxMode.bwrap
        scratch, log = rd.root / "scratch", rd.logs / "grader.log"
        outcome = grade_run(card, rd.workspace, scratch, log, ckpt.end_summary, pinned, sandboxed=sandboxed)
    return Grade(
        at_seconds=round(ckpt.spend.wall_seconds, 3),
        step=ckpt.step,
        tokens=ckpt.spend.usage.total,
        usd=ckpt.spend.usd,
        subtasks=outcome.subtasks,
        score=outcome.score,
        error=outcome.error,
        note=outcome.note,
        task_changed=outcome.task_changed,
        warnings=outcome.warnings,
    )


def latest_state(workspace: Path, jobs: JobManager) -> str:
    """What the agent's successor needs besides the summaries: changed files and jobs. The changes are labkube's
    record's (against the pristine commit), never git's of the agent's own `.git`, which would run its config."""
    try:
        changed = record_git(workspace, "status", "--short", "--ignore-submodules=dirty").strip() or "(no changes)"
    except RuntimeError:  # no record (a run directory of an older labkube) among them
        changed = "(unknown)"
    lines = ["## Latest state", "Files changed since the start (git status --short):", changed[:4000]]
    for record in jobs.jobs.values():
        jobs.poll(record.id)
        state = "running" if record.exit_code is None else f"exit {record.exit_code}"
        lines.append(f"- background {record.id}: {record.command!r} ({state})")
    return "\n".join(lines)


def handoff_messages(
    card: TaskCard, spec: RunSpec, workspace: Path, jobs: JobManager
) -> Callable[[list[str]], list[Message]]:
    def build(summaries: list[str]) -> list[Message]:
        notes = "\n\n".join(f"### Hand-off summary {i}\n{text}" for i, text in enumerate(summaries, start=1))
        return [
            *initial_messages(card, spec, workspace),
            Message(
                role="user",
                content=f"You are continuing earlier work on this task.\n\n{notes}\n\n{latest_state(workspace, jobs)}",
            ),
        ]

    return build


def restore_messages(rd: RunDir, ckpt: Checkpoint) -> list[Message]:
    records = read_jsonl(rd.root / "conversation.jsonl", ckpt.epoch_start_offset, ckpt.conversation_offset)
    return [Message.model_validate({k: v for k, v in r.items() if k != "epoch"}) for r in records]


async def run_agent(run_dir: Path, resume: bool = False, steering: Steering | None = None) -> RunResult:
    rd = RunDir(run_dir)
    spec = rd.spec()
    steering = steering or Steering.of_run(rd.root, spec.run_id)
    # the budgets as extended so far (labkube runs extend): a vendor CLI's gateway holds them for its whole start, so
    # for Claude Code and Codex an extend takes effect at their next start; rg-agent also takes later ones live
    spec = spec.model_copy(update={"budgets": steering.refresh().budgets(spec.budgets)})
    card = card_for_run(spec.task, spec.task_path, spec.task_id, spec.family, spec.task_overlay)
    record_if_intact(card, spec.task_digest, rd.root)  # so that a change from here on is named
    use_task_environment(rd, card)
    prepare_run_workspace(card, rd.workspace, spec.idea_hint)
    rd.logs.mkdir(parents=True, exist_ok=True)

    ckpt = read_model(rd.checkpoint_json, Checkpoint)
    if ckpt is not None and not resume:
        raise AgentError(f"run {spec.run_id} already started (checkpoint at step {ckpt.step}); pass --resume")
    if ckpt is not None and ckpt.stop_reason is not None:
        return finalize(rd, spec, card, ckpt)  # the loop had ended; only grading was left

    transcript = JsonlLog(rd.transcript)
    conversation = JsonlLog(rd.root / "conversation.jsonl")
    if ckpt is None:
        ckpt = Checkpoint(started_at=utcnow())
        transcript.truncate(0)
        conversation.truncate(0)
        messages: list[Message] = []
    else:
        transcript.truncate(ckpt.transcript_offset)
        conversation.truncate(ckpt.conversation_offset)
        messages = restore_messages(rd, ckpt)
        ckpt.resumes += 1
    from labkube.agent.gateway.ledger import cluster_spend  # the gateway package is the sidecar's, not loaded before

    seen = cluster_spend()  # on a cluster, what earlier pods' gateways counted: the checkpoint is the agent's to write
    if seen is not None:
        ckpt.spend = spend_floor(ckpt.spend, seen)

    ref = parse_model(spec.model)
    graded = [g.score for g in ckpt.score_curve if g.score is not None]
    telemetry = start_telemetry(spec, best_score=max(graded, default=None))
    start_gpu_meter(rd.root, spec.gpus, telemetry)  # a daemon thread: samples until this process ends
    world = None

    def stop_before_the_loop(reason: StopReason, error: str | None) -> RunResult:
        ckpt.stop_reason = reason
        transcript.close()
        conversation.close()
        return finalize(rd, spec, card, ckpt, error, telemetry)

    if card.gaia2 is not None:
        world, early = await start_gaia2(rd, spec, card, ckpt, transcript, ref.provider == "oracle")
        if early is not None:  # the oracle's verdict, or a world that would not start
            return stop_before_the_loop(*early)
        if spec.agent == "are-default":
            assert world is not None
            try:
                outcome = await run_are_default(spec, ckpt, world, transcript)
            finally:
                await world.close()
            return stop_before_the_loop(*outcome)
    if spec.agent in CLI_AGENTS:
        # Here only: the vendor CLIs' scaffold brings the model gateway and the SDKs' types it reads answers with
        # (0.3 s of imports), which a scripted run, forked from the zygote that imported this module, never uses.
        from labkube.agent.scaffolds.cli_agents import CLI_TOOL_NAMES, RunHooks, run_cli_agent

        telemetry.declare_tools(CLI_TOOL_NAMES)
        hooks = RunHooks(take_grade, write_status, save_checkpoint, gpu_minor_numbers)
        try:
            outcome = await run_cli_agent(rd, spec, card, ckpt, transcript, telemetry, hooks, world)
            if world is not None and outcome[0] is not StopReason.world_error:
                ckpt.world_verdict = (await world.finish()).model_dump(mode="json")
        except WorldFailure as exc:
            outcome = (StopReason.world_error, f"the Gaia2 world failed: {exc}")
        finally:
            if world is not None:
                await world.close()
        return stop_before_the_loop(*outcome)
    if spec.agent != "rg-agent":
        return stop_before_the_loop(StopReason.error, f"agent {spec.agent} runs Gaia2 scenarios only")
    try:
        provider = make_provider(ref, card, spec)
    except ProviderError as exc:  # a missing key or an unusable model: graded as it stands
        transcript.append({"type": "model_error", "ts": now_iso(), "reason": exc.reason.value, "error": str(exc)})
        if world is not None:
            await world.close()
        return stop_before_the_loop(exc.reason, str(exc))
    provider.restore(ckpt.provider_state)
    jobs = JobManager(rd.root / "jobs")
    jobs.restore(ckpt.jobs)
    tracker = BudgetTracker(spec.budgets, ckpt.spend)  # as extended so far (above)

    def time_left() -> float | None:
        if tracker.budgets.wall_seconds is None:
            return None
        tracker.tick()
        return tracker.budgets.wall_seconds - tracker.spend.wall_seconds

    ctx = ToolContext(
        workspace=Workspace(rd.workspace),
        blocked_urls=card.blocked_urls,
        jobs=jobs,
        time_left=time_left,
        secret_vars=frozenset(spec.api_key_env.values()),
        room=run_room(
            spec,
            rd.root,
            rd.workspace,
            gpu_minors=gpu_minor_numbers(spec.gpus),
            outbound_proxy=card.network is NetworkAccess.proxy,
        ),
    )
    tools = await world_tools(world, ctx) if world else [*tools_for(card, ctx), *web_tools(ctx)]
    telemetry.declare_tools(t.name for t in tools)
    run = AgentRun(
        client=ModelClient(provider, str(ref), prices=dict(spec.prices)),
        tools={t.name: t for t in tools},
        ctx=ctx,
        tracker=tracker,
        transcript=transcript,
        conversation=conversation,
        checkpoint=ckpt,
        messages=messages,
        context_threshold=spec.context_threshold or int(provider.context_tokens * 0.75),
        base_messages=handoff_messages(card, spec, rd.workspace, jobs),
        telemetry=telemetry,
        world=world,
    )
    run.context_estimate = sum(estimate_tokens(m) for m in messages)
    if not messages:
        for m in initial_messages(card, spec, rd.workspace):
            run.add_message(m)
    transcript.append(
        {
            "type": "resume" if ckpt.resumes else "start",
            "ts": now_iso(),
            "run_id": spec.run_id,
            "step": ckpt.step,
            "model": spec.model,
            "seed": spec.seed,
        }
    )

    async def after_step(r: AgentRun) -> None:
        interval = None if card.gaia else spec.grade_interval_s or card.grading.interval_s
        if interval and r.tracker.spend.wall_seconds - ckpt.last_grade_at >= interval:
            grade = await asyncio.to_thread(take_grade, rd, card, ckpt)
            ckpt.score_curve.append(grade)
            ckpt.last_grade_at = r.tracker.spend.wall_seconds
            r.transcript.append({"type": "grade", "ts": now_iso(), **grade.model_dump(mode="json")})
            telemetry.grade(grade.score, completion_of(grade.subtasks))
        telemetry.step(r.tracker)
        ckpt.provider_state = provider.state()
        ckpt.jobs = list(jobs.jobs.values())
        ckpt.ended, ckpt.end_summary = r.ctx.ended, r.ctx.end_summary
        ckpt.transcript_offset = r.transcript.offset
        ckpt.conversation_offset = r.conversation.offset
        save_checkpoint(rd, ckpt)
        write_status(rd, spec, ckpt, RunPhase.running)

    run.on_step = after_step
    run.before_step = make_before_step(steering, spec, spec.budgets, telemetry)
    ckpt.transcript_offset, ckpt.conversation_offset = transcript.offset, conversation.offset
    save_checkpoint(rd, ckpt)
    write_status(rd, spec, ckpt, RunPhase.running)

    error = None
    proxy = None
    if ctx.room.proxy is not None:  # only a `network: proxy` task's run loads the proxy (and the gateway's wire)
        from labkube.agent.sandbox_proxy import start_proxy

        proxy = await start_proxy(ctx.room.proxy, card, transcript)
    try:
        reason = await run_loop(run)
    except RunPaused as paused:  # at a step boundary: what the step before it saved is the run's whole state
        jobs.kill_all()
        if world is not None:
            await world.close()
        ckpt.jobs = list(jobs.jobs.values())
        ckpt.transcript_offset, ckpt.conversation_offset = transcript.offset, conversation.offset
        save_checkpoint(rd, ckpt)
        write_status(rd, spec, ckpt, RunPhase.paused, paused.why)
        raise
    except asyncio.CancelledError:
        run.tracker.tick()
        if steering.halt == "cancel":  # a person cancelled it: graded as it stands (or not at all: --no-grade)
            jobs.kill_all()
            reason = StopReason.cancelled
            record_interventions(steering.refresh(), ckpt, transcript, telemetry, ckpt.step)
        elif not time_is_up(run.tracker):
            # SIGTERM (preemption, a dead supervisor): the last completed step's checkpoint is on disk.
            jobs.kill_all()
            if world is not None:
                await world.close()
            transcript.append({"type": "terminated", "ts": now_iso(), "step": ckpt.step})
            write_status(rd, spec, ckpt, RunPhase.running, "terminated; resumable")
            raise
        else:  # terminated at the end of the time budget (a pod's deadline, a stuck call): grade what is there
            reason = StopReason.time
            transcript.append(
                {"type": "budget_stop", "ts": now_iso(), "reason": "time", "detail": "terminated at deadline"}
            )
    except Exception as exc:  # a harness error: still grade what is there
        if is_disk_full(exc):
            raise
        reason, error = StopReason.error, f"{type(exc).__name__}: {exc}"
        (rd.logs / "agent-error.txt").write_text(traceback.format_exc())
        transcript.append({"type": "harness_error", "ts": now_iso(), "error": error})
    finally:
        jobs.kill_all()
        if proxy is not None:
            await proxy.close()
        try:
            await provider.aclose()
        except Exception as exc:  # after the run's last call: the run's result stands, the failure is logged
            log.warning("run %s: closing the model client failed: %s: %s", spec.run_id, type(exc).__name__, exc)
    if world is not None:
        if reason is StopReason.world_error:
            error = f"the Gaia2 world failed: {run.world_error}"
        else:
            try:
                ckpt.world_verdict = (await world.finish()).model_dump(mode="json")
            except WorldFailure as exc:
                reason, error = StopReason.world_error, f"the Gaia2 world failed: {exc}"
        await world.close()
    ckpt.jobs = list(jobs.jobs.values())
    ckpt.spend = run.tracker.spend
    ckpt.stop_reason = reason
    ckpt.transcript_offset = transcript.offset
    ckpt.conversation_offset = conversation.offset
    save_checkpoint(rd, ckpt)
    transcript.close()
    conversation.close()
    return finalize(rd, spec, card, ckpt, error, telemetry)


def run_capabilities(card: TaskCard, spec: RunSpec) -> list[str]:
    """The scenario's capabilities, plus the augmentations this run applied (reported as their own)."""
    if card.gaia2 is None:
        return []
    tags = set(card.gaia2.capabilities)
    if spec.gaia2_noise:
        tags.add("noise")
    if spec.gaia2_a2a and spec.model != "oracle":
        tags.add("agent2agent")
    return sorted(tags)


# Set on a run pod's agent container (operator/pod_manifest.py), never on its grading pod's: the operator grades
# the run in a pod of its own once this one ended and takes no result from this one (operator/k8s_grading.py), so
# the final grade and the audit here would only spend the pod's time, and its GPUs, twice.
GRADED_BY_OPERATOR_VARIABLE = "LABKUBE_GRADED_BY_OPERATOR"


def hand_over_to_grading(
    rd: RunDir, spec: RunSpec, ckpt: Checkpoint, error: str | None, telemetry: RunTelemetry | None
) -> RunResult:
    """The agent's loop ended in a run pod: its checkpoint is saved for the grading pod; no grade, no `result.json`.
    The returned result is provisional, written nowhere: only its status becomes the exit code (0: the loop ended, 1: it
    failed), which is all the operator reads of this pod."""
    reason = ckpt.stop_reason or StopReason.killed
    ckpt.stop_reason = reason
    save_checkpoint(rd, ckpt)
    write_status(rd, spec, ckpt, RunPhase.grading, "graded in a pod of its own once this one ends")
    if telemetry is not None:
        telemetry.finished()
    return RunResult.of_run(
        spec,
        status=RunPhase.failed if reason in FAILURE_STOPS else RunPhase.finished,
        stop_reason=reason,
        error=error,
        spend=ckpt.spend,
        started_at=ckpt.started_at,
        resumes=ckpt.resumes,
    )


def finalize(
    rd: RunDir,
    spec: RunSpec,
    card: TaskCard,
    ckpt: Checkpoint,
    error: str | None = None,
    telemetry: RunTelemetry | None = None,
) -> RunResult:
    """Take the final grade from the pristine grader and write `result.json` (in a run pod: leave it to the grading
    pod, `hand_over_to_grading`)."""
    if os.environ.get(GRADED_BY_OPERATOR_VARIABLE) == "1":
        return hand_over_to_grading(rd, spec, ckpt, error, telemetry)
    # The record is made again from the task wherever the agent could have written the run folder's: on a cluster
    # (the grading pod), or unsandboxed. Under the local sandbox it is out of the agent's reach, and copying a
    # workspace of many gigabytes at every run's end would buy nothing.
    rebuilt = spec.sandbox is not SandboxMode.bwrap
    recorded = record_workspace(rd, PristineTask(card, spec.idea_hint) if rebuilt else None)
    control = RunControl(run_id=spec.run_id, interventions=interventions_of(rd, spec.run_id))
    cancel = control.cancelled
    if cancel is not None and ckpt.stop_reason in (None, StopReason.killed, StopReason.cancelled):
        ckpt.stop_reason = StopReason.cancelled
    write_status(rd, spec, ckpt, RunPhase.grading)
    if ckpt.stop_reason is StopReason.cancelled and cancel is not None and not cancel.grade:
        final = Grade(at_seconds=round(ckpt.spend.wall_seconds, 3), step=ckpt.step, note=NOT_GRADED)
    else:
        final = take_grade(rd, card, ckpt, final=True)
    ckpt.score_curve.append(final)
    primary = card.primary
    p = next((s for s in final.subtasks if primary and s.id == primary.id), None)
    reason = ckpt.stop_reason or StopReason.killed
    stopped_by_failure = reason in (StopReason.error, StopReason.auth, StopReason.model_error, StopReason.world_error)
    if error is None and stopped_by_failure:
        events = read_jsonl(rd.transcript)
        error = next(
            (e.get("error") for e in reversed(events) if e.get("type") in ("model_error", "harness_error")),
            None,
        )
    judge_error = judge_failure(ckpt.world_verdict) if card.gaia2 is not None else None
    grader_error = final.error if card.gaia2 is None else None
    outcome = outcome_for(
        reason,
        RunPhase.finished,
        grader_failed=grader_error is not None,
        score=final.score,
        judge_failed=judge_error is not None,
        task_changed=final.task_changed,
    )
    if outcome is Outcome.grader_error or final.task_changed:
        error = final.error if error is None else f"{error}; {final.error}"
    elif outcome is Outcome.judge_error:
        error = judge_error
    elif outcome.is_error and error is None:
        error = f"the run stopped on {reason.value}"
    message = None if outcome.is_error else final.note
    if outcome is Outcome.cancelled and cancel is not None:
        message = f"{cancel.describe()}{f'; {final.note}' if final.note else ''}"
    result = RunResult.of_run(
        spec,
        status=RunPhase.failed if outcome.is_error else RunPhase.finished,
        stop_reason=reason,
        outcome=outcome,
        error=error,
        message=message,
        score=final.score,
        flagged_score=p.fraction_of_sota if p is not None and p.implausible else None,
        values_before_error=final.values_before_error,
        primary_scores=primary_scores(card, final.subtasks),
        beat_baseline=None if p is None or p.raw is None else p.beat_baseline,
        completion=None if final.error else completion_of(final.subtasks),
        subtasks=final.subtasks,
        spend=ckpt.spend,
        score_curve=ckpt.score_curve,
        # a grading pod copied the periodic gradings from the agent's checkpoint: they are the agent pod's claim
        score_curve_source="referee" if cluster_account() is None else "agent_pod",
        started_at=ckpt.started_at,
        capabilities=run_capabilities(card, spec),
        details=result_details(card, spec, ckpt),
        finished_at=utcnow(),
        resumes=ckpt.resumes,
        setup_seconds=setup_seconds(rd),
        gpu=read_gpu_use(rd.root),
        interventions=control.interventions,
    )
    save_checkpoint(rd, ckpt)
    write_model(rd.result_json, result)
    # A grade that ran nothing over the workspace left it as recorded: the audit takes the record's changes.
    result = audit(rd, spec, result, telemetry, card, None if grade_runs_in_workspace(card) else recorded)
    write_status(rd, spec, ckpt, result.status, result.error or result.message or "")
    if telemetry is not None:
        telemetry.grade(final.score, result.completion)
        if card.gaia2 is not None and ckpt.world_verdict is not None:
            telemetry.gaia2(bool(ckpt.world_verdict.get("success")), result.capabilities)
        telemetry.finished()
    return result


NOT_GRADED = "cancelled with --no-grade: not graded"


def interventions_of(rd: RunDir, run_id: str) -> list[Intervention]:
    """The run's interventions for its result: in a grading pod the operator's account of them (the Run's spec, which
    only the API's RBAC lets anyone write), else the campaign's control file (out of every sandbox's reach)."""
    account = cluster_account()
    if account is not None:
        return account.interventions
    path = run_control_path(rd.root)
    return read_control(path, run_id).interventions if path is not None else []


def result_details(card: TaskCard, spec: RunSpec, ckpt: Checkpoint) -> dict[str, Any]:
    """ARE's verdict for a Gaia2 run; for a vendor CLI, which one ran (pinned and reported versions) and how
    each start began (its session resumed, or anew)."""
    details: dict[str, Any] = {}
    if card.gaia2 and ckpt.world_verdict:
        details["gaia2"] = ckpt.world_verdict
    if spec.agent in CLI_AGENTS and "cli" in ckpt.provider_state:
        details["cli"] = ckpt.provider_state["cli"]
    return details


def record_workspace(rd: RunDir, pristine: PristineTask | None = None) -> WorkspaceChanges | None:
    """The run-end record of the workspace's files (content ids, when each was last written) that the audit reads
    file times from, taken before anything can copy the run, against the `pristine` task made again (in a grading
    pod the run folder's `workspace.git` is the agent's to have rewritten). Every scaffold ends here; without a record
    the audit falls back to the files' own times. Returns the workspace's changes it recorded (None when it failed)."""
    from labkube.integrity import record_workspace_files

    try:
        return record_workspace_files(rd.root, pristine)
    except (OSError, RuntimeError) as exc:
        rd.logs.mkdir(parents=True, exist_ok=True)
        (rd.logs / "audit-error.txt").write_text(f"recording the workspace's files failed: {exc}\n")
        return None


def audit(
    rd: RunDir,
    spec: RunSpec,
    result: RunResult,
    telemetry: RunTelemetry | None = None,
    card: TaskCard | None = None,
    changed: WorkspaceChanges | None = None,
) -> RunResult:
    """The integrity audit (of `card`'s task, with the workspace's `changed` files when they are known already); a
    failure of the audit itself is recorded, never fatal to the run."""
    from labkube.agent.gateway.record import records_dir
    from labkube.integrity import audit_run

    try:
        report = audit_run(
            rd.root,
            spec.inspector_model,
            spec.inspector_budget_usd,
            card=card,
            changed=changed,
            spec=spec,
            result=result,
            # a grading pod's read-only mount of the gateway's record of the model's tool calls (the pod manifest)
            gateway_records=records_dir(),
        )
    except Exception as exc:
        (rd.logs / "audit-error.txt").write_text(traceback.format_exc())
        result.integrity_verdict = "NEEDS_REVIEW"
        failed = f"integrity audit failed: {type(exc).__name__}: {exc}"
        result.message = f"{result.message}; {failed}" if result.message else failed
        write_model(rd.result_json, result)
        return result
    result.integrity_verdict = report.verdict.value
    if telemetry is not None:
        telemetry.integrity(report.verdict.value, [v.type.value for v in report.violations])
    return result


# Stops whose outcome is an error already: a missing verdict is not what went wrong.
FAILURE_STOPS = frozenset(
    {
        StopReason.auth,
        StopReason.model_error,
        StopReason.world_error,
        StopReason.error,
        StopReason.setup_error,
        StopReason.killed,
    }
)


def finalize_stopped(run_dir: Path, reason: StopReason) -> RunResult:
    """Grade a run whose agent was stopped from outside (time budget overrun, unrecoverable crash)."""
    rd = RunDir(run_dir)
    account = cluster_account()
    # a grading pod: the run folder is the agent's volume; what it planted where labkube reads and writes goes aside
    planted = set_aside_planted(rd.root) if account is not None else []
    spec = rd.spec()
    card = card_for_run(spec.task, spec.task_path, spec.task_id, spec.family, spec.task_overlay)
    use_task_environment(rd, card)
    prepare_run_workspace(card, rd.workspace, spec.idea_hint)
    ckpt = read_model(rd.checkpoint_json, Checkpoint) or Checkpoint()
    if account is None:
        ckpt.stop_reason = ckpt.stop_reason or reason
    else:  # a grading pod: the checkpoint is on the agent's volume, and the run is charged what the cluster saw
        budgets = RunControl(run_id=spec.run_id, interventions=account.interventions).budgets(spec.budgets)
        ckpt.stop_reason = cluster_stop_reason(reason, ckpt.stop_reason, account, budgets)
        if account.spend is not None:
            ckpt.spend = account.spend.model_copy(deep=True)
        ckpt.spend.wall_seconds = account.wall_seconds
        ckpt.resumes = max(0, account.attempts - 1)
    error = None
    if card.gaia2 is not None and os.environ.get(WORLD_VERDICT_SOURCE) == "operator":
        # A grading pod: the checkpoint is on the agent's volume; the verdict is the one the world sidecar reported.
        ckpt.world_verdict = verdict_from_report(os.environ.get(WORLD_VERDICT_VARIABLE))
        if ckpt.world_verdict is None and ckpt.stop_reason not in FAILURE_STOPS:
            ckpt.stop_reason = StopReason.world_error
            error = "the run's world sidecar reported no verdict (it never judged the run, or ended first)"
    result = finalize(rd, spec, card, ckpt, error, telemetry=start_telemetry(spec))
    if planted:
        # said in the result; the audit saw each as a `planted_file` (integrity/rules.py check_run_folder)
        refused = "set aside what the agent left where labkube keeps its files: " + ", ".join(planted)
        result.message = f"{result.message}; {refused}" if result.message else refused
    ended = account is not None and end_the_rest_of_the_container() is not None
    if planted or ended:
        # the grader may have run the agent's code: with every other process of the pod ended, the result written
        # now (and the termination message read from it) is this process's, whatever a leftover wrote meanwhile
        write_model(rd.result_json, result)
    return result


def cluster_account() -> ClusterAccount | None:
    """The operator's account of the run, in a grading pod (`CLUSTER_ACCOUNT_VARIABLE`); None elsewhere."""
    text = os.environ.get(CLUSTER_ACCOUNT_VARIABLE)
    return ClusterAccount.model_validate_json(text) if text else None


BUDGET_STOPS = (StopReason.tokens, StopReason.usd, StopReason.steps)


def cluster_stop_reason(
    reason: StopReason, claimed: StopReason | None, account: ClusterAccount, budgets: Budgets
) -> StopReason:
    """Why a run on a cluster stopped, from what the operator saw (`reason`: the agent pod's exit code, a deadline, the
    attempts used up) and the gateways' account; the checkpoint's word (`claimed`) only names which failure an agent
    that failed (exit 1) had, which changes no score."""
    if reason is StopReason.error:
        return claimed if claimed in FAILURE_STOPS else reason
    if reason is not StopReason.done:
        return reason
    if account.budget_stop in BUDGET_STOPS:
        return account.budget_stop
    spend = account.spend
    if spend is not None:
        if budgets.tokens is not None and spend.usage.total >= budgets.tokens:
            return StopReason.tokens
        if budgets.usd is not None and spend.usd >= budgets.usd:
            return StopReason.usd
        if budgets.steps is not None and spend.steps >= budgets.steps:
            return StopReason.steps
    if budgets.wall_seconds is not None and account.wall_seconds >= budgets.wall_seconds:
        return StopReason.time
    return reason


def time_is_up(tracker: BudgetTracker) -> bool:
    limit = tracker.budgets.wall_seconds
    return limit is not None and tracker.spend.wall_seconds >= limit


def is_disk_full(exc: BaseException) -> bool:
    """A full, over-quota or read-only filesystem (labkube/storage_full.py), however it surfaced."""
    return storage_error(exc) is not None


def setup_seconds(rd: RunDir) -> float | None:
    """The sandbox's time on the task environment (`setup.json`), reported beside the budget, not in it."""
    from labkube.tasks.environment import TaskEnv

    env = read_model(rd.root / "setup.json", TaskEnv)
    return round(env.seconds, 3) if env is not None else None


def use_task_environment(rd: RunDir, card: TaskCard) -> None:
    """The task's environment for this process's tools and grader. The local sandbox builds it first and names it
    (LABKUBE_TASK_ENV); in a pod the `task-env` init container (`runs.taskEnvironments`) or the task's image has
    built it into LABKUBE_ENV_CACHE, where it is found by its key. A pod with neither runs the task with labkube's
    own interpreter, as before (its NetworkPolicy would refuse the package index)."""
    from labkube.tasks.environment import ENV_VARIABLE, SetupError, ensure_env, ready_env

    if os.environ.get(ENV_VARIABLE) or card.gaia2 is not None or card.gaia is not None:
        return
    if os.environ.get("LABKUBE_RUN_DIR") and not ready_env(card):  # a pod without a prepared environment
        return
    try:
        env = ensure_env(card)
    except SetupError as exc:  # the agent never starts: a final result that says why, then the one-line error
        spec = rd.spec()
        result = RunResult.of_run(
            spec,
            status=RunPhase.failed,
            stop_reason=StopReason.setup_error,
            outcome=Outcome.setup_error,
            error=str(exc),
            details={"setup_log_tail": exc.log_tail} if exc.log_tail else {},
            finished_at=utcnow(),
        )
        write_model(rd.result_json, result)
        raise AgentError(str(exc)) from None
    if env is None:
        return
    os.environ[ENV_VARIABLE] = str(env.path)
    if not (rd.root / "setup.json").exists():
        write_model(rd.root / "setup.json", env)
