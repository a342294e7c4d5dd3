"""The world client's own HTTP/1.1 (tasks/gaia2/world_client.py) against a real threaded HTTP server on the loopback,
in the ways a world process's server can answer: one kept-alive connection for every call, a connection the server
closed while it lay idle (a new one, the call not lost), `Connection: close`, a chunked body, no answer in time
(WorldTimeout), something that is not HTTP and a server that is gone (WorldDied). The real world's answers are
tests/test_gaia2_world.py's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest
from local_http import LocalHTTPServer

from labkube.tasks.gaia2 import WorldClient
from labkube.tasks.gaia2.world_client import WorldDied, WorldRequestError, WorldTimeout, world_address


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        owner: Served = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        owner.seen.append((self.command, self.path, self.client_address[1], body))
        if self.path == "/echo":
            self._reply(200, {"body": body})
        elif self.path == "/then-close":  # answered, then the connection closed as it lies idle
            self._reply(200, {"ok": True})
            self.close_connection = True
        elif self.path == "/close":
            self._reply(200, {"ok": True}, {"Connection": "close"})
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b'{"parts": ', b"[1, 2, 3]}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/missing":
            self._reply(409, {"error": "no scenario loaded"})
        elif self.path == "/slow":
            time.sleep(1.5)
            self._reply(200, {"late": True})
        elif self.path == "/not-http":
            self.wfile.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            self.close_connection = True

    do_GET = _handle
    do_POST = _handle


class Served:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int, Any]] = []
        self.server = LocalHTTPServer(self, Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.drop_connections()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    served = Served()
    yield served
    served.stop()


async def test_calls_share_one_kept_alive_connection_and_bodies_go_both_ways(served: Served) -> None:
    async with WorldClient(served.url) as client:
        assert await client._call("POST", "/echo", {"say": "é"}) == {"body": {"say": "é"}}
        assert await client._call("POST", "/echo") == {"body": None}
        assert await client._call("GET", "/echo") == {"body": None}
        assert await client._call("GET", "/chunked") == {"parts": [1, 2, 3]}
    assert [(method, body) for method, _, _, body in served.seen] == [
        ("POST", {"say": "é"}),
        ("POST", None),
        ("GET", None),
        ("GET", None),
    ]
    assert len({port for _, _, port, _ in served.seen}) == 1


async def test_a_connection_the_world_closed_is_replaced_and_the_next_call_is_not_lost(served: Served) -> None:
    async with WorldClient(served.url) as client:
        await client._call("GET", "/then-close")
        await asyncio.sleep(0.2)  # the world's close arrives while the connection lies idle
        assert await client._call("POST", "/echo", {"n": 1}) == {"body": {"n": 1}}
        await client._call("GET", "/close")
        assert await client._call("POST", "/echo", {"n": 2}) == {"body": {"n": 2}}
    ports = [port for _, _, port, _ in served.seen]
    assert ports[0] != ports[1] == ports[2] != ports[3]
    assert [body for _, path, _, body in served.seen if path == "/echo"] == [{"n": 1}, {"n": 2}]


async def test_an_error_status_is_a_request_error_and_the_connection_goes_on(served: Served) -> None:
    async with WorldClient(served.url) as client:
        with pytest.raises(WorldRequestError) as missing:
            await client._call("GET", "/missing")
        assert missing.value.status == 409 and missing.value.message == "no scenario loaded"
        assert await client._call("GET", "/echo") == {"body": None}
    assert len({port for _, _, port, _ in served.seen}) == 1


async def test_no_answer_in_time_is_a_timeout_and_the_late_answer_is_not_read_as_the_next(served: Served) -> None:
    async with WorldClient(served.url, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(WorldTimeout, match="did not answer GET /slow"):
            await client._call("GET", "/slow")
        assert time.monotonic() - started < 1.2
        assert await client._call("POST", "/echo", {"after": True}) == {"body": {"after": True}}


async def test_a_world_that_is_gone_or_not_http_died(served: Served) -> None:
    async with WorldClient(served.url) as client:
        with pytest.raises(WorldDied, match="not an HTTP response"):
            await client._call("GET", "/not-http")
        alive = False
        gone = WorldClient(served.url, timeout=0.3, is_alive=lambda: alive)
        with pytest.raises(WorldDied, match="timed out"):
            await gone._call("GET", "/slow")
        await gone.aclose()
    served.stop()
    async with WorldClient(served.url) as client:
        with pytest.raises(WorldDied, match="is gone"):
            await client._call("GET", "/echo")


async def test_a_world_named_by_host_name_is_reached_at_an_address_that_answers(served: Served) -> None:
    """`localhost` may resolve to ::1 first, where this server does not listen: the next address is tried."""
    async with WorldClient(served.url.replace("127.0.0.1", "localhost")) as client:
        assert await client._call("POST", "/echo", {"by": "name"}) == {"body": {"by": "name"}}


async def test_closing_the_client_fails_a_call_still_waiting_at_once(served: Served) -> None:
    """Another task's call in flight when the client closes (a session ending) fails as a world that ended would
    fail it, not after its read timeout."""
    client = WorldClient(served.url)
    waiting = asyncio.create_task(client._call("GET", "/slow"))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await client.aclose()
    with pytest.raises(WorldDied, match="GET /slow"):
        await waiting
    assert time.monotonic() - started < 1.0
    async with WorldClient(served.url) as again:  # the loop still hears from new connections
        assert await again._call("POST", "/echo", {"n": 3}) == {"body": {"n": 3}}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080",
        "http://localhost",
        "HTTP://World-Sidecar:9000/prefix/v1",
        "http://[::1]:7000",
        "http://[fe80::1%25eth0]:7000/x",
        "http://10.0.0.7:31000/a?b=c",
    ],
)
def test_a_world_address_is_read_as_urllib_reads_it(url: str) -> None:
    parts = urlsplit(url)
    assert world_address(url) == (parts.hostname, parts.port or 80, parts.netloc, parts.path)


@pytest.mark.parametrize(
    "url", ["https://127.0.0.1:8443", "127.0.0.1:8080", "http://:8080", "http://user@host:1", "http://host:port"]
)
def test_a_world_address_is_plain_http(url: str) -> None:
    with pytest.raises(ValueError, match="plain HTTP"):
        WorldClient(url)
