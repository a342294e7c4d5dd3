"""`labkube settings`: the `LABKUBE_*` environment variables a user sets (labkube/settings.py), each with its value
here, its default, what it accepts and what it does; a value that is not accepted is shown and refused (exit 2)."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table

from labkube.cli_checks import console, err_console
from labkube.settings import USER_SETTINGS, SettingError, settings_problems


@click.command("settings")
def settings() -> None:
    """The LABKUBE_* environment variables: value here, default, what each accepts, what it does."""
    table = Table(title="labkube settings (environment variables)", show_lines=False)
    for column in ("variable", "value here", "default", "accepts", "what it does"):
        table.add_column(column, overflow="fold")
    for setting in USER_SETTINGS:
        value = setting.raw()
        if value is None:
            shown = "[dim](unset)[/]"
        else:
            try:
                read = setting.read()
                shown = escape(value) + (f" ({'on' if read else 'off'})" if isinstance(read, bool) else "")
            except SettingError:
                shown = f"[bold red]{escape(value)} (not accepted)[/]"
        table.add_row(setting.name, shown, escape(setting.shown_default), escape(setting.accepts), escape(setting.help))
    console.print(table)
    problems = settings_problems(all_settings=True)
    for problem in problems:
        err_console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if problems:
        sys.exit(2)
