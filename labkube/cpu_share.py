"""The share of the CPU of what a campaign starts ahead of its first run, where Linux groups processes by session
("autogroups", sched(7)).

`labkube run` starts the campaign's first worlds and its agent zygote while Ray's head starts (warm.EarlyWorlds,
zygote_handoff.EarlyZygote), so that their imports (seconds of CPU for ARE) overlap the head's. A world is a session
of its own, so that stopping it kills its process group and only it. With autogroups on, the default of most
distributions' kernels (this machine's included), the kernel gives each session an equal share: the world importing
ARE had as much of the machine as the whole of the user's session, where `labkube run`, Ray's head and the
supervisor's worker shared theirs with the zygote's imports; and the first run waits for the head and the
supervisor, not for the world. So the early worlds and the zygote (a session of its own too) start "warming", their
autogroup at nice WARMING_NICE, and get the full share back (nice 0) when the supervisors are up, or at their first
request, whichever comes first. Nothing that a run waits for is started warming.

An unprivileged process may set an autogroup's nice value back to 0 (only a negative one needs CAP_SYS_NICE), of
its own processes; the kernel takes one autogroup change every 100 ms from all such processes together, and
refuses the others with EAGAIN (whoever asked again then succeeds). Without autogroups the file is missing, or the
kernel ignores what is written to it. tasks/gaia2/world_cpu_share.py is the world's side, in the world's own
virtualenv.
"""

from __future__ import annotations

import errno
import os

WARMING_NICE = 10
RETRY_S = 0.1  # the kernel's interval between two unprivileged autogroup changes


def set_autogroup_nice(nice: int, pid: int | None = None) -> int:
    """Set the nice value of the autogroup of `pid` (this process by default); 0 when taken, else the errno
    (EAGAIN: ask again after RETRY_S; ENOENT: no autogroups, or no such process)."""
    path = f"/proc/{pid if pid is not None else 'self'}/autogroup"
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        return exc.errno or errno.ENOENT
    try:
        os.write(fd, str(nice).encode())
    except OSError as exc:
        return exc.errno or errno.EIO
    finally:
        os.close(fd)
    return 0


def autogroup_nice(pid: int | None = None) -> int | None:
    """The nice value of the autogroup of `pid` (this process by default); None without autogroups, and for a process
    in the kernel's root autogroup (one whose session never made its own, such as a container's first process's),
    which /proc shows as empty."""
    try:
        with open(f"/proc/{pid if pid is not None else 'self'}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, IndexError, ValueError):
        return None
