"""The `labkube` command line: a thin click layer over the same functions the tests call.

Exit codes: 0 when every run ended with a measurement (a score, or a grading that gave no value; a low score
is not a failure), 1 when a run ended in an error outcome (grader_error, judge_error, world_error, setup_error,
model_error, harness_error), 2 for bad usage or bad input (one line; labkube/cli_checks.py), 130 when
interrupted. A traceback only ever shows a labkube bug, with a line asking for a report.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from labkube.budgets import Budgets, format_usd
from labkube.campaign import CampaignSpec, resolve_local_paths
from labkube.cli_checks import (
    FrontDoor,
    UsageFailure,
    check_finite_positive,
    check_output_dir,
    check_output_file,
    check_port_free,
    check_ray_address,
    err_console,
    write_output_file,
)
from labkube.integrity_report import IntegrityReport, verdict_basis
from labkube.model_ref import UnknownModel
from labkube.report import aggregate, comparison_order, report_rows
from labkube.result import RunResult
from labkube.results.passk import Attempt, capability_scores, macro_average
from labkube.results.views import aggregate_table, report_table, status_table
from labkube.run_spec import RunSpec, RunStatus, scaffold_label, slug
from labkube.store import CampaignDir, CampaignLocked, RunDir, StoreError
from labkube.task_card import LabkubeYaml, TaskCard
from labkube.tasks import TaskError

# Wide tables when output goes to a file or a pipe, the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 150)

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


def first_validation_error(exc: ValidationError, what: str) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{what}: {where}: {msg}"


@click.group(cls=FrontDoor, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="labkube")
def main() -> None:
    """labkube: run research agents on ResearchGym tasks and Gaia2 worlds, locally or on Kubernetes."""


# -- running campaigns ---------------------------------------------------------------------------


def run_campaign(spec: CampaignSpec, out: Path, ray_address: str | None, metrics_port: int | None = None) -> None:
    from labkube.operator import CampaignError, DriverError, TaskError, launch, plan_campaign
    from labkube.operator.driver import HELD

    check_output_dir(out)
    spec = campaign_here(spec, CampaignDir(out))
    try:
        plan_campaign(spec, out)
    except (TaskError, CampaignError, StoreError, UnknownModel, ValueError) as exc:
        raise UsageFailure(str(exc)) from None
    check_port_free(metrics_port)
    check_ray_address(ray_address)

    cdir = CampaignDir(out)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    bar = progress.add_task(f"campaign {spec.name}", total=None)
    live = Live(console=console, auto_refresh=False, transient=False)
    drawn = {"at": -math.inf, "cost": 0.0}

    def render(force: bool = False) -> None:
        # Reading every run's files and drawing every row costs the driver's process ~4 ms a run: with hundreds of
        # short runs, redrawn twice a second, it took a core the runs needed. Redraw at most ~5% of the time.
        now = time.monotonic()
        if not force and now - drawn["at"] < max(0.5, 20 * drawn["cost"]):
            return
        rows = report_rows(cdir)
        done = sum(r.status in ("Finished", "Failed") for r in rows)
        progress.update(bar, total=len(rows), completed=done)
        live.update(Group(status_table(rows, f"runs in {cdir.root}"), progress), refresh=True)
        drawn["at"], drawn["cost"] = now, time.monotonic() - now

    def on_start(_cdir: CampaignDir, runs: list[RunSpec], todo: list[RunSpec]) -> None:
        skipped = len(runs) - len(todo)
        if skipped:
            console.print(f"{skipped} of {len(runs)} runs already finished in {cdir.root}: skipped")

    try:
        with cdir.lock(), live:
            results = launch(spec, out, ray_address, on_start=on_start, on_tick=render, metrics_port=metrics_port)
            render(force=True)
        console.print()
    except CampaignLocked as exc:
        raise UsageFailure(str(exc)) from None
    except KeyboardInterrupt:
        from labkube.operator.campaign_run import stop_unfinished

        stopped = stop_unfinished(cdir)
        err_console.print(
            f"[yellow]interrupted:[/] {stopped} unfinished run(s) marked stopped in {cdir.root}; to resume them, "
            f"run the same command again (the same tasks, models and seeds, --out {cdir.root})",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(130)
    except DriverError as exc:
        raise UsageFailure(f"{exc} (results so far are kept in {out})") from None
    failed = [r for r in results if r.status.value == "Failed"]
    held = [r for r in report_rows(cdir) if r.status == "Pending" and r.message.startswith(HELD)]
    console.print(f"campaign directory: {cdir.root}")
    for r in failed:
        what = r.outcome.value if r.outcome else "failed"
        why = escape(one_line(r.error or str(r.stop_reason)))
        err_console.print(f"[red]run {r.run_id} {what}:[/] {why}", highlight=False, soft_wrap=True)
    if held:
        err_console.print(
            f"[yellow]{len(held)} run(s) not started:[/] {escape(held[0].message.removeprefix(HELD))}; "
            "raise gpu_hours_cap and run the campaign again to start them",
            highlight=False,
        )
    if failed or held:
        sys.exit(1)


def campaign_here(spec: CampaignSpec, cdir: CampaignDir) -> CampaignSpec:
    """The campaign with its relative task and `replay:` paths resolved against this working directory; a campaign
    directory written when such paths were stored as typed resumes with its spec as it was written."""
    resolved = resolve_local_paths(spec, Path.cwd())
    with contextlib.suppress(StoreError):
        existing = cdir.load_spec()
        if existing != resolved and resolve_local_paths(existing, Path.cwd()) == resolved:
            return existing
    return resolved


def one_line(text: str, limit: int = 400) -> str:
    """A multi-line error (a grader's last lines) as one line of a terminal summary: its lines joined, the end kept."""
    joined = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return joined if len(joined) <= limit else f"…{joined[-limit:]}"


def budgets_from(hours: float | None, usd: float | None, tokens: int | None, steps: int | None) -> Budgets:
    try:
        return Budgets(wall_hours=hours, usd=usd, tokens=tokens, steps=steps)
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])
        flag, value, kind = {
            "wall_hours": ("--budget-hours", hours, "a finite number"),
            "usd": ("--budget-usd", usd, "a finite number"),
            "tokens": ("--budget-tokens", tokens, "a whole number"),
        }.get(field, ("--budget-steps", steps, "a whole number"))
        raise UsageFailure(f"{flag} {value}: give {kind} above 0") from None


