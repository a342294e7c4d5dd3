"""`labkube runs VERB CAMPAIGN [RUN_ID...]`: steer a live campaign's runs (docs/live-control.md). CAMPAIGN is a
campaign directory (local) or a Campaign's name (`--backend k8s`). Every request is checked before anything is
written (a run id that does not exist, a finished run, resuming a run that is not paused, a message to a run that
cannot take one: one line, exit 2, nothing changed), then recorded as an intervention of each run it acts on."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from labkube.cli_checks import UsageFailure, console, did_you_mean, open_campaign, option_error_line
from labkube.control import requester, steer_here
from labkube.interventions import (
    PAST,
    BudgetChange,
    ControlError,
    ControlVerb,
    Intervention,
    InterventionKind,
    SteerRequest,
)
from labkube.store import LOCK_FILE

WHEN = {
    ControlVerb.cancel: "ends now; it is graded as it stands",
    ControlVerb.pause: "pauses at its next step (its checkpoint saved, its slot and GPUs freed)",
    ControlVerb.resume: "goes on from its checkpoint",
    ControlVerb.drain: "will not start until resumed",
    ControlVerb.extend: "has its new budgets from its next step",
    ControlVerb.message: "reads the message at its next turn",
}


def steering_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """CAMPAIGN, RUN_ID..., --all, --reason and the backend's options, common to every verb."""

    @click.argument("campaign")
    @click.argument("run_ids", nargs=-1)
    @click.option("--all", "all_runs", is_flag=True, help="Every run of the campaign this applies to.")
    @click.option("--reason", default=None, help="Why: kept with the intervention, in the record of the run.")
    @click.option(
        "--backend",
        type=click.Choice(["local", "k8s"]),
        default="local",
        show_default=True,
        help="local: CAMPAIGN is the campaign's directory; k8s: the Campaign's name.",
    )
    @click.option("--kube-context", default=None, help="k8s: kubeconfig context (default: the current one).")
    @click.option("--namespace", default=None, help="k8s: namespace of the Campaign (default: the context's).")
    @wraps(command)
    def wrapped(**kwargs: Any) -> None:
        command(**kwargs)

    return wrapped


def steer(verb: ControlVerb, kind: InterventionKind, params: dict[str, Any], **fields: Any) -> None:
    """Check and record one request, then say what each run it acted on does next."""
    campaign, run_ids, all_runs = params["campaign"], list(params["run_ids"]), params["all_runs"]
    backend = params["backend"]
    if verb is ControlVerb.drain and (run_ids or all_runs):
        raise UsageFailure("drain acts on the whole campaign: give no RUN_ID and no --all")
    if verb is not ControlVerb.drain and not run_ids and not all_runs:
        raise UsageFailure(f"name the runs to {verb.value} (RUN_ID...), or give --all for every run it applies to")
    if run_ids and all_runs:
        raise UsageFailure("give RUN_IDs or --all, not both")
    if backend == "local" and (params["kube_context"] or params["namespace"]):
        raise UsageFailure("--kube-context and --namespace need --backend k8s")
    if verb is ControlVerb.drain:
        given = params["reason"]
        fields["reason"] = f"drained: {given}" if given else "drained"
    try:
        request = SteerRequest(
            verb=verb,
            campaign=campaign,
            run_ids=run_ids,
            all_runs=all_runs,
            intervention=Intervention(kind=kind, by=requester(), **{"reason": params["reason"], **fields}),
        )
    except ValidationError as exc:
        ctx = click.get_current_context()
        raise UsageFailure(option_error_line(exc, ctx.command, ctx.params)) from None
    if backend == "k8s":
        from labkube.operator.k8s_control import steer as steer_on_cluster
        from labkube.operator.kube import KubeError

        try:
            picked = steer_on_cluster(request, params["kube_context"], params["namespace"])
        except (ControlError, KubeError) as exc:
            raise UsageFailure(f"campaign {campaign}: {exc}") from None
        held = True
    else:
        picked, held = steer_local(Path(campaign), request)
    when = WHEN[verb]
    if request.intervention.now:
        when = "stops now (the step under way runs again on resume), its slot and GPUs freed"
    elif verb is ControlVerb.cancel and not request.intervention.grade:
        when = "ends now, not graded (--no-grade)"
    for run_id in picked:
        console.print(f"{PAST[verb]}: {run_id} {when}", highlight=False, soft_wrap=True)
    if not held:
        console.print(
            "no labkube run is running this campaign: this takes effect at its next `labkube run` (a paused run stays "
            "paused)",
            highlight=False,
            soft_wrap=True,
        )


