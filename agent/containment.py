"""A run's processes end with the run.

A command the agent runs may leave processes behind that no process group reaches: `setsid nohup train.py &`,
a double fork, a daemon an async job starts. Left alone they outlive the run, and the next run that gets the
same GPU finds its memory and compute taken. Three mechanisms, from the strongest:

- **A cgroup v2 per run** (what container runtimes use), where the machine allows it: the local sandbox creates
  `<its own cgroup>/labkube-<token>`, moves the agent into it before the agent starts anything, and at every end
  of the agent (done, budget, kill, crash) kills the cgroup as a whole (`cgroup.kill`, atomic against forks)
  and removes it. The cgroup outlives a harness killed with SIGKILL; the next start of the run (a resume) kills
  it. Memory and CPU come from the task card the way a pod's do (`memory.max` from `memory_gb`, `cpu.weight`
  from `cpus` as kubelet maps a CPU request), where the hierarchy has those controllers; `containment.json`
  says when it does not.
- **The agent as child subreaper** (`prctl(PR_SET_CHILD_SUBREAPER)`): an orphaned descendant of the agent is
  re-parented to the agent instead of init, so "every descendant of the agent" is every process of the run
  while the agent lives, whatever sessions they made. The agent kills them when it ends, and the local sandbox
  kills the agent's whole tree when it has to kill the agent itself.
- **A token in the environment** (`LABKUBE_RUN_TOKEN`): every process of the run inherits it, and a scan of
  `/proc/*/environ` finds them after the agent and the supervisor are both gone (SIGKILL of the harness); the
  token is kept in `<run>/containment.json` so the next start of the run finds them. It is what works where no
  cgroup can be made; it misses a process that cleared its environment (`env -i`) *and* outlived a killed agent,
  which the cgroup does not.

Every end of a run uses all that applies: the cgroup when there is one, then the token scan. Kubernetes pods
get the same from the container runtime; in a pod this module only adds the subreaper and the token scan.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from labkube.settings import CONTAINMENT, SettingError
from labkube.store import read_model, write_model

TOKEN_VARIABLE = "LABKUBE_RUN_TOKEN"
MODE_VARIABLE = CONTAINMENT.name  # auto (default), cgroup (required), processes (no cgroup)
RECORD_NAME = "containment.json"
PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT_S = 10.0


class ContainmentError(RuntimeError):
    pass


class Containment(BaseModel):
    """How a run's processes are found and ended (`<run>/containment.json`): kept so that a resume after the
    harness itself was killed finds what the previous start left."""

    token: str = Field(description=f"The value of {TOKEN_VARIABLE} every process of the run inherits.")
    method: Literal["cgroup", "processes"] = "processes"
    cgroup: str | None = Field(default=None, description="The run's cgroup v2 directory, while it has one.")
    memory_max_bytes: int | None = Field(default=None, description="memory.max of the run's cgroup, when applied.")
    cpu_weight: int | None = Field(default=None, description="cpu.weight of the run's cgroup, when applied.")
    note: str = Field(default="", description="Why there is no cgroup, or no limits on it.")


def record_path(run_dir: Path) -> Path:
    return Path(run_dir) / RECORD_NAME


def read_record(run_dir: Path) -> Containment | None:
    return read_model(record_path(run_dir), Containment)


def new_token() -> str:
    return secrets.token_hex(12)


# -- finding a run's processes ----------------------------------------------------------------------


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _proc_file(pid: int, name: str) -> bytes | None:
    """`/proc/<pid>/<name>`; None when the process is gone or not ours to read."""
    return _read_file(f"/proc/{pid}/{name}")


def _read_file(path: str) -> bytes | None:
    """Plain `open`, not pathlib: a scan reads two files of every process on the machine at every end of a run."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def tagged_pids(token: str) -> set[int]:
    """Processes whose environment holds the run's token (all of them, whoever their parent is now)."""
    return run_pids(token=token)


