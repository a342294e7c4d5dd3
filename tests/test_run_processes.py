"""A run's processes end with the run (issue #23, item 7): what the agent's commands leave running in ways no
process group reaches (`setsid nohup ... &`, a daemon's double fork, an escapee of an async job) is gone when
the run ends on its wall budget, and after `kill -9` of the harness and the agent, once the run resumes.

These tests reach the containment under the sandbox (the run's cgroup, its token): their runs are unsandboxed
(`sandbox="none"`), since inside a run's sandbox (docs/sandbox.md) the pids a command writes are its pid
namespace's, and everything a command leaves ends with its namespace anyway. The sandboxed run's own case is
`test_kill_9_of_the_harness_ends_a_sandboxed_runs_processes_at_once`.

Real parts throughout: the local sandbox (`supervise_run`, as a Ray actor runs it), the `labkube agent`
subprocess, the scripted provider, real processes; the cgroup variant uses the machine's cgroup v2 hierarchy
and is skipped where none can be made here. "Gone" is checked by pid, by a scan of /proc for processes whose
working directory is the run's workspace (independent of labkube's token), and by the cgroup's removal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.containment import (
    MODE_VARIABLE,
    Containment,
    cgroup2_mount,
    make_run_cgroup,
    new_token,
    read_record,
    tagged_pids,
)
from labkube.budgets import Budgets
from labkube.operator.supervisor import supervise_run

DAEMON = """import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        open('double.pid', 'w').write(str(os.getpid()))
        time.sleep(600)  # the escapee: lives until the run's cleanup ends it
    os._exit(0)
while not os.path.exists('double.pid') or not os.path.getsize('double.pid'):  # the escape is done
    time.sleep(0.01)
"""
ESCAPES = [
    {
        "tool": "bash",
        "args": {
            "command": "setsid nohup bash -c 'echo $$ > setsid.pid; exec sleep 600' >/dev/null 2>&1 & "
            "until [ -s setsid.pid ]; do sleep 0.01; done"
        },
    },
    {"tool": "python", "args": {"code": DAEMON}},
    {
        "tool": "start_async",
        "args": {
            "command": "setsid bash -c 'echo $$ > job-escapee.pid; exec sleep 600' >/dev/null 2>&1 & "
            "echo $$ > job.pid; sleep 600"
        },
    },
]
PID_FILES = ("setsid.pid", "double.pid", "job-escapee.pid", "job.pid")
WAIT = [{"tool": "bash", "args": {"command": "sleep 1"}}] * 60
UNTIL_GO = [{"tool": "bash", "args": {"command": "until [ -e go ]; do sleep 0.1; done"}}]


@pytest.fixture(params=["cgroup", "processes"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cgroup":
        try:
            probe = make_run_cgroup("probe-" + str(os.getpid()), None, None)
        except Exception as exc:  # ContainmentError or an unreadable hierarchy
            pytest.skip(f"no usable cgroup v2 here: {exc}")
        if probe.cgroup is None:
            pytest.skip(f"no usable cgroup v2 here: {probe.note}")
        Path(probe.cgroup).rmdir()
    monkeypatch.setenv(MODE_VARIABLE, request.param)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    return request.param


def started_pids(workspace: Path, timeout: float = 60) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return {name: int((workspace / name).read_text()) for name in PID_FILES}
        except (FileNotFoundError, ValueError):
            time.sleep(0.1)
    raise AssertionError(f"the run never started its processes: {sorted(p.name for p in workspace.iterdir())}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def in_workspace(workspace: Path) -> list[int]:
    """Live processes whose working directory is the workspace (how a person would look for them)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if cwd == str(workspace) and alive(int(name)):
                found.append(int(name))
    return found


def run_cgroups(token: str) -> list[Path]:
    mount = cgroup2_mount()
    return list(mount.rglob(f"labkube-{token}")) if mount else []


