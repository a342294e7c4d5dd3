"""How the `labkube` process ends once a campaign command has done and said everything: without the
interpreter's teardown.

After a campaign, Python's finalization (every module's objects, Ray's core worker and its gRPC threads) took
0.2-0.3 s of a 4-s, 20-run `labkube run` on a 2-core machine, and frees nothing the process's exit does not. A
command that ran a campaign asks for the short end (`skip_teardown`) once its results are on disk and Ray has
stopped; `exit_process`, called by the console script's entry, then runs the atexit handlers, flushes the standard
streams and exits with the command's code. Anything else ends as Python ends: a command that did not ask, a
thread still running (daemon or not), an exit code that is not a number. Tests invoke the click group (`cli.main`),
never the entry, so their process is never ended.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_process", "skip_teardown"]

_teardown_skipped = {"asked": False}


def skip_teardown() -> None:
    """The command's work is on disk and every process it started has stopped: its end may skip the teardown."""
    _teardown_skipped["asked"] = True


def exit_process(code: object) -> NoReturn:
    """End the process with `code` (a SystemExit's), skipping the interpreter's teardown where that was asked for
    and nothing else is running."""
    if code is None:
        code = 0
    if not _teardown_skipped["asked"] or not isinstance(code, int) or threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()  # what the teardown would have run first: logging's flush, Ray's exit hook, finalizers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: Python's own exit reports it as 120
            code = code or 120
    os._exit(code)
