"""Relays a vendor CLI uses inside the run's sandbox to reach the two servers outside it, over unix sockets.

The sandbox's network is its own `lo` only, and labkube's package is not in it, so this file is standalone: the
standard library and nothing else, copied beside the CLI's helpers (`agent/scaffolds/cli_sandbox.py`) and run by
path with the interpreter bound in the sandbox (`python -I sandbox_relay.py ...`).

    forward SOCKET PORT [SOCKET PORT ...] -- ARGV...
                                     listen on the sandbox's own 127.0.0.1:PORT and pass every connection on to
                                     SOCKET, for each pair (the model gateway, the run's proxy; the CLIs speak HTTP
                                     over TCP only), then run ARGV (the CLI, a command) in a process group of its
                                     own: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent here go on to its group, its exit
                                     status is this process's, and the group is killed when it exits
    stdio SOCKET                     this process's stdin and stdout to SOCKET and back (an MCP server over stdio
                                     for the CLI, served outside the sandbox: the world's tools of a Gaia2 run)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
CHUNK = 256 * 1024


def connect_unix(path: str) -> socket.socket:
    """A connection to the unix socket at `path`, through its folder's descriptor where the path is too long for
    `sun_path` (a run folder deep in a campaign's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(path)) < 108:
            sock.connect(path)
        else:
            folder, name = os.path.split(path)
            fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
            try:
                sock.connect(f"/proc/self/fd/{fd}/{name}")
            finally:
                os.close(fd)
    except BaseException:
        sock.close()
        raise
    return sock


class Pair:
    """Two connected sockets piped both ways, each direction a thread; both are closed once both directions end."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.sockets = (a, b)
        self.left = 2
        self.lock = threading.Lock()
        for src, dst in ((a, b), (b, a)):
            threading.Thread(target=self.pipe, args=(src, dst), daemon=True).start()

    def pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            for sock in self.sockets:
                sock.close()


def accept_forever(listener: socket.socket, target: str) -> None:
    while True:
        conn, _ = listener.accept()
        try:
            upstream = connect_unix(target)
        except OSError as exc:
            print(f"labkube relay: cannot reach {target}: {exc}", file=sys.stderr, flush=True)
            conn.close()
            continue
        Pair(conn, upstream)


def forward(routes: list[tuple[str, int]], argv: list[str]) -> int:
    for target, port in routes:  # every port listens before the command starts
        listener = socket.create_server(("127.0.0.1", port), backlog=64)
        threading.Thread(target=accept_forever, args=(listener, target), daemon=True).start()
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []  # a signal that came before the command started: passed on once it has

    def pass_on(signum: int, _frame: object) -> None:
        if not started:
            early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(started[0].pid, signum)

    for signum in FORWARDED_SIGNALS:  # before the command starts: a signal right after its start is not lost
        signal.signal(signum, pass_on)
    child = subprocess.Popen(argv, start_new_session=True)
    started.append(child)
    for signum in early:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)
    code = child.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)  # what the CLI's commands left running in its group
    if code < 0:  # killed by a signal: end the same way, so whoever waits on this process sees it
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def stdio(target: str) -> int:
    sock = connect_unix(target)

    def upstream() -> None:
        try:
            while data := os.read(0, CHUNK):
                sock.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while data := sock.recv(CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
    except OSError:
        return 1
    return 0


def forward_routes(args: list[str]) -> tuple[list[tuple[str, int]], list[str]] | None:
    """`SOCKET PORT [SOCKET PORT ...] -- ARGV...` as its (socket, port) pairs and ARGV; None if malformed."""
    if "--" not in args:
        return None
    split = args.index("--")
    pairs, argv = args[:split], args[split + 1 :]
    if not pairs or len(pairs) % 2 or not argv or not all(p.isdigit() for p in pairs[1::2]):
        return None
    return [(pairs[i], int(pairs[i + 1])) for i in range(0, len(pairs), 2)], argv


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "forward" and (parsed := forward_routes(argv[2:])) is not None:
        return forward(*parsed)
    if len(argv) == 3 and argv[1] == "stdio":
        return stdio(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