def assert_nothing_left(run_dir: Path, pids: dict[str, int]) -> None:
    record = read_record(run_dir)
    assert record is not None
    left = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not left, f"processes of the run outlived it: {left}"
    assert not in_workspace(run_dir / "workspace")
    assert not tagged_pids(record.token)
    assert not run_cgroups(record.token), "the run's cgroup was removed"


def run_cgroup_or_skip(prefix: str) -> Containment:
    """A real run cgroup (cgroup v2, delegated to this user) for a test; the test is skipped where none can be made."""
    try:
        record = make_run_cgroup(f"{prefix}-{new_token()}", None, None)
    except Exception as exc:
        pytest.skip(f"no usable cgroup v2 here: {exc}")
    if record.cgroup is None:
        pytest.skip(f"no usable cgroup v2 here: {record.note}")
    return record


def test_processes_a_run_leaves_end_with_its_wall_budget(tmp_path: Path, mode: str) -> None:
    task = make_tiny_task(tmp_path, [*ESCAPES, *WAIT])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=6 / 3600), sandbox="none")
    pids: dict[str, int] = {}

    async def run() -> str:
        supervising = asyncio.create_task(supervise_run(str(run_dir)))
        found = asyncio.create_task(asyncio.to_thread(started_pids, run_dir / "workspace"))
        pids.update(await found)
        assert all(alive(p) for p in pids.values()), "the processes ran while the run did"
        return (await supervising).stop_reason

    assert asyncio.run(run()) == "time"
    record = read_record(run_dir)
    assert record is not None and record.method == mode
    assert_nothing_left(run_dir, pids)


HARNESS = (
    "import asyncio, sys; from labkube.operator.supervisor import supervise_run; "
    "asyncio.run(supervise_run(sys.argv[1]))"
)


def agent_of(harness: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tid in os.listdir(f"/proc/{harness}/task"):
            for child in Path(f"/proc/{harness}/task/{tid}/children").read_text().split():
                if b"agent" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
        time.sleep(0.1)
    raise AssertionError("the harness started no agent")


def test_kill_9_of_the_harness_leaves_nothing_once_the_run_resumes(tmp_path: Path, mode: str) -> None:
    task = make_tiny_task(tmp_path, [*ESCAPES, *UNTIL_GO])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=120 / 3600), sandbox="none")
    harness = subprocess.Popen([sys.executable, "-P", "-c", HARNESS, str(run_dir)], start_new_session=True)
    try:
        agent = agent_of(harness.pid)
        pids = started_pids(run_dir / "workspace")
        # Both die at once, as in an OOM kill or a lost node: no one is left to clean up.
        os.kill(agent, signal.SIGSTOP)
        os.killpg(harness.pid, signal.SIGKILL)
        os.kill(agent, signal.SIGKILL)
        harness.wait(timeout=10)
    finally:
        with_harness_gone(harness)
    escaped = {"setsid.pid", "double.pid", "job-escapee.pid"}
    deadline = time.monotonic() + 10
    while (survivors := {n for n, pid in pids.items() if alive(pid) and n != "job.pid"}) != escaped:
        assert time.monotonic() < deadline, f"{survivors} alive 10 s after the kill: what escaped the harness lives on"
        time.sleep(0.05)
    (run_dir / "workspace" / "go").touch()  # the resumed agent's plan ends
    result = asyncio.run(supervise_run(str(run_dir)))
    assert result.final and result.resumes == 1 and result.stop_reason == "done"
    assert_nothing_left(run_dir, pids)


