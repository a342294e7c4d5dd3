"""The run's outbound proxy: a `network: proxy` task's only way out of the sandbox, for HTTP and HTTPS.

A sandboxed command has no route of its own. For a task whose card says `network: proxy`, each command starts
behind `sandbox_relay.py forward` (agent/run_sandbox.py), whose port on the sandbox's own loopback is the command's
HTTP(S)_PROXY; the relay passes every connection on to this server's unix socket in `<run>/sandbox/sockets/`, here
in the harness, outside the sandbox. It answers two kinds of request:

- `CONNECT host:443` (an HTTPS tunnel): it sees the host, not the path; port 443 only.
- an absolute-URI request (`GET http://host/path`): it sees the whole URL; one request per connection, its `Host`
  header the URL's own (so a shared address cannot serve a blocked site by name), its body framed by Content-Length.

It refuses, with a 403 and a one-line reason, a URL (or, for CONNECT, a host) the task's blocked URLs match
(`agent/blocked_urls.py`, the rules the web tools apply), and a name that resolves to any address that is not a
public one: loopback (the host's Ray, the worlds' control ports, other runs' gateways), link-local (cloud metadata
at 169.254.169.254), private and other special ranges. It connects to the address it checked, never resolving the
name again. Every request, allowed or refused, is one record (`NetworkRecord`, a `{"type": "network"}` transcript
line): method, host, URL where it is known, status, bytes each way, duration. What it buffers is bounded (a request's
or response's head at 64 KiB, a chunk at a time in flight), and a tunnel with no byte either way for
`idle_timeout_s` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel

if TYPE_CHECKING:
    from labkube.agent.run_sandbox import ProxyRoute
    from labkube.task_card import TaskCard

from labkube.agent.blocked_urls import is_blocked
from labkube.agent.gateway.wire import unix_listener
from labkube.agent.transcript import JsonlLog, now_iso

__all__ = [
    "LOOPBACK_FOR_TESTS_VARIABLE",
    "NetworkRecord",
    "SandboxProxy",
    "loopback_allowed_for_tests",
    "refusal_of_address",
]

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

TUNNEL_PORTS = frozenset({443})  # CONNECT is for HTTPS: a tunnel to another port would be any TCP service
HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 300.0
MAX_CONNECTIONS = 256
# Test-only: tests/test_sandbox_network.py's server listens on the host's loopback (nothing here can listen on a
# public address), which the proxy refuses. This names exact loopback address:port pairs it may reach instead;
# anything but a loopback address is refused when read, so no setting opens cloud metadata or a private network.
LOOPBACK_FOR_TESTS_VARIABLE = "LABKUBE_PROXY_ALLOW_LOOPBACK_FOR_TESTS"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "host",
    }
)


class NetworkRecord(BaseModel):
    """One request through the proxy, as the transcript records it."""

    type: Literal["network"] = "network"
    ts: str
    method: str
    host: str
    port: int | None = None
    url: str | None = None  # the whole URL of a plain HTTP request; a tunnel's path is not seen
    allowed: bool
    status: int | None = None  # what the command was answered: the refusal's, 200 for a tunnel, the server's
    reason: str | None = None  # why it was refused, or why it failed
    address: str | None = None  # the address connected to
    bytes_up: int = 0
    bytes_down: int = 0
    duration_s: float = 0.0


class Refused(Exception):
    """The proxy's own answer, not a server's: a refusal (4xx, 503) or a server it could not reach (502, 504)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason

    @property
    def allowed(self) -> bool:
        """Whether the rules let the request through (and reaching the server then failed)."""
        return self.status in (502, 504)


class NoRequest(Exception):
    """The connection closed before it sent a request: nothing to answer or record."""


REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    411: "Length Required",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def refusal_of_address(ip: IPAddress) -> str | None:
    """Why the proxy never connects to `ip`, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if ip.is_private:
        return "a private address"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved or not ip.is_global:
        return "not a public address"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (a literal address is itself)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


def loopback_allowed_for_tests(value: str | None = None) -> frozenset[tuple[IPAddress, int]]:
    """The test-only allow-list (`LOOPBACK_FOR_TESTS_VARIABLE`): comma-separated `127.0.0.1:PORT` or `[::1]:PORT`."""
    text = os.environ.get(LOOPBACK_FOR_TESTS_VARIABLE, "") if value is None else value
    pairs: set[tuple[IPAddress, int]] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        split = urlsplit(f"//{item}")
        if split.hostname is None or split.port is None:
            raise ValueError(f"{LOOPBACK_FOR_TESTS_VARIABLE}: {item!r} is not ADDRESS:PORT")
        ip = ipaddress.ip_address(split.hostname)
        if not ip.is_loopback:
            raise ValueError(f"{LOOPBACK_FOR_TESTS_VARIABLE}: {item!r} is not a loopback address")
        pairs.add((ip, split.port))
    return frozenset(pairs)


@dataclass
class Request:
    """What the command asked for, as far as the proxy has read it."""

    method: str = "?"
    host: str = ""
    port: int | None = None
    url: str | None = None
    started: float = field(default_factory=time.monotonic)
    status: int | None = None
    address: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass
class Tunnel:
    """Bytes both ways between the command and the server until either closes or neither sends for `idle_s`."""

    request: Request
    idle_s: float
    last: float = field(default_factory=time.monotonic)

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upward: bool) -> None:
        while data := await reader.read(CHUNK):
            self.last = time.monotonic()
            writer.write(data)
            await writer.drain()  # at most a chunk and the transport's high-water mark held per direction
            if upward:
                self.request.bytes_up += len(data)
            else:
                self.request.bytes_down += len(data)
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()

    async def run(self, *pipes: Awaitable[None]) -> None:
        tasks = [asyncio.ensure_future(p) for p in pipes]
        try:
            pending = set(tasks)
            while pending:
                left = self.idle_s - (time.monotonic() - self.last)
                if left <= 0:
                    return
                done, pending = await asyncio.wait(pending, timeout=left)
                if any(t.exception() is not None for t in done if not t.cancelled()):
                    return
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class SandboxProxy:
    """The proxy of one run, on the unix socket at `path`. `record` takes each request's record (the harness appends
    it to the transcript). `resolver` and `allow_for_tests` are for tests: a name's addresses, and the exact loopback
    address:port pairs it may reach (`loopback_allowed_for_tests`)."""

    def __init__(
        self,
        path: Path,
        blocked_urls: Iterable[str],
        record: Callable[[NetworkRecord], None],
        *,
        resolver: Resolver = resolve,
        allow_for_tests: frozenset[tuple[IPAddress, int]] = frozenset(),
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        for ip, port in allow_for_tests:
            if not ip.is_loopback:
                raise ValueError(f"only loopback addresses may be allowed for tests, not {ip}:{port}")
        self.path = path
        self.blocked = list(blocked_urls)
        self.record = record
        self.resolver = resolver
        self.allow_for_tests = allow_for_tests
        self.idle_timeout_s = idle_timeout_s
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> SandboxProxy:
        self._server = await asyncio.start_unix_server(self._serve, sock=unix_listener(self.path), limit=HEAD_LIMIT)
        return self

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def close(self) -> None:
        """Stop listening, cut every connection and remove the socket."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._connections.clear()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        request = Request()
        try:
            if len(self._connections) > MAX_CONNECTIONS:
                raise Refused(503, f"more than {MAX_CONNECTIONS} connections through the proxy at once")
            await self._handle(reader, writer, request)
            self._log(request, allowed=True)
        except NoRequest:
            pass
        except Refused as refusal:
            request.status = refusal.status
            self._log(request, allowed=refusal.allowed, reason=refusal.reason)
            await answer(writer, refusal)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            self._log(request, allowed=request.status is not None, reason=f"{type(exc).__name__}: {exc}"[:300])
        except asyncio.CancelledError:
            self._log(request, allowed=request.status is not None, reason="cut when the run ended")
            raise
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            self._connections.discard(task)

    def _log(self, request: Request, allowed: bool, reason: str | None = None) -> None:
        line = NetworkRecord(
            ts=now_iso(),
            method=request.method,
            host=request.host,
            port=request.port,
            url=request.url,
            allowed=allowed,
            status=request.status,
            reason=reason,
            address=request.address,
            bytes_up=request.bytes_up,
            bytes_down=request.bytes_down,
            duration_s=round(time.monotonic() - request.started, 6),
        )
        try:
            self.record(line)
        except Exception as exc:  # a closed transcript at the very end: the request is over either way
            log.warning("the proxy could not record a request: %s", exc)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Request) -> None:
        try:
            head = await read_head(reader, HEAD_TIMEOUT_S, 431)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip():
                raise NoRequest from None
            raise Refused(400, "the connection closed within the request's head") from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise Refused(400, f"not an HTTP/1.x request line: {lines[0][:100]!r}")
        request.method, target = parts[0].upper(), parts[1]
        if request.method == "CONNECT":
            await self._tunnel(target, reader, writer, request)
        else:
            await self._forward(target, lines[1:], reader, writer, request)

    async def _tunnel(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Request
    ) -> None:
        host, port = host_and_port(target, None)
        request.host, request.port = host, port
        self._refuse_blocked(host, host)
        upstream_reader, upstream_writer = await self._connect(request, tunnel=True)
        try:
            request.status = 200
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            tunnel = Tunnel(request, self.idle_timeout_s)
            await tunnel.run(tunnel.pipe(reader, upstream_writer, True), tunnel.pipe(upstream_reader, writer, False))
        finally:
            upstream_writer.close()

    async def _forward(
        self,
        target: str,
        header_lines: list[str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: Request,
    ) -> None:
        split = urlsplit(target)
        if split.scheme.lower() != "http" or not split.hostname:
            raise Refused(400, f"the proxy takes CONNECT host:443 or an absolute http:// URL, not {target[:200]!r}")
        host, port = host_and_port(split.netloc.rpartition("@")[2], 80)
        path = split.path or "/"
        origin = f"{path}?{split.query}" if split.query else path
        request.host, request.port = host, port
        request.url = f"http://{host}{'' if port == 80 else f':{port}'}{origin}"
        self._refuse_blocked(host, f"http://{host}{origin}")
        headers, length, continues = request_headers(header_lines)
        upstream_reader, upstream_writer = await self._connect(request, tunnel=False)
        try:
            authority = host if port == 80 else f"{host}:{port}"
            if ":" in host:
                authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
            head = [f"{request.method} {origin} HTTP/1.1", f"Host: {authority}", *headers, "Connection: close"]
            sent = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
            upstream_writer.write(sent)
            request.bytes_up += len(sent)
            if continues:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.bytes_up += await copy_exactly(reader, upstream_writer, length)
            await upstream_writer.drain()
            try:
                response = await read_head(upstream_reader, self.idle_timeout_s, 502)
            except asyncio.IncompleteReadError:
                raise Refused(502, f"{host} closed the connection without an answer") from None
            status_line, *response_lines = response.decode("latin-1").split("\r\n")
            with contextlib.suppress(IndexError, ValueError):
                request.status = int(status_line.split(" ")[1])
            kept = [line for line in response_lines if line and header_name(line) not in HOP_BY_HOP]
            out = ("\r\n".join([status_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
            writer.write(out)
            request.bytes_down += len(out)
            tunnel = Tunnel(request, self.idle_timeout_s)
            await tunnel.run(tunnel.pipe(upstream_reader, writer, False))
        finally:
            upstream_writer.close()

    def _refuse_blocked(self, host: str, url: str) -> None:
        for candidate in dict.fromkeys((url, unquote(url), host)):
            pattern = is_blocked(candidate, self.blocked)
            if pattern:
                raise Refused(403, f"{candidate} is blocked for this task (matches {pattern!r})")

    async def _connect(self, request: Request, tunnel: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the request's host, at an address checked first: every address the name resolves to must
        be public (or on the test allow-list), and the one connected to is one of those, not a second lookup's."""
        host, port = request.host, request.port
        assert port is not None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                addresses = await self.resolver(host, port)
        except (OSError, UnicodeError, ValueError) as exc:
            raise Refused(502, f"cannot resolve {host}: {exc}") from None
        except TimeoutError:
            raise Refused(504, f"resolving {host} took over {CONNECT_TIMEOUT_S:g}s") from None
        if not addresses:
            raise Refused(502, f"{host} resolves to no address")
        for ip in addresses:
            if (ip, port) in self.allow_for_tests:
                continue
            why = refusal_of_address(ip)
            if why is not None:
                named = host if host == str(ip) else f"{host} ({ip})"
                raise Refused(403, f"{named} is {why}; the proxy reaches public addresses only")
        if tunnel and port not in TUNNEL_PORTS and not all((ip, port) in self.allow_for_tests for ip in addresses):
            raise Refused(403, f"CONNECT to port {port}: tunnels are for HTTPS, port 443 only")
        failures = []
        for ip in addresses:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    connection = await asyncio.open_connection(str(ip), port, limit=HEAD_LIMIT)
            except (OSError, TimeoutError) as exc:
                failures.append(f"{ip}: {exc or type(exc).__name__}")
                continue
            request.address = str(ip)
            return connection
        raise Refused(502, f"cannot connect to {host}:{port} ({'; '.join(failures)[:200]})")


def host_and_port(authority: str, default_port: int | None) -> tuple[str, int]:
    """`host:port` or `[v6]:port` (the port `default_port` where it may be left out), the host lower-case and without
    a trailing dot (so `Blocked.Example.` is matched as `blocked.example`)."""
    try:
        split = urlsplit(f"//{authority}")
        host, port = split.hostname, split.port
    except ValueError:
        raise Refused(400, f"not a host:port: {authority[:200]!r}") from None
    port = port if port is not None else default_port
    if not host or port is None or not 0 < port < 65536:
        raise Refused(400, f"not a host:port: {authority[:200]!r}")
    return host.lower().rstrip("."), port


def header_name(line: str) -> str:
    return line.partition(":")[0].strip().lower()


def request_headers(lines: list[str]) -> tuple[list[str], int, bool]:
    """The headers passed on (no hop-by-hop ones, no `Host`: the URL's is sent), the body's length, and whether the
    command waits for `100 Continue` (answered here: the body is sent on at once)."""
    kept, length, continues = [], 0, False
    named_hop_by_hop = {  # what a Connection header lists is hop-by-hop too
        token.strip().lower()
        for line in lines
        if header_name(line) in ("connection", "proxy-connection")
        for token in line.partition(":")[2].split(",")
    }
    for line in lines:
        if not line:
            continue
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "transfer-encoding":
            raise Refused(411, "a request body must have a Content-Length (no chunked uploads through the proxy)")
        if name == "content-length":
            if not value.isdigit():
                raise Refused(400, f"bad Content-Length: {value[:50]!r}")
            length = int(value)
        if name == "expect" and value.lower() == "100-continue":
            continues = True
        if name not in HOP_BY_HOP and name not in named_hop_by_hop:
            kept.append(line)
    return kept, length, continues


async def read_head(reader: asyncio.StreamReader, timeout_s: float, too_large: int) -> bytes:
    """A request's or response's head, up to its blank line: at most HEAD_LIMIT bytes (else a `too_large` answer),
    within `timeout_s` (a request's) or a gateway timeout (a server's)."""
    try:
        async with asyncio.timeout(timeout_s):
            head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise Refused(too_large, f"a head over {HEAD_LIMIT // 1024} KiB") from None
    except TimeoutError:
        status = 400 if too_large == 431 else 504
        raise Refused(status, f"no complete head within {timeout_s:g}s") from None
    return head[:-4]


async def copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> int:
    left = length
    while left > 0:
        data = await reader.read(min(CHUNK, left))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        writer.write(data)
        await writer.drain()
        left -= len(data)
    return length


async def answer(writer: asyncio.StreamWriter, refusal: Refused) -> None:
    body = f"labkube proxy: {refusal.reason}\n".encode()
    head = (
        f"HTTP/1.1 {refusal.status} {REASONS.get(refusal.status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError, RuntimeError):
        writer.write(head.encode() + body)
        await asyncio.wait_for(writer.drain(), 5.0)


async def start_proxy(route: ProxyRoute | None, card: TaskCard, transcript: JsonlLog) -> SandboxProxy | None:
    """The proxy of a `network: proxy` task's sandboxed run (rg-agent's commands, a vendor CLI), at the socket its
    room's relay forwards to (`route`); every request it sees is a `network` line of the transcript. None where the
    room has no proxy (`network: none`, or an unsandboxed run, which has the host's network)."""
    if route is None:
        return None

    def record(line: NetworkRecord) -> None:
        transcript.append(line.model_dump(mode="json"))

    proxy = SandboxProxy(route.socket, card.blocked_urls, record, allow_for_tests=loopback_allowed_for_tests())
    return await proxy.start()
