"""`labkube tools apply-patch` and `labkube schema`: what labkube's own machinery does, for use by hand: the
agent's patch tool on stdin, and the JSON Schema of each document labkube reads or writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from pydantic import BaseModel

from labkube.budgets import Budgets
from labkube.campaign import CampaignSpec
from labkube.cli_checks import console, err_console
from labkube.integrity_report import IntegrityReport
from labkube.result import RunResult
from labkube.run_spec import RunSpec, RunStatus
from labkube.task_card import LabkubeYaml, TaskCard

SCHEMAS: dict[str, type[BaseModel]] = {
    "task-card": TaskCard,
    "labkube-yaml": LabkubeYaml,
    "campaign": CampaignSpec,
    "run-spec": RunSpec,
    "run-status": RunStatus,
    "run-result": RunResult,
    "budgets": Budgets,
    "integrity-report": IntegrityReport,
}


@click.command("schema")
@click.argument("name", type=click.Choice(sorted(SCHEMAS)))
def schema(name: str) -> None:
    """Print the JSON Schema of a labkube document."""
    click.echo(json.dumps(SCHEMAS[name].model_json_schema(), indent=2))


@click.group("tools")
def tools() -> None:
    """The agent's tools, for use by hand."""


@tools.command("apply-patch")
@click.option("--cwd", type=click.Path(path_type=Path, exists=True, file_okay=False), default=Path("."))
def tools_apply_patch(cwd: Path) -> None:
    """Apply a V4A patch read from stdin, with the same code the agent uses."""
    from labkube.agent.rg.apply_patch import PatchError, apply_patch

    try:
        result = apply_patch(sys.stdin.read(), cwd)
    except PatchError as exc:
        err_console.print(f"[bold red]patch not applied:[/] {exc}", highlight=False)
        sys.exit(1)
    console.print(result.summary, highlight=False)
