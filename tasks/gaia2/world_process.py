"""Start, stop and reuse world processes.

A world process is `world_server.py` run by the ARE virtualenv's python, in a process group of its
own. Stopping it kills the whole group at once: ARE can hang at exit (after `scenario_mcp_demo`,
`are-run` hung for minutes closing its MCP session), so nothing here waits for it to exit by itself.
Starting one costs a few seconds (importing ARE); loading a scenario into a warm one costs
milliseconds, hence `WorldPool`.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel

from labkube.cpu_share import set_autogroup_nice
from labkube.tasks.gaia2.verdict_message import CONTROL_ENV
from labkube.tasks.gaia2.world_client import WorldClient
from labkube.tasks.gaia2.world_env import world_python

SERVER_SCRIPT = Path(__file__).with_name("world_server.py")
WARMING_ENV = "LABKUBE_WORLD_WARMING"  # read by world_cpu_share.py, in the world's own virtualenv
STARTUP_TIMEOUT = 60.0


class WorldStartError(RuntimeError):
    """The world process did not come up (its log says why)."""


class WorldHandoff(BaseModel):
    """A listening world that one process of this machine started and another adopts into its pool: `labkube
    run` starts its campaign's first worlds while Ray starts, and hands them to the supervisor actor."""

    pid: int
    started_ticks: int  # /proc/<pid>/stat's start time: with the pid, it names one process (pids are reused)
    host: str
    port: int
    log_path: str
    control_token: str | None = None  # the key to its controller's endpoints (world_server.py CONTROL_ROUTES)

    @classmethod
    def of(cls, pid: int, host: str, port: int, log_path: Path, control_token: str | None = None) -> WorldHandoff:
        """The handoff of a live process (its start time read now; -1, which no process has, when it is gone)."""
        stat = _proc_stat(pid)
        ticks = stat[1] if stat else -1
        return cls(
            pid=pid, started_ticks=ticks, host=host, port=port, log_path=str(log_path), control_token=control_token
        )


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, from /proc; None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
    return fields[0], int(fields[19])


class WorldProcess:
    """A running world server. `stop()` is idempotent and never waits on the process itself."""

    def __init__(
        self, proc: subprocess.Popen[bytes], host: str, port: int, log_path: Path, temp_dir: Path | None = None
    ) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self.temp_dir = temp_dir  # its TMPDIR, removed by stop(): the world's alone, none of its copies'
        self.control_token: str | None = None  # announced on its LISTENING line

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def client(self, **kwargs: object) -> WorldClient:
        """An async client bound to this process (a dead process surfaces as `WorldDied`), holding its control token."""
        kwargs.setdefault("control_token", self.control_token)
        return WorldClient(self.base_url, is_alive=self.alive, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Kill the process group (the server and anything ARE started in it)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        # SIGKILL cannot be ignored, so reaping is immediate; the timeout only guards odd kernels.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def handoff(self) -> WorldHandoff:
        """What another process needs to adopt this world (its parent, this process, still reaps it)."""
        return WorldHandoff.of(self.pid, self.host, self.port, self.log_path, self.control_token)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"WorldProcess(pid={self.pid}, url={self.base_url}, alive={self.alive()})"


class AdoptedWorld(WorldProcess):
    """A world another process started (`WorldHandoff`): not this process's child, so it is watched through /proc
    (a zombie or a reused pid is not alive) and stopped by killing its process group; its parent reaps it."""

    def __init__(self, handoff: WorldHandoff) -> None:
        self.handed = handoff
        self.host, self.port, self.log_path = handoff.host, handoff.port, Path(handoff.log_path)
        self.control_token = handoff.control_token

    @property
    def pid(self) -> int:
        return self.handed.pid

    def alive(self) -> bool:
        stat = _proc_stat(self.handed.pid)
        return stat is not None and stat[0] not in ("Z", "X") and stat[1] == self.handed.started_ticks

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.handed.pid, signal.SIGKILL)


