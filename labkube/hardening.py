"""Keep a process that holds API keys from being read by other processes of its user.

`labkube agent` (the harness: the run's keys, its world's control token) and `labkube gateway` (a pod's sidecar,
the provider's key) call `not_dumpable()` first thing. The kernel then treats the process as it treats a setuid
one: no core dump, its `/proc/<pid>/mem`, `environ`, `fd` and the rest owned by root and closed to ptrace and to
other processes of the same user without CAP_SYS_PTRACE, which the agent's own commands never have. The flag is
inherited across fork (the agent zygote's children) and reset by execve, so a process that re-executes itself
(the keys moved to stdin in a pod) calls this again; the agent's commands, each an execve, are left as they were.
Root (CI) still reads every process: the flag matters for the sandboxed agent.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["dumpable", "not_dumpable"]

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def _prctl(option: int, value: int = 0) -> int:
    return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0))


def not_dumpable() -> bool:
    """`prctl(PR_SET_DUMPABLE, 0)` for this process (and the children it forks); True where it took. A no-op off
    Linux."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _prctl(PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):  # no libc to load, or one without prctl
        return False


def dumpable() -> bool | None:
    """Whether this process is dumpable (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _prctl(PR_GET_DUMPABLE) != 0
    except (OSError, AttributeError):
        return None