def run_pids(*, token: str | None = None, root: int | None = None, since: int | ProcessMark | None = None) -> set[int]:
    """The processes of a run, in one pass over /proc: those whose environment holds `token` and those below
    `root` in the process tree (`root` excluded). With `since` (a start time in clock ticks after boot, as
    /proc/<pid>/stat gives it, or a `ProcessMark`), a process that started earlier is not looked at for the token: it
    cannot hold one minted after it started. Reading a process's environment is the costly read of a scan; with a
    mark, a pid handed out before it is not even read (`ProcessMark.first_new_pid`)."""
    needle = f"{TOKEN_VARIABLE}={token}".encode() if token else None
    if needle is None and root is not None:
        below = _descendants_from_children_lists(root)
        if below is not None:
            return below
    first_new = since.first_new_pid() if isinstance(since, ProcessMark) and root is None else None
    since_ticks = since.ticks if isinstance(since, ProcessMark) else since
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for pid in _pids():
        if first_new is not None and pid < first_new:
            continue
        stat = _stat(pid) if root is not None or since_ticks is not None else None
        if stat is not None and root is not None:
            children.setdefault(stat[1], []).append(pid)
        if needle is not None and (since_ticks is None or (stat is not None and stat[2] >= since_ticks)):
            environ = _proc_file(pid, "environ")
            if environ is not None and needle in environ.split(b"\0"):
                found.add(pid)
    return found | (_below(root, children) if root is not None else set())


def _descendants_from_children_lists(root: int) -> set[int] | None:
    """Every process below `root`, from the kernel's lists of each thread's children (/proc/<pid>/task/<tid>/
    children): a walk over the run's own processes instead of a read of every process on the machine. None where
    the kernel keeps no such list (CONFIG_PROC_CHILDREN). A process forked during the walk may be missed: a caller
    that kills what it finds walks again until nothing is left."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone: its children, if any, went to the subreaper, whose list is read again next walk
            continue
        for tid in threads:
            listed = _read_file(f"/proc/{pid}/task/{tid}/children")
            for child in map(int, (listed or b"").split()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def boot_ticks() -> int:
    """A second ago, as a process's start time is counted (/proc/<pid>/stat: clock ticks since boot, as /proc/uptime
    counts seconds): every process started from now on started after it. The two clocks are not read the same way
    (seen 2 ticks apart on a VM), so the second is the margin; what started in it is searched too."""
    ticks = os.sysconf("SC_CLK_TCK")
    return int(float(Path("/proc/uptime").read_text().split()[0]) * ticks) - ticks


@dataclass(frozen=True)
class ProcessMark:
    """A moment in the process table, to find what started after it: the clock tick (`boot_ticks`) and, where /proc
    is this process's pid namespace, the last pid handed out, the forks since boot and the tasks alive then."""

    ticks: int
    last_pid: int | None = None
    forks: int = 0
    tasks: int = 0

    def first_new_pid(self) -> int | None:
        """The lowest pid a process started since the mark can have; None when that cannot be bounded. Pids are handed
        out upward from the last one and wrap at pid_max to low numbers again. The allocator can pass pid_max only
        after `pid_max - last_pid - tasks` forks at least (it skips the pids of tasks alive then, and each fork moves it
        on one): while fewer forks have happened since (/proc/stat counts every fork, threads and other namespaces
        included), every new pid is above the mark's last. A process that sets its own pid (clone3's set_tid, which
        needs CAP_CHECKPOINT_RESTORE) is missed, as is one that cleared its environment."""
        if self.last_pid is None:
            return None
        forks, pid_max = _forks_since_boot(), _read_int("/proc/sys/kernel/pid_max")
        if forks is None or pid_max is None or self.last_pid + (forks - self.forks) + self.tasks >= pid_max:
            return None
        return self.last_pid + 1


