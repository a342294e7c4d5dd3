"""A warm agent process per supervisor worker: scripted runs start by `fork()`, not by a fresh interpreter.

`labkube agent` costs a second or more before it does anything (the interpreter, then labkube's imports); a
scripted run (oracle, noop, replay, cheat) or a GAIA question with a scripted answer is over in a fraction of that.
The zygote is a process that has imported the agent once and forks one child per run. The child is what
`labkube agent --run-dir DIR` would have been: its own process and session (a crash ends that run alone, the
supervisor signals its group as before), its own environment (the run's, as the local sandbox builds it), the API
keys on stdin, stdout and stderr to the run's logs. The zygote itself holds no key and runs nothing of a run.

The child calls the agent room's `agent_process` (agent/harness/sandbox_process.py), the function the command line's
`labkube agent` calls, with the options the supervisor would have passed on that command line.

Protocol (JSON lines): the supervisor writes `{"id", "run_dir", "resume", "finalize_reason", "env", "secrets",
"stdout", "stderr"}` on the zygote's stdin; the zygote answers `{"id", "pid"}` once the child exists (or `{"id",
"error"}`), then `{"pid", "exit"}` when it has exited (its exit code, negative for a signal). When the supervisor
goes away (the zygote's stdin closes) the zygote exits; its children, orphaned, checkpoint and exit by themselves as
an orphaned `labkube agent` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from labkube.hardening import not_dumpable
from labkube.operator.agent_keys import split_secrets

ZYGOTE_MODULE = "labkube.operator.agent_zygote"
WARMING_ENV = "LABKUBE_ZYGOTE_WARMING"  # started ahead of the first run, in a session of its own (labkube/cpu_share.py)
# What a scripted run imports (the agent, its Gaia2 and GAIA tasks, the audit, the metrics), once for every child.
PRELOAD = (
    "prometheus_client",
    "labkube.agent.harness.sandbox_process",
    "labkube.agent.harness.entrypoint",
    "labkube.agent.rg.world_session",
    "labkube.integrity.audit",
    "labkube.tasks.environment",
    "labkube.tasks.gaia",
    "labkube.tasks.gaia2.cards",
    "httpx",
    # What httpx imports on its first request (a model SDK's): its async stack, trio included where installed.
    "httpcore",
    "h11",
    "anyio",
    "anyio._backends._asyncio",
    "sniffio",
    "trio",
)


class ChildRequest(BaseModel):
    id: int
    run_dir: str
    resume: bool = False
    finalize_reason: str | None = None
    env: dict[str, str]
    secrets: dict[str, str]
    stdout: str
    stderr: str


# -- the zygote process ---------------------------------------------------------------------------------------


def _send(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _child(request: ChildRequest, inherited: list[int]) -> None:
    """In the forked child: become `labkube agent --run-dir DIR ARGS` for the run; never returns."""
    code: int = 1
    try:
        not_dumpable()  # the run's keys pass through this child next (agent_process says it again)
        os.setsid()
        for fd in inherited:
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        keys_read, keys_write = os.pipe()
        os.write(keys_write, (json.dumps(request.secrets) + "\n").encode())  # far below a pipe's buffer
        os.close(keys_write)
        os.dup2(keys_read, 0)
        os.close(keys_read)
        for fd, path in ((1, request.stdout), (2, request.stderr)):
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(request.run_dir)
        os.environ.clear()
        os.environ.update({**request.env, "LABKUBE_KEYS_ON_STDIN": "1"})
        _metrics_for_this_run()
        resume = ["--resume"] if request.resume else []
        finalize = ["--finalize", request.finalize_reason] if request.finalize_reason is not None else []
        sys.argv = ["labkube", "agent", "--run-dir", request.run_dir, *resume, *finalize]
        from labkube.agent.harness.sandbox_process import agent_process

        code = agent_process(Path(request.run_dir), request.resume, request.finalize_reason)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what an uncaught exception (a labkube bug) does to `labkube agent`: a traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _metrics_for_this_run() -> None:
    """prometheus_client picks how values are kept (in this process, or in files of a shared directory) when it is
    imported, from PROMETHEUS_MULTIPROC_DIR; the zygote imported it before any run's environment existed, so the
    child picks again with its own (`labkube.metrics.use_multiprocess_dir`, as the agent's telemetry would)."""
    from prometheus_client import values

    from labkube.metrics import use_multiprocess_dir

    if os.environ.get("LABKUBE_METRICS_DIR"):
        use_multiprocess_dir(os.environ["LABKUBE_METRICS_DIR"])
    values.ValueClass = values.get_value_class()


def take_free_heap_chunks(batch: int = 8) -> int:
    """Take, for good, every free chunk of the C heap (glibc's malloc) that is not its top; the bytes taken (0 where
    the C library is not glibc 2.33 or later). Imports leave free chunks scattered over the heap's pages; a child's
    first allocations (its environment's strings, then Python's objects over 512 bytes) would reuse them, and each
    reuse writes to a page it shares with the zygote, which the kernel then copies: about 200 of a forked Gaia2
    run's 2,700 page faults, and its environment's update 4 times slower. Taken here, a child's allocations come
    from the top of the heap instead, a few fresh pages. A batch is taken while the top stays as it was: a change
    means the free chunks of that size are used up (at most `batch` chunks of it then come from the top)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
        ] + [("keepcost", ctypes.c_size_t)]

    try:
        libc = ctypes.CDLL(None)
        mallinfo2, malloc = libc.mallinfo2, libc.malloc
    except (OSError, AttributeError):
        return 0
    mallinfo2.restype = MallInfo2
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    taken = 0
    for size in (64, *range(16, 1040, 16)):  # 64 first: it splits what larger free chunks there are
        top = mallinfo2().keepcost
        while taken < 64 << 20:  # a bound, far above what imports leave free (about 200 KB)
            for _ in range(batch):
                malloc(size)
            taken += batch * size
            if mallinfo2().keepcost != top:
                break
    return taken


def serve() -> None:
    """The zygote's loop: fork a child per request, report each child's exit. Single-threaded, so forking is safe."""
    import importlib

    from labkube.cpu_share import RETRY_S, WARMING_NICE, set_autogroup_nice

    # Warming until the first request (or until the driver says the supervisors are up): the full share then,
    # asked for again every RETRY_S while the kernel refuses (EAGAIN), without a thread (this process forks).
    warming = os.environ.pop(WARMING_ENV, None) == "1" and set_autogroup_nice(WARMING_NICE) == 0
    share = "warming" if warming else "full"  # then "asking" while the kernel refuses the full share
    for module in PRELOAD:
        with contextlib.suppress(ImportError):  # an optional one (trio) that is not installed
            importlib.import_module(module)
    from labkube.agent.harness.sandbox_process import end_prepared_runs, prepare_for_runs

    prepare_for_runs()
    # What the zygote made stays out of its children's garbage collections, whose passes over those objects would
    # write to (and so copy, one page at a time) the memory every child shares with it.
    gc.freeze()
    take_free_heap_chunks()

    children: dict[int, int] = {}  # pidfd -> pid
    buffer = b""
    while True:
        ready, _, _ = select.select([0, *children], [], [], RETRY_S if share == "asking" else None)
        if share == "asking" and set_autogroup_nice(0) != errno.EAGAIN:
            share = "full"
        for fd in ready:
            if fd != 0:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})
                continue
            chunk = os.read(0, 65536)
            if not chunk:  # the supervisor is gone
                end_prepared_runs()
                os._exit(0)
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = ChildRequest.model_validate_json(line)
                if share == "warming":
                    share = "asking" if set_autogroup_nice(0) == errno.EAGAIN else "full"
                try:
                    pid = os.fork()
                except OSError as exc:
                    _send({"id": request.id, "error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    _child(request, [*children])
                children[os.pidfd_open(pid)] = pid
                _send({"id": request.id, "pid": pid})


# -- the supervisor's side ------------------------------------------------------------------------------------


class ZygoteError(RuntimeError):
    """The zygote could not start a run's agent (the caller falls back to a fresh `labkube agent` process)."""


def agent_options(args: list[str]) -> tuple[bool, str | None]:
    """`resume` and `finalize_reason` from the options the local sandbox gives `labkube agent` (`--resume`,
    `--finalize REASON`); anything else is a ZygoteError, and the sandbox starts the command, which parses it."""
    resume, finalize_reason, rest = False, None, list(args)
    while rest:
        option = rest.pop(0)
        if option == "--resume":
            resume = True
        elif option == "--finalize" and rest:
            finalize_reason = rest.pop(0)
        else:
            raise ZygoteError(f"the agent zygote forks only `labkube agent [--resume] [--finalize REASON]`: {args}")
    return resume, finalize_reason


class ZygoteChild:
    """A forked agent as `asyncio.subprocess.Process` looks to the local sandbox: `pid`, `returncode`, `wait()`.
    It is not this process's child: its exit code comes from the zygote, which reaps it."""

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class AgentZygote:
    """The supervisor's handle on its zygote: started on first use, replaced when it dies."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[int]] = {}  # request id -> pid
        self._exits: dict[int, asyncio.Future[int]] = {}  # pid -> exit code
        self._start_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def start(self) -> None:
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            env, _keys = split_secrets(dict(os.environ), set())  # the zygote holds no key; each child gets its own
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # never the working directory on sys.path (a checkout's `operator/` would shadow the stdlib's)
                "-m",
                ZYGOTE_MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
                cwd=Path(os.sep),
            )
            self._reader = asyncio.create_task(self._read(self._proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            message = json.loads(line)
            if "exit" in message:
                self._exit_future(message["pid"]).set_result(int(message["exit"]))
                continue
            waiter = self._pending.pop(message["id"], None)
            if waiter is None or waiter.done():
                continue
            if "error" in message:
                waiter.set_exception(ZygoteError(message["error"]))
            else:
                waiter.set_result(int(message["pid"]))
        await proc.wait()
        # The zygote died: its children were orphaned (they checkpoint and exit on their own); to the supervisor
        # each ended as if killed, so their runs resume.
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ZygoteError(f"the agent zygote exited {proc.returncode}"))
        self._pending.clear()
        for exited in self._exits.values():
            if not exited.done():
                exited.set_result(-signal.SIGKILL)

    def _exit_future(self, pid: int) -> asyncio.Future[int]:
        if pid not in self._exits:
            self._exits[pid] = asyncio.get_running_loop().create_future()
        return self._exits[pid]

    async def spawn(
        self, run_dir: Path, args: list[str], env: dict[str, str], secrets: dict[str, str], logs: Path
    ) -> ZygoteChild:
        """Fork `labkube agent --run-dir RUN_DIR ARGS` with `env` as its environment and `secrets` on its stdin."""
        resume, finalize_reason = agent_options(args)
        await self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        self._next_id += 1
        request = ChildRequest(
            id=self._next_id,
            run_dir=str(run_dir),
            resume=resume,
            finalize_reason=finalize_reason,
            env=env,
            secrets=secrets,
            stdout=str(logs / "agent.stdout"),
            stderr=str(logs / "agent.stderr"),
        )
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = waiter
        try:
            proc.stdin.write(request.model_dump_json().encode() + b"\n")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._pending.pop(request.id, None)
            raise ZygoteError(f"the agent zygote is gone ({exc})") from None
        pid = await waiter
        return ZygoteChild(pid, self._exit_future(pid))

    def forget(self, pid: int) -> None:
        self._exits.pop(pid, None)

    async def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the zygote exits on end of input; a run still going ends as an orphaned agent does
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=5)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            await self._reader


if __name__ == "__main__":
    serve()
