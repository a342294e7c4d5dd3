"""`labkube status`, `labkube report` and `labkube view`: a campaign's runs as a live table, a report (terminal
tables, JSON, CSV or a self-contained HTML page, with Gaia2's per-capability pass@k) and one run's trajectory
viewer, all read from the results store (registered by labkube/cli.py)."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import click
from pydantic import BaseModel
from rich.console import Console
from rich.live import Live
from rich.table import Table

from labkube.cli_checks import (
    UsageFailure,
    check_output_file,
    console,
    err_console,
    open_campaign,
    write_output_file,
)
from labkube.report import ReportRow, aggregate, comparison_order, report_rows
from labkube.results.passk import Attempt, capability_scores, macro_average
from labkube.results.views import aggregate_table, report_table, status_table
from labkube.run_spec import scaffold_label
from labkube.store import LOCK_FILE, CampaignDir, StoreError


@click.command("status")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh until every run is final, or until no `labkube run` holds the campaign (nothing would change).",
)
def status(directory: Path, watch: bool) -> None:
    """Table of the campaign's runs: phase, step, score so far, tokens, dollars, elapsed."""
    cdir = open_campaign(directory)
    if not watch:
        console.print(status_table(report_rows(cdir), f"runs in {cdir.root}"))
        return
    if console.is_terminal:
        with Live(console=console, refresh_per_second=2) as live:
            ending = watch_campaign(cdir, lambda rows: live.update(status_table(rows, f"runs in {cdir.root}")))
    else:  # a pipe or a file: a table each time a run's phase or note changes, not one a second
        shown: list[tuple[str, str, str, int]] = []

        def print_changed(rows: list[ReportRow]) -> None:
            phases = [(r.run_id, r.status, r.message, len(r.interventions)) for r in rows]
            if phases != shown:
                console.print(status_table(rows, f"runs in {cdir.root}"))
                shown[:] = phases

        ending = watch_campaign(cdir, print_changed)
    console.print(ending, highlight=False, soft_wrap=True)


def watch_campaign(cdir: CampaignDir, show: Callable[[list[ReportRow]], None], interval_s: float = 1.0) -> str:
    """Show the campaign's rows every `interval_s` until every run is final or the `labkube run` that held the
    campaign's lock has let go of it (it ended or died: nothing will change); the line that says which."""
    while True:
        # The lock first, the rows after: a runner that let go had written every result it would.
        gone = runner_gone(cdir)
        rows = report_rows(cdir)
        show(rows)
        unfinished = [r for r in rows if r.status not in ("Finished", "Failed")]
        if not unfinished:
            return f"campaign finished: all {len(rows)} run(s) are final"
        if gone:
            return (
                f"nothing is running this campaign: {len(unfinished)} unfinished run(s); to go on, run the same "
                f"`labkube run` (or `labkube campaign run`) command again with --out {cdir.root}"
            )
        time.sleep(interval_s)


def runner_gone(cdir: CampaignDir) -> bool:
    """Whether the campaign's lock (`CampaignDir.lock`, an flock the kernel drops with its holder) exists and no
    process holds it. A campaign the Kubernetes operator drives has no lock file (its replicas hold a Lease
    instead): there nothing here can tell, and the watch goes on until every run is final.

    Asked by taking the lock shared, without waiting, and letting go at once: a `labkube run` starting in those
    microseconds would be refused as if the campaign were busy, a race far too narrow to matter."""
    try:
        fd = os.open(cdir.root / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only descriptor of the open file lets go of the lock it took
    return True


@click.command("report")
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
    "--exclude-intervened",
    is_flag=True,
    help="Leave out runs a person (or a usage checkpoint) intervened in while they ran: cancelled, paused, "
    "resumed, extended or sent a message (`labkube runs`).",
)
@click.option(
    "--by",
    type=click.Choice(["run", "scaffold"]),
    default="run",
    show_default=True,
    help="With --format json or csv: one row per run, or per task one row per model and scaffold (over seeds).",
)
def report(
    directory: Path, fmt: str, out_file: Path | None, exclude_suspicious: bool, exclude_intervened: bool, by: str
) -> None:
    """One row per run, plus per task one row per model and scaffold over seeds, the scaffolds of a model side
    by side (or a self-contained HTML report with the same comparison)."""
    cdir = open_campaign(directory)
    warn_missing_run_folders(cdir)
    if fmt == "html":
        from labkube.results.html_report import render_report_html

        target = out_file or cdir.root / "report.html"
        check_output_file(target)
        gaia2 = gaia2_scores(cdir, exclude_suspicious, exclude_intervened)
        html = render_report_html(
            cdir.root, exclude_suspicious=exclude_suspicious, exclude_intervened=exclude_intervened, gaia2=gaia2
        )
        write_output_file(target, html)
        if exclude_intervened:
            note_left_out_intervened(sum(r.intervened for r in report_rows(cdir)))
        console.print(f"report written: {target}")
        return
    if out_file is not None:
        check_output_file(out_file)
    rows = comparison_order(report_rows(cdir))
    if exclude_suspicious:
        rows = [r for r in rows if r.integrity_verdict != "SUSPICIOUS"]
    if exclude_intervened:
        note_left_out_intervened(sum(r.intervened for r in rows))
        rows = [r for r in rows if not r.intervened]
    records: list[BaseModel] = [*aggregate(rows)] if by == "scaffold" else [*rows]
    if fmt == "json":
        text = json.dumps([r.model_dump(mode="json") for r in records], indent=2) + "\n"
    elif fmt == "csv":
        text = csv_text(records)
    else:
        tables = [
            report_table(rows, f"campaign {cdir.load_spec().name} ({cdir.root})"),
            aggregate_table(aggregate(rows)),
        ]
        capability_table = gaia2_table(cdir, exclude_suspicious, exclude_intervened)
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


