"""`labkube run`, `labkube campaign run` and `labkube demo`: a campaign from the command line's options or a YAML
file, run here (the operator room's Ray driver, with a live table of its runs) or submitted to a cluster as a
Campaign resource and followed until every run is final."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from labkube import interrupts
from labkube.budgets import Budgets, format_tokens, format_usd
from labkube.campaign import CampaignSpec, resolve_local_paths
from labkube.cli_checks import (
    UsageFailure,
    check_output_dir,
    check_port_free,
    check_ray_address,
    console,
    data_error_line,
    err_console,
    open_campaign,
    option_error_line,
)
from labkube.model_ref import UnknownModel
from labkube.report import LiveRows, aggregate, report_rows
from labkube.results.views import aggregate_table, report_table, status_table
from labkube.run_spec import (
    DEFAULT_JUDGE_TIMEOUT_S,
    PAUSE_EVERY_HOURS_HELP,
    PAUSE_EVERY_USD_HELP,
    WORLD_VALIDATION_LIMIT_S,
    RunSpec,
    slug,
)
from labkube.store import CampaignDir, CampaignLocked, StoreError
from labkube.task_card import Grading, TaskCard, TaskFamily


def run_campaign(spec: CampaignSpec, out: Path, ray_address: str | None, metrics_port: int | None = None) -> None:
    from labkube.operator import CampaignError, DriverError, TaskError, launch, plan_campaign
    from labkube.operator.driver_errors import HELD
    from labkube.process_exit import skip_teardown

    check_output_dir(out)
    spec = campaign_here(spec, CampaignDir(out))
    try:
        _, _, cards = plan_campaign(spec, out)
    except (TaskError, CampaignError, StoreError, UnknownModel, ValueError) as exc:
        raise UsageFailure(str(exc)) from None
    check_gradable([card for task_cards in cards.values() for card in task_cards])
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
    live_rows = LiveRows(cdir)

    def render(force: bool = False) -> None:
        """Redraw the table while the campaign runs (at most ~5% of the time: with hundreds of short runs, redrawn
        twice a second, it took a core the runs needed); `force`: the whole table, once, as the campaign ends.
        Where nothing is drawn until the end (output to a file or a pipe), nothing is done until then."""
        now = time.monotonic()
        if not force and (
            now - drawn["at"] < max(0.5, 20 * drawn["cost"]) or not (console.is_terminal or console.is_jupyter)
        ):
            return
        rows = live_rows.rows()
        done = sum(r.status in ("Finished", "Failed") for r in rows)
        progress.update(bar, total=len(rows), completed=done)
        # A live table taller than the terminal shows only its first lines: the rows below are not drawn.
        shown = rows if force else rows[: console.height]
        live.update(Group(status_table(shown, f"runs in {cdir.root}"), progress), refresh=not force)
        drawn["at"], drawn["cost"] = now, time.monotonic() - now

    def on_start(_cdir: CampaignDir, runs: list[RunSpec], todo: list[RunSpec]) -> None:
        skipped = len(runs) - len(todo)
        if skipped:
            console.print(f"{skipped} of {len(runs)} runs already finished in {cdir.root}: skipped")

    def draw_final() -> None:
        render(force=True)
        live.stop()  # draws it, while the campaign's Ray shuts down (leaving `with live` is then a no-op)

    interrupts.check()  # a signal so far: nothing was written, nothing to stop
    try:
        with cdir.lock(), live:
            interrupts.check()
            results = launch(
                spec,
                out,
                ray_address,
                on_start=on_start,
                on_tick=render,
                metrics_port=metrics_port,
                on_end=draw_final,
            )
        interrupts.check()  # one that came as the last run ended: the command still ends as interrupted
        console.print()
        skip_teardown()  # every result is on disk, and this process is done with Ray
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
        sys.exit(interrupts.exit_code())
    except DriverError as exc:
        raise UsageFailure(f"{exc} (results so far are kept in {out})") from None
    failed = [r for r in results if r.status.value == "Failed"]
    held = [r for r in live_rows.rows() if r.status == "Pending" and r.message.startswith(HELD)]
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


def check_gradable(cards: list[TaskCard]) -> None:
    """Refuse, before anything runs, a paper task whose grader is missing: every run of it would end, hours later,
    as a grader_error. GAIA and Gaia2 grade without a folder of their own; a task naming its own grading.command is
    taken at its word."""
    default_command = Grading().command
    for card in cards:
        if card.family is not TaskFamily.researchgym or card.grading.command != default_command:
            continue
        if not (Path(card.path) / "grading" / "grade.sh").is_file():
            raise UsageFailure(
                f"task {card.ref}: no grading/grade.sh in {card.path}, so none of its runs could be graded; add the "
                "task's grader there (or name another in its labkube.yaml: grading: {command: ...})"
            )


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


@click.command("run")
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
    "--sandbox",
    type=click.Choice(["bwrap", "none"]),
    default="bwrap",
    show_default=True,
    help="local: bwrap runs each run's agent and grader in a bubblewrap sandbox; none runs them unsandboxed "
    "(marked so in every report; docs/sandbox.md says what that gives up).",
)
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
@click.option("--pause-every-usd", type=float, default=None, help=PAUSE_EVERY_USD_HELP)
@click.option("--pause-every-hours", type=float, default=None, help=PAUSE_EVERY_HOURS_HELP)
@click.option("--idea-hint", is_flag=True, help="Show the task's idea_hint.txt to the agent.")
@click.option("--grade-interval", type=float, default=None, help="Grade every N seconds during a run.")
@click.option("--judge-model", default=None, help="Gaia2: model for ARE's soft (LLM) judge checks.")
@click.option("--gaia2-judge-budget-usd", type=float, default=None, help="Gaia2: the soft judge's own dollars per run.")
@click.option(
    "--judge-timeout",
    "gaia2_judge_timeout",
    type=float,
    default=DEFAULT_JUDGE_TIMEOUT_S,
    show_default=True,
    help=f"Gaia2: seconds the judge model may take per check (below {WORLD_VALIDATION_LIMIT_S:.0f}, the world's limit "
    "for validating a run); a judge that does not answer in time is a judge_error.",
)
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
    pause_every_usd: float | None,
    pause_every_hours: float | None,
    idea_hint: bool,
    grade_interval: float | None,
    judge_model: str | None,
    gaia2_judge_budget_usd: float | None,
    gaia2_judge_timeout: float,
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
    sandbox: str = "bwrap",
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
            pause_every_usd=pause_every_usd,
            pause_every_hours=pause_every_hours,
            idea_hint=idea_hint,
            grade_interval_s=grade_interval,
            judge_model=judge_model,
            gaia2_judge_budget_usd=gaia2_judge_budget_usd,
            gaia2_judge_timeout_s=gaia2_judge_timeout,
            inspector_model=inspector_model,
            inspector_budget_usd=inspector_budget_usd,
            agents=list(agents),
            gaia2_noise=gaia2_noise,
            gaia2_a2a=gaia2_a2a or 0.0,
            gaia2_a2a_model=gaia2_a2a_model,
            think_time_s=think_time,
            backend=backend,
            sandbox=sandbox,
            overlay=str(overlay.resolve()) if overlay is not None and backend == "local" else None,
            task_overlays=task_overlays,
        )
    except ValidationError as exc:
        ctx = click.get_current_context()
        raise UsageFailure(option_error_line(exc, ctx.command, ctx.params)) from None
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


def kube_runs_table(title: str, runs: list[dict[str, Any]]) -> Table:
    """The Run resources of a campaign as `labkube run --backend k8s` follows them: unknown dollars as unknown, lower
    bounds with "≥"."""
    from labkube.operator.k8s_submit import run_rows

    view = Table(title=title, title_justify="left")
    for col in ("run", "phase", "score", "tokens", "$", "pods", "message"):
        view.add_column(col, overflow="fold")
    for row in run_rows(runs):
        score = "—" if row["score"] is None else f"{row['score']:.3f}"
        view.add_row(
            row["run_id"],
            row["phase"],
            score,
            format_tokens(row["tokens"], row["spend_at_least"]),
            format_usd(row["cost_usd"], digits=4, at_least=row["spend_at_least"]),
            str(row["attempts"]),
            row["message"],
        )
    return view


def run_on_kubernetes(spec: CampaignSpec, kube_context: str | None, namespace: str | None) -> None:
    """Create the campaign as a Campaign resource and follow its Runs until every run is final.

    The operator in the cluster runs it (the same driver and agent as locally); results go to the
    campaign directory on the operator's runs volume. Stopping the command leaves the campaign running.
    """
    import time

    from labkube.operator.k8s_submit import CampaignExists, read_campaign, run_rows, submit_campaign
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
        return kube_runs_table(f"{where}: {phase or 'Pending'}", runs)

    campaign_obj: dict | None = None
    runs: list[dict] = []
    status: dict = {}
    try:
        interrupts.raise_on_signal()  # this loop only waits, and a signal only stops the following
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
        sys.exit(interrupts.exit_code())
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


@click.group("campaign")
def campaign() -> None:
    """Campaigns from YAML files."""


class DuplicateKey(yaml.YAMLError):
    """A mapping in a YAML file gives one key twice (YAML forbids it; PyYAML would keep the last silently)."""

    def __init__(self, key: object, first_line: int, second_line: int) -> None:
        super().__init__(f"`{key}` is given twice (lines {first_line} and {second_line}); keep one")


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (`models:` twice: the last would win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            # Merge keys (`<<: *base`) may repeat, and the keys they bring in may be overridden: YAML allows both.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_lines:
                raise DuplicateKey(key, first_lines[key], line)
            first_lines[key] = line
        return super().construct_mapping(node, deep=deep)


def load_campaign_file(path: Path) -> CampaignSpec:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except FileNotFoundError:
        raise UsageFailure(f"{path}: no such campaign file") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise UsageFailure(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageFailure(f"{path}: not a text (UTF-8) file") from None
    except RecursionError:
        raise UsageFailure(f"{path}: nested too deeply to be a campaign file") from None
    except DuplicateKey as exc:
        raise UsageFailure(f"{path}: {exc}") from None
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
        raise UsageFailure(data_error_line(exc, data, CampaignSpec, str(path))) from None


def with_overlays_read(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A campaign file's `overlay` read into its `task_overlays` (the path is kept on the local backend only)."""
    try:
        spec = CampaignSpec.model_validate({**data, "backend": "local"})
    except ValidationError as exc:
        raise UsageFailure(data_error_line(exc, data, CampaignSpec, str(path))) from None
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


@click.command("demo")
@click.option("--out", type=click.Path(path_type=Path), default=Path("campaigns/demo"), show_default=True)
@click.option("--ray-address", default=None)
def demo(out: Path, ray_address: str | None) -> None:
    """Run the demo campaign (bundled tasks, reference solutions and a do-nothing agent), then report."""
    spec = load_campaign_file(Path(__file__).parent / "data" / "demo.yaml")
    run_campaign(spec, out, ray_address)
    interrupts.check()
    cdir = open_campaign(out)
    rows = report_rows(cdir)
    console.print(report_table(rows, f"campaign {spec.name} ({cdir.root})"))
    console.print(aggregate_table(aggregate(rows)))
