"""`labkube tasks list|show|prepare|dockerfile`: the bundled tasks, a task's parsed card (and what could not be
inferred from its folder), and its environment (`prepare` and `dockerfile` are in labkube/task_env_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from labkube.cli_checks import UsageFailure, console
from labkube.settings import TASK_OVERLAY
from labkube.task_env_cli import tasks_dockerfile, tasks_prepare


@click.group("tasks")
def tasks() -> None:
    """Bundled tasks and task directories."""


@tasks.command("list")
def tasks_list() -> None:
    """The tasks that ship with labkube."""
    from rich.table import Table

    from labkube.tasks import TaskError, bundled_tasks, resolve_tasks

    table = Table(title="bundled tasks", title_justify="left")
    for col in ("task", "family", "subtasks / questions", "primary metric", "baseline", "budget"):
        table.add_column(col)
    for ref in bundled_tasks():
        try:
            cards = resolve_tasks(ref)
        except TaskError as exc:
            table.add_row(ref, "?", f"[red]cannot load: {exc}[/]", "", "", "")
            continue
        card = cards[0]
        if card.gaia2 is not None:
            table.add_row(
                ref,
                "gaia2",
                ", ".join(card.gaia2.capabilities) or "—",
                "ARE's judge",
                "—",
                f"{card.budgets.wall_hours:g} h" if card.budgets.wall_hours else "—",
            )
            continue
        if card.gaia is not None:
            levels = sorted({c.gaia.level for c in cards if c.gaia})
            table.add_row(
                ref,
                "gaia",
                f"{len(cards)} questions (levels {', '.join(map(str, levels))})",
                "correct answer",
                "—",
                "—",
            )
            continue
        p = card.primary
        table.add_row(
            ref,
            card.family.value,
            str(len(card.subtasks)),
            f"{p.metric} ({p.direction.value} is better)" if p else "—",
            "—" if p is None or p.baseline is None else f"{p.baseline:g}",
            f"{card.budgets.wall_hours:g} h" if card.budgets.wall_hours else "—",
        )
    console.print(table)


@tasks.command("show")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print the task card(s) as JSON.")
@click.option(
    "--overlay",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    envvar=TASK_OVERLAY.name,
    help="A labkube.yaml to merge over the task's own, or a directory of them: DIR/<task-name>.yaml or "
    "DIR/<task-name>/labkube.yaml (default: $LABKUBE_TASK_OVERLAY).",
)
@click.pass_context
def tasks_show(ctx: click.Context, task: str, as_json: bool, overlay: Path | None = None) -> None:
    """The parsed task card, and what could not be inferred (with the labkube.yaml line that fixes it)."""
    from rich.table import Table

    from labkube.task_card import TaskFamily
    from labkube.tasks import TaskError, resolve_tasks
    from labkube.tasks.researchgym import load_researchgym

    folder = Path(task).expanduser()
    known_files = ("task_description.md", "metadata.jsonl")
    if folder.is_dir() and not any((folder / n).exists() for n in known_files) and not any(folder.glob("*.json*")):
        raise UsageFailure(
            f"{task}: no task_description.md, so not a ResearchGym task folder (nor a GAIA or Gaia2 dataset): "
            "add a task_description.md whose baseline table has a `Your Method` row"
        )
    try:
        cards = resolve_tasks(task)
        if overlay is not None and cards[0].family is not TaskFamily.researchgym:
            if ctx.get_parameter_source("overlay") is click.core.ParameterSource.ENVIRONMENT:
                overlay = None  # $LABKUBE_TASK_OVERLAY is for the ResearchGym tasks among all the others
            else:
                raise UsageFailure(f"--overlay is for ResearchGym task folders; {task} is a {cards[0].family} task")
        if overlay is not None:
            cards = [load_researchgym(Path(cards[0].path), cards[0].ref, overlay=overlay)]
    except TaskError as exc:
        raise UsageFailure(str(exc)) from None
    if as_json:
        click.echo(json.dumps([c.model_dump(mode="json", exclude={"description"}) for c in cards], indent=2))
        return
    if cards[0].gaia is not None:
        table = Table(title=f"GAIA questions in {cards[0].path}", title_justify="left")
        for col in ("task", "level", "attachment", "question"):
            table.add_column(col, overflow="fold")
        for c in cards:
            assert c.gaia is not None
            table.add_row(c.ref, str(c.gaia.level), c.gaia.file_name or "—", c.gaia.question[:100])
        console.print(table)
        return
    if cards[0].gaia2 is not None:
        table = Table(title="Gaia2 scenarios", title_justify="left")
        for col in ("task", "scenario id", "capabilities", "source"):
            table.add_column(col, overflow="fold")
        for c in cards:
            assert c.gaia2 is not None
            source = c.gaia2.source if len(c.gaia2.source) < 120 else "(JSON text)"
            table.add_row(c.ref, c.gaia2.scenario_id, ", ".join(c.gaia2.capabilities) or "—", source)
        console.print(table)
        return
    card = cards[0]
    console.print(f"[bold]{escape(card.name)}[/]  ({card.family.value}, {escape(card.path)})")
    if card.overlay:
        console.print(f"overlay: {escape(card.overlay)}", highlight=False)
    table = Table(title=f"subtasks ({len(card.subtasks)})", title_justify="left")
    for col in ("id", "metric", "direction", "baseline (best listed)", "SOTA", "primary"):
        table.add_column(col)
    for s in card.subtasks:
        how = {None: "", "assumed": " (assumed)"}.get(s.direction_inferred, " (inferred)")
        baseline = "—" if s.baseline is None else f"{s.baseline:g}"
        role = ["yes"] if s.primary else []
        if s.primary_group and len(card.primary_groups) > 1:
            role.append(f"group {escape(s.primary_group)}")
        table.add_row(
            escape(s.id),
            escape(s.metric),
            s.direction.value + how,
            baseline + (f" ({escape(s.baseline_method)})" if s.baseline_method else ""),
            "—" if s.sota is None else f"{s.sota:g}",
            "; ".join(role),
        )
    console.print(table)
    if len(card.primary_groups) > 1:  # runs report a score per group
        groups = ", ".join(f"{escape(name)} ({escape(s.id)})" for name, s in card.primary_groups.items())
        console.print(f"primary groups (a score each): {groups}", highlight=False)
    r = card.resources
    extra = f", image {r.image}" if r.image else ""
    console.print(f"resources: {r.gpus} GPU, {r.cpus:g} CPU, {r.memory_gb:g} GB{extra}")
    console.print(f"default budgets: {card.budgets.model_dump(exclude_none=True) or 'none'}")
    console.print(f"hidden from the agent: {', '.join(card.hidden)}")
    console.print(f"blocked URLs: {len(card.blocked_urls)}; reference solution: {'yes' if card.oracle else 'no'}")
    console.print(f"the agent's commands' network: {card.network.value}")
    if card.warnings:
        console.print("[yellow]could not infer:[/]")
        for w in card.warnings:
            console.print(f"  - {escape(w)}", highlight=False, soft_wrap=True)  # fix lines stay whole to copy


tasks.add_command(tasks_prepare)
tasks.add_command(tasks_dockerfile)