def test_kill_9_of_the_harness_ends_a_sandboxed_runs_processes_at_once(tmp_path: Path) -> None:
    """In the run's sandbox what a command leaves behind ends with that command's pid namespace, and a background
    job (with what it forked away from itself) ends within a second of `kill -9` of the harness and the agent, with
    no resume to clean up after them (bubblewrap's --die-with-parent)."""
    task = make_tiny_task(tmp_path, [*ESCAPES, *UNTIL_GO])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=120 / 3600))
    workspace = run_dir / "workspace"
    harness = subprocess.Popen([sys.executable, "-P", "-c", HARNESS, str(run_dir)], start_new_session=True)
    try:
        agent = agent_of(harness.pid)
        started_pids(workspace)
        deadline = time.monotonic() + 10
        while len(running := in_workspace(workspace)) < 2:  # the job's shell and its escapee (and the wait step)
            assert time.monotonic() < deadline, f"the job never ran: {running}"
            time.sleep(0.05)
        os.kill(agent, signal.SIGSTOP)
        os.killpg(harness.pid, signal.SIGKILL)
        os.kill(agent, signal.SIGKILL)
        harness.wait(timeout=10)
    finally:
        with_harness_gone(harness)
    deadline = time.monotonic() + 2
    while left := in_workspace(workspace):
        assert time.monotonic() < deadline, f"{left} alive 2 s after the kill: the sandbox outlived its harness"
        time.sleep(0.05)


def with_harness_gone(harness: subprocess.Popen) -> None:
    if harness.poll() is None:
        os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(timeout=10)