@main.command()
@click.argument("tasks", nargs=-1, required=True)
@click.option(
    "--model",
    "models",
    multiple=True,
    default=["oracle"],
    show_default=True,
    help="Model string, e.g. openai:gpt-5, anthropic:claude-sonnet-4-5, oracle. Repeatable.",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Seeds 0..N-1 per task and model.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Campaign directory (default ./campaigns/NAME).",
)
@click.option("--name", default=None, help="Campaign name (default from the tasks).")
@click.option(
    "--backend",
    type=click.Choice(["local", "k8s"]),
    default="local",
    show_default=True,
    help="local: processes on this machine; k8s: a Campaign resource that `labkube operator` runs as pods.",
)
@click.option("--kube-context", default=None, help="k8s: kubeconfig context (default: the current one).")
@click.option("--namespace", default=None, help="k8s: namespace of the Campaign (default: the context's).")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--budget-hours", type=float, default=None, help="Wall-clock hours per run.")
@click.option("--budget-usd", type=float, default=None, help="Model spend per run, in dollars.")
@click.option("--budget-tokens", type=int, default=None, help="Tokens per run (input + output).")
@click.option("--budget-steps", type=int, default=None, help="Agent steps per run.")
@click.option("--idea-hint", is_flag=True, help="Show the task's idea_hint.txt to the agent.")
@click.option("--grade-interval", type=float, default=None, help="Grade every N seconds during a run.")
@click.option("--judge-model", default=None, help="Gaia2: model for ARE's soft (LLM) judge checks.")
@click.option("--gaia2-judge-budget-usd", type=float, default=None, help="Gaia2: the soft judge's own dollars per run.")
@click.option("--inspector-model", default=None, help="Model for the LLM integrity inspector (rule checks always run).")
@click.option("--inspector-budget-usd", type=float, default=1.0, show_default=True, help="Inspector dollars per run.")
@click.option(
    "--agent",
    "agents",
    type=click.Choice(["rg-agent", "are-default", "claude-code", "codex"]),
    multiple=True,
    default=("rg-agent",),
    show_default=True,
    help="Scaffold; repeat to compare: claude-code and codex are the vendors' CLIs (through the model gateway), "
    "are-default is ARE's own agent, in the world, on the same model (Gaia2).",
)
@click.option(
    "--gaia2-noise", is_flag=True, help="Gaia2: ARE's noise augmentation (tool failures, extra events), seeded per run."
)
@click.option(
    "--gaia2-a2a",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Gaia2 agent2agent: this share of the apps become ARE app agents (seeded per run).",
)
@click.option("--gaia2-a2a-model", default=None, help="Gaia2: model for the app agents (default: the run's model).")
@click.option(
    "--think-time",
    type=float,
    default=None,
    help="Gaia2: simulated seconds charged per model call (default: the measured latency).",
)
@click.option("--ray-address", default=None, help="Connect to an existing Ray cluster instead of starting one.")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the campaign's and its runs' Prometheus metrics on this port while it runs.",
)
@click.option(
    "--overlay",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    envvar="LABKUBE_TASK_OVERLAY",
    help="A labkube.yaml merged over the task's own (SOTA values, GPUs, budgets), or a directory of them: "
    "DIR/<task-name>.yaml or DIR/<task-name>/labkube.yaml; read here and carried in the campaign "
    "(default: $LABKUBE_TASK_OVERLAY).",
)
def run(
    tasks: tuple[str, ...],
    models: tuple[str, ...],
    seeds: int,
    out: Path | None,
    name: str | None,
    backend: str,
    concurrency: int,
    budget_hours: float | None,
    budget_usd: float | None,
    budget_tokens: int | None,
    budget_steps: int | None,
    idea_hint: bool,
    grade_interval: float | None,
    judge_model: str | None,
    gaia2_judge_budget_usd: float | None,
    inspector_model: str | None,
    inspector_budget_usd: float,
    agents: tuple[str, ...],
    gaia2_noise: bool,
    gaia2_a2a: float | None,
    gaia2_a2a_model: str | None,
    think_time: float | None,
    ray_address: str | None,
    metrics_port: int | None,
    kube_context: str | None = None,
    namespace: str | None = None,
    overlay: Path | None = None,
) -> None:
    """Run TASK... (bundled names like researchgym/NAME, or task directories) as one campaign."""
    task_overlays = read_overlays(overlay, list(tasks))
    # a campaign name is a Kubernetes name: no underscores (Gaia2 scenario ids have them)
    joined = slug("-".join(t.rstrip("/").split("/")[-1] for t in tasks)).replace("_", "-")
    default_name = joined[:40].strip("-.") or "campaign"
    try:
        spec = CampaignSpec(
            name=name or default_name,
            tasks=list(tasks),
            models=list(models),
            seeds=seeds,
            budgets=budgets_from(budget_hours, budget_usd, budget_tokens, budget_steps),
            concurrency=concurrency,
            idea_hint=idea_hint,
            grade_interval_s=grade_interval,
            judge_model=judge_model,
            gaia2_judge_budget_usd=gaia2_judge_budget_usd,
            inspector_model=inspector_model,
            inspector_budget_usd=inspector_budget_usd,
            agents=list(agents),
            gaia2_noise=gaia2_noise,
            gaia2_a2a=gaia2_a2a or 0.0,
            gaia2_a2a_model=gaia2_a2a_model,
            think_time_s=think_time,
            backend=backend,
            overlay=str(overlay.resolve()) if overlay is not None and backend == "local" else None,
            task_overlays=task_overlays,
        )
    except ValidationError as exc:
        raise UsageFailure(first_validation_error(exc, "campaign")) from None
    if backend == "k8s":
        given = [
            flag
            for flag, value in (("--out", out), ("--ray-address", ray_address), ("--metrics-port", metrics_port))
            if value
        ]
        if given:
            raise UsageFailure(f"{given[0]} is for the local backend; on k8s the operator's config says where runs go")
        run_on_kubernetes(spec, kube_context, namespace)
        return
    if kube_context or namespace:
        raise UsageFailure("--kube-context and --namespace need --backend k8s")
    run_campaign(spec, out or Path("campaigns") / spec.name, ray_address, metrics_port)


