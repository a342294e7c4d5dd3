"""What a campaign starts ahead of its first run warms up at a smaller share of the CPU (labkube/cpu_share.py).

Real parts: the kernel's autogroups (read and written through /proc, as labkube does), real world processes in ARE's
virtualenv, the zygote `labkube run` starts. Where the kernel has no autogroups, or has them off, there is nothing to
share out and these tests are skipped; this machine and CI's have them on."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from labkube.cpu_share import WARMING_NICE, autogroup_nice, set_autogroup_nice
from labkube.operator.warm import EarlyWorlds
from labkube.operator.zygote_handoff import EarlyZygote
from labkube.tasks.gaia2 import WorldPool
from labkube.tasks.gaia2.world_process import WARMING_ENV, AdoptedWorld, start_world

PR_SET_DUMPABLE = 4


def autogroups_on() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not autogroups_on(), reason="this kernel has no autogroups, or has them off")


def nice_becomes(pid: int, nice: int, within_s: float = 5.0) -> int | None:
    """The autogroup nice value of `pid` once it is `nice`, or the last one read after `within_s`."""
    deadline = time.monotonic() + within_s
    seen = autogroup_nice(pid)
    while seen != nice and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = autogroup_nice(pid)
    return seen


def test_a_process_of_the_user_in_a_session_of_its_own_has_its_autogroup_set_and_read_back() -> None:
    """The contract labkube relies on: a session of its own is an autogroup of its own, whose nice value another
    process of the same user can raise and set back to 0 (the driver does, for its worlds and zygote)."""
    own = autogroup_nice()  # None where this process is in the kernel's root autogroup (CI's test process is)
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert autogroup_nice(child.pid) == 0
        assert Path(f"/proc/{child.pid}/autogroup").read_text() != Path("/proc/self/autogroup").read_text()
        assert set_autogroup_nice(WARMING_NICE, child.pid) == 0
        assert autogroup_nice(child.pid) == WARMING_NICE
        assert autogroup_nice() == own, "this process's own autogroup was left alone"
        assert set_autogroup_nice(0, child.pid) == 0
        assert autogroup_nice(child.pid) == 0
    finally:
        child.kill()
        child.wait()
    assert set_autogroup_nice(0, child.pid) == errno.ENOENT, "a process that is gone is an errno, not an exception"


def unprivileged_asks() -> dict:
    """In a forked child, user nobody in a session of its own (not this test's autogroup): the world's own side of
    the share (world_cpu_share.py, standard library only) meets the kernel's limit on unprivileged changes."""
    from labkube.tasks.gaia2 import world_cpu_share as share

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through the pipe
        try:
            os.close(read)
            os.setsid()
            os.setgid(65534)
            os.setuid(65534)
            # A change of user leaves /proc/self root's until the process is dumpable again, as a fresh one is.
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            # One unprivileged autogroup change every 100 ms, from all processes together: ask until one is taken,
            # then at once again, which the kernel refuses.
            while share.set_autogroup_nice(WARMING_NICE) == errno.EAGAIN:
                time.sleep(0.01)
            warming = autogroup_nice()
            refused = share.set_autogroup_nice(0)
            share.end_warming()  # asks again from a thread until it is taken
            final = nice_becomes(os.getpid(), 0)
            os.write(write, json.dumps({"warming": warming, "refused": refused, "final": final}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(report)


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes another user to meet the kernel's limit on unprivileged ones")
def test_an_unprivileged_world_asks_again_for_its_full_share_until_the_kernel_grants_it() -> None:
    """Without CAP_SYS_ADMIN the kernel refuses a second autogroup change within 100 ms (EAGAIN): two worlds and the
    zygote end warming at about the same time. The world's `end_warming` asks again until it is taken."""
    seen = unprivileged_asks()
    assert seen["warming"] == WARMING_NICE, seen
    assert seen["refused"] == errno.EAGAIN, seen
    assert seen["final"] == 0, seen


def test_a_world_started_ahead_of_its_run_warms_until_its_first_request(are_python: Path, tmp_path: Path) -> None:
    """`prestart(2, warming=True)`: the first world imports ARE at nice 10 in an autogroup of its own; its copy,
    forked once ARE is imported, is a session of its own at the full share. The first request (any) gives the first
    world its full share back. A world started for a run that waits for it never warms."""
    with WorldPool(are_python, max_idle=2, log_dir=tmp_path) as pool:
        pool.prestart(2, warming=True)
        worlds = pool.idle()
        first = next(w for w in worlds if not isinstance(w, AdoptedWorld))
        (copy,) = (w for w in worlds if w is not first)
        assert os.getsid(first.pid) == first.pid and os.getsid(copy.pid) == copy.pid
        assert autogroup_nice(first.pid) == WARMING_NICE
        assert autogroup_nice(copy.pid) == 0
        assert f"{WARMING_ENV}=1".encode() in Path(f"/proc/{first.pid}/environ").read_bytes().split(b"\0")

        async def ask() -> None:
            async with first.client() as client:
                await client.health()

        asyncio.run(ask())
        assert nice_becomes(first.pid, 0) == 0
    waited_for = start_world(are_python, log_path=tmp_path / "waited-for.log")
    try:
        assert autogroup_nice(waited_for.pid) == 0
        assert f"{WARMING_ENV}=1".encode() not in Path(f"/proc/{waited_for.pid}/environ").read_bytes().split(b"\0")
    finally:
        waited_for.stop()


def test_labkube_runs_early_worlds_stop_warming_when_the_supervisors_are_up(are_python: Path, tmp_path: Path) -> None:
    """`labkube run` starts its first worlds warming while Ray's head starts; asking for their handoffs (which the
    driver does once its supervisors answer) gives them their full share back, before any request reaches them."""
    early = EarlyWorlds(1, tmp_path)
    try:
        assert early.pool is not None and early._thread is not None
        early._thread.join(timeout=120)
        (world,) = early.pool.idle()
        assert autogroup_nice(world.pid) == WARMING_NICE
        (handoff,) = early.handoffs()
        assert handoff.pid == world.pid
        assert autogroup_nice(world.pid) == 0
    finally:
        early.close()


def test_the_zygote_labkube_run_starts_warms_in_a_session_of_its_own_until_the_supervisors_are_up() -> None:
    early = EarlyZygote(True)
    try:
        assert early.proc is not None
        pid = early.proc.pid
        assert os.getsid(pid) == pid, "a session of its own: an autogroup of its own"
        assert nice_becomes(pid, WARMING_NICE) == WARMING_NICE
        early.end_warming()
        assert autogroup_nice(pid) == 0
    finally:
        if early.proc is not None:
            os.kill(early.proc.pid, signal.SIGKILL)
        early.close()
