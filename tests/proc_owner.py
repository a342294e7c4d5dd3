"""Which processes on this machine this test process started, directly or not.

The suite runs in several test processes at once (pytest-xdist, scripts/test.sh): a check such as "no supervisor
actor is left" or a fault such as "kill -9 the supervisor actor" must look at this process's own, never at another
one's. Every process inherits its starter's environment unless told otherwise, and Ray's workers inherit their node's:
this process marks its own environment (`mark_this_process`, from tests/conftest.py) and a process is ours when it
carries the mark."""

from __future__ import annotations

import os
from pathlib import Path

OWNER_VARIABLE = "LKTEST_OWNER"  # no LABKUBE_ or RAY_ prefix: tests drop those when they build an environment


def mark_this_process() -> None:
    """Set, not kept from a parent: pytest-xdist's workers are started by a process that marked itself first."""
    os.environ[OWNER_VARIABLE] = str(os.getpid())


def ours(pid: int) -> bool:
    """Whether process `pid` carries this test process's mark (False once it is gone)."""
    mark = f"{OWNER_VARIABLE}={os.environ.get(OWNER_VARIABLE, '')}".encode()
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