def read_overlays(overlay: Path | None, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """`--overlay` (or a campaign file's `overlay`) read into `task_overlays`: the campaign carries the content,
    so the planner, the runs and the operator's pods on a cluster all see it."""
    from labkube.tasks import TaskError, read_task_overlays

    if overlay is None:
        return {}
    if overlay.is_file() and len(tasks) > 1:
        raise UsageFailure(
            f"overlay {overlay} is one task's labkube.yaml; for {len(tasks)} tasks pass a directory "
            "holding <task-name>.yaml (or <task-name>/labkube.yaml) for each"
        )
    try:
        return read_task_overlays(overlay, tasks)
    except TaskError as exc:
        raise UsageFailure(str(exc)) from None


def run_on_kubernetes(spec: CampaignSpec, kube_context: str | None, namespace: str | None) -> None:
    """Create the campaign as a Campaign resource and follow its Runs until every run is final.

    The operator in the cluster runs it (the same driver and agent as locally); results go to the
    campaign directory on the operator's runs volume. Stopping the command leaves the campaign running.
    """
    import time

    from rich.table import Table

    from labkube.operator.k8s_operator import CampaignExists, read_campaign, run_rows, submit_campaign
    from labkube.operator.kube import KubeError, KubeTarget, api_client, check_reachable, default_namespace

    target = KubeTarget(context=kube_context)
    try:
        ns = namespace or default_namespace(target)
        client = api_client(target)
        check_reachable(client, target)
        _, created = submit_campaign(client, spec, ns)
    except (KubeError, CampaignExists) as exc:
        raise UsageFailure(str(exc)) from None
    where = f"Campaign {spec.name} in namespace {ns}"
    console.print(f"{'created' if created else 'following the existing'} {where}", highlight=False)

    def table(runs: list[dict], phase: str) -> Table:
        view = Table(title=f"{where}: {phase or 'Pending'}", title_justify="left")
        for col in ("run", "phase", "score", "tokens", "$", "pods", "message"):
            view.add_column(col, overflow="fold")
        for row in run_rows(runs):
            score = "—" if row["score"] is None else f"{row['score']:.3f}"
            view.add_row(
                row["run_id"],
                row["phase"],
                score,
                str(row["tokens"]),
                format_usd(row["cost_usd"], digits=4),
                str(row["attempts"]),
                row["message"],
            )
        return view

    campaign_obj: dict | None = None
    runs: list[dict] = []
    status: dict = {}
    try:
        with Live(table([], ""), console=console, refresh_per_second=2) as live:
            while True:
                try:
                    campaign_obj, runs = read_campaign(client, ns, spec.name)
                except Exception as exc:  # a blip of the API server: keep following
                    err_console.print(f"[yellow]reading {where}:[/] {str(exc).splitlines()[0]}", highlight=False)
                    time.sleep(2.0)
                    continue
                if campaign_obj is None:
                    raise UsageFailure(f"{where} was deleted")
                status = campaign_obj.get("status") or {}
                live.update(table(runs, status.get("phase", "")))
                if status.get("phase") in ("Finished", "Failed"):
                    break
                time.sleep(1.0)
        console.print()
    except KeyboardInterrupt:
        console.print(
            f"stopped following; it keeps running: kubectl get lkr -n {ns} -l labkube.dev/campaign={spec.name}"
        )
        sys.exit(130)
    console.print(
        f"results: the campaign directory {ns}/{spec.name}/ under the operator's runs root (default /runs); "
        f"transcripts and workspaces on namespace {ns}'s runs claim, if one is configured"
    )
    if status.get("phase") == "Failed":
        problem: dict = next((c for c in status.get("conditions", []) if c.get("status") == "False"), {})
        err_console.print(f"[bold red]error:[/] {problem.get('message') or 'the campaign failed'}", highlight=False)
        sys.exit(2 if problem.get("reason") in ("InvalidSpec", "UnknownTask", "NoReferenceSolution") else 1)
    failed = [r for r in run_rows(runs) if r["phase"] == "Failed"]
    for row in failed:
        err_console.print(f"[red]run {row['run_id']} failed:[/] {row['message'] or 'see its logs/'}", highlight=False)
    if failed:
        sys.exit(1)


@main.group()
def campaign() -> None:
    """Campaigns from YAML files."""


def load_campaign_file(path: Path) -> CampaignSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageFailure(f"{path}: no such campaign file") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise UsageFailure(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageFailure(f"{path}: not a text (UTF-8) file") from None
    except RecursionError:
        raise UsageFailure(f"{path}: nested too deeply to be a campaign file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageFailure(f"{path}: not valid YAML{where}") from None
    if isinstance(data, dict) and data.get("kind") == "Campaign" and "spec" in data:
        metadata, spec = data.get("metadata"), data.get("spec")
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            raise UsageFailure(f"{path}: a Campaign resource needs `metadata` and `spec` mappings")
        data = {"name": metadata.get("name", "campaign"), **spec}
    if not isinstance(data, dict):
        raise UsageFailure(f"{path}: a campaign file is a mapping with at least `tasks:`")
    if data.get("overlay") is not None:  # a path on this machine: read here, carried as task_overlays
        data = with_overlays_read(data, path)
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise UsageFailure(first_validation_error(exc, str(path))) from None


def with_overlays_read(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A campaign file's `overlay` read into its `task_overlays` (the path is kept on the local backend only)."""
    try:
        spec = CampaignSpec.model_validate({**data, "backend": "local"})
    except ValidationError as exc:
        raise UsageFailure(first_validation_error(exc, str(path))) from None
    assert spec.overlay is not None
    if spec.task_overlays:
        raise UsageFailure(f"{path}: give overlay (a path) or task_overlays (the mappings), not both")
    overlay = Path(spec.overlay).expanduser()
    if not overlay.exists():
        raise UsageFailure(f"{path}: overlay {overlay} does not exist")
    local = data.get("backend", "local") == "local"
    overlays = read_overlays(overlay, spec.tasks)
    return {**data, "overlay": str(overlay.resolve()) if local else None, "task_overlays": overlays}


@campaign.command("run")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Campaign directory (default ./campaigns/NAME).",
)
@click.option("--ray-address", default=None)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the campaign's and its runs' Prometheus metrics on this port while it runs.",
)
def campaign_run(file: Path, out: Path | None, ray_address: str | None, metrics_port: int | None) -> None:
    """Run the campaign described in FILE (YAML: name, tasks, models, seeds, budgets, concurrency)."""
    spec = load_campaign_file(file)
    if spec.backend == "k8s":  # the file asks for the cluster: the operator runs it
        if out or ray_address or metrics_port:
            raise UsageFailure("--out, --ray-address and --metrics-port are for the local backend")
        run_on_kubernetes(spec, None, None)
        return
    run_campaign(spec, out or Path("campaigns") / spec.name, ray_address, metrics_port)


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("campaigns/demo"), show_default=True)
@click.option("--ray-address", default=None)
def demo(out: Path, ray_address: str | None) -> None:
    """Run the demo campaign (bundled tasks, reference solutions and a do-nothing agent), then report."""
    spec = load_campaign_file(Path(__file__).parent / "data" / "demo.yaml")
    run_campaign(spec, out, ray_address)
    cdir = open_campaign(out)
    rows = report_rows(cdir)
    console.print(report_table(rows, f"campaign {spec.name} ({cdir.root})"))
    console.print(aggregate_table(aggregate(rows)))


# -- reading results -----------------------------------------------------------------------------


def open_campaign(directory: Path) -> CampaignDir:
    cdir = CampaignDir(directory)
    if not cdir.exists():
        raise UsageFailure(f"{directory}: not a campaign directory (no campaign.json); pass the --out of a run")
    try:
        cdir.load_spec()
    except StoreError as exc:
        raise UsageFailure(f"{exc}: not a campaign labkube wrote (empty or damaged); pass the --out of a run") from None
    return cdir


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--watch", is_flag=True, help="Refresh until every run is final.")
def status(directory: Path, watch: bool) -> None:
    """Table of the campaign's runs: phase, step, score so far, tokens, dollars, elapsed."""
    import time

    cdir = open_campaign(directory)
    rows = report_rows(cdir)
    if not watch:
        console.print(status_table(rows, f"runs in {cdir.root}"))
        return
    with Live(status_table(rows, f"runs in {cdir.root}"), console=console, refresh_per_second=2) as live:
        while not all(r.status in ("Finished", "Failed") for r in rows):
            time.sleep(1.0)
            rows = report_rows(cdir)
            live.update(status_table(rows, f"runs in {cdir.root}"))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "csv", "html"]), default="table", show_default=True
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),  # checked by check_output_file: one line, as every other refusal
    default=None,
    help="Write the report to this file (its folder is created) instead of the terminal; with --format html, "
    "default DIR/report.html.",
)
@click.option("--exclude-suspicious", is_flag=True, help="Leave out runs the integrity audit found SUSPICIOUS.")
@click.option(
    "--by",
    type=click.Choice(["run", "scaffold"]),
    default="run",
    show_default=True,
    help="With --format json or csv: one row per run, or per task one row per model and scaffold (over seeds).",
)
def report(directory: Path, fmt: str, out_file: Path | None, exclude_suspicious: bool, by: str) -> None:
    """One row per run, plus per task one row per model and scaffold over seeds, the scaffolds of a model side
    by side (or a self-contained HTML report with the same comparison)."""
    cdir = open_campaign(directory)
    if fmt == "html":
        from labkube.results.html_report import render_report_html

        target = out_file or cdir.root / "report.html"
        check_output_file(target)
        gaia2 = gaia2_scores(cdir, exclude_suspicious)
        html = render_report_html(cdir.root, exclude_suspicious=exclude_suspicious, gaia2=gaia2)
        write_output_file(target, html)
        console.print(f"report written: {target}")
        return
    if out_file is not None:
        check_output_file(out_file)
    rows = comparison_order(report_rows(cdir))
    if exclude_suspicious:
        rows = [r for r in rows if r.integrity_verdict != "SUSPICIOUS"]
    records: list[BaseModel] = [*aggregate(rows)] if by == "scaffold" else [*rows]
    if fmt == "json":
        text = json.dumps([r.model_dump(mode="json") for r in records], indent=2) + "\n"
    elif fmt == "csv":
        buf = io.StringIO()
        fields = list(records[0].model_dump().keys()) if records else []
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        for r in records:  # a mapping (per primary group) goes in one cell, as JSON
            row = r.model_dump(mode="json")
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
        text = buf.getvalue()
    else:
        tables = [
            report_table(rows, f"campaign {cdir.load_spec().name} ({cdir.root})"),
            aggregate_table(aggregate(rows)),
        ]
        capability_table = gaia2_table(cdir, exclude_suspicious)
        if capability_table is not None:
            tables.append(capability_table)
        if out_file is None:
            for table in tables:
                console.print(table)
            return
        written = io.StringIO()
        plain = Console(file=written, width=150, no_color=True, force_terminal=False)
        for table in tables:
            plain.print(table)
        text = written.getvalue()
    if out_file is None:
        click.echo(text, nl=False)
        return
    write_output_file(out_file, text)
    console.print(f"report written: {out_file}")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),  # checked by check_output_file: one line, as every other refusal
    default=None,
    help="The HTML file to write (default RUN_DIR/view.html).",
)
def view(run_dir: Path, out_file: Path | None) -> None:
    """Write a self-contained HTML trajectory viewer for one run."""
    from labkube.results.trajectory_view import render_run_html

    if out_file is not None:
        check_output_file(out_file)
    try:
        html = render_run_html(run_dir)
    except StoreError as exc:
        raise UsageFailure(str(exc)) from None
    target = out_file or run_dir / "view.html"
    write_output_file(target, html)
    console.print(f"trajectory viewer written: {target}")


