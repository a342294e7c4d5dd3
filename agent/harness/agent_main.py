"""`labkube agent`'s process around one run (agent/harness/entrypoint.py runs the run itself): one agent per run
folder (its lock), every process the run starts contained and ended with it, SIGTERM and an orphaned agent saving the
checkpoint and exiting, the run's live control stopping it (a cancel graded as it stands, a pause saved: exit 76), a
full disk resumable (exit 75), and the exit code its supervisor reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from labkube.agent.checkpoint import Checkpoint
from labkube.agent.containment import adopt_run_processes, end_run_processes
from labkube.agent.harness.entrypoint import AgentError, finalize_stopped, run_agent, write_status
from labkube.agent.harness.steering import RunPaused, Steering
from labkube.agent.providers.provider import ProviderError
from labkube.budgets import StopReason
from labkube.control import PAUSED_EXIT
from labkube.interventions import pause_line
from labkube.result import RunResult
from labkube.run_spec import RunPhase
from labkube.storage_full import line_for, storage_error
from labkube.store import RunDir, read_model

DISK_FULL_EXIT = 75  # EX_TEMPFAIL: the run can resume once there is space again


async def stop_when_orphaned(task: asyncio.Task, every_s: float = 1.0) -> None:
    """A supervisor that dies leaves no agent behind: behave as on SIGTERM (checkpoint, exit)."""
    parent = os.getppid()
    while True:
        await asyncio.sleep(every_s)
        if os.getppid() != parent:
            task.cancel()
            return


class DiskFull(AgentError):
    pass


def main(run_dir: Path, resume: bool, finalize_reason: StopReason | None = None) -> int:
    """Exit codes: 0 finished, 1 run failed, 75 disk full (resumable), 143 terminated (resumable)."""
    try:
        return _main(run_dir, resume, finalize_reason)
    except OSError as exc:
        found = storage_error(exc, run_dir)
        if found is None:
            raise
        raise DiskFull(f"{line_for(found)} (everything written before this step is intact)") from None


def _main(run_dir: Path, resume: bool, finalize_reason: StopReason | None) -> int:
    with run_lock(run_dir):
        return _locked_main(run_dir, resume, finalize_reason)


@contextlib.contextmanager
def run_lock(run_dir: Path, wait_s: float = 30.0) -> Iterator[None]:
    """One agent per run directory. A new supervisor may start while the previous agent, orphaned by
    a dead supervisor, is still writing its checkpoint: wait for it rather than run twice."""
    fh = open_lock_file(run_dir / ".agent.lock")
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AgentError(f"{run_dir} is being run by another agent process; wait for it to end") from None
                time.sleep(0.2)
        yield
    finally:
        fh.close()


def open_lock_file(path: Path) -> IO[bytes]:
    """The run's lock file, opened without following a link or waiting on a FIFO; anything but a regular file there
    (an agent's, in a grading pod) is removed and the file made again."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    for _ in range(3):
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "rb+")
        os.close(fd)
        path.unlink()
    raise AgentError(f"{path}: could not make the run's lock file (something keeps replacing it)")


def _locked_main(run_dir: Path, resume: bool, finalize_reason: StopReason | None) -> int:
    adopt_run_processes(run_dir)
    try:
        return _contained_main(run_dir, resume, finalize_reason)
    finally:
        end_run_processes()  # whatever the run started dies with it, however it ended


def _contained_main(run_dir: Path, resume: bool, finalize_reason: StopReason | None) -> int:
    if finalize_reason is not None:
        result = finalize_stopped(run_dir, finalize_reason)
        return 0 if result.status is RunPhase.finished else 1
    spec = RunDir(run_dir).spec()
    steering = Steering.of_run(RunDir(run_dir).root, spec.run_id)
    # rg-agent pauses at its next step boundary; a vendor CLI or ARE's agent has none of labkube's: at once
    steps_itself = spec.agent == "rg-agent" and spec.family != "gaia2"
    before = steering.halt_now(steps_itself=False)  # before a start, any pause holds it at once
    if before is not None:  # it was cancelled or paused before this start (or while its supervisor started it)
        steering.halt = before
        return _halted(run_dir, steering)

    async def guarded() -> RunResult:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None

        def cancel_the_run(*_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the run is over
                loop.call_soon_threadsafe(task.cancel)

        # A Python handler, not `loop.add_signal_handler`: asyncio checks the signal against every valid one (63
        # enum conversions) when it adds the handler and again when the loop closes, 0.2 ms of a short run's CPU.
        # The handler runs on the main thread as soon as the loop's wait is interrupted, and wakes the loop.
        signal.signal(signal.SIGTERM, cancel_the_run)
        watchdog = asyncio.create_task(stop_when_orphaned(task))
        watcher = asyncio.create_task(steering.watch(task, steps_itself))
        try:
            return await run_agent(run_dir, resume, steering)
        finally:
            watchdog.cancel()
            watcher.cancel()

    try:
        # asyncio's loop, not uvloop (which the gateway sidecar runs on): uvloop's subprocesses inherit the loop's own
        # descriptors, so a command's background process kept its output pipe open (the command never returned) and
        # the agent's sockets would be a run's code's to use.
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        return _halted(run_dir, steering) if steering.halt is not None else 143
    except RunPaused:
        return PAUSED_EXIT
    except ProviderError as exc:
        raise AgentError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as the loop's close left it
    return 0 if result.status is RunPhase.finished else 1


def _halted(run_dir: Path, steering: Steering) -> int:
    """The run's agent was stopped by an intervention (`steering.halt`): a cancelled run is graded as it stands (or
    not: --no-grade); a paused one keeps its last step's checkpoint and says it is paused."""
    if steering.halt == "cancel":
        result = finalize_stopped(run_dir, StopReason.cancelled)
        return 0 if result.status is RunPhase.finished else 1
    rd = RunDir(run_dir)
    ckpt = read_model(rd.checkpoint_json, Checkpoint) or Checkpoint()
    pause = steering.control.paused
    write_status(rd, rd.spec(), ckpt, RunPhase.paused, pause_line(pause) if pause is not None else "paused")
    return PAUSED_EXIT
