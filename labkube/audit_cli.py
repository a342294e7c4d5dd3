"""`labkube audit RUN_DIR`: the integrity audit run again on a finished run (the rule checks, and the LLM inspector
when a model is given), its verdict and violations shown, integrity.json and result.json rewritten."""

from __future__ import annotations

import os
from pathlib import Path

import click

from labkube.cli_checks import UsageFailure, check_finite_positive, console
from labkube.integrity_report import verdict_basis
from labkube.model_ref import UnknownModel
from labkube.result import RunResult
from labkube.run_spec import RunStatus
from labkube.store import RunDir, read_model
from labkube.tasks import TaskError
from labkube.tasks.workspace import MissingRecord


@click.command("audit")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--inspector-model", default=None, help="Also run the LLM integrity inspector with this model.")
@click.option("--inspector-budget-usd", type=float, default=None, help="The inspector's dollars (default 1.0).")
@click.option("--judge-model", default=None, help="Deprecated: --inspector-model.")
@click.option("--judge-budget-usd", type=float, default=None, help="Deprecated: --inspector-budget-usd.")
def audit(
    run_dir: Path,
    inspector_model: str | None,
    inspector_budget_usd: float | None,
    judge_model: str | None,
    judge_budget_usd: float | None,
) -> None:
    """Re-run the integrity audit on a finished run; writes integrity.json and updates result.json."""
    from rich.table import Table

    from labkube.integrity import audit_run
    from labkube.model_ref import parse_model

    if not (run_dir / "run.json").exists():
        raise UsageFailure(f"{run_dir}: not a run directory (no run.json); pass campaigns/NAME/runs/RUN-ID")
    check_run_finished(RunDir(run_dir))
    for old, new, given in (
        ("--judge-model", "--inspector-model", judge_model),
        ("--judge-budget-usd", "--inspector-budget-usd", judge_budget_usd),
    ):
        if given is not None:
            click.echo(f"warning: labkube audit {old} is deprecated; use {new} (the integrity inspector's)", err=True)
    inspector_model = inspector_model or judge_model
    check_finite_positive(inspector_budget_usd, "--inspector-budget-usd")
    check_finite_positive(judge_budget_usd, "--judge-budget-usd")
    spec = RunDir(run_dir).spec()
    if inspector_model:
        from labkube.agent.providers.registry import header_safe_key, required_key_variable

        try:
            var = required_key_variable(inspector_model, parse_model(inspector_model), spec.api_key_env)
            key = header_safe_key(var, os.environ.get(var) or "") if var else None
        except (UnknownModel, ValueError) as exc:
            raise UsageFailure(f"inspector model {inspector_model}: {exc}") from None
        if var and key is None:
            raise UsageFailure(
                f"inspector model {inspector_model}: {var} is not set; export it, or audit without "
                "--inspector-model (the rule checks need no key)"
            )
    budget = inspector_budget_usd or judge_budget_usd or 1.0
    try:
        report = audit_run(run_dir, inspector_model, budget)
    except TaskError as exc:
        raise UsageFailure(
            f"{run_dir}: cannot read the run's task ({exc}); the audit needs the task folder where the run found it, "
            f"{spec.task_path or spec.task}"
        ) from None
    except MissingRecord as exc:
        raise UsageFailure(f"{run_dir}: {exc}") from None
    style = {"PASS": "green", "NEEDS_REVIEW": "yellow", "SUSPICIOUS": "bold red"}[report.verdict.value]
    console.print(
        f"[{style}]{report.verdict.value}[/] ({verdict_basis(report)}); checks: {', '.join(report.checks_run)}"
    )
    if report.violations:
        table = Table(title="violations", title_justify="left")
        for col in ("type", "severity", "where", "evidence"):
            table.add_column(col, overflow="fold")
        for v in report.violations:
            where = v.file + (f":{v.line}" if v.line else "") if v.file else (f"step {v.step}" if v.step else "")
            table.add_row(v.type.value, v.severity.value, where, v.evidence[:300])
        console.print(table)
    if report.inspector:
        console.print(
            f"inspector ({report.inspector.model}): {report.inspector.verdict.value} - "
            f"{report.inspector.reasoning[:500]}",
            highlight=False,
        )
    console.print(f"written: {run_dir / 'integrity.json'}")


def check_run_finished(rd: RunDir) -> None:
    """The audit reads a run's end (its final result, its workspace as the agent left it): a run that never started
    or is still going has none, and a verdict on it would say nothing (a PASS on a workspace still changing)."""
    result = read_model(rd.result_json, RunResult)
    if result is not None and result.final:
        return
    status = read_model(rd.status_json, RunStatus)
    if result is not None:
        phase = result.status
    elif status is not None:
        phase = status.phase
    else:
        raise UsageFailure(f"{rd.root}: this run never started (no status.json), so there is nothing to audit")
    campaign = rd.root.parent.parent
    follow = f" (`labkube status --watch {campaign}` follows it)" if (campaign / "campaign.json").is_file() else ""
    raise UsageFailure(
        f"{rd.root}: this run has not finished (no final result.json; its status is {phase}); audit it once "
        f"it has ended{follow}"
    )