def steer_local(directory: Path, request: SteerRequest) -> tuple[list[str], bool]:
    """`request` on the campaign in `directory`: the runs it acted on, and whether a `labkube run` holds it now."""
    from labkube.results.report_cli import runner_gone

    cdir = open_campaign(directory)
    owner = cdir.root.stat().st_uid
    if owner != os.getuid():
        raise UsageFailure(
            f"{directory}: the campaign belongs to uid {owner}; only its owner can steer its runs (run this as them)"
        )
    known = cdir.run_ids()
    for run_id in request.run_ids:
        if run_id not in known:
            hint = did_you_mean(run_id, known) or f"its runs are listed by `labkube status {directory}`"
            raise UsageFailure(f"run {run_id}: not a run of the campaign in {directory}; {hint}")
    try:
        picked = steer_here(cdir, request)
    except ControlError as exc:
        raise UsageFailure(str(exc)) from None
    return picked, (cdir.root / LOCK_FILE).exists() and not runner_gone(cdir)


@click.group("runs")
def runs() -> None:
    """Steer a live campaign's runs: cancel, pause, resume, drain, extend or message them. Every intervention is
    kept with the run (transcript, result.json, reports, exports, metrics)."""


@runs.command("cancel")
@steering_options
@click.option("--no-grade", is_flag=True, help="Do not grade the workspace as it stands.")
def cancel(no_grade: bool, **params: Any) -> None:
    """End runs now: outcome `cancelled`, left out of every statistic and counted apart; the campaign goes on."""
    steer(ControlVerb.cancel, InterventionKind.cancel, params, grade=not no_grade)


@runs.command("pause")
@steering_options
@click.option("--now", is_flag=True, help="At once: the step under way is lost (it runs again on resume).")
def pause(now: bool, **params: Any) -> None:
    """Pause runs at their next step: checkpoint saved, processes ended, slot and GPUs freed, time not charged."""
    steer(ControlVerb.pause, InterventionKind.pause, params, now=now)


@runs.command("resume")
@steering_options
def resume(**params: Any) -> None:
    """Resume paused runs from their checkpoints."""
    steer(ControlVerb.resume, InterventionKind.resume, params)


@runs.command("drain")
@steering_options
def drain(**params: Any) -> None:
    """Start no new run of the campaign (those running finish); `resume --all` undoes it."""
    steer(ControlVerb.drain, InterventionKind.pause, params)


@runs.command("extend")
@steering_options
@click.option("--hours", "wall_hours", type=float, default=None, help="The run's new time budget, in hours.")
@click.option("--usd", type=float, default=None, help="The run's new dollar budget.")
@click.option("--tokens", type=int, default=None, help="The run's new token budget.")
@click.option("--steps", type=int, default=None, help="The run's new step budget.")
def extend(wall_hours: float | None, usd: float | None, tokens: int | None, steps: int | None, **params: Any) -> None:
    """Set live runs' budgets (raised or lowered) from their next step; the agent is told its new remaining budget.
    An extend also releases a run paused at a usage checkpoint."""
    try:
        change = BudgetChange(wall_hours=wall_hours, usd=usd, tokens=tokens, steps=steps)
    except ValidationError as exc:
        ctx = click.get_current_context()
        raise UsageFailure(option_error_line(exc, ctx.command, ctx.params)) from None
    steer(ControlVerb.extend, InterventionKind.extend, params, budgets=change)


@runs.command("message")
@steering_options
@click.option("--text", "-m", "text", required=True, help="What to tell the agent (its next turn, marked as yours).")
def message(text: str, **params: Any) -> None:
    """Send a note to runs' agents, delivered in their next turn as the operator's (rg-agent only)."""
    if not text.strip():
        raise UsageFailure("--text is empty; say what the agent should read")
    steer(ControlVerb.message, InterventionKind.message, params, message=text)
