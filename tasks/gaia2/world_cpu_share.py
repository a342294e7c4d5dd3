"""A world's share of the CPU while it warms up: the world's side of labkube/cpu_share.py (read it first).

A world started ahead of its first run (`labkube run`'s early worlds: LABKUBE_WORLD_WARMING=1) sets its autogroup's
nice value to WARMING_NICE before it imports ARE; the driver sets it back to 0 once the supervisors are up, and the
world does at its first request, whichever comes first. Its forked copies are sessions of their own, at the full
share: they fork once ARE is imported. Standard library only: the world runs with ARE's virtualenv.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

AUTOGROUP = "/proc/self/autogroup"
WARMING_ENV = "LABKUBE_WORLD_WARMING"
WARMING_NICE = 10
RETRY_S = 0.1  # the kernel's interval between two unprivileged autogroup changes
RETRY_FOR_S = 10.0


def set_autogroup_nice(nice: int) -> int:
    """Write this process's autogroup's nice value; 0 when taken, else the errno (EAGAIN: ask again later)."""
    try:
        fd = os.open(AUTOGROUP, os.O_WRONLY)
    except OSError as exc:
        return exc.errno or errno.ENOENT
    try:
        os.write(fd, str(nice).encode())
    except OSError as exc:
        return exc.errno or errno.EIO
    finally:
        os.close(fd)
    return 0


def start_warming() -> bool:
    """At the world's start, before ARE is imported: the smaller share, when the driver asked for it. A refusal
    (EAGAIN included) leaves the full share, which costs only speed. Returns whether the share was lowered."""
    if os.environ.get(WARMING_ENV) != "1":
        return False
    return set_autogroup_nice(WARMING_NICE) == 0


WARMING = start_warming()  # on import: world_server.py imports this module before anything of ARE's


def end_warming() -> None:
    """The full share back (nice 0): now, or from a thread that asks every RETRY_S while the kernel says EAGAIN."""
    if set_autogroup_nice(0) != errno.EAGAIN:
        return

    def again() -> None:
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            time.sleep(RETRY_S)
            if set_autogroup_nice(0) != errno.EAGAIN:
                return
        # Not a wrong verdict, but a slower world for the whole campaign: its log says so.
        logging.getLogger("labkube.world").warning(
            "the kernel refused this world its full CPU share for %.0f s: it stays at autogroup nice %d",
            RETRY_FOR_S,
            WARMING_NICE,
        )

    threading.Thread(target=again, daemon=True, name="world-full-share").start()