def test_the_walk_of_children_lists_finds_what_a_scan_of_every_process_finds(tmp_path: Path) -> None:
    """The agent's end (under the sandbox) walks the kernel's children lists from itself; a scan of every process's
    parent finds the same tree: here a shell with a child, and a subshell with two children of its own."""
    from labkube.agent import containment

    if containment._descendants_from_children_lists(os.getpid()) is None:
        pytest.skip("this kernel keeps no children lists (CONFIG_PROC_CHILDREN)")
    tree = subprocess.Popen(["bash", "-c", "sleep 60 & (sleep 60 & sleep 60 & wait) & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(containment._descendants_from_children_lists(tree.pid) or ()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        walked = containment._descendants_from_children_lists(tree.pid)
        assert walked is not None and len(walked) == 4  # a sleep, the subshell, its two sleeps
        assert walked == containment._below(tree.pid, _parents_map())
        assert tree.pid in (containment._descendants_from_children_lists(os.getpid()) or set())
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()


def _parents_map() -> dict[int, list[int]]:
    from labkube.agent import containment

    children: dict[int, list[int]] = {}
    for pid in containment._pids():
        stat = containment._stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    return children


def test_a_token_search_since_a_start_skips_only_older_processes(tmp_path: Path) -> None:
    """`since` leaves out of the token search only what started before it: an agent on its own (no sandbox) searches
    from its own start, and what its run started carries the token and started later."""
    from labkube.agent import containment

    token = containment.new_token()
    env = {**os.environ, containment.TOKEN_VARIABLE: token}
    older = subprocess.Popen(["sleep", "60"], env=env)
    time.sleep(0.05)  # a clock tick (1/100 s) at least between the two starts
    newer = subprocess.Popen(["sleep", "60"], env=env)
    try:
        # Popen returns once exec has closed its close-on-exec pipe, which the kernel does before it lays out the
        # new program's environment: for a moment /proc/<pid>/environ reads empty (seen once on a loaded machine).
        deadline = time.monotonic() + 5
        while not Path(f"/proc/{newer.pid}/environ").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        newer_start = containment._stat(newer.pid)
        assert newer_start is not None
        assert containment.run_pids(token=token) == {older.pid, newer.pid}
        assert containment.run_pids(token=token, since=newer_start[2]) == {newer.pid}
        assert containment.kill_pids(token=token, since=newer_start[2]) == set()
        # Killed, and reaped by kill_pids itself (`reap_children`) where it died before that reap: Popen then reads
        # returncode 0 (the status is gone), never a `sleep 60` that ended on its own within the 5 s.
        assert newer.wait(timeout=5) in (-signal.SIGKILL, 0)
        assert older.poll() is None  # older than `since`: not this search's
    finally:
        for proc in (older, newer):
            proc.kill()
            proc.wait()


def test_boot_ticks_count_as_a_process_start_time_does() -> None:
    """The sandbox takes `boot_ticks()` before the agent starts and searches for the run's token only among processes
    started since: a process started after it has a start time after it, and about the clock's now."""
    from labkube.agent import containment

    before = containment.boot_ticks()
    proc = subprocess.Popen(["sleep", "5"])
    try:
        stat = containment._stat(proc.pid)
        assert stat is not None
        ticks = os.sysconf("SC_CLK_TCK")
        # Started after `before`, whichever way the two clocks round (seen 2 ticks apart), and not a second later.
        assert before <= stat[2] <= containment.boot_ticks() + 2 * ticks
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_joins_its_runs_cgroup_unless_the_sandbox_moved_it_there_first(tmp_path: Path) -> None:
    """`join_own_cgroup` moves the agent into the run's cgroup; when the sandbox was first (the pid is listed), it
    writes nothing (a move takes a hierarchy-wide lock). Here on a real cgroup where one can be made, and on a
    directory standing in for one, whose `cgroup.procs` shows whether it was written."""
    from labkube.agent import containment

    stand_in = tmp_path / "labkube-stand-in"
    stand_in.mkdir()
    listed = f"1\n{os.getpid()}\n"
    (stand_in / "cgroup.procs").write_text(listed)
    containment.join_own_cgroup(stand_in)
    assert (stand_in / "cgroup.procs").read_text() == listed  # already there: not written
    (stand_in / "cgroup.procs").write_text("1\n")
    containment.join_own_cgroup(stand_in)
    assert (stand_in / "cgroup.procs").read_text() == str(os.getpid())
    containment.join_own_cgroup(tmp_path / "gone")  # a cgroup already removed: nothing to join, no error

    record = run_cgroup_or_skip("join")
    joins = "import sys; from pathlib import Path; from labkube.agent.containment import join_own_cgroup as j; "
    joins += "j(Path(sys.argv[1])); j(Path(sys.argv[1])); print(open('/proc/self/cgroup').read())"
    try:
        out = subprocess.run([sys.executable, "-P", "-c", joins, record.cgroup], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        unified = next(line for line in out.stdout.splitlines() if line.startswith("0::"))
        assert unified.endswith("/" + Path(record.cgroup).name)
    finally:
        containment.kill_cgroup(Path(record.cgroup))


def test_a_token_search_from_a_mark_finds_what_started_since_and_reads_no_older_pid(tmp_path: Path) -> None:
    """The sandbox marks the process table before the agent starts (`mark_processes`); the search for the run's token
    at the end finds what started since, and does not read a pid handed out before the mark while no wrap of the pids
    can have happened since (the older process, holding the token, is left alone)."""
    from labkube.agent import containment

    token = containment.new_token()
    env = {**os.environ, containment.TOKEN_VARIABLE: token}
    older = subprocess.Popen(["sleep", "60"], env=env)
    time.sleep(0.05)
    mark = containment.mark_processes()
    newer = subprocess.Popen(["sleep", "60"], env=env)
    try:
        if mark.last_pid is None:
            pytest.skip("/proc here is not this process's pid namespace")
        first_new_pid = mark.first_new_pid()
        forks_since = containment._forks_since_boot() - mark.forks  # read after: never fewer than it read
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        # A machine whose pids are near pid_max (CI's 32768 is reached in one test session) may wrap before the
        # search: then the mark bounds no pid (the wrap case is its own test below) and the start time alone decides.
        bounded = first_new_pid is not None
        if bounded:
            assert first_new_pid == mark.last_pid + 1
            assert older.pid <= mark.last_pid < newer.pid
        else:
            assert mark.last_pid + forks_since + mark.tasks >= pid_max
        assert containment.run_pids(token=token, since=mark) == {newer.pid}
        if bounded:
            # A mark whose start time is before both: the older process is still not read (its pid is below the
            # mark's).
            assert containment.run_pids(token=token, since=replace(mark, ticks=0)) == {newer.pid}
        assert containment.kill_pids(token=token, since=mark) == set()
        # Killed, and reaped by kill_pids itself (`reap_children`) where it died before that reap: Popen then reads
        # returncode 0 (the status is gone), never a `sleep 60` that ended on its own within the 5 s.
        assert newer.wait(timeout=5) in (-signal.SIGKILL, 0)
        assert older.poll() is None
    finally:
        for proc in (older, newer):
            proc.kill()
            proc.wait()


def test_a_mark_bounds_no_pid_once_the_pids_may_have_wrapped() -> None:
    """Near pid_max, the forks since a mark may have wrapped the pids around to low numbers: no bound, the search
    reads every process (by start time, as without a mark)."""
    from labkube.agent import containment

    mark = containment.mark_processes()
    if mark.last_pid is None:
        pytest.skip("/proc here is not this process's pid namespace")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert replace(mark, last_pid=pid_max - mark.tasks).first_new_pid() is None
    assert replace(mark, forks=mark.forks - pid_max).first_new_pid() is None
    assert containment.ProcessMark(mark.ticks).first_new_pid() is None


def test_killing_a_runs_cgroup_removes_the_cgroups_its_processes_made_below_it(tmp_path: Path) -> None:
    """A run's process may make cgroups below the run's (a container runtime, systemd-run): `kill_cgroup` kills what
    runs in any of them and removes them all, the deepest first."""
    from labkube.agent import containment

    record = run_cgroup_or_skip("nest")
    run = Path(record.cgroup)
    inner = run / "inner" / "deeper"
    inner.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (inner / "cgroup.procs").write_text(str(sleeper.pid))
        assert containment.kill_cgroup(run) == set()
        assert not containment.alive(sleeper.pid)  # killed, and reaped by kill_cgroup (this process is its parent)
        assert not run.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for directory in (inner, inner.parent, run):
            with contextlib.suppress(OSError):
                directory.rmdir()


def test_a_grading_pods_pid_1_ends_every_other_process_of_its_container(tmp_path: Path) -> None:
    """A grading pod's `labkube agent --finalize` is PID 1 of its container. What the grader left (a double-forked
    process that cleared its environment, so no token finds it, still writing) is killed before the result is
    written for the last time; not PID 1, it kills nothing. A pid namespace of bwrap's (`--as-pid-1`) is the
    container here."""
    from labkube.agent import containment
    from labkube.sandbox import find_bwrap

    bwrap = find_bwrap()
    if bwrap is None:
        pytest.skip("no bwrap here")
    assert containment.end_the_rest_of_the_container() is None  # this test's process is no container's PID 1
    beat = tmp_path / "beat"
    script = f"""
import os, sys, time
sys.path[:0] = {sys.path!r}
from labkube.agent import containment
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.environ.clear()
        while True:
            open({str(beat)!r}, "a").write("x")
            time.sleep(0.01)
    os._exit(0)
time.sleep(0.3)
assert os.getpid() == 1
others = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
left = containment.end_the_rest_of_the_container()
now = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
print(len(others), left, now)
"""
    argv = [bwrap, "--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--proc", "/proc"]
    ran = subprocess.run([*argv, sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    if ran.returncode != 0 and "Operation not permitted" in ran.stderr:
        pytest.skip(f"no pid namespace here: {ran.stderr.strip()}")
    assert ran.returncode == 0, ran.stderr
    before, left, after = ran.stdout.split()
    assert int(before) >= 1 and (left, after) == ("set()", "[]")  # the daemon (and its parent's zombie) are gone
    size = beat.stat().st_size
    time.sleep(0.2)
    assert beat.stat().st_size == size  # nothing writes any more
