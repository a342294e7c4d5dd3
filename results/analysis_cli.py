"""`labkube analyze CAMPAIGN... [--format html|json|md] [--out PATH] [--exclude-suspicious] [--exclude-intervened]`
(registered by labkube/cli.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

SUFFIX = {"html": "html", "json": "json", "md": "md"}


class BadInput(click.ClickException):
    exit_code = 2  # bad usage (STYLE.md: exit codes)


@click.command("analyze")
@click.argument("campaigns", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["html", "json", "md"]), default="html", show_default=True)
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write (default: analysis.<format> in the first campaign directory).",
)
@click.option(
    "--exclude-suspicious", is_flag=True, help="Leave out runs the integrity audit found SUSPICIOUS (as `report`)."
)
@click.option(
    "--exclude-unsandboxed",
    is_flag=True,
    help="Leave out runs whose agent ran outside labkube's sandbox (--sandbox none).",
)
@click.option(
    "--exclude-intervened",
    is_flag=True,
    help="Leave out runs a person (or a usage checkpoint) intervened in while they ran: cancelled, paused, resumed, "
    "extended or sent a message (`labkube runs`).",
)
def analyze(
    campaigns: tuple[Path, ...],
    fmt: str,
    out_file: Path | None,
    exclude_suspicious: bool,
    exclude_unsandboxed: bool,
    exclude_intervened: bool,
) -> None:
    """Capability, reliability, efficiency, behaviour and failure-mode analysis of campaigns (pooled). Runs that
    ended in an error outcome, and runs a person cancelled, are left out of every number and counted."""
    from labkube.result import AGENT_POD_CURVE_LABEL
    from labkube.results.analysis import AnalysisError, analyze_campaigns  # numpy and friends: only when analysing
    from labkube.results.analysis_md import render_markdown

    try:
        analysis = analyze_campaigns(
            list(campaigns),
            progress=True,
            exclude_suspicious=exclude_suspicious,
            exclude_unsandboxed=exclude_unsandboxed,
            exclude_intervened=exclude_intervened,
        )
    except AnalysisError as exc:
        raise BadInput(str(exc)) from None
    out = out_file or Path(campaigns[0]) / f"analysis.{SUFFIX[fmt]}"
    if fmt == "json":
        text = analysis.model_dump_json(indent=2)
    elif fmt == "md":
        text = render_markdown(analysis)
    else:
        from labkube.results.analysis_html import render_analysis_html

        text = render_analysis_html(analysis)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    click.echo(f"{analysis.runs} runs analysed, {len(analysis.flags)} flags, {len(analysis.figures)} figures")
    if analysis.errors:
        outcomes = Counter(e.outcome for e in analysis.errors)
        what = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
        click.echo(f"left out: {len(analysis.errors)} runs that ended in an error outcome ({what})")
    if analysis.cancelled:
        click.echo(f"left out: {len(analysis.cancelled)} runs a person cancelled (not errors; counted apart)")
    if exclude_intervened:
        click.echo(f"left out: {len(analysis.excluded_intervened)} runs a person intervened in (--exclude-intervened)")
    elif analysis.intervened:
        click.echo(f"marked: {len(analysis.intervened)} analysed runs a person intervened in (--exclude-intervened)")
    if analysis.excluded_suspicious:
        click.echo(f"left out: {len(analysis.excluded_suspicious)} SUSPICIOUS runs (--exclude-suspicious)")
    if analysis.excluded_unsandboxed:
        click.echo(f"left out: {len(analysis.excluded_unsandboxed)} unsandboxed runs (--exclude-unsandboxed)")
    if analysis.agent_pod_curves:
        n = len(analysis.agent_pod_curves)
        click.echo(f"marked: {n} runs whose score curve is {AGENT_POD_CURVE_LABEL} (their efficiency rows and curves)")
    click.echo(f"written: {out}")
