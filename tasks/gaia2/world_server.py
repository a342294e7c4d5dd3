"""The Gaia2 world process: a warm ARE 1.2.0 runtime behind a small HTTP JSON protocol.

Standalone: it imports only the standard library and ARE, and runs with the ARE virtualenv's python,
by path:

    <are-venv>/bin/python world_server.py --port 0

The first line on stdout is `LISTENING <port>` (with `--copy-log`, each forked copy i adds `LISTENING <port>
<pid> <i>`; with LABKUBE_WORLD_CONTROL=1, each line ends with ` control=<token>`, the key to the run controller's
endpoints, which a pod's sidecar writes to the file LABKUBE_WORLD_CONTROL_FILE names instead); everything else (ARE's
logging included) goes to stderr. One process serves any number of scenarios one after another (`POST /scenario`
replaces the current one). The protocol is documented in docs/gaia2-world-protocol.md.

ARE decides everything that matters: the apps and their tools, the event loop and its simulated clock,
the notification system, the turn triggers and the judge (GraphPerEventJudge for Gaia2 JSON scenarios,
the scenario's own `validate` for registry scenarios). The world process only adapts them to HTTP.

This file is the HTTP side: the routes, JSON in and out, the server and its command line. The adaptation of
ARE lives beside it, in modules it imports by name from this folder (the script's folder is sys.path[0]):
world_session.py (the served scenario, one method per endpoint), world_scenario.py (loading a scenario, its
tools), world_engines.py (ARE's LLM engines, its agent's log), world_judge.py (the judge and its verdicts),
world_health.py (is the world sound?), world_protocol.py (the protocol's error, deadlines) and
verdict_message.py (the verdict as a pod's termination message).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import secrets
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import deferred_imports  # noqa: F401  (before any of ARE: ARE's document converter is imported on first use)
import world_cpu_share  # before ARE: a world warming up ahead of its first run yields the CPU while it imports ARE
from verdict_message import CONTROL_ENV, CONTROL_FILE_VARIABLE, CONTROL_HEADER
from world_health import WorldBroken
from world_judge import install_judge_caches, warm_judge
from world_protocol import ProtocolError, one_line
from world_scenario import install_environment_shortcuts
from world_session import WorldSession

ARE_VERSION = "1.2.0"
# The run's controller's endpoints: the scenario it loads, the clock the gateway stops during model calls, the
# judge, the oracle and ARE's agent. The agent's (its tools, notifications, time, messages to the user) stay open:
# a vendor CLI reaches them through the MCP bridge, which holds no token, and so could the CLI's shell.
CONTROL_ROUTES = frozenset(
    {
        ("POST", "/scenario"),
        ("GET", "/state"),
        ("POST", "/clock/pause"),
        ("POST", "/clock/resume"),
        ("POST", "/finish"),
        ("POST", "/oracle"),
        ("POST", "/are_agent"),
    }
)
# A request body past this is refused (413) unread; a control request without the token is refused (403) with its
# body read only up to REFUSED_BODY_BYTES (to keep its connection), else unread with the connection closed.
MAX_BODY_BYTES = 32 * 1024 * 1024
REFUSED_BODY_BYTES = 64 * 1024
log = logging.getLogger("labkube.world")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stalls
    session: WorldSession  # set by serve()
    warming = world_cpu_share.WARMING  # until the first request (world_cpu_share.py)
    control_token: str | None = None  # set by serve() when the starter asked for one (CONTROL_ENV)
    control_file: Path | None = None  # where a pod's sidecar published it, until a request carries it

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:  # its body left unread: the client is told this connection ends here
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _body(self, raw: bytes) -> dict[str, Any]:
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(400, f"the request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ProtocolError(400, "the request body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        if Handler.warming:  # the first request: the world is wanted now
            Handler.warming = False
            world_cpu_share.end_warming()
        s = self.session
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
            ("GET", "/health"): lambda _: {"status": "ok", "are_version": ARE_VERSION, "pid": os.getpid()},
            ("GET", "/scenario"): lambda _: s.info(),
            ("GET", "/state"): lambda _: s.state(),
            ("POST", "/scenario"): s.load,
            ("GET", "/tools"): lambda _: s.list_tools(),
            ("POST", "/tools/call"): s.call_tool,
            ("POST", "/notifications/pull"): lambda _: s.pull_notifications(),
            ("POST", "/wait_for_notification"): s.wait,
            ("GET", "/time"): lambda _: s.clock(),
            ("POST", "/clock/pause"): lambda _: s.pause(),
            ("POST", "/clock/resume"): s.resume,
            ("POST", "/message_to_user"): s.message_to_user,
            ("POST", "/finish"): lambda _: s.finish(),
            ("POST", "/oracle"): lambda _: s.run_oracle(),
            ("POST", "/are_agent"): s.run_are_agent,
        }
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        # The body is read whatever the answer (left unread, a refused request's body would be read from this
        # kept-alive connection as the next request), but only once the head says it may be: one over
        # MAX_BODY_BYTES, or a control request without the token whose body is over REFUSED_BODY_BYTES, is answered
        # with the connection closed and its body unread (the agent's shell reaches this port: it must not make the
        # world hold what it sends).
        try:
            length = int(self.headers.get("Content-Length") or 0) if method == "POST" else 0
        except ValueError:
            self.close_connection = True
            self._send(400, {"error": f"Content-Length is not a number: {self.headers.get('Content-Length')!r}"})
            return
        allowed = (method, path) not in CONTROL_ROUTES or self._controller()
        if not allowed and length > REFUSED_BODY_BYTES:
            self.close_connection = True
            length = 0
        elif length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, {"error": f"the request body is over {MAX_BODY_BYTES} bytes"})
            return
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            route = routes.get((method, path))
            if route is None:
                known = ", ".join(f"{m} {p}" for m, p in routes)
                raise ProtocolError(404, f"no endpoint {method} {path} (endpoints: {known})")
            if not allowed:
                raise ProtocolError(
                    403,
                    f"{method} {path} is the run's controller's, and this request does not carry its control token "
                    "(a run's agent calls the world's tools; the scenario, the clock and the judge are labkube's)",
                )
            self._send(200, route(self._body(raw)))
        except ProtocolError as exc:
            self._send(exc.status, {"error": str(exc)})
        except WorldBroken as exc:
            log.error("the world is broken (%s %s): %s", method, path, exc)
            self._send(503, {"error": str(exc), "world_broken": True})
        except Exception as exc:
            log.error("unexpected error on %s %s\n%s", method, path, traceback.format_exc())
            self._send(500, {"error": f"unexpected error in the world process: {one_line(exc)}"})

    def _controller(self) -> bool:
        token = Handler.control_token
        if token is None:  # a world started without one (by hand): every endpoint is open
            return True
        if not hmac.compare_digest(self.headers.get(CONTROL_HEADER, "").encode(), token.encode()):
            return False
        published, Handler.control_file = Handler.control_file, None
        if published is not None:  # its readers have it (publish_control_token): the agent's commands never will
            published.unlink(missing_ok=True)
        return True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


def _exit_with(starter: int, forked: bool) -> None:
    """A world belongs to the process that started it (an agent, a supervisor, `labkube run`): when that process is
    gone, so is the world. A forked copy's parent is the first world, not the starter, so the starter is watched
    through a pidfd (readable once it exits); without pidfds, the first world watches its parent pid change and a
    copy polls the starter's pid."""
    try:
        pidfd = os.pidfd_open(starter)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        select.select([pidfd], [], [])
    else:
        while (os.getppid() == starter) if not forked else _exists(starter):
            time.sleep(1.0)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(host: str, port: int, announce: Callable[[str], None], starter: int, copy: int = 0) -> None:
    if os.environ.get("LABKUBE_WORLD_ORPHAN_EXIT", "1") == "1":
        threading.Thread(target=_exit_with, args=(starter, copy > 0), daemon=True, name="world-parent").start()
    install_judge_caches()
    install_environment_shortcuts()
    threading.Thread(target=warm_judge, daemon=True, name="world-warm-judge").start()
    Handler.session = WorldSession()
    # Each world its own token (a forked copy makes its own), announced only to the process that started it, on the
    # pipe that is its stdout: never in its environment or command line, which another process of the user reads.
    Handler.control_token = secrets.token_urlsafe(24) if os.environ.get(CONTROL_ENV) == "1" else None
    control_file = os.environ.get(CONTROL_FILE_VARIABLE)
    if Handler.control_token and control_file and copy == 0:
        Handler.control_file = publish_control_token(Handler.control_token, Path(control_file))
    server = ThreadingHTTPServer((host, port), Handler)  # listening from here: the pod's startup probe passes
    server.daemon_threads = True
    # A pod's sidecar publishes it to the file only: its stdout is the container's log, which the cluster keeps.
    control = f" control={Handler.control_token}" if Handler.control_token and not control_file else ""
    announce(f"LISTENING {server.server_address[1]}" + (f" {os.getpid()} {copy}" if copy else "") + control)
    server.serve_forever()


