"""labkube as `pip install .` leaves it, before a benchmark times a start-up: its modules compiled.

An editable install (`pip install -e`, what scripts/test.sh and a checkout use) leaves labkube's own modules
uncompiled. Python then compiles each one at its first import and writes the bytecode beside it, except where
PYTHONDONTWRITEBYTECODE is set (this sandbox, many CI images): there every process compiled labkube's modules again
at each start (0.07-0.1 s of CPU for the CLI's imports alone, more for a supervisor, the agent zygote and the
worlds), which neither a user's install nor ARE's virtualenv (compiled by its installer) pays."""

from __future__ import annotations

import compileall
import re

from docs_block import REPO

PACKAGE_FOLDERS = ("labkube", "agent", "tasks", "integrity", "operator", "results")  # pyproject's package-dir
TASK_FILES = re.compile(r"tasks/bundled/")  # the bundled tasks' own code: copied into workspaces as it is


def compile_labkube() -> None:
    """Write the bytecode of labkube's modules (what is already current is left as it is)."""
    for folder in PACKAGE_FOLDERS:
        if not compileall.compile_dir(REPO / folder, quiet=1, workers=0, rx=TASK_FILES):
            raise SystemExit(f"compiling {REPO / folder} failed: a module of it does not compile")


if __name__ == "__main__":  # scripts/test.sh, after its editable install
    compile_labkube()