def gaia2_scores(cdir: CampaignDir, exclude_suspicious: bool = False) -> list:
    """Per-capability pass@1 / pass@k / pass^k of the campaign's final Gaia2 runs (empty when it has none)."""
    from labkube.results.html_report import CapabilityScore

    scores = capability_scores(gaia2_attempts(cdir, exclude_suspicious))
    return [CapabilityScore(**s.model_dump(exclude={"stderr"})) for s in scores]


def gaia2_attempts(cdir: CampaignDir, exclude_suspicious: bool = False) -> list[Attempt]:
    """One attempt per final Gaia2 run; one that ended in an error outcome or with no verdict is not counted
    (neither a pass nor a fail) but still listed, so the tables can say how many were left out."""
    attempts = []
    for run_id in cdir.run_ids():
        result = cdir.result(run_id)
        if result is None or not result.capabilities or not result.final:
            continue
        if exclude_suspicious and result.integrity_verdict == "SUSPICIOUS":
            continue
        attempts.append(
            Attempt(
                scenario=result.task,
                model=scaffold_label(result.agent, result.model),
                seed=result.seed,
                passed=result.score == 1.0,
                capabilities=result.capabilities,
                counted=not result.is_error and result.score is not None,
            )
        )
    return attempts


def fmt_rate(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}"


