"""How `labkube` meets Ctrl-C (SIGINT), SIGTERM and SIGHUP: one way for all three, at any moment of the command.

The console script (labkube/cli_entry.py) installs the handlers before it imports anything else, so a signal while the
imports load is met too. A handler never raises into whatever the main thread happens to run: Python's default
did, and a KeyboardInterrupt raised inside logging's fork hooks (`_releaseLock`) was swallowed ("Exception
ignored"), lost the interrupt and left logging's module lock held, which later hung Ray's shutdown. Instead the
first signal is recorded and wakes whoever waits (the campaign's event loop, through `waking`); the command stops at
its next safe point (`check`), ends its runs and Ray, and exits with 128 + the signal's number (130, 143, 129). A
second signal, or a clean-up that outlasts FORCE_AFTER_S, ends the process at once, after killing every process it
started.

Commands that never start a campaign take Python's own handling back (`hand_back`) once they are known. This module
imports only the standard library's smallest parts: it runs before everything else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

__all__ = [
    "Interrupted",
    "check",
    "exit_code",
    "hand_back",
    "install",
    "pending",
    "raise_on_signal",
    "waking",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORCE_AFTER_S = 30.0


class Interrupted(KeyboardInterrupt):
    """A signal asked the command to stop, met where stopping is safe. A KeyboardInterrupt, so every clean-up that
    already handles Ctrl-C handles SIGTERM and SIGHUP the same way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    installed = False
    deferring = False  # True: a signal is recorded, never raised; False: raised at once, as Python's default does
    signum: int | None = None
    originals: dict[int, object] = {}
    wakers: list[Callable[[], object]] = []


def install() -> None:
    """Meet SIGINT, SIGTERM and SIGHUP from now on by recording them (`check` raises at the next safe point)."""
    for sig in SIGNALS:
        _State.originals[sig] = signal.getsignal(sig)
        if _State.originals[sig] is signal.SIG_IGN:  # nohup, or a shell's background job: the user's choice stands
            continue
        signal.signal(sig, _on_signal)
    _State.installed, _State.deferring = True, True


def hand_back() -> None:
    """For a command that starts no campaign: signals are handled as Python would have (the handlers there were
    before `install`); one that came while the command loaded ends it now."""
    if not _State.installed:
        return
    _State.installed = False
    for sig, original in _State.originals.items():
        if original is not None:
            signal.signal(sig, original)  # type: ignore[arg-type]
    check(always=True)


def raise_on_signal() -> None:
    """From now on a signal raises Interrupted at once (a loop that only waits, and handles KeyboardInterrupt)."""
    _State.deferring = False
    check()


def pending() -> int | None:
    """The signal that asked this command to stop, if one did."""
    return _State.signum


def exit_code(default: int = 130) -> int:
    """128 + the signal's number: the exit status a shell gives a command a signal ended."""
    return 128 + _State.signum if _State.signum is not None else default


def check(always: bool = False) -> None:
    """A safe point: raise Interrupted if a signal asked the command to stop."""
    if _State.signum is not None and (_State.installed or always):
        raise Interrupted(_State.signum)


@contextlib.contextmanager
def waking(wake: Callable[[], object]) -> Iterator[None]:
    """While inside, a signal calls `wake` (from the main thread, between two bytecodes: it must only hand work
    over, e.g. `loop.call_soon_threadsafe`); a signal already recorded calls it at once."""
    _State.wakers.append(wake)
    try:
        if _State.signum is not None:
            wake()
        yield
    finally:
        _State.wakers.remove(wake)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _State.signum is not None:
        _force(signum)
    _State.signum = signum
    if not _State.deferring:
        raise Interrupted(signum)
    for wake in list(_State.wakers):
        with contextlib.suppress(Exception):
            wake()
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGALRM, _on_overdue)
        signal.setitimer(signal.ITIMER_REAL, FORCE_AFTER_S)


def _on_overdue(_signum: int, _frame: FrameType | None) -> None:
    _force(_State.signum or signal.SIGINT, f"the clean-up took over {FORCE_AFTER_S:.0f} s")


def _force(signum: int, why: str = "interrupted again") -> NoReturn:
    """End at once: every process this one started, then this one (no clean-up: the runs stay as they were, and
    the same command run again resumes them)."""
    with contextlib.suppress(Exception):
        os.write(
            sys.stderr.fileno(),
            f"\n{why}: stopped at once; to resume the unfinished runs, run the same command again\n".encode(),
        )
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(128 + (_State.signum or signum))


def _descendants(root: int) -> list[int]:
    """Every living process below `root` (children first found, then theirs), read from /proc."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
