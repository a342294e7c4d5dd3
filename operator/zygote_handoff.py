"""The agent zygote `labkube run` starts while Ray starts, handed to the supervisor actor that forks its runs.

The zygote's imports take about a second, and the supervisor that would start it exists only once Ray has started
and its worker has imported labkube: a short campaign's first run waited for both, one after the other. So the
driver starts the zygote first (as it does the campaign's worlds, `warm.EarlyWorlds`) and hands it over.

The zygote speaks its protocol on its stdin and stdout (`agent_zygote`); here both are one end of a socket pair,
whose other end the driver holds until a supervisor asks for it on a Unix socket of the driver's (an abstract name
with a random part, answered only to a process of the same user) and receives it as a file descriptor
(SCM_RIGHTS). From then on the supervisor alone holds it: the zygote exits when the supervisor closes it or dies,
as a zygote the supervisor started does. The driver, the zygote's parent, reaps it at the end of the campaign; a
zygote nobody adopted ends when the driver closes its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

from pydantic import BaseModel

from labkube.cpu_share import set_autogroup_nice
from labkube.operator.agent_keys import split_secrets
from labkube.operator.agent_zygote import WARMING_ENV, ZYGOTE_MODULE, AgentZygote

ADDRESS_PREFIX = "labkube-zygote-"
STOP_WAIT_S = 5.0


class ZygoteHandoff(BaseModel):
    """What a supervisor needs to adopt a zygote another process started: its pid and where to ask for its socket."""

    pid: int
    address: str  # an abstract Unix socket name (without its leading NUL)


class EarlyZygote:
    """The zygote started by this process (the driver), offered to one supervisor (`handoff`); `close()` reaps it."""

    def __init__(self, wanted: bool) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._ours: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.address = ADDRESS_PREFIX + secrets.token_hex(16)
        if not wanted:
            return
        ours, theirs = socket.socketpair()
        env, _keys = split_secrets(dict(os.environ), set())  # the zygote holds no key; each child gets its own
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", ZYGOTE_MODULE],  # -P: never the working directory on sys.path
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.DEVNULL,  # not the terminal the campaign's table is on (its children log per run)
                env={**env, WARMING_ENV: "1"},  # while Ray's head and the supervisors start (labkube/cpu_share.py)
                cwd=Path(os.sep),
                start_new_session=True,  # its share of the CPU its own, not taken from the head's
            )
        self._ours = ours
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._hand_over, daemon=True, name="early-zygote")
        self._thread.start()

    def handoff(self) -> ZygoteHandoff | None:
        return ZygoteHandoff(pid=self.proc.pid, address=self.address) if self.proc is not None else None

    def end_warming(self) -> None:
        """The full share of the CPU back to the zygote: the supervisor that will ask it for runs is up. One ask: one
        the kernel refuses (EAGAIN) the zygote takes back at its first request."""
        if self.proc is not None:
            set_autogroup_nice(0, self.proc.pid)

    def _hand_over(self) -> None:
        """Give the zygote's socket to the first process of this user that asks, then let go of it."""
        assert self._listener is not None and self._ours is not None
        while True:
            try:
                asker, _ = self._listener.accept()
            except OSError:  # closed: the campaign ended before a supervisor asked
                return
            with asker:
                uid = struct.unpack("3i", asker.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[2]
                if uid != os.getuid():
                    continue
                socket.send_fds(asker, [b"z"], [self._ours.fileno()])
            self._ours.close()
            self._listener.close()
            return

    def close(self, patience_s: float = STOP_WAIT_S) -> None:
        """Stop offering the zygote, let go of it (it exits once its supervisor has let go too), and reap it: killed
        after `patience_s` (none when the campaign was interrupted: its runs' agents may still hold it)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._thread is not None:
            self._thread.join()
        if self._ours is not None:
            self._ours.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=patience_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def receive(handoff: ZygoteHandoff) -> socket.socket | None:
    """The zygote's socket from the process that started it; None when it is no longer offered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as asking:
        try:
            asking.settimeout(STOP_WAIT_S)
            asking.connect("\0" + handoff.address)
            _, fds, _, _ = socket.recv_fds(asking, 1, 1)
        except OSError:
            return None
    if not fds:
        return None
    os.set_inheritable(fds[0], False)  # a received descriptor is inheritable: no child of ours may keep the zygote
    return socket.socket(fileno=fds[0])


class _Writer:
    """The zygote's stdin as `asyncio.subprocess.Process.stdin` looks: closing it ends the writing half only, so the
    zygote reads the end of its input and its last messages still arrive."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.write_eof()


class HandedProcess:
    """An adopted zygote as `asyncio.subprocess.Process` looks to `AgentZygote`. It is not this process's child:
    its end is seen through a pidfd, and its exit code is not known (reported as killed)."""

    def __init__(self, pid: int, pidfd: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.stdin = _Writer(writer)
        self.stdout = reader
        self._writer = writer
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(pidfd, self._on_end)

    def _on_end(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._writer.close()
        if not self._ended.done():
            self._ended.set_result(None)

    @property
    def returncode(self) -> int | None:
        if not self._ended.done() and select.select([self._pidfd], [], [], 0)[0]:
            self._on_end()  # ended, and the event loop has not run the reader yet
        return -signal.SIGKILL if self._ended.done() else None

    async def wait(self) -> int:
        await asyncio.shield(self._ended)
        return -signal.SIGKILL

    def kill(self) -> None:
        if not self._ended.done():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class SupervisorZygote(AgentZygote):
    """A supervisor's zygote: adopted from the process that started it (`adopt`), or, as `AgentZygote` does, started
    by the supervisor itself when there is none to adopt or the adopted one is gone."""

    async def adopt(self, handoff: ZygoteHandoff) -> bool:
        """Whether the zygote was adopted (False: it was gone or no longer offered). Holds the start lock throughout,
        so a run or a warm-up that wants the zygote meanwhile waits for this one instead of starting another."""
        async with self._start_lock:
            try:
                pidfd = os.pidfd_open(handoff.pid)
            except OSError:
                return False
            connection = await asyncio.to_thread(receive, handoff)
            if connection is None:
                os.close(pidfd)
                return False
            reader, writer = await asyncio.open_unix_connection(sock=connection)
            proc = HandedProcess(handoff.pid, pidfd, reader, writer)
            self._proc = proc  # type: ignore[assignment]
            self._reader = asyncio.create_task(self._read(proc))  # type: ignore[arg-type]
        return True
