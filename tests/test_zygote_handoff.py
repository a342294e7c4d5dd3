"""The agent zygote `labkube run` starts while Ray starts and hands to its supervisor (operator/zygote_handoff.py).

Real parts: the zygote process, the supervisor's `WarmWorker` and `supervise_run`, a forked `labkube agent` on a
scripted GAIA answer (test_warm_workers.gaia_question)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from test_warm_workers import gaia_question

from labkube.cpu_share import autogroup_nice
from labkube.operator.supervisor import supervise_run
from labkube.operator.warm import WarmWorker
from labkube.operator.zygote_handoff import EarlyZygote, ZygoteHandoff, receive


def ended(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts) or gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


async def test_a_supervisor_forks_its_runs_from_the_zygote_the_driver_started(tmp_path: Path) -> None:
    """The supervisor adopts the driver's zygote (it starts none of its own), forks a run from it, and when the
    supervisor lets go of it at the end, the zygote exits and the driver reaps it at once."""
    early = EarlyZygote(True)
    handoff = early.handoff()
    assert handoff is not None and early.proc is not None
    warm = WarmWorker()
    try:
        assert await warm.zygote.adopt(handoff)
        await warm.warm_up(1, tmp_path, worlds=0, fork_agents=True)  # the adopted zygote serves: none started
        assert warm.zygote.pid == early.proc.pid
        run_dir = gaia_question(tmp_path, "a", ["echo $PPID > agent.pid"], "4", sandbox="none")
        result = await supervise_run(str(run_dir), warm=warm)
        assert result.score == 1.0 and result.status.value == "Finished", result.error
        agent_pid = int((run_dir / "workspace" / "agent.pid").read_text())
        assert agent_pid not in (os.getpid(), early.proc.pid), "the agent was a process of its own"
        assert warm.zygote.pid == early.proc.pid
        if autogroup_nice() is not None:  # it started warming (labkube/cpu_share.py); its first request ended that
            assert autogroup_nice(early.proc.pid) == 0
    finally:
        await warm.close()
    assert ended(early.proc.pid), "the zygote outlived its supervisor's hold on it"
    started = time.monotonic()
    early.close()
    assert time.monotonic() - started < 1.0 and early.proc.returncode is not None


async def test_a_zygote_nobody_adopts_ends_with_the_driver_and_a_late_supervisor_starts_its_own(
    tmp_path: Path,
) -> None:
    early = EarlyZygote(True)
    handoff = early.handoff()
    assert handoff is not None and early.proc is not None
    started = time.monotonic()
    early.close()  # the campaign ended (or failed) before any supervisor asked
    assert time.monotonic() - started < 3.0 and early.proc.returncode is not None
    warm = WarmWorker()
    try:
        assert not await warm.zygote.adopt(handoff)  # no longer offered
        await warm.warm_up(1, tmp_path, worlds=0, fork_agents=True)
        assert warm.zygote.pid not in (None, early.proc.pid)
    finally:
        await warm.close()


def test_the_zygote_is_offered_once_and_only_to_this_user() -> None:
    early = EarlyZygote(True)
    try:
        handoff = early.handoff()
        assert handoff is not None
        connection = receive(handoff)
        assert connection is not None
        with connection:
            assert connection.family == socket.AF_UNIX and not connection.get_inheritable()
            assert receive(handoff) is None  # one supervisor holds it
            assert receive(ZygoteHandoff(pid=handoff.pid, address=handoff.address + "0")) is None
    finally:
        early.close()


def test_no_zygote_when_no_run_forks_one() -> None:
    early = EarlyZygote(False)
    assert early.handoff() is None and early.proc is None
    early.close()


async def test_a_zygote_that_died_before_its_adoption_is_replaced_by_the_supervisors_own(tmp_path: Path) -> None:
    early = EarlyZygote(True)
    handoff = early.handoff()
    assert handoff is not None and early.proc is not None
    early.proc.kill()  # not reaped: the driver reaps it only at the end, so its pid stays its own until then
    while not ended(early.proc.pid):
        await asyncio.sleep(0.01)
    warm = WarmWorker()
    try:
        await warm.zygote.adopt(handoff)
        await warm.warm_up(1, tmp_path, worlds=0, fork_agents=True)
        assert warm.zygote.pid not in (None, early.proc.pid)
        result = await supervise_run(str(gaia_question(tmp_path, "a", [], "4")), warm=warm)
        assert result.score == 1.0, result.error
    finally:
        await warm.close()
        early.close()


def marked_processes(marker: str) -> list[str]:
    """The processes whose environment holds `marker` (every process `labkube run` starts inherits it)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes().split(b"\0"):
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_labkube_run_leaves_no_process_behind(tmp_path: Path) -> None:
    """`labkube run` on Gaia2 oracle runs (their agents forked from the zygote the command started and its supervisor
    adopted): no process the command started (Ray's, the agent stand-ins, the zygote, the worlds, the agents)
    outlives it."""
    from cli_helpers import labkube

    marker = f"LABKUBE_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
    out = tmp_path / "camp"
    proc = labkube(
        "run", "gaia2/time_door_code", "--model", "oracle", "--seeds", "2", "--concurrency", "2",
        "--out", str(out), cwd=tmp_path, env=dict([marker.split("=", 1)]),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list(out.glob("runs/*/result.json"))) == 2
    deadline = time.monotonic() + 5  # Ray signals its processes and does not wait for them to be gone
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked_processes(marker) == [], "processes outlived labkube run"