def gaia2_table(cdir: CampaignDir, exclude_suspicious: bool = False) -> Table | None:
    scores = capability_scores(gaia2_attempts(cdir, exclude_suspicious))
    if not scores:
        return None
    table = Table(title="Gaia2 by capability (ARE's judge; over seeds)", title_justify="left")
    for col in ("capability", "model", "scenarios", "pass@1", "± s.e.", "pass@k", "pass^k", "k", "excluded"):
        table.add_column(col, justify="left" if col in ("capability", "model") else "right")
    for s in scores:
        table.add_row(
            s.capability,
            s.model,
            str(s.scenarios),
            fmt_rate(s.pass_at_1),
            "—" if s.stderr is None else f"{s.stderr:.3f}",
            fmt_rate(s.pass_at_k),
            fmt_rate(s.pass_hat_k),
            str(s.k),
            f"[bold red]{s.excluded}[/]" if s.excluded else "0",
        )
    for model, avg in macro_average(scores).items():
        table.add_row(
            "[bold]macro average[/]",
            model,
            "",
            f"{avg['pass_at_1']:.3f}",
            "",
            f"{avg['pass_at_k']:.3f}",
            f"{avg['pass_hat_k']:.3f}",
            "",
            "",
        )
    return table


# -- tasks ---------------------------------------------------------------------------------------


