"""Async client for a world process (see docs/gaia2-world-protocol.md).

Exceptions:

    WorldError                 anything that stops a world call from giving its answer
    +-- WorldDied              the world process is gone (connection refused or dropped)
    +-- WorldTimeout           it is alive but did not answer in time
    +-- WorldRequestError      it answered `{"error": ...}` with a 4xx/5xx status
        +-- WorldBroken        ... saying the world itself is broken (ARE's event loop died, an unsound
                               scenario): the run cannot be judged

A tool the agent misuses is not an exception: `call_tool` returns a `ToolResult` with `ok=False`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any, Literal, Self

import h11
from pydantic import BaseModel, ConfigDict, Field

from labkube.tasks.gaia2.verdict_message import CONTROL_HEADER


class WorldError(Exception):
    """A world call did not give its answer."""


class WorldDied(WorldError):
    """The world process is gone; everything it held (the scenario, the clock) is lost."""


class WorldTimeout(WorldError):
    """The world process did not answer in time (it may be stuck: stop it and start another)."""


class WorldRequestError(WorldError):
    """The world answered with an error status."""

    def __init__(self, status: int, message: str, endpoint: str) -> None:
        super().__init__(f"{endpoint}: HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.endpoint = endpoint


class WorldBroken(WorldRequestError):
    """The world answered that it cannot run faithfully (`"world_broken": true`): ARE's event loop died, an
    oracle event calls an app the scenario lacks, or ARE's oracle run was cut short."""


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Health(_Reply):
    status: str
    are_version: str
    pid: int


class ScenarioInfo(_Reply):
    scenario_id: str
    kind: Literal["json", "registry"]
    oracle: bool
    seed: int | None = None
    start_time: float | None = None
    duration: float | None = None
    nb_turns: int = 1
    capabilities: list[str] = []
    judge: str = ""
    finished: bool = False
    time: float | None = None


class ToolSpec(_Reply):
    """An app tool as ARE names it (`App__method`), with a JSON schema for its arguments."""

    name: str
    app: str
    description: str
    parameters: dict[str, Any]
    write: bool


class ToolResult(_Reply):
    ok: bool
    result: Any = None
    text: str = ""  # the result as ARE's own agent would see it (str of the return value)
    error: str | None = None
    time: float  # simulated time after the call
    turn_ended: bool = False  # the call was AgentUserInterface__send_message_to_user
    turns_completed: int | None = None
    world_stopped: bool = False


class Notification(_Reply):
    type: Literal["user_message", "environment", "environment_stop"]
    message: str
    timestamp: float  # simulated, seconds since the epoch
    datetime: str


class Notifications(_Reply):
    notifications: list[Notification]
    time: float
    world_stopped: bool = False


class WaitResult(_Reply):
    time: float
    datetime: str
    advanced: float  # simulated seconds the clock moved
    world_stopped: bool = False
    error: str | None = None  # the wait itself failed in ARE (noise can make any tool fail)


class ClockState(_Reply):
    time: float
    datetime: str
    start_time: float
    elapsed: float
    paused: bool


class ClockResumed(_Reply):
    time: float
    paused: bool
    charged: float  # simulated seconds charged for the pause


class TurnEnd(_Reply):
    time: float
    turn_ended: bool
    turns_completed: int
    nb_turns: int
    world_stopped: bool


class ActionMatch(_Reply):
    """One agent event ARE's judge weighed (its write actions and messages to the user), in order."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    turn: int = 0
    simulated_time: float | None = None
    oracle_event_id: str | None = None  # None: the judge matched it to no oracle event


class ValidationResult(_Reply):
    """ARE's verdict on a scenario run (GraphPerEventJudge, or a registry scenario's own validation)."""

    scenario_id: str
    success: bool
    rationale: str | None = None
    exception: str | None = None
    judge: str
    judge_usd: float | None = Field(
        default=None, description="What ARE's soft judge spent on its model; None where no price was given."
    )
    checks: list[str]
    soft_checks: str
    oracle: bool
    turns_completed: int = 0
    nb_turns: int = 1
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    matches: list[ActionMatch] | None = Field(
        default=None,
        description="The agent's events the judge weighed, each with the oracle event it matched "
        "(GraphPerEventJudge only; None when the judge keeps no per-action matching).",
    )


class AgentLogEntry(_Reply):
    """One entry of ARE's agent log (`type`: system_prompt, task, llm_output, tool_call, observation, ...)."""

    type: str
    timestamp: float  # simulated
    content: Any = None
    tool: str | None = None
    arguments: Any = None
    messages: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    completion_duration: float | None = None


