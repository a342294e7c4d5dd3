"""The `labkube` console script (and `python -m labkube`): the signal handlers first, then the command line.

Everything the command line imports takes about a second; a Ctrl-C, SIGTERM or SIGHUP in that second is met by
labkube/interrupts.py like one at any later moment (a single "interrupted" line, exit 128 + the signal's number),
never with an import traceback. So this module imports nothing heavy before `interrupts.install()`.
"""

from __future__ import annotations

import sys

from labkube import interrupts


def main() -> None:
    interrupts.install()
    from labkube.cli import entry

    if interrupts.pending() is not None:
        sys.stderr.write("interrupted\n")
        sys.exit(interrupts.exit_code())
    entry()