def mark_processes() -> ProcessMark:
    """Now, as `ProcessMark`: every process started after this call started after the mark."""
    forks = _forks_since_boot()  # before the last pid: a fork between the two reads is counted among those since
    loadavg = (_read_file("/proc/loadavg") or b"").split()  # "1.0 0.8 0.6 RUNNING/TASKS LAST_PID"
    ticks = boot_ticks()
    own_namespace = os.path.realpath("/proc/self") == f"/proc/{os.getpid()}"
    if forks is None or len(loadavg) < 5 or not own_namespace:
        return ProcessMark(ticks)
    return ProcessMark(ticks, int(loadavg[4]), forks, int(loadavg[3].split(b"/")[1]))


def _forks_since_boot() -> int | None:
    for line in (_read_file("/proc/stat") or b"").splitlines():
        if line.startswith(b"processes "):
            return int(line.split()[1])
    return None


def _read_int(path: str) -> int | None:
    raw = _read_file(path)
    return int(raw) if raw and raw.strip().isdigit() else None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks after boot) of a process; None when it is gone."""
    raw = _proc_file(pid, "stat")
    if raw is None:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[1]), int(fields[19])


def descendants(root: int) -> set[int]:
    """Every process below `root` in the process tree (with the agent as subreaper: every process it started)."""
    return run_pids(root=root)


def _below(root: int, children: dict[int, list[int]]) -> set[int]:
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def alive(pid: int) -> bool:
    """A zombie holds no memory, GPU or files: it counts as gone."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def kill_pids(
    *,
    token: str | None = None,
    root: int | None = None,
    since: int | ProcessMark | None = None,
    exclude: Iterable[int] = (),
    wait_s: float = KILL_WAIT_S,
) -> set[int]:
    """SIGKILL the processes of a run (those tagged with `token`, those below `root`, `root` excluded; `since` as
    for `run_pids`) until none is left; returns the pids still alive after `wait_s` (a process stuck in
    uninterruptible sleep)."""
    skip = {os.getpid(), *exclude}
    deadline = time.monotonic() + wait_s
    while True:
        pids = {p for p in run_pids(token=token, root=root, since=since) - skip if alive(p)}
        if not pids:
            return set()
        if time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap_children()
        time.sleep(0.02)


