"""The `labkube` command line: a thin click layer over the same functions the tests call. This module only
assembles it; each command family has a module of its own, which parses its options and calls into the rooms:

- `run`, `campaign run`, `demo`: labkube/runs_cli.py
- `runs cancel|pause|resume|drain|extend|message` (live control of a campaign's runs): labkube/control_cli.py
- `status`, `report`, `view`: results/report_cli.py; `analyze`: results/analysis_cli.py; `export`:
  results/export_cli.py
- `audit`: labkube/audit_cli.py
- `tasks list|show`: labkube/tasks_cli.py (`tasks prepare|dockerfile`: labkube/task_env_cli.py)
- `worlds setup|serve`, `world-mcp`: labkube/worlds_cli.py
- `agent`, `agents install`, `gateway`: labkube/agents_cli.py
- `operator`: labkube/operator_cli.py; `crds apply`: labkube/crds_cli.py
- `tools apply-patch`, `schema`: labkube/tools_cli.py
- `settings` (the LABKUBE_* environment variables, labkube/settings.py): labkube/settings_cli.py

Exit codes: 0 when every run ended with a measurement (a score, or a grading that gave no value; a low score
is not a failure), 1 when a run ended in an error outcome (grader_error, judge_error, world_error, setup_error,
model_error, harness_error), 2 for bad usage or bad input (one line; labkube/cli_checks.py), 130 when
interrupted (143 on SIGTERM, 129 on SIGHUP: labkube/interrupts.py). A traceback only ever shows a labkube bug, with
a line asking for a report.
"""

from __future__ import annotations

import click

from labkube.agents_cli import agent, agents, gateway
from labkube.audit_cli import audit
from labkube.cli_checks import FrontDoor
from labkube.control_cli import runs
from labkube.crds_cli import crds
from labkube.operator_cli import operator_command
from labkube.process_exit import exit_process
from labkube.results.analysis_cli import analyze
from labkube.results.export_cli import export
from labkube.results.report_cli import report, status, view
from labkube.runs_cli import campaign, demo, run
from labkube.settings_cli import settings
from labkube.tasks_cli import tasks
from labkube.tools_cli import schema, tools
from labkube.worlds_cli import world_mcp, worlds


@click.group(
    cls=FrontDoor,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Settings: LABKUBE_* environment variables (warm workers, containment, caches, fake GPUs, ...) are "
    "checked before a campaign starts; `labkube settings` lists them with their values, defaults and what each "
    "accepts.",
)
@click.version_option(package_name="labkube")
def main() -> None:
    """labkube: run research agents on ResearchGym tasks and Gaia2 worlds, locally or on Kubernetes."""


for command in (
    run,
    campaign,
    demo,
    runs,
    status,
    report,
    view,
    analyze,
    export,
    audit,
    tasks,
    worlds,
    world_mcp,
    agent,
    agents,
    gateway,
    operator_command,
    crds,
    tools,
    schema,
    settings,
):
    main.add_command(command)


def entry() -> None:
    """The `labkube` console script once its signal handlers are in (labkube/cli_entry.py): the click group, then
    the process's end (`process_exit`)."""
    try:
        main()
    except SystemExit as done:  # click's standalone mode always ends with one
        exit_process(done.code)
