"""`labkube analyze CAMPAIGN... [--format html|json|md] [--out PATH]` (registered at the end of labkube/cli.py)."""

from __future__ import annotations

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
def analyze(campaigns: tuple[Path, ...], fmt: str, out_file: Path | None) -> None:
    """Capability, reliability, efficiency, behaviour and failure-mode analysis of campaigns (pooled)."""
    from labkube.analysis import AnalysisError, analyze_campaigns  # numpy and friends: only when analysing
    from labkube.analysis_md import render_markdown

    try:
        analysis = analyze_campaigns(list(campaigns), progress=True)
    except AnalysisError as exc:
        raise BadInput(str(exc)) from None
    out = out_file or Path(campaigns[0]) / f"analysis.{SUFFIX[fmt]}"
    if fmt == "json":
        text = analysis.model_dump_json(indent=2)
    elif fmt == "md":
        text = render_markdown(analysis)
    else:
        from labkube.analysis_html import render_analysis_html

        text = render_analysis_html(analysis)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    click.echo(f"{analysis.runs} runs analysed, {len(analysis.flags)} flags, {len(analysis.figures)} figures")
    click.echo(f"written: {out}")
