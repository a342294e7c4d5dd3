"""HTTP/1.1 for the gateway's calls, on asyncio's protocols, with httptools (llhttp, in C, as uvicorn uses it) doing
the parsing: the agent's side (`HttpServer`, one `Reply` a request) and the provider's (`UpstreamPool`, connections
kept for the next call).

Why not aiohttp's server and client: a run's gateway is one event loop, so the calls of a burst (a CLI's subagents)
are worked through one after another, and each waits for the CPU of those before it. aiohttp's request machinery
(the application, router and request objects, the client's session, connector, request and response objects,
their timers) cost 1.3-1.9 ms of CPU a call, most of what the gateway added at 16 calls at once
(docs/third-party-agents.md, "Against the target"). Here a call costs the parsing and a few writes. A streamed
answer is passed on as its chunks arrive, re-framed for the agent's connection, from the provider connection's own
callback (`UpstreamResponse.relay`): a chunk wakes no task.

What it does not do, because neither side needs it: HTTP/2, proxies, cookies, redirects, trailers, upgrades. The
provider is asked for an uncompressed answer (a server that compresses anyway is decompressed for gzip and
deflate), so the gateway can read its usage; the agent gets it uncompressed, as it did from aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import json
import logging
import os
import socket
import ssl
import stat
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httptools

# A request head past this size is refused (431), as aiohttp's server refused one past 8 KB a line.
MAX_HEAD_BYTES = 64 * 1024
# What the bodies of all the requests a server holds (arriving, waiting, being answered) may add up to: past it, a
# request is refused (503, retried by the SDKs) rather than held, so that N agents' connections cannot take the
# gateway's memory (a pod's sidecar has 512 Mi) however slowly they send.
MAX_HELD_BYTES = 128 * 1024 * 1024
# A streamed answer the agent does not read fast enough is buffered up to this before the provider's socket waits.
UPSTREAM_BUFFER_BYTES = 1024 * 1024

log = logging.getLogger(__name__)


class UpstreamBroke(ConnectionError):
    """The provider's connection ended, or spoke something other than HTTP/1.1, before its answer was whole."""


class AgentClosed(ConnectionResetError):
    """The agent closed its connection before its answer was sent."""


class AgentStalled(AgentClosed):
    """The agent read nothing of a stream for the call's time-out: the gateway gives the stream up."""


@dataclass(slots=True)
class Request:
    """One request from an agent: header names lower-cased (a repeated header's values joined by ", "), the query as
    it came (without its "?")."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Request, "Reply"], Awaitable[None]]
# Asked with a request's method, path and headers once its head has arrived, before a byte of its body is read:
# None admits it; a refusal (status, JSON body) is sent and the connection closed with the body unread.
Admit = Callable[[str, str, dict[str, str]], tuple[int, bytes] | None]


def _header_dict(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Header names lower-cased, a repeated header's values joined by ", " (RFC 9110, 5.3)."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}
    if len(headers) != len(raw):
        headers = {}
        for name, value in raw:
            key, text = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


def _head(first_line: bytes, headers: Mapping[str, str], framing: str) -> bytes:
    lines = [first_line]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines.append(framing.encode("latin-1"))
    lines.append(b"\r\n")
    return b"".join(lines)


class Reply:
    """The answer to one request: `send` a whole one, or `start` a streamed one, `push` its chunks and `end` it.
    `push` says when the agent's socket is full (then wait for `drained`) and raises `AgentClosed` once the agent has
    gone."""

    __slots__ = ("_connection", "_keep_alive", "ended", "started")

    def __init__(self, connection: _AgentConnection, keep_alive: bool) -> None:
        self._connection = connection
        self._keep_alive = keep_alive
        self.started = False
        self.ended = False

    def _framing(self, framing: str) -> str:
        return framing if self._keep_alive else framing + "connection: close\r\n"

    def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        assert not self.started, "a reply is sent once"
        self.started = self.ended = True
        if self._connection.closed:
            return
        head = _head(_status_line(status), headers, self._framing(f"content-length: {len(body)}\r\n"))
        self._connection.transport.writelines((head, body))

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        assert not self.started, "a reply is started once"
        self.started = True
        if not self._connection.closed:
            head = _head(_status_line(status), headers, self._framing("transfer-encoding: chunked\r\n"))
            self._connection.transport.write(head)

    def push(self, data: bytes) -> bool:
        """One chunk of a streamed answer, written at once: True when the agent's socket is full (wait for `drained`
        before more)."""
        connection = self._connection
        if connection.closed:
            raise AgentClosed("the agent closed the connection")
        if data:
            connection.transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        return connection.write_paused

    async def drained(self) -> None:
        """Once the agent's socket has room (at once if it has); `AgentClosed` if the agent has gone."""
        connection = self._connection
        if connection.closed:
            raise AgentClosed("the agent closed the connection")
        if connection.write_paused:
            await connection.drained()

    def end(self) -> None:
        if not self.ended and not self._connection.closed:
            self._connection.transport.write(b"0\r\n\r\n")
        self.ended = True