def csv_text(records: list[BaseModel]) -> str:
    """One line per record: a mapping (per primary group) goes in one cell, as JSON; a run's interventions as their
    count (the JSON report lists them whole)."""
    buf = io.StringIO()
    fields = list(records[0].model_dump().keys()) if records else []
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    for r in records:
        row = r.model_dump(mode="json")
        if isinstance(r, ReportRow):
            row["interventions"] = len(r.interventions)
        writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
    return buf.getvalue()


def note_left_out_intervened(count: int) -> None:
    """The one line that says how many runs `--exclude-intervened` left out (on stderr: stdout may be the report)."""
    err_console.print(
        f"left out: {count} run{'s' if count != 1 else ''} a person intervened in (--exclude-intervened)",
        highlight=False,
        soft_wrap=True,
    )


def warn_missing_run_folders(cdir: CampaignDir) -> None:
    """One line on stderr when campaign.json lists runs whose folder (or its run.json) is gone: the report leaves
    them out, and would otherwise read as a smaller campaign."""
    listed = cdir.run_ids()
    missing = [run_id for run_id in listed if cdir.run_spec(run_id) is None]
    if not missing:
        return
    named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    err_console.print(
        f"[yellow]warning:[/] {len(missing)} of the campaign's {len(listed)} runs have no run folder (or no readable "
        f"run.json) in {cdir.root / 'runs'}: {named}; the report leaves them out. To run them again, run the "
        f"campaign's `labkube run` command again with --out {cdir.root}",
        highlight=False,
        soft_wrap=True,
    )


@click.command("view")
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


def gaia2_scores(cdir: CampaignDir, exclude_suspicious: bool = False, exclude_intervened: bool = False) -> list:
    """Per-capability pass@1 / pass@k / pass^k of the campaign's final Gaia2 runs (empty when it has none)."""
    from labkube.results.html_report import CapabilityScore

    scores = capability_scores(gaia2_attempts(cdir, exclude_suspicious, exclude_intervened))
    return [CapabilityScore(**s.model_dump(exclude={"stderr"})) for s in scores]


def gaia2_attempts(
    cdir: CampaignDir, exclude_suspicious: bool = False, exclude_intervened: bool = False
) -> list[Attempt]:
    """One attempt per final Gaia2 run; one that ended in an error outcome, was cancelled or has no verdict is not
    counted (neither a pass nor a fail) but still listed, so the tables can say how many were left out."""
    attempts = []
    for run_id in cdir.run_ids():
        result = cdir.result(run_id)
        if result is None or not result.capabilities or not result.final:
            continue
        if exclude_suspicious and result.integrity_verdict == "SUSPICIOUS":
            continue
        if exclude_intervened and result.intervened:
            continue
        attempts.append(
            Attempt(
                scenario=result.task,
                model=scaffold_label(result.agent, result.model),
                seed=result.seed,
                passed=result.score == 1.0,
                capabilities=result.capabilities,
                counted=result.measured and result.score is not None,
            )
        )
    return attempts


def fmt_rate(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}"


def gaia2_table(cdir: CampaignDir, exclude_suspicious: bool = False, exclude_intervened: bool = False) -> Table | None:
    scores = capability_scores(gaia2_attempts(cdir, exclude_suspicious, exclude_intervened))
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