def reap_children() -> None:
    """Reap exited children that nobody waits for (orphans re-parented to this subreaper). Only at the end of the
    run: during it, `waitpid(-1)` would take the exit status of a command asyncio or a job is waiting on."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become_subreaper() -> bool:
    """Orphaned descendants of this process come back to it instead of init (Linux >= 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# -- the run's cgroup ------------------------------------------------------------------------------


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
    hybrid one (v1 controllers beside an empty v2 tree)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(before.split()[4])
    return None


def own_cgroup() -> str | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


def kubelet_cpu_weight(cpus: float) -> int:
    """cgroup v2 cpu.weight for a CPU request, as kubelet computes it (shares = millicores x 1024 / 1000)."""
    shares = max(2, round(cpus * 1024))
    return max(1, min(10_000, 1 + ((shares - 2) * 9999) // 262142))


def make_run_cgroup(token: str, memory_gb: float | None, cpus: float | None) -> Containment:
    """The run's cgroup below this process's own, with the card's limits where the controllers are there; a
    record with method `processes` and the reason when no usable cgroup can be made here."""
    record = Containment(token=token)
    try:
        mode = CONTAINMENT.read()
    except SettingError as exc:
        raise ContainmentError(str(exc)) from None
    if mode == "processes":
        return record.model_copy(update={"note": f"{MODE_VARIABLE}=processes"})
    mount, own = cgroup2_mount(), own_cgroup()
    why = ""
    if mount is None or own is None:
        why = "no cgroup v2 hierarchy is mounted"
    else:
        parent = mount / own.lstrip("/")
        path = parent / f"labkube-{token}"
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            why = f"cannot create a cgroup under {parent} ({exc.strerror})"
        else:
            if not (path / "cgroup.kill").exists() or not os.access(path / "cgroup.procs", os.W_OK):
                with contextlib.suppress(OSError):
                    path.rmdir()
                why = "the kernel has no cgroup.kill (Linux < 5.14) or the cgroup is not writable"
            else:
                record = record.model_copy(update={"method": "cgroup", "cgroup": str(path)})
                return apply_limits(record, parent, memory_gb, cpus)
    if mode == "cgroup":
        raise ContainmentError(f"{MODE_VARIABLE}=cgroup, but {why}; unset it to fall back to process tracking")
    return record.model_copy(update={"note": why})


def apply_limits(record: Containment, parent: Path, memory_gb: float | None, cpus: float | None) -> Containment:
    assert record.cgroup is not None
    path = Path(record.cgroup)
    available = set((parent / "cgroup.controllers").read_text().split())
    wanted = {"memory", "cpu"} & available
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    for controller in wanted - enabled:
        # Fails (EBUSY) where the parent holds processes itself and is not the root: cgroup v2's
        # "no internal processes" rule. The run is still contained, only not limited.
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
    update: dict[str, object] = {}
    notes = []
    if memory_gb and (path / "memory.max").exists():
        update["memory_max_bytes"] = round(memory_gb * 2**30)
        (path / "memory.max").write_text(str(update["memory_max_bytes"]))
    elif memory_gb:
        notes.append("memory")
    if cpus and (path / "cpu.weight").exists():
        update["cpu_weight"] = kubelet_cpu_weight(cpus)
        (path / "cpu.weight").write_text(str(update["cpu_weight"]))
    elif cpus:
        notes.append("cpu")
    if notes:
        update["note"] = (
            f"no {' or '.join(notes)} limit: the cgroup v2 hierarchy at {parent} does not offer "
            f"{' and '.join(notes)} to its children (controllers: {' '.join(sorted(available)) or 'none'})"
        )
    return record.model_copy(update=update)


def cgroup_pids(path: Path) -> set[int]:
    pids: set[int] = set()
    for directory, _dirs, files in os.walk(path):  # the run's cgroup and any its processes made below it
        if "cgroup.procs" in files:
            raw = _read_file(os.path.join(directory, "cgroup.procs"))
            with contextlib.suppress(ValueError):
                pids |= {int(line) for line in (raw or b"").split()}
    return pids


def kill_cgroup(path: Path, wait_s: float = KILL_WAIT_S) -> set[int]:
    """Kill every process of the cgroup (and its children) at once, wait until they are gone, remove it.
    Returns what was still there after `wait_s`."""
    if not path.is_dir():
        return set()
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + wait_s
    left = {p for p in cgroup_pids(path) if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        reap_children()
        left = {p for p in cgroup_pids(path) if alive(p)}
    # Deepest first, the run's own last (a cgroup with children cannot go); walked as `cgroup_pids` does, not globbed:
    # a glob stats each of a cgroup's dozens of interface files (half a millisecond of every run's end).
    for directory, _dirs, _files in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    return left


def join_cgroup(record: Containment, pid: int) -> Containment:
    """Move `pid` (the agent, before it has started anything) into the run's cgroup; on failure, fall back."""
    if record.cgroup is None:
        return record
    try:
        (Path(record.cgroup) / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        kill_cgroup(Path(record.cgroup))
        if CONTAINMENT.read() == "cgroup":
            raise ContainmentError(f"cannot move the agent into {record.cgroup}: {exc.strerror}") from None
        return record.model_copy(
            update={"method": "processes", "cgroup": None, "note": f"cannot join the cgroup ({exc.strerror})"}
        )
    return record


# -- a run's start and end -------------------------------------------------------------------------


def end_leftovers(run_dir: Path, exclude: Iterable[int] = ()) -> set[int]:
    """What a previous start of this run left alive (its harness was killed with SIGKILL): its cgroup and every
    process carrying its token are killed. Returns pids that would not die."""
    previous = read_record(run_dir)
    if previous is None:
        return set()
    left = kill_cgroup(Path(previous.cgroup)) if previous.cgroup else set()
    return left | kill_pids(token=previous.token, exclude=exclude)


def open_containment(run_dir: Path, memory_gb: float | None = None, cpus: float | None = None) -> Containment:
    """For the local sandbox, before the agent starts: end the run's leftovers, then make (and record) its cgroup
    under the same token, so that a process an earlier start left and nobody found is still found by it."""
    end_leftovers(run_dir)
    previous = read_record(run_dir)
    record = make_run_cgroup(previous.token if previous else new_token(), memory_gb, cpus)
    write_model(record_path(run_dir), record)
    return record


def close_containment(run_dir: Path, record: Containment, since: int | ProcessMark | None = None) -> set[int]:
    """After the agent has exited: every process of the run is killed and gone before this returns. With `since`
    (`mark_processes()` or `boot_ticks()` before the agent started), only processes started since are searched for
    the run's token."""
    left = kill_cgroup(Path(record.cgroup)) if record.cgroup else set()
    left |= kill_pids(token=record.token, since=since)
    write_model(record_path(run_dir), record.model_copy(update={"cgroup": None}))
    return left


_token_from_sandbox = False  # whether this agent was given its run's token (set by `adopt_run_processes`)


def adopt_run_processes(run_dir: Path) -> str:
    """For the agent, before it starts anything: take the run's token (the sandbox's, or a new one when the agent
    runs on its own), end what an earlier start left, and become the subreaper of everything it starts.
    Returns the token, also set in this process's environment for every child."""
    global _token_from_sandbox
    token = os.environ.get(TOKEN_VARIABLE)
    _token_from_sandbox = token is not None
    record = read_record(run_dir)
    if token is None:
        end_leftovers(run_dir)
        token = record.token if record else new_token()
        if record is None:
            write_model(record_path(run_dir), Containment(token=token, note="the agent ran without a sandbox"))
        os.environ[TOKEN_VARIABLE] = token
    elif record is not None and record.cgroup:
        # Started by the sandbox, which ended the run's leftovers and moves this process into the run's cgroup right
        # after starting it; joining here too closes the gap between the two.
        join_own_cgroup(Path(record.cgroup))
    become_subreaper()
    return token


def join_own_cgroup(cgroup: Path) -> None:
    """Move this process into `cgroup` unless it is there already (the sandbox is usually first): a move takes a
    lock of the whole cgroup hierarchy, whose release waits for an RCU grace period (0.5 ms and more of a forked
    agent's start, for a move that changes nothing). A cgroup that is gone is left alone."""
    procs = _read_file(str(cgroup / "cgroup.procs"))
    if procs is None or str(os.getpid()).encode() in procs.split():
        return
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def end_run_processes() -> set[int]:
    """For the agent, as it exits: every process it started, wherever it went, is killed. Under the local sandbox
    (which gave it the run's token) those are the processes below it, the subreaper: the sandbox then ends the
    run's cgroup and searches the machine for the token itself. On its own, the agent searches for the token too;
    what carries it started after this process (an earlier start's leftovers were ended before it started), so
    older processes are not searched."""
    if _token_from_sandbox:
        return kill_pids(root=os.getpid())
    me = _stat(os.getpid())
    return kill_pids(token=os.environ.get(TOKEN_VARIABLE), root=os.getpid(), since=me[2] if me is not None else None)


def end_the_rest_of_the_container(wait_s: float = KILL_WAIT_S) -> set[int] | None:
    """As PID 1 of a container (a grading pod's `labkube agent --finalize`): SIGKILL every other process of its pid
    namespace, reaping them, until none is left; what is still alive after `wait_s` (stuck in uninterruptible sleep)
    is returned. None, having killed nothing, where this process is not PID 1: its /proc then shows processes that are
    not its container's (a test's kubelet runs pods as host processes), and `end_run_processes` is what ends a run's.

    A grading pod runs the task's grader, which may run the agent's code: a process it left (double-forked, its
    environment cleared, so no token finds it) could rewrite the result after labkube wrote it, or the container's
    termination message itself. With every other process gone, nothing but labkube writes either from then on."""
    if os.getpid() != 1:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        others = {p for p in _pids() if p != 1 and alive(p)}
        reap_children()
        if not others:
            return set()
        if time.monotonic() > deadline:
            return others
        for pid in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