def publish_control_token(token: str, path: Path) -> Path | None:
    """A pod's world sidecar: its kubelet starts it, so no starter reads its `LISTENING` line. The token goes to
    `path`, on a memory volume the gateway sidecar and the agent container mount read-only, before the world
    listens: once the pod's startup probe passes, the gateway reads it, then the agent's harness, whose loading of
    the scenario (the first request carrying the token) has the world remove it, before any of the agent's commands
    runs. Returns `path`, or None where nothing was published.

    Once per pod: a world the kubelet restarts (its scenario, clock and judge lost with the process) finds its own
    mark in its HOME (the pod's `world-tmp`, a volume no other container mounts, which outlives the process) and
    publishes nothing,
    since the agent's commands would read a second token there; its controller's endpoints stay closed to every
    caller, and the run's harness meets a 403 and fails the run, never a world its shell steers."""
    mark = Path.home() / ".labkube-world-control-published"
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        log.error(
            "this world sidecar was restarted in its pod: its control token is not published again (%s), so the "
            "scenario, the clock and the judge stay closed to every caller and the run fails",
            path,
        )
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # only this pod's user reads it
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return path


def fork_copies(logs: list[str]) -> tuple[int, list[int]]:
    """Fork one copy of this process per log path, before any thread exists (ARE is imported once, for all of
    them). Each copy gets a session of its own (stopping one world kills its process group, and only it) and its own
    log on stdout and stderr. Returns (this process's copy index, the children it must reap: only the first has)."""
    children: list[int] = []
    for index, log in enumerate(logs, start=1):
        pid = os.fork()
        if pid == 0:
            os.setsid()
            Handler.warming = False  # a session of its own: an autogroup of its own, at the full share
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, sys.stderr.fileno())
            os.dup2(fd, sys.stdout.fileno())
            os.close(fd)
            return index, []
        children.append(pid)
    return 0, children


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve ARE Gaia2 scenarios over HTTP (labkube world process).")
    # A pod's world sidecar gets its port from LABKUBE_WORLD_PORT (the chart's runs.world.port).
    parser.add_argument("--host", default=os.environ.get("LABKUBE_WORLD_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("LABKUBE_WORLD_PORT", "0")),
        help="0 picks a free port (printed as LISTENING <port>); default: $LABKUBE_WORLD_PORT",
    )
    parser.add_argument("--log-level", default=os.environ.get("LABKUBE_WORLD_LOG_LEVEL", "WARNING"))
    parser.add_argument(
        "--copy-log",
        action="append",
        default=[],
        help="serve one more world, forked after ARE is imported, logging here (repeatable); each announces "
        "LISTENING <port> <pid> <copy> on stdout",
    )
    args = parser.parse_args(argv)
    # ARE starts some tool servers (MCP) as a bare `python`: make that this virtualenv's python.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # stdout carries only the LISTENING line: anything ARE prints goes to stderr.
    announce_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("are").setLevel(args.log_level.upper())

    def announce(line: str) -> None:
        os.write(announce_fd, (line + "\n").encode())  # one short write: the copies' lines never interleave
        os.close(announce_fd)

    starter = os.getppid()
    index, children = fork_copies(args.copy_log) if args.copy_log else (0, [])
    for child in children:  # the first world reaps its copies (they are stopped by their own process group)
        threading.Thread(target=os.waitpid, args=(child, 0), daemon=True, name="world-copy-reaper").start()
    serve(args.host, args.port if index == 0 else 0, announce, starter, copy=index)


if __name__ == "__main__":
    main()