@main.group()
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
    envvar="LABKUBE_TASK_OVERLAY",
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
    if card.warnings:
        console.print("[yellow]could not infer:[/]")
        for w in card.warnings:
            console.print(f"  - {escape(w)}", highlight=False, soft_wrap=True)  # fix lines stay whole to copy


@main.group()
def worlds() -> None:
    """Gaia2 worlds: Meta's ARE in an environment of its own."""


@worlds.command("setup")
@click.option("--force", is_flag=True, help="Recreate the environment even if it is ready.")
def worlds_setup(force: bool) -> None:
    """Create (once) the virtualenv that runs ARE world processes; safe to run again."""
    from labkube.tasks.gaia2 import ARE_VERSION, WorldEnvError, setup_world_env

    try:
        with console.status(f"installing meta-agents-research-environments {ARE_VERSION} ..."):
            venv = setup_world_env(force=force)
    except WorldEnvError as exc:
        raise UsageFailure(str(exc)) from None
    console.print(f"ARE {ARE_VERSION} world environment ready: {venv}")


@main.group()
def agents() -> None:
    """Third-party agent CLIs (Claude Code, Codex) run by --agent."""


@agents.command("install")
@click.argument("names", nargs=-1, type=click.Choice(["claude-code", "codex"]))
def agents_install(names: tuple[str, ...]) -> None:
    """Install the pinned CLIs from npm into the CLI cache ($LABKUBE_CLI_CACHE); safe to run again."""
    from rich.table import Table

    from labkube.agent.cli_install import CLI_AGENTS, InstallError, ensure_installed, reported_version

    table = Table("agent", "package", "reports", "executable")
    for name in names or tuple(CLI_AGENTS):
        agent = CLI_AGENTS[name]
        try:
            with console.status(f"installing {agent.pinned} ..."):
                exe = ensure_installed(agent)
        except InstallError as exc:
            raise UsageFailure(str(exc)) from None
        table.add_row(name, agent.pinned, reported_version(exe), str(exe))
    console.print(table)