class AreAgentReport(_Reply):
    name: str
    model: str
    output: str | None = None
    # why it stopped; all but "finished" stop short, and the run is judged as it stands
    stopped: Literal["finished", "timeout", "max_iterations", "model_failed", "error"] = "finished"
    error: str | None = None  # what went wrong, in one line (None when finished)
    logs: list[AgentLogEntry] = []


class AreAgentRun(ValidationResult):
    """ARE's verdict on a run of ARE's own default agent, with what that agent did."""

    agent: AreAgentReport


# Every call has a timeout. The world answers slow operations itself within its own deadlines
# (load 180 s, validation 300 s): the client waits a little longer than that, never forever.
DEFAULT_TIMEOUT = 30.0
# Where a run's agent process finds the token of the world lent to it: among its secrets (on stdin, as its API keys),
# never in its environment, which its commands (a vendor CLI's shell) read.
CONTROL_TOKEN_VARIABLE = "LABKUBE_WORLD_CONTROL_TOKEN"
SLOW_TIMEOUT = 330.0
CONNECT_TIMEOUT = 5.0
MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers


def world_address(url: str) -> tuple[str, int, str, str]:
    """`http://HOST[:PORT][/PREFIX]`: (host, port, `HOST[:PORT]` as written, `/PREFIX` or ""), as
    `urllib.parse.urlsplit` reads it (whose Python code is 50 pages a forked run would copy, for one address)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if "[" in netloc:  # an IPv6 literal
        host, _, after = netloc[netloc.find("[") + 1 :].partition("]")
        port = after.removeprefix(":")
    else:
        host, _, port = netloc.partition(":")
    if scheme.lower() != "http" or not sep or not host or "@" in netloc or not (port.isdigit() or not port):
        raise ValueError(f"a world speaks plain HTTP: {url!r} is not an http://HOST[:PORT] address")
    return host.lower(), int(port or 80), netloc, (slash + path).split("?", 1)[0].split("#", 1)[0]


class _HttpError(Exception):
    """The connection broke, or what came back is not an HTTP response: the world process is gone."""


class _Connection:
    """One keep-alive HTTP/1.1 connection to a world, one request at a time, on a non-blocking socket through the
    event loop's own socket calls (no transport, protocol and stream objects: a third of a short run's world calls'
    CPU went on building them). The HTTP itself (framing, chunked and close-delimited bodies, keep-alive) is h11's,
    the protocol library under httpx, which the agent zygote has imported already."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socket.inet_pton(family, host)  # not `ipaddress`: its Python code is pages a forked run would copy
            addresses = [(family, (host, port))]
        except OSError:  # a name: the resolver's addresses, in its order
            found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses = [(found_family, address) for found_family, _, _, _, address in found]
        failure: OSError = OSError(f"no address for {host}")
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
                return cls(sock)
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        raise failure

    def reusable(self) -> bool:
        """Not closed by the world while it lay idle (nothing to read from it but its end; one peek, no wait)."""
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # its end (b""), or bytes nobody asked for
        except BlockingIOError:
            return True
        except OSError:
            pass
        return False

    def close(self) -> None:
        self.sock.close()

    def cut(self) -> None:
        """End a connection a call is waiting on: the call sees its end at once and closes it (closing it here would
        leave the call waiting on a descriptor the event loop no longer hears from)."""
        with contextlib.suppress(OSError):  # it ended already
            self.sock.shutdown(socket.SHUT_RDWR)

    async def exchange(self, request: h11.Request, data: bytes, read: float) -> tuple[int, bytes, bool]:
        """Send `request` with `data`; (status, body, whether the connection may carry another request). Waits `read`
        seconds at most for the request to go and the answer's first bytes to come, then as long again for the rest."""
        loop = asyncio.get_running_loop()
        http = self.http
        try:
            outgoing = http.send(request) or b""
            if data:
                outgoing += http.send(h11.Data(data=data)) or b""
            outgoing += http.send(h11.EndOfMessage()) or b""
            async with asyncio.timeout(read) as deadline:
                await loop.sock_sendall(self.sock, outgoing)
                status, parts = 0, []
                while True:
                    event = http.next_event()
                    if event is h11.NEED_DATA:
                        http.receive_data(await loop.sock_recv(self.sock, 65536))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                        deadline.reschedule(loop.time() + read)
                    elif isinstance(event, h11.Data):
                        parts.append(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        raise _HttpError("the connection closed before the answer was complete")
                    # h11.InformationalResponse (a 1xx before the answer): nothing to keep
        except h11.ProtocolError as exc:
            raise _HttpError(f"not an HTTP response the client can read: {exc}") from None
        keep_alive = http.our_state is h11.DONE and http.their_state is h11.DONE
        if keep_alive:
            http.start_next_cycle()
        return status, b"".join(parts), keep_alive


class WorldClient:
    """One world process, one scenario at a time. Use as `async with WorldClient(url) as world: ...`.

    `is_alive` (from `WorldProcess.alive`) lets a timeout on a dead process surface as `WorldDied`. `control_token`:
    a world started by labkube on this machine answers its controller's endpoints (the scenario, the clock, the
    judge) only to a client that holds the token it announced (docs/gaia2-world-protocol.md, "Who may call what").
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        slow_timeout: float = SLOW_TIMEOUT,
        is_alive: Callable[[], bool] | None = None,
        control_token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # The run's controller's (the agent process's) key to the world's scenario, clock and judge (CONTROL_HEADER)
        self._control = [(CONTROL_HEADER.encode(), control_token.encode())] if control_token else []
        self._host, self._port, netloc, self._prefix = world_address(self.base_url)
        self._host_header = netloc.encode()
        self._timeout = timeout
        self._slow_timeout = slow_timeout
        self._is_alive = is_alive
        # Plain HTTP/1.1, each connection kept for the next call (the world's server keeps them alive); made on the
        # first call, on the loop that makes it. Neither httpx's nor aiohttp's clients (h11 under httpx does the HTTP):
        # a short Gaia2 run's agent spent more CPU in their request machinery (sessions, connectors, cookie jars,
        # timers) for its two world calls than in anything else it does. A world speaks plain HTTP on this machine or
        # in this pod: no TLS, no proxy, no cookies, JSON both ways.
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        for connection in self._busy:  # a call still waiting (another task's) fails as the world's end would fail it
            connection.cut()
        self._idle.clear()
        self._busy.clear()

    def _drop(self, connection: _Connection | None) -> None:
        """A connection whose call failed carries no other: what is left of its answer would be read as the next's."""
        if connection is not None:
            self._busy.discard(connection)
            connection.close()

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        async with asyncio.timeout(CONNECT_TIMEOUT):
            return await _Connection.open(self._host, self._port)

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        slow: bool = False,
        read_timeout: float | None = None,
    ) -> Any:
        read = read_timeout or (self._slow_timeout if slow else self._timeout)
        endpoint = f"{method} {path}"
        headers = [(b"Host", self._host_header), *self._control]
        if body is not None:
            data = json.dumps(body).encode()
            headers += [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(data))]
        else:
            data = b""
            headers += [(b"Content-Length", b"0")] if method == "POST" else []
        request = h11.Request(method=method, target=f"{self._prefix}{path}", headers=headers)
        connection = None
        try:
            connection = await self._connection()
            self._busy.add(connection)
            status, raw, keep_alive = await connection.exchange(request, data, read)
        except TimeoutError as exc:  # before OSError, of which it is one
            self._drop(connection)
            if self._is_alive is not None and not self._is_alive():
                raise WorldDied(f"the world process at {self.base_url} is gone ({endpoint} timed out)") from exc
            raise WorldTimeout(f"the world at {self.base_url} did not answer {endpoint} within {read:.0f} s") from exc
        except (OSError, _HttpError, ValueError) as exc:
            self._drop(connection)
            raise WorldDied(f"the world process at {self.base_url} is gone ({endpoint}: {exc!r})") from exc
        except BaseException:  # cancelled mid-call: the answer may still come, on this connection
            self._drop(connection)
            raise
        self._busy.discard(connection)
        if keep_alive:
            self._idle.append(connection)
        else:
            connection.close()
        text = raw.decode(errors="replace")
        try:
            data = json.loads(raw)
        except ValueError:
            raise WorldRequestError(status, text[:300], endpoint) from None
        if status >= 400:
            message = data.get("error", text) if isinstance(data, dict) else text
            broken = isinstance(data, dict) and data.get("world_broken") is True
            raise (WorldBroken if broken else WorldRequestError)(status, str(message), endpoint)
        return data

    async def health(self) -> Health:
        return Health.model_validate(await self._call("GET", "/health"))

    async def load_scenario(
        self,
        source: str,
        *,
        seed: int | None = None,
        oracle: bool = False,
        noise: bool | dict[str, Any] | None = None,
        judge: dict[str, Any] | None = None,
        duration: float | None = None,
        agent2agent: dict[str, Any] | None = None,
    ) -> ScenarioInfo:
        """Load a scenario (an ARE registry id, a JSON file path or JSON text), replacing the current one.

        `judge` (an LLM spec: {"model", "provider", "endpoint", "api_key"}) turns on ARE's soft (LLM)
        checks; without it the judge runs its hard checks only. `agent2agent` ({"proportion", "llm"})
        turns that share of the apps into ARE app agents. `oracle=True` prepares `run_oracle()` instead
        of an agent run.
        """
        body: dict[str, Any] = {"source": source, "oracle": oracle}
        optional = {"seed": seed, "noise": noise, "judge": judge, "duration": duration, "agent2agent": agent2agent}
        for key, value in optional.items():
            if value is not None:
                body[key] = value
        return ScenarioInfo.model_validate(await self._call("POST", "/scenario", body, slow=True))

    async def state(self) -> dict[str, Any]:
        """ARE's dumps of the loaded scenario: `{"apps": [...], "event_log": [...]}` (`GET /state`)."""
        data: dict[str, Any] = await self._call("GET", "/state")
        return data

    async def scenario(self) -> ScenarioInfo:
        return ScenarioInfo.model_validate(await self._call("GET", "/scenario"))

    async def list_tools(self) -> list[ToolSpec]:
        data = await self._call("GET", "/tools")
        return [ToolSpec.model_validate(t) for t in data["tools"]]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        body = {"name": name, "arguments": arguments or {}}
        return ToolResult.model_validate(await self._call("POST", "/tools/call", body, slow=True))

    async def pull_notifications(self) -> Notifications:
        """Messages and events delivered since the last pull, with their simulated timestamps."""
        return Notifications.model_validate(await self._call("POST", "/notifications/pull"))

    async def wait_for_notification(self, timeout: float) -> WaitResult:
        """Jump the simulated clock to the next event or notification, or by `timeout` simulated seconds.
        Returns at once when notifications are already waiting to be pulled."""
        body = {"timeout": timeout}
        return WaitResult.model_validate(await self._call("POST", "/wait_for_notification", body, slow=True))

    async def time(self) -> ClockState:
        return ClockState.model_validate(await self._call("GET", "/time"))

    async def pause_clock(self) -> float:
        """Stop the simulated clock (call before a model request); returns the simulated time."""
        return float((await self._call("POST", "/clock/pause"))["time"])

    async def resume_clock(
        self, mode: Literal["measured", "fixed"] = "measured", seconds: float | None = None
    ) -> ClockResumed:
        """Restart the clock, charging the think time: measured (the pause's wall time, or `seconds` if
        the caller measured it) or fixed (`seconds`)."""
        body: dict[str, Any] = {"mode": mode}
        if seconds is not None:
            body["seconds"] = seconds
        return ClockResumed.model_validate(await self._call("POST", "/clock/resume", body))

    async def send_message_to_user(self, content: str) -> TurnEnd:
        """AgentUserInterface__send_message_to_user: ends the agent's turn."""
        return TurnEnd.model_validate(await self._call("POST", "/message_to_user", {"content": content}, slow=True))

    async def finish(self) -> ValidationResult:
        """End the run and get ARE's verdict."""
        return ValidationResult.model_validate(await self._call("POST", "/finish", slow=True))

    async def run_are_agent(
        self,
        llm: dict[str, Any],
        *,
        think_time: float | None = None,
        timeout: float = 3600.0,
        max_iterations: int | None = None,
    ) -> AreAgentRun:
        """Run ARE's own default agent on the loaded scenario (agent mode) with `llm`, then judge it.

        Think time is measured per model call, or `think_time` simulated seconds each. The agent gets
        `timeout` wall seconds; on running out it is stopped and judged on what it did."""
        body: dict[str, Any] = {
            "llm": llm,
            "timeout": timeout,
            "think_time": {"mode": "measured"} if think_time is None else {"mode": "fixed", "seconds": think_time},
        }
        if max_iterations is not None:
            body["max_iterations"] = max_iterations
        read = timeout + self._slow_timeout  # the agent's own time, then judging
        return AreAgentRun.model_validate(await self._call("POST", "/are_agent", body, read_timeout=read))

    async def run_oracle(self) -> ValidationResult:
        """Run the loaded scenario's oracle events (load it with `oracle=True`) and get ARE's verdict."""
        return ValidationResult.model_validate(await self._call("POST", "/oracle", slow=True))
