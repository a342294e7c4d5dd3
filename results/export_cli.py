"""`labkube export CAMPAIGN... --format atif|sft-jsonl [--out DIR] [--exclude-suspicious] [--min-score X]
[--include-errors] [--exclude-intervened]` (registered by labkube/cli.py)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import click

from labkube.cli_checks import check_output_dir


class BadInput(click.ClickException):
    exit_code = 2  # bad usage (STYLE.md: exit codes)


@click.command("export")
@click.argument("campaigns", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["atif", "sft-jsonl"]), required=True)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory for one file per run (default: export-<format>/ in the first campaign directory).",
)
@click.option("--exclude-suspicious", is_flag=True, help="Drop runs whose integrity verdict is not PASS.")
@click.option("--min-score", type=float, default=None, help="Drop runs whose score is below this (or missing).")
@click.option(
    "--include-errors",
    is_flag=True,
    help="Also export runs that ended in an error outcome (grader, judge, world, setup, model or harness error), "
    "with the outcome and null terminal rewards (left out by default).",
)
@click.option(
    "--exclude-intervened",
    is_flag=True,
    help="Drop runs a person (or a usage checkpoint) intervened in while they ran: cancelled, paused, resumed, "
    "extended or sent a message (exported and marked `intervened` by default).",
)
def export(
    campaigns: tuple[Path, ...],
    fmt: str,
    out_dir: Path | None,
    exclude_suspicious: bool,
    min_score: float | None,
    include_errors: bool,
    exclude_intervened: bool,
) -> None:
    """Export finished runs as ATIF trajectories (with rewards) or OpenAI chat fine-tuning JSONL. Runs that ended in
    an error outcome are left out (and counted) unless --include-errors."""
    from labkube.results.export import INTERVENED_SKIP, ExportError, ExportFilter, export_campaigns

    if min_score is not None and not math.isfinite(min_score):
        raise BadInput(f"--min-score {min_score}: give a finite number (runs scoring below it are left out)")
    out = out_dir or Path(campaigns[0]) / f"export-{fmt}"
    check_output_dir(out)
    flt = ExportFilter(exclude_suspicious, min_score, include_errors, exclude_intervened)
    try:
        runs = export_campaigns(list(campaigns), fmt, out, flt, progress=True)
    except ExportError as exc:
        raise BadInput(str(exc)) from None
    written = [r for r in runs if r.path is not None]
    skipped = [r for r in runs if r.path is None]
    for r in skipped:
        click.echo(f"skipped {r.run_id}: {r.skipped}")
    click.echo(f"{len(written)} of {len(runs)} runs exported as {fmt}")
    errors = Counter(r.error_outcome for r in runs if r.error_outcome is not None)
    if errors:
        what = ", ".join(f"{n} {outcome}" for outcome, n in sorted(errors.items()))
        click.echo(
            f"left out: {errors.total()} runs that ended in an error outcome ({what}); "
            "--include-errors exports them with null rewards"
        )
    intervened = sum(r.skipped is not None and r.skipped.startswith(INTERVENED_SKIP) for r in skipped)
    if exclude_intervened:
        click.echo(f"left out: {intervened} runs a person intervened in (--exclude-intervened)")
    click.echo(f"written: {out}" if written else "nothing written")