@main.command("gateway")
@click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (the pod's loopback).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port (0: a free one).")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("/gateway/token"),
    show_default=True,
    help="Where to write the run token (a volume shared with the agent container only).",
)
def gateway(run_dir: Path, host: str, port: int, token_file: Path) -> None:
    """Serve the run's model gateway (a pod's `gateway` sidecar; locally, `labkube agent` runs it in-process).

    The first line on stdout is `LISTENING <url>`; docs/third-party-agents.md says what it does."""
    import asyncio

    from labkube.agent.gateway import GatewayError, serve_run_gateway
    from labkube.agent.provider import ProviderError
    from labkube.store import StoreError

    try:
        asyncio.run(serve_run_gateway(run_dir, host, port, token_file))
    except (GatewayError, ProviderError, StoreError) as exc:
        raise UsageFailure(str(exc)) from None


@worlds.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    envvar="LABKUBE_WORLD_PORT",
    default=0,
    help="Port (0: a free one). Default: $LABKUBE_WORLD_PORT, as the chart sets it in the world sidecar.",
)
@click.option("--log-level", default="WARNING", show_default=True)
def worlds_serve(host: str, port: int, log_level: str) -> None:
    """Serve Gaia2 scenarios over HTTP (the world process; the sidecar image's entrypoint).

    The first line on stdout is `LISTENING <port>`; the protocol is in docs/gaia2-world-protocol.md."""
    from labkube.tasks.gaia2 import WorldEnvError, world_python
    from labkube.tasks.gaia2.world_process import world_command

    try:
        python = world_python()
    except WorldEnvError as exc:
        raise UsageFailure(str(exc)) from None
    sys.stdout.flush()
    os.execv(python, world_command(python, host, port, log_level))


@main.command("world-mcp")
@click.option(
    "--world-url",
    envvar="LABKUBE_WORLD_URL",
    required=True,
    help="The running world, its scenario loaded (default: $LABKUBE_WORLD_URL).",
)
@click.option("--log-level", default="WARNING", show_default=True)
def world_mcp(world_url: str, log_level: str) -> None:
    """Serve a Gaia2 world's tools to an agent CLI as an MCP server on stdio (Claude Code's --mcp-config, Codex's
    [mcp_servers]). It neither loads nor judges the scenario: the run's agent process does.

    Stdout carries only the MCP protocol; logs go to stderr."""
    import asyncio
    import logging

    from labkube.agent.mcp_bridge import serve_world
    from labkube.agent.world_errors import WorldFailure

    logging.basicConfig(stream=sys.stderr, level=log_level.upper(), format="world-mcp %(levelname)s %(message)s")
    try:
        asyncio.run(serve_world(world_url))
    except WorldFailure as exc:
        raise UsageFailure(f"world-mcp: {exc} (is the world at {world_url} up, with a scenario loaded?)") from None


# -- the sandbox entrypoint, schemas, tools ------------------------------------------------------


def keys_to_stdin_and_reexec(names: list[str]) -> None:
    """A pod gets its API keys as environment variables from Secrets (`LABKUBE_STDIN_VARS` names them), where
    the agent's own commands could read them in `/proc/<pid>/environ`. Hand them over on a pipe as stdin, as
    the local sandbox does, and exec this command again without them: the new environ holds no key."""
    keys = {name: os.environ.pop(name) for name in names if name in os.environ}
    read, write = os.pipe()
    os.write(write, (json.dumps(keys) + "\n").encode())  # a few hundred bytes: far below the pipe's buffer
    os.close(write)
    os.dup2(read, sys.stdin.fileno())
    os.close(read)
    os.environ["LABKUBE_KEYS_ON_STDIN"] = "1"
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", "labkube", *sys.argv[1:]])


def report_termination(run_dir: Path) -> None:
    """In a pod, leave the run's result in the container's termination message (`LABKUBE_TERMINATION_LOG`,
    the pod's `terminationMessagePath`): the operator reads it from the API when it does not share the volume."""
    path = os.environ.get("LABKUBE_TERMINATION_LOG")
    if not path:
        return
    from labkube.result import RunResult, termination_report
    from labkube.store import read_model

    result = read_model(run_dir / "result.json", RunResult)
    if result is not None and result.final:
        with contextlib.suppress(OSError):  # no termination log is not a failed run
            Path(path).write_text(termination_report(result))


@main.command()
@click.option("--run-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint.")
@click.option("--finalize", "finalize_reason", default=None, help="Only grade the stopped run (reason: time, killed).")
def agent(run_dir: Path, resume: bool, finalize_reason: str | None) -> None:
    """Run one run's agent in this process (what a sandbox executes)."""
    from labkube.agent.entrypoint import DISK_FULL_EXIT, AgentError, DiskFull
    from labkube.agent.entrypoint import main as agent_main
    from labkube.budgets import StopReason
    from labkube.store import StoreError as _StoreError

    secret_env = [n for n in os.environ.pop("LABKUBE_STDIN_VARS", "").split(",") if n]
    if secret_env and os.environ.get("LABKUBE_KEYS_ON_STDIN") != "1":
        keys_to_stdin_and_reexec(secret_env)
    if os.environ.pop("LABKUBE_KEYS_ON_STDIN", None) == "1":
        from labkube.agent.registry import set_secrets

        line = sys.stdin.readline()
        try:
            set_secrets({str(k): str(v) for k, v in json.loads(line or "{}").items()})
        except (ValueError, AttributeError):
            raise UsageFailure("the API keys on stdin are not a JSON object") from None
    reason = None
    if finalize_reason is not None:
        try:
            reason = StopReason(finalize_reason)
        except ValueError:
            raise UsageFailure(f"--finalize: unknown reason {finalize_reason!r}") from None
    try:
        code = agent_main(run_dir, resume, reason)
        report_termination(run_dir)
    except DiskFull as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(DISK_FULL_EXIT)
    except (AgentError, _StoreError) as exc:
        raise UsageFailure(str(exc)) from None
    sys.exit(code)