class _AgentConnection(asyncio.Protocol):
    """One agent's connection: requests parsed as they arrive, answered one after another by the server's handler."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.closed = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.waiting: deque[tuple[Request, bool]] = deque()
        self.task: asyncio.Task[None] | None = None
        self._refusal: tuple[int, str] | None = None
        self._refusal_body: bytes | None = None  # the admission's own answer (`Admit`), else a one-line error
        self._start_message()

    def _start_message(self) -> None:
        self._url = b""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0  # counted in the server's `held` until the request's answer ends (`_release`)

    # -- asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.task is None:  # else `_serve` lets go of what its requests hold as it ends
            self._release_all()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(AgentClosed("the agent closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    async def drained(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    def data_received(self, data: bytes) -> None:
        self.server.received += len(data)
        if self._refusal is not None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            self._refuse(*(self._refusal or (400, f"malformed HTTP request: {exc}")))

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be served: answered with `status` (unless an answer is under way) and the
        connection closed."""
        self._refusal = (status, message)
        if self.task is None:
            body = self._refusal_body or json.dumps({"error": f"labkube gateway: {message}"}).encode()
            Reply(self, keep_alive=False).send(status, {"content-type": "application/json"}, body)
        self.transport.close()

    # -- httptools' callbacks
    def on_message_begin(self) -> None:
        self._start_message()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refusal = (431, "request head too large")
            raise ValueError("head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refusal = (431, "request head too large")
            raise ValueError("head too large")
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers = _header_dict(self._raw_headers)
        admit = self.server.admit
        if admit is not None:  # before the body: a caller without the run's token never has one read or held
            try:
                path = httptools.parse_url(self._url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                self._refusal = (400, "malformed request target")
                raise
            refused = admit(self.parser.get_method().decode("latin-1"), path.decode("latin-1"), self._headers)
            if refused is not None:
                self._refusal, self._refusal_body = (refused[0], "refused"), refused[1]
                raise ValueError("not admitted")
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._refusal = (413, f"request body over {self.server.max_body} bytes")
            raise ValueError("body too large")
        if self._headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._body_bytes + len(body) > self.server.max_body:
            self._refusal = (413, f"request body over {self.server.max_body} bytes")
            raise ValueError("body too large")
        server = self.server
        if server.held + len(body) > server.max_held:
            self._refusal = (503, f"the gateway holds {server.max_held} bytes of request bodies already; try again")
            raise ValueError("too much held")
        self._body_bytes += len(body)
        server.held += len(body)
        self._body.append(body)

    def on_message_complete(self) -> None:
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:
            self._refusal = (400, "malformed request target")
            raise
        request = Request(
            method=self.parser.get_method().decode("latin-1"),
            path=url.path.decode("latin-1") if url.path else "/",
            query=url.query.decode("latin-1") if url.query else "",
            headers=self._headers,
            body=b"".join(self._body),  # one piece: that piece itself, not a copy
        )
        self._body, self._body_bytes = [], 0  # held now as the waiting request's body
        self.waiting.append((request, self.parser.should_keep_alive()))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    def _release_all(self) -> None:
        """What this connection's requests still hold of the server's `held`: the one arriving and those waiting."""
        self.server.held -= self._body_bytes + sum(len(request.body) for request, _ in self.waiting)
        self._body_bytes = 0
        self._body = []
        self.waiting.clear()

    async def _serve(self) -> None:
        try:
            while self.waiting and not self.closed:
                request, keep_alive = self.waiting.popleft()
                reply = Reply(self, keep_alive)
                try:
                    await self.server.handler(request, reply)
                except Exception:
                    log.exception("labkube gateway: %s %s failed", request.method, request.path)
                    if not reply.started:
                        body = b'{"error": "labkube gateway: internal error"}'
                        reply.send(500, {"content-type": "application/json"}, body)
                    else:
                        self.transport.close()
                        return
                finally:
                    self.server.held -= len(request.body)
                if not reply.ended:  # a stream that broke off: the agent sees it end without its last chunk
                    self.transport.close()
                    return
                if not keep_alive:
                    self.transport.close()
                    return
        finally:
            self.task = None
            if self.closed:  # gone while this ran: what its other requests held (`connection_lost` left it here)
                self._release_all()


def unix_listener(path: Path) -> socket.socket:
    """A listening unix socket at `path`, whatever its length: bound through the folder's descriptor
    (`/proc/self/fd/N/name`) where the path is over the 107 bytes of `sun_path` (a run folder deep in a campaign's).
    What an earlier attempt left there, a stale socket or a link in its place, is replaced."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(path)) < 108:
            sock.bind(str(path))
        else:
            folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{folder}/{path.name}")
            finally:
                os.close(folder)
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    """Serves `handler` on host:port (`start` answers the port it bound) and on any unix sockets (`start_unix`: a
    sandboxed agent's way in). `close` stops listening, closes idle connections, gives the requests being answered
    `grace_s` to finish, then cuts them.

    `admit` (the gateway's token check) sees each request's head before its body is read; `max_body` bounds one
    request's body (413) and `max_held` what all the connections' requests hold together (503). `received` counts
    the bytes read from agents, `held` the bodies held now."""

    def __init__(
        self, handler: Handler, max_body: int, admit: Admit | None = None, max_held: int = MAX_HELD_BYTES
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.admit = admit
        self.max_held = max_held
        self.held = 0
        self.received = 0
        self.connections: set[_AgentConnection] = set()
        self._servers: list[asyncio.Server] = []

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _AgentConnection(self), host, port)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def start_unix(self, sock: socket.socket) -> None:
        """Serve on a unix socket already bound and listening (its path may be longer than `sun_path` allows, so the
        caller binds it)."""
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(lambda: _AgentConnection(self), sock=sock))

    async def close(self, grace_s: float) -> None:
        if not self._servers:
            return
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            if connection.task is None:
                connection.transport.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for connection in list(self.connections):
            connection.transport.abort()
            if connection.task is not None:
                connection.task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers = []


# -- the provider's side


class _UpstreamConnection(asyncio.Protocol):
    """One connection to the provider, one request at a time; the answer's body is buffered as it arrives."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.closed = False
        self.start_answer(reused=False)

    def start_answer(self, reused: bool) -> None:
        """Ready for the answer to the next request (`reused`: this connection has answered one before)."""
        self.reused = reused
        self.idle = False
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] = {}
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
        self._wake: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.sink: Callable[[bytes], None] | None = None  # the body handed on as it arrives (`UpstreamResponse.relay`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head.done() and not self.complete:
            close_delimited = "content-length" not in self.headers and "chunked" not in self.headers.get(
                "transfer-encoding", ""
            )
            if close_delimited and exc is None:
                self.complete = True  # llhttp ends such a body only at the connection's end, which this is
            else:
                self.error = UpstreamBroke(f"the provider closed the connection mid-answer ({exc or 'EOF'})")
        elif not self.head.done():
            why = f"the provider closed the connection without answering ({exc or 'EOF'})"
            self.head.set_exception(UpstreamBroke(why))
            self.head.exception()  # retrieved here: a caller that timed out no longer waits for it
        self._notify()

    def data_received(self, data: bytes) -> None:
        if self.idle:  # bytes no request asked for: whatever they are, the connection cannot carry the next
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            broke = UpstreamBroke(f"the provider's answer is not HTTP/1.1: {exc}")
            if not self.head.done():
                self.head.set_exception(broke)
                self.head.exception()
            else:
                self.error = broke
            self.transport.close()
            self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers = _header_dict(self.raw_headers)
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            return self.sink(body)
        self.hold(body)
        self._notify()

    def hold(self, body: bytes) -> None:
        """Keep a piece of the body until it is taken; past `UPSTREAM_BUFFER_BYTES`, read no more until then."""
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > UPSTREAM_BUFFER_BYTES and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def take(self) -> bytes:
        """What is held of the body (b"" if nothing), and the provider read again while it is handed on."""
        data = b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self._reading_paused:
            self._reading_paused = False
            if not self.closed:
                self.transport.resume_reading()
        return data

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._notify()

    async def next_chunk(self) -> bytes | None:
        """What has arrived of the body since the last call (None: the body is whole); waits for more."""
        while True:
            if self.body:
                return self.take()
            if self.error is not None:
                raise self.error
            if self.complete:
                return None
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None


class UpstreamResponse:
    """The provider's answer: `status`, `headers` (names lower-cased), then `read()` the body or `relay` it to the
    agent. `release()` (always) keeps the connection for the next call if the answer was read to its end."""

    def __init__(self, connection: _UpstreamConnection, pool: UpstreamPool, key: tuple[str, str, int]) -> None:
        self._connection, self._pool, self._key = connection, pool, key
        self.status = connection.status
        self.headers = connection.headers
        encoding = self.headers.get("content-encoding", "").strip().lower()
        self._decoder = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in encoding else 32))
            self.headers.pop("content-encoding")
        self._released = False

    @property
    def arrived(self) -> bool:
        """The whole answer is here (most answers come with their head): reading it waits for nothing."""
        return self._connection.complete

    def _decoded(self, data: bytes) -> bytes:
        if self._decoder is None:
            return data
        try:
            return self._decoder.decompress(data)
        except zlib.error as exc:
            raise UpstreamBroke(f"the provider's compressed answer is corrupt: {exc}") from None

    async def relay(self, reply: Reply, seen: Callable[[bytes], None], silence_s: float) -> None:
        """The body to the agent as it arrives, each piece passed to `seen` first, from the connection's own callback:
        no task is woken, no future made, a piece. Returns once the body is whole. Raises `AgentClosed` once the
        agent has gone, `AgentStalled` once its socket has stayed full for `silence_s`, the provider's error if it
        broke off, and `TimeoutError` once the provider has sent nothing for `silence_s`. While the agent's socket
        is full, what arrives is held here (up to `UPSTREAM_BUFFER_BYTES`, then reading from the provider waits)
        and handed on at once when the socket has room."""
        connection = self._connection
        loop = asyncio.get_running_loop()
        last = [loop.time()]  # when the last piece came
        stopped: list[BaseException] = []  # what ended the relay from inside the callback
        full = [False]  # the agent's socket is: pieces wait in `connection.body` for the relay's task

        def hand_on(data: bytes) -> None:
            if stopped or not data:
                return
            last[0] = loop.time()
            if full[0]:
                return connection.hold(data)
            try:
                if data := self._decoded(data):
                    seen(data)
                    full[0] = reply.push(data)
            except (AgentClosed, UpstreamBroke) as exc:
                stopped.append(exc)
            if full[0] or stopped:
                connection._notify()

        hand_on(connection.take())  # what came before the relay began
        connection.sink = hand_on
        try:
            while True:
                if stopped:
                    raise stopped[0]
                if full[0]:
                    try:
                        async with asyncio.timeout(silence_s):
                            await reply.drained()
                    except TimeoutError:
                        raise AgentStalled(f"the agent read nothing of the stream for {silence_s:g} s") from None
                    full[0] = False
                    hand_on(connection.take())
                    continue
                if connection.error is not None:
                    raise connection.error
                if connection.complete:
                    return
                remaining = last[0] + silence_s - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"the provider sent nothing for {silence_s:g} s")
                connection._wake = wake = loop.create_future()
                timer = loop.call_later(remaining, connection._notify)  # one timer a wait, not a piece
                try:
                    await wake
                finally:
                    timer.cancel()
                    connection._wake = None
        finally:
            connection.sink = None

    async def read(self) -> bytes:
        pieces = []
        while (data := await self._connection.next_chunk()) is not None:
            pieces.append(self._decoded(data))
        return b"".join(pieces)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        connection = self._connection
        if connection.complete and connection.keep_alive and not connection.closed and connection.error is None:
            self._pool.keep(self._key, connection)
        else:
            connection.transport.close()


