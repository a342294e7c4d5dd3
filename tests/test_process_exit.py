"""The `labkube` process's end after a campaign (labkube/process_exit.py): the interpreter's teardown is skipped
only where the command asked for it, and the end keeps what the teardown would have done that a user sees: the
exit code, every byte written to a pipe, the atexit handlers. Run in real child processes: the end is `os._exit`.

The campaign commands' own exit codes through the console script's entry (`python -m labkube run`: 0, 1 for a run
that ended in an error outcome, 2 for bad input) are checked by test_outcomes.py, test_campaign_lock.py and the
front-door tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from cli_helpers import labkube
from tinytask import make_tiny_task

CHILD = """
import atexit, sys, threading
from labkube.process_exit import exit_process, skip_teardown

class Finalized:
    def __del__(self):
        sys.stdout.write(" finalized")  # runs in the teardown only: module globals are cleared there

kept = Finalized()
atexit.register(lambda: sys.stdout.write(" atexit"))
if "ask" in sys.argv:
    skip_teardown()
if "thread" in sys.argv:
    import time
    threading.Thread(target=lambda: (time.sleep(0.5), sys.stdout.write(" thread"))).start()  # not a daemon
sys.stdout.write("done" * 20000)  # more than a pipe's buffer: a lost flush would show
exit_process(int(sys.argv[1]))
"""


def end(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("code", [0, 3])
def test_an_asked_end_skips_the_teardown_and_keeps_the_code_the_output_and_the_atexit_handlers(code: int) -> None:
    child = end(str(code), "ask")
    assert child.returncode == code, child.stderr
    assert child.stdout == "done" * 20000 + " atexit"  # flushed whole, atexit run, no finalizer: no teardown
    assert child.stderr == ""


def test_an_end_not_asked_for_is_python_s_own() -> None:
    child = end("3")
    assert child.returncode == 3, child.stderr
    assert child.stdout == "done" * 20000 + " atexit finalized"


def test_a_thread_still_running_gets_python_s_own_end() -> None:
    child = end("4", "ask", "thread")
    assert child.returncode == 4, child.stderr
    assert child.stdout.endswith(" thread atexit finalized")  # Python's exit waited for it


def test_labkube_run_ends_with_its_whole_output_on_a_pipe(tmp_path) -> None:
    """The console script's entry after a real campaign: the last lines reach the pipe, the code is 0."""
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    proc = labkube("run", str(task), "--model", "oracle", "--out", str(tmp_path / "c"), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == f"campaign directory: {tmp_path / 'c'}"