def _read_listening(
    proc: subprocess.Popen[bytes], copies: int, timeout: float
) -> dict[int, tuple[int, int, str | None]]:
    """The worlds' LISTENING lines: {copy: (port, pid, control token)}, until all `copies` answered or `timeout` s
    passed."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer, listening = b"", {}
    while time.monotonic() < deadline and len(listening) < copies:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break  # stdout closed: every copy is exiting
            buffer += chunk
            for line in buffer.decode(errors="replace").splitlines():
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "LISTENING":
                    token = fields.pop()[len("control=") :] if fields[-1].startswith("control=") else None
                    copy = int(fields[3]) if len(fields) == 4 else 0
                    listening[copy] = (int(fields[1]), int(fields[2]) if len(fields) == 4 else proc.pid, token)
        elif proc.poll() is not None and 0 not in listening:
            break
    return listening


def world_command(
    python: Path, host: str, port: int, log_level: str, copy_logs: list[Path] | tuple[()] = ()
) -> list[str]:
    """The world process's argv: the server script, by path, with the ARE environment's python; one more world,
    forked once ARE is imported, per path in `copy_logs` (their logs)."""
    copies = [arg for log in copy_logs for arg in ("--copy-log", str(log))]
    return [str(python), str(SERVER_SCRIPT), "--host", host, "--port", str(port), "--log-level", log_level, *copies]


def _temporary_log() -> Path:
    fd, name = tempfile.mkstemp(prefix="labkube-world-", suffix=".log")
    os.close(fd)
    return Path(name)


def start_worlds(
    python: Path | None = None,
    count: int = 1,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = STARTUP_TIMEOUT,
    log_paths: list[Path] | None = None,
    log_level: str = "WARNING",
    key_variables: Iterable[str] = (),
    warming: bool = False,
    on_spawn: Callable[[int], None] | None = None,
    temp_dir: Path | None = None,
) -> list[WorldProcess]:
    """Start `count` worlds from one import of ARE (a process, and `count - 1` copies it forks once ARE is
    imported: importing ARE is most of a world's start, seconds of CPU each), each on a port, in a process group and
    with a log of its own; wait (at most `startup_timeout` s) for them to listen. The first is this process's child
    (`WorldProcess`); the copies are the first's (`AdoptedWorld`: stopping the first does not stop them). Returns
    the ones that listen; raises WorldStartError when none does. The worlds start without this process's API keys:
    its `*_API_KEY` variables and the `key_variables` a campaign names for its models (`api_key_env`). `warming`:
    started ahead of anything that waits for them, the first takes a smaller share of the CPU until its first request
    or `set_autogroup_nice(0, pid)` (labkube/cpu_share.py); `on_spawn` gets its pid as soon as it exists.

    The worlds' temporary files (ARE makes a sandbox directory when it is imported, and more per scenario, and never
    removes them) go in `temp_dir`, which the caller removes once they are all stopped (`WorldPool.close`); without
    one, a single world gets a directory of its own, which its `stop()` removes."""
    python = python or world_python()
    logs = list(log_paths) if log_paths else [_temporary_log() for _ in range(count)]
    cmd = world_command(python, host, port, log_level, logs[1:count])
    # A world needs no key (an LLM spec carries its own, in the request); an agent's shell of the same user could
    # read one from the world's /proc/<pid>/environ.
    keys = frozenset(key_variables)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in keys and k != WARMING_ENV}
    env[CONTROL_ENV] = "1"  # the scenario, the clock and the judge answer only the holder of its token
    if warming:
        env[WARMING_ENV] = "1"
    owned = None
    if temp_dir is None:
        if count > 1:
            raise ValueError("worlds forked from one import of ARE share a temporary directory: pass temp_dir")
        temp_dir = owned = Path(tempfile.mkdtemp(prefix="labkube-world-"))
    env["TMPDIR"] = str(temp_dir)
    with logs[0].open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # its own process group, so stop() can kill everything it started
            cwd=tempfile.gettempdir(),
        )
    if on_spawn is not None:
        on_spawn(proc.pid)
    first = WorldProcess(proc, host, 0, logs[0], temp_dir=owned)
    listening = _read_listening(proc, count, startup_timeout)
    copies: list[WorldProcess] = []
    for copy, (port, pid, token) in sorted(listening.items()):
        if copy == 0:
            first.port, first.control_token = port, token
            continue
        copies.append(AdoptedWorld(WorldHandoff.of(pid, host, port, logs[copy], token)))
    if 0 not in listening:
        for world in (*copies, first):
            world.stop()
        tail = first.log_tail(5).replace("\n", " | ")
        raise WorldStartError(
            f"the world process ({python} {SERVER_SCRIPT.name}) did not start listening within "
            f"{startup_timeout:.0f} s; log {logs[0]}: {tail or 'empty'}"
        )
    return [first, *copies]


def start_world(
    python: Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = STARTUP_TIMEOUT,
    log_path: Path | None = None,
    log_level: str = "WARNING",
) -> WorldProcess:
    """Start a world process and wait (at most `startup_timeout` s) for it to listen."""
    logs = [log_path] if log_path is not None else None
    return start_worlds(
        python, 1, host=host, port=port, startup_timeout=startup_timeout, log_paths=logs, log_level=log_level
    )[0]


class WorldPool:
    """Warm world processes to reuse across runs (importing ARE is the slow part).

    `acquire()` hands out an idle live process or starts one; `release()` takes it back, or stops it when the run
    that used it went wrong (`healthy=False`: the world errored, its scenario failed to load, the run's agent was
    killed) or the pool already keeps `max_idle`. A world keeps nothing of a run: the next `POST /scenario` unloads
    the previous scenario and builds the next from its source. `prestart(n)` starts worlds ahead of the first run,
    from one import of ARE (forked copies); `adopt()` takes worlds another process started. With `log_dir`, world
    i logs to `log_dir/<log_prefix>-<i>.log`. `close()` stops them all.
    """

    def __init__(
        self,
        python: Path | None = None,
        *,
        max_idle: int = 2,
        log_dir: Path | None = None,
        log_prefix: str = "world",
        **start_kwargs: object,
    ) -> None:
        self._python = python
        self._max_idle = max_idle
        self._log_dir = log_dir
        self._log_prefix = log_prefix
        self._start_kwargs = start_kwargs
        self._idle: list[WorldProcess] = []
        self._busy: set[WorldProcess] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._started = 0
        self._warming: set[int] = set()  # pids of worlds started warming, until end_warming()
        self._temp_dir: Path | None = None  # the TMPDIR of the worlds it starts, removed by close()

    @property
    def started(self) -> int:
        """How many world processes this pool has started (a reused world is not counted again)."""
        return self._started

    def _start(self, count: int = 1, warming: bool = False) -> list[WorldProcess]:
        """`count` worlds from one import of ARE (`start_worlds`), numbered on from the pool's last; `warming` when
        no run waits for them yet."""
        with self._lock:
            first = self._started + 1
            self._started += count
            if self._temp_dir is None:
                self._temp_dir = Path(tempfile.mkdtemp(prefix="labkube-worlds-"))
        kwargs = dict(self._start_kwargs)
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            kwargs["log_paths"] = [self._log_dir / f"{self._log_prefix}-{n}.log" for n in range(first, first + count)]
        spawned = self._warming.add if warming else None
        kwargs.update(warming=warming, on_spawn=spawned, temp_dir=self._temp_dir)
        return start_worlds(self._python, count, **kwargs)  # type: ignore[arg-type]

    def prestart(self, count: int, warming: bool = False) -> None:
        """Start worlds until `count` are idle (at most `max_idle`), from one import of ARE; worlds that fail to
        start are left to the first `acquire()`, which raises their error. `warming`: nothing waits for them until
        `end_warming()` (labkube/cpu_share.py)."""
        with self._lock:
            missing = min(count, self._max_idle) - len(self._idle) - len(self._busy)
        if missing <= 0:
            return
        with contextlib.suppress(WorldStartError):
            for world in self._start(missing, warming=warming):
                self.release(world)

    def end_warming(self) -> None:
        """The full share of the CPU back to the worlds started warming: what waits for them is up. One ask each: one
        the kernel refuses (EAGAIN, labkube/cpu_share.py) takes it back at its first request."""
        with self._lock:
            pids, self._warming = self._warming, set()
        for pid in pids:
            set_autogroup_nice(0, pid)

    def adopt(self, handoffs: list[WorldHandoff]) -> int:
        """Take idle worlds another process started, up to `max_idle` (an idle world that died makes room); one
        left over is stopped, since nothing would use it, and one gone already is skipped. Returns how many were
        taken."""
        taken = 0
        for handoff in handoffs:
            world = AdoptedWorld(handoff)
            with self._lock:
                dead = [w for w in self._idle if not w.alive()]  # a world that died idle holds no place
                self._idle = [w for w in self._idle if w not in dead]
                room = not self._closed and len(self._idle) + len(self._busy) < self._max_idle
                taken_now = room and world.alive()
                if taken_now:
                    self._idle.append(world)
                    taken += 1
            for gone in dead:
                gone.stop()
            if not taken_now:
                world.stop()
        return taken

    def idle(self) -> list[WorldProcess]:
        with self._lock:
            return list(self._idle)

    def acquire_idle(self) -> WorldProcess | None:
        """An idle live world, or None (without starting one, so without blocking: a caller on an event loop
        starts one in a thread only when this gives none)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the world pool is closed")
            while self._idle:
                world = self._idle.pop()
                if world.alive():
                    self._busy.add(world)
                    return world
                world.stop()
        return None

    def acquire(self) -> WorldProcess:
        world = self.acquire_idle()
        if world is not None:
            return world
        (world,) = self._start()
        with self._lock:
            if self._closed:
                world.stop()
                raise RuntimeError("the world pool is closed")
            self._busy.add(world)
        return world

    def release(self, world: WorldProcess, healthy: bool = True) -> None:
        with self._lock:
            self._busy.discard(world)
            keep = healthy and world.alive() and not self._closed and len(self._idle) < self._max_idle
            if keep:
                self._idle.append(world)
        if not keep:
            world.stop()

    @contextlib.contextmanager
    def world(self) -> Iterator[WorldProcess]:
        """`with pool.world() as w:` — a process whose state is unknown after an error is not reused."""
        world = self.acquire()
        healthy = False
        try:
            yield world
            healthy = True
        finally:
            self.release(world, healthy)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            worlds = [*self._idle, *self._busy]
            self._idle, self._busy = [], set()
            temp_dir, self._temp_dir = self._temp_dir, None
        for world in worlds:
            world.stop()
        if temp_dir is not None:  # every world started with it is stopped
            shutil.rmtree(temp_dir, ignore_errors=True)

    def __enter__(self) -> WorldPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