@main.command("operator")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The operator's config (OperatorConfig, camelCase YAML); default /etc/labkube/operator.yaml.",
)
@click.option("--kube-context", default=None, help="Use this kubeconfig context instead of the pod's service account.")
@click.option(
    "--runs-root",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where campaign directories go (default $LABKUBE_RUNS_ROOT, else the config's runsRoot, /runs).",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=None,
    help="GPUs Ray may hand out at once (the cluster's); default: only the Kubernetes scheduler bounds GPUs.",
)
@click.option(
    "--max-runs", type=click.IntRange(min=1), default=1000, show_default=True, help="Runs supervised at once in all."
)
@click.option("--verbose", is_flag=True, help="Debug logging.")
def operator_command(
    config_file: Path | None,
    kube_context: str | None,
    runs_root: Path | None,
    gpus: int | None,
    max_runs: int,
    verbose: bool,
) -> None:
    """Run the Kubernetes operator: Campaign resources become Runs and pods (what the Helm chart runs)."""
    import os

    from labkube.operator import DriverError
    from labkube.operator.k8s_models import OperatorConfig
    from labkube.operator.k8s_operator import OperatorError, OperatorRuntime, run_operator
    from labkube.operator.kube import KubeError, KubeTarget, default_namespace

    path = config_file or Path("/etc/labkube/operator.yaml")
    if not path.exists():
        raise UsageFailure(f"{path}: no operator config; pass --config FILE (the Helm chart mounts one)")
    try:
        config = OperatorConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError:
        raise UsageFailure(f"{path}: not valid YAML") from None
    except ValidationError as exc:
        raise UsageFailure(first_validation_error(exc, str(path))) from None
    root = runs_root or Path(os.environ.get("LABKUBE_RUNS_ROOT") or config.runs_root)
    target = KubeTarget(context=kube_context)
    namespace = os.environ.get("LABKUBE_OPERATOR_NAMESPACE") or None
    if namespace is None:
        with contextlib.suppress(KubeError):
            namespace = default_namespace(target)
    runtime = OperatorRuntime(config=config, kube=target, runs_root=root, namespace=namespace)
    try:
        run_operator(runtime, gpus=gpus, max_runs=max_runs, verbose=verbose)
    except (KubeError, DriverError, OperatorError) as exc:
        raise UsageFailure(str(exc)) from None


@main.command()
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
        from labkube.operator.campaign_run import API_KEYS

        try:
            ref = parse_model(inspector_model)
        except UnknownModel as exc:
            raise UsageFailure(str(exc)) from None
        var = spec.api_key_env.get(inspector_model) or API_KEYS.get(ref.provider)
        if var and not os.environ.get(var):
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


@main.command()
@click.argument("name", type=click.Choice(sorted(SCHEMAS)))
def schema(name: str) -> None:
    """Print the JSON Schema of a labkube document."""
    click.echo(json.dumps(SCHEMAS[name].model_json_schema(), indent=2))


@main.group()
def tools() -> None:
    """The agent's tools, for use by hand."""


@tools.command("apply-patch")
@click.option("--cwd", type=click.Path(path_type=Path, exists=True, file_okay=False), default=Path("."))
def tools_apply_patch(cwd: Path) -> None:
    """Apply a V4A patch read from stdin, with the same code the agent uses."""
    from labkube.agent.apply_patch import PatchError, apply_patch

    try:
        result = apply_patch(sys.stdin.read(), cwd)
    except PatchError as exc:
        err_console.print(f"[bold red]patch not applied:[/] {exc}", highlight=False)
        sys.exit(1)
    console.print(result.summary, highlight=False)


def _register_task_env_commands() -> None:
    from labkube.task_env_cli import tasks_dockerfile, tasks_prepare

    tasks.add_command(tasks_prepare)
    tasks.add_command(tasks_dockerfile)


_register_task_env_commands()


def _register_analyze_command() -> None:
    from labkube.results.analysis_cli import analyze

    main.add_command(analyze)


_register_analyze_command()


def _register_export_command() -> None:
    from labkube.results.export_cli import export

    main.add_command(export)


_register_export_command()


def _register_crds_command() -> None:
    from labkube.crds_cli import crds

    main.add_command(crds)


_register_crds_command()