@functools.lru_cache(maxsize=64)
def _split_url(url: str) -> tuple[tuple[str, str, int], str, str, str]:
    """A provider URL's connection key (scheme, host, port), its Host header, path and query."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamBroke(f"not an http(s) URL: {url}")
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 literal in brackets
    host = name if port == default else f"{name}:{port}"
    return (scheme, parts.hostname, port), host, parts.path or "/", parts.query


@dataclass(slots=True)
class Sent:
    """Whether the last try of a `request` wrote the request to the provider (a refused connection did not)."""

    value: bool = False


class UpstreamPool:
    """Connections to the providers, kept alive between calls (TLS for https URLs, with the system's CAs)."""

    def __init__(self, connect_timeout_s: float = 30.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, str, int], list[_UpstreamConnection]] = {}
        self._ssl: ssl.SSLContext | None = None

    def keep(self, key: tuple[str, str, int], connection: _UpstreamConnection) -> None:
        connection.idle = True
        self._idle.setdefault(key, []).append(connection)

    async def _connection(self, key: tuple[str, str, int]) -> _UpstreamConnection:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed and not connection.transport.is_closing():
                connection.start_answer(reused=True)
                return connection
        scheme, host, port = key
        tls = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                _UpstreamConnection, host, port, ssl=tls, server_hostname=host if tls else None
            )
        return connection

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, query: str = "", sent: Sent | None = None
    ) -> UpstreamResponse:
        """Send one request and wait for the head of its answer. Raises OSError (`UpstreamBroke`, a refused or
        timed-out connection, TLS) where no answer came; `sent` says whether the request had reached the provider."""
        key, host, target, url_query = _split_url(url)
        if query or url_query:
            target += "?" + "&".join(q for q in (url_query, query) if q)
        fields = {"host": host, **headers, "accept-encoding": "identity"}
        framing = f"content-length: {len(body)}\r\n" if body or method in ("POST", "PUT", "PATCH") else ""
        head = _head(f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), fields, framing)
        sent = sent or Sent()
        while True:
            sent.value = False
            connection = await self._connection(key)
            try:
                connection.transport.writelines((head, body) if body else (head,))
                sent.value = True
                await connection.head
                if method == "HEAD":  # its answer has no body, whatever its head says; llhttp cannot be told so
                    connection.complete, connection.keep_alive = True, False
            except UpstreamBroke:
                connection.transport.close()
                if connection.reused:  # the provider closed it while it was idle: once more, on a new one
                    continue
                raise
            except BaseException:
                connection.transport.close()
                raise
            return UpstreamResponse(connection, self, key)

    def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.transport.close()
        self._idle.clear()
