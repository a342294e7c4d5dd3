"""The gateway's HTTP/1.1 at the socket (agent/gateway/wire.py): what real clients and providers put on the wire and
the SDK-level tests never produce. The agent's side is driven with raw bytes and `http.client`; the provider's side
is a server written at the socket (`RawProvider`), so each test sends exactly the framing it names (chunked,
gzip, close-delimited, cut off, not HTTP), and one over TLS with a CA of its own. No fake here is more lenient than
a real peer: each speaks plain HTTP/1.1 or breaks it on purpose."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import anthropic
import pytest
from fakellm import FakeLLM, Reply
from fakellm import Usage as FakeUsage
from k8s.tls import make_tls
from raynodes import free_port

from labkube.agent.gateway import GatewayConfig, ModelGateway, Upstream
from labkube.agent.gateway.proxy import CLOSE_GRACE_S
from labkube.agent.gateway.wire import MAX_HEAD_BYTES, HttpServer, Request
from labkube.agent.gateway.wire import Reply as WireReply
from labkube.agent.transcript import JsonlLog, read_jsonl

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "done"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 5},
}
BODY = json.dumps(MESSAGE).encode()
CALL = {"model": "claude-sonnet-4-6", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}

Act = Callable[[int, asyncio.StreamWriter], Awaitable[bool]]


class RawProvider:
    """A provider at the socket: reads each request (its head and Content-Length body) and lets `act(n, writer)`
    answer the n-th request overall, byte for byte; `act` says whether the connection stays open."""

    def __init__(self, act: Act) -> None:
        self.act = act
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                if not await self.act(len(self.requests), writer):
                    return
        finally:
            writer.close()
            self.handlers.discard(task)

    async def start(self, tls: object = None) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)  # type: ignore[arg-type]
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.handlers):
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", "content-type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def gateway(base_url: str, tmp_path: Path, **config: object) -> ModelGateway:
    cfg = GatewayConfig(
        anthropic=Upstream(base_url=base_url, api_key="sk-real"),
        provider_prefix="anthropic",
        base_delay_s=0.01,
        **config,  # type: ignore[arg-type]
    )
    return ModelGateway(cfg, transcript=JsonlLog(tmp_path / "transcript.jsonl"), state_path=tmp_path / "gateway.json")


async def sdk_call(gw: ModelGateway) -> anthropic.types.Message:
    client = anthropic.AsyncAnthropic(api_key=gw.config.token, base_url=gw.anthropic_base_url, max_retries=0)
    async with client:
        return await client.messages.create(**CALL)  # type: ignore[arg-type]


async def raw_exchange(url: str, data: bytes | list[bytes], read_until_close: bool = True) -> bytes:
    """Bytes to the gateway over one connection (a list: sent one after another, each after the gateway's answer
    to the one before begins); what came back."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        out = b""
        for i, piece in enumerate(data if isinstance(data, list) else [data]):
            writer.write(piece)
            await writer.drain()
            if i < (len(data) - 1 if isinstance(data, list) else 0):
                out += await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        out += await asyncio.wait_for(reader.read(-1) if read_until_close else reader.read(65536), 10)
        return out
    finally:
        writer.close()


# -- the agent's side


async def test_a_chunked_body_sent_after_100_continue_reaches_the_provider_whole(tmp_path: Path) -> None:
    """curl sends a large body this way (`Expect: 100-continue`, then chunks); the gateway must say Continue, or
    the client waits a second before sending anyway, and join the chunks into the provider's Content-Length body."""
    with FakeLLM() as server:
        server.script(Reply.text("joined", usage=FakeUsage(input=7, output=3)))
        async with gateway(server.base_url, tmp_path) as gw:
            body = json.dumps(CALL).encode()
            head = (
                "POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"x-api-key: {gw.config.token}\r\nanthropic-version: 2023-06-01\r\ntransfer-encoding: chunked\r\n"
                "expect: 100-continue\r\nconnection: close\r\n\r\n"
            ).encode()
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:20], body[20:])) + b"0\r\n\r\n"
            started = time.monotonic()
            out = await raw_exchange(gw.url, [head, chunks])
        seen = server.requests
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), out[:200]
    assert time.monotonic() - started < 1
    assert json.loads(out.split(b"\r\n\r\n", 2)[2])["content"][0]["text"] == "joined"
    assert len(seen) == 1 and seen[0].body == CALL
    (line,) = read_jsonl(tmp_path / "transcript.jsonl")
    assert line["usage"]["input"] == 7 and line["usage"]["output"] == 3


async def test_an_agents_connection_carries_one_call_after_another_until_it_asks_to_close(tmp_path: Path) -> None:
    with FakeLLM() as server:
        async with gateway(server.base_url, tmp_path) as gw:
            host, port = gw.url.removeprefix("http://").split(":")

            def calls() -> tuple[list[tuple[int, str | None]], list[object]]:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                headers = {"x-api-key": gw.config.token, "content-type": "application/json"}
                seen, sockets = [], []
                for close in (False, False, True):
                    extra = {"connection": "close"} if close else {}
                    conn.request("POST", "/anthropic/v1/messages", json.dumps(CALL), {**headers, **extra})
                    sockets.append(conn.sock)
                    response = conn.getresponse()
                    response.read()
                    seen.append((response.status, response.getheader("connection")))
                sockets.append(conn.sock)  # http.client drops a socket its server said it closes
                return seen, sockets

            seen, sockets = await asyncio.to_thread(calls)
    assert seen == [(200, None), (200, None), (200, "close")]
    assert sockets[0] is sockets[1] is sockets[2] is not None and sockets[3] is None
    assert len(read_jsonl(tmp_path / "transcript.jsonl")) == 3


async def test_a_request_that_cannot_be_served_gets_a_one_line_error_and_the_connection_closed(tmp_path: Path) -> None:
    async def echo(request: Request, reply: WireReply) -> None:
        reply.send(200, {"content-type": "text/plain"}, request.body)

    server = HttpServer(echo, max_body=100)
    port = await server.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        ok = await raw_exchange(url, b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi")
        assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b"\r\n\r\nhi")
        garbage = await raw_exchange(url, b"this is not HTTP\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"malformed HTTP request" in garbage
        big_head = b"GET /x HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n"
        assert (await raw_exchange(url, big_head)).startswith(b"HTTP/1.1 431 ")
        over = await raw_exchange(url, b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 101\r\n\r\n" + b"a" * 101)
        assert over.startswith(b"HTTP/1.1 413 ") and b"request body over 100 bytes" in over
        chunked_over = b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + b"65\r\n" + b"a" * 101
        assert (await raw_exchange(url, chunked_over + b"\r\n0\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
    finally:
        await server.close(grace_s=1)


def _unauthenticated_upload(host: str, port: int, path: str, total: int) -> tuple[bytes, int]:
    """A client without the run's token that announces a `total`-byte body, reads what the gateway answers to the
    head, then pushes the body in 1 MiB pieces until the gateway's closing of the connection stops it: the answer, and
    how many body bytes it got into the socket."""
    chunk = b"a" * (1 << 20)
    with socket.create_connection((host, port), timeout=10) as sock:
        head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {total}\r\n\r\n"
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        sent = 0
        try:
            while sent < total:
                sent += sock.send(chunk)
                time.sleep(0.001)
        except OSError:  # the gateway closed it: EPIPE or ECONNRESET
            pass
    return answer, sent


async def test_a_caller_without_the_token_is_refused_from_its_head_and_none_of_its_body_is_held(tmp_path: Path) -> None:
    """Issue 41: bodies used to be buffered (up to 64 MiB a connection) before the token was checked, so anything on
    a pod's loopback could fill the sidecar's memory with unfinished uploads. Five callers at once, each announcing
    a 64 MiB body (to a model route, the checkpoint, an unknown path, even the open `/healthz`), get 401 from the
    head alone, and the gateway reads next to nothing of their bodies; a bodiless `GET /healthz` still answers."""
    total = 64 * 1024 * 1024
    async with gateway("http://127.0.0.1:9", tmp_path) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        paths = ["/anthropic/v1/messages", "/openai/v1/responses", "/checkpoint", "/anywhere", "/healthz"]
        results = await asyncio.gather(
            *(asyncio.to_thread(_unauthenticated_upload, host, int(port), path, total) for path in paths)
        )
        server = gw._server
        assert server is not None
        received, held = server.received, server.held
        health = await raw_exchange(gw.url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    for path, (answer, sent) in zip(paths, results, strict=True):
        assert answer.startswith(b"HTTP/1.1 401 "), (path, answer[:200])
        assert b"connection: close" in answer and b"wrong or missing run token" in answer
        assert sent < total, f"{path}: the whole body went into a connection the gateway had refused"
    assert answer_type(results[0][0]) == "authentication_error"  # in the Anthropic API's own words
    assert health.startswith(b"HTTP/1.1 200 OK"), health
    # The heads, and at most what arrived with them in one read: not the 320 MiB announced.
    assert received < 5 * 1024 * 1024, received
    assert held == 0


def answer_type(answer: bytes) -> str:
    return str(json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"])


async def test_the_bodies_held_across_connections_are_bounded_and_let_go_when_answered(tmp_path: Path) -> None:
    """Callers with the token are bounded too: one body over `max_body` is a 413, and past `max_held` held across
    all connections (slow uploads that have not finished) a request is refused 503, which the SDKs retry. What a
    request held is let go once it is answered or its connection goes."""
    seen: list[int] = []

    async def echo(request: Request, reply: WireReply) -> None:
        seen.append(len(request.body))
        reply.send(200, {"content-type": "text/plain"}, b"ok")

    server = HttpServer(echo, max_body=800, max_held=1000)
    port = await server.start("127.0.0.1", 0)
    try:
        slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 800\r\n\r\n" + b"a" * 600)
        await slow.drain()
        for _ in range(100):
            if server.held == 600:
                break
            await asyncio.sleep(0.01)
        assert server.held == 600
        second = await raw_exchange(
            f"http://127.0.0.1:{port}", b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n" + b"b" * 500
        )
        assert second.startswith(b"HTTP/1.1 503 ") and b"request bodies already" in second
        assert server.held == 600, "the refused request's bytes are not held"
        slow.write(b"a" * 200)
        await slow.drain()
        assert (await asyncio.wait_for(slow_reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200 OK")
        assert seen == [800] and server.held == 0
        slow.write(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 800\r\n\r\n" + b"a" * 300)
        await slow.drain()
        for _ in range(100):
            if server.held == 300:
                break
            await asyncio.sleep(0.01)
        assert server.held == 300
        slow.close()  # gone mid-body: what it held is let go
        for _ in range(100):
            if server.held == 0:
                break
            await asyncio.sleep(0.01)
        assert server.held == 0
    finally:
        await server.close(grace_s=1)


async def test_an_agent_that_leaves_mid_stream_is_recorded_as_such(tmp_path: Path) -> None:
    """The agent reads the first event and closes; the gateway's next write finds it gone, and the call's line
    says so (the provider's answer goes on being counted no further)."""
    more = asyncio.Event()

    async def stream(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        event = b'event: message_start\ndata: {"type":"message_start","message":' + BODY + b"}\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await more.wait()
        ping = b'event: ping\ndata: {"type":"ping"}\n\n'
        for _ in range(3):
            writer.write(b"%x\r\n%s\r\n" % (len(ping), ping))
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    provider = RawProvider(stream)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            request = json.dumps({**CALL, "stream": True}).encode()
            head = (
                f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
                f"content-length: {len(request)}\r\n\r\n"
            ).encode()
            out = await raw_exchange(gw.url, head + request, read_until_close=False)
            assert b"message_start" in out
            await asyncio.sleep(0.1)  # the agent has gone
            more.set()
            for _ in range(100):
                if gw.state.calls:
                    break
                await asyncio.sleep(0.02)
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        # it left before the answer said its usage: what the provider generated may be billed, and is not known
        assert line["error"] == "the agent closed the stream; its usage is only what came before (a lower bound)"
        assert line["usage_partial"] is True and gw.state.spend.partial_calls == 1
    finally:
        await provider.stop()


STREAM_EVENTS = [
    {"type": "message_start", "message": {**MESSAGE, "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "done"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    },
    {"type": "message_stop"},
]


@pytest.mark.parametrize("how", ["gzip", "cut", "corrupt"])
async def test_a_stream_is_handed_on_piece_by_piece_whole_uncompressed_or_broken_as_it_came(
    tmp_path: Path, how: str
) -> None:
    """The gateway hands a stream's pieces to the agent from the provider connection's own callback
    (`UpstreamResponse.relay`). A provider's gzip stream, sent event by event with pauses between, reaches the real
    SDK uncompressed and whole, and is counted. A stream the provider cuts after the text (no last chunk), and one
    whose compressed bytes turn to garbage, reach the agent as far as they came, then end without their last chunk,
    and the line says what broke, never a whole answer."""
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)  # gzip

    async def stream(_n: int, writer: asyncio.StreamWriter) -> bool:
        framing = "content-encoding: gzip\r\n" if how != "cut" else ""
        head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{framing}transfer-encoding: chunked\r\n\r\n"
        writer.write(head.encode())
        for i, event in enumerate(STREAM_EVENTS):
            data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            if how != "cut":
                data = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
            if how == "corrupt" and i == 3:
                data = b"\x00garbage, not deflate\xff" * 4
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(0.02)
            if how == "cut" and i == 2:
                return False  # closed mid-body: no last chunk
        if how == "gzip":
            tail = compressor.flush()
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        return how == "gzip"

    provider = RawProvider(stream)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            if how == "gzip":
                client = anthropic.AsyncAnthropic(
                    api_key=gw.config.token, base_url=gw.anthropic_base_url, max_retries=0
                )
                async with client, client.messages.stream(**CALL) as events:  # type: ignore[arg-type]
                    message = await events.get_final_message()
                assert message.content[0].text == "done" and message.usage.output_tokens == 5  # type: ignore[union-attr]
            else:
                request = json.dumps({**CALL, "stream": True}).encode()
                head = (
                    f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
                    f"content-length: {len(request)}\r\n\r\n"
                ).encode()
                out = await raw_exchange(gw.url, head + request)  # until the gateway closes the connection
                head_out, _, body = out.partition(b"\r\n\r\n")
                assert b"200 OK" in head_out and b"content-encoding" not in head_out.lower()
                events, ended = unchunk(body)
                assert not ended, "a broken stream must not end as a whole one does"
                assert b'"text_delta"' in events and b"message_stop" not in events  # as far as it came, decoded
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        if how == "gzip":
            assert "error" not in line and line["usage"]["input"] == 10 and line["usage"]["output"] == 5
            assert gw.state.spend.partial_calls == 0
        else:
            broke = "UpstreamBroke: the provider closed the connection mid-answer" if how == "cut" else "is corrupt"
            assert line["error"].startswith("the provider's stream broke: ") and broke in line["error"], line
            assert line["usage_partial"] is True and gw.state.spend.partial_calls == 1
    finally:
        await provider.stop()


def unchunk(data: bytes) -> tuple[bytes, bool]:
    """A chunked body's content, and whether its terminating chunk came."""
    out, at = [], 0  # an offset, not slices of the rest: a 64 MB body comes in thousands of chunks
    while at < len(data):
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            return b"".join(out), True
        out.append(data[end + 2 : end + 2 + size])
        at = end + 2 + size + 2
    return b"".join(out), False


async def test_an_agent_that_reads_slowly_holds_the_providers_stream_back_and_gets_every_byte(
    tmp_path: Path,
) -> None:
    """Flow control, both hops: while the agent reads nothing, the gateway stops writing to it and stops reading the
    provider, so what is in flight is the gateway's own buffer (`UPSTREAM_BUFFER_BYTES`) and the sockets' (the
    kernel's, a few MB), never the whole answer in the gateway's memory; once the agent reads again, every byte
    arrives in order, and the call is counted from its closing usage event."""
    total_mb, written = 64, 0
    text = "x" * 65536
    delta = json.dumps({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
    events = [
        b'event: message_start\ndata: {"type":"message_start","message":' + BODY + b"}\n\n",
        *[b"event: content_block_delta\ndata: " + delta.encode() + b"\n\n"] * (total_mb * 16),
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"output_tokens":7}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]

    async def stream(_n: int, writer: asyncio.StreamWriter) -> bool:
        nonlocal written
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()  # returns once the socket took it: what the gateway has read, or its kernel holds
            written += len(event)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    provider = RawProvider(stream)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            host, port = gw.url.removeprefix("http://").split(":")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # a slow agent's small window
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
            reader, writer = await asyncio.open_connection(sock=sock)
            request = json.dumps({**CALL, "stream": True}).encode()
            writer.write(
                f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
                f"content-length: {len(request)}\r\n\r\n".encode()
                + request
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(1.5)  # the agent reads nothing
            held_back = written
            body = bytearray()
            while not body.endswith(b"\r\n0\r\n\r\n"):
                body += await asyncio.wait_for(reader.read(1 << 20), 10)
            writer.close()
        content, whole = unchunk(bytes(body))
        assert whole and content == b"".join(events)  # every byte, in order
        assert held_back < total_mb * 2**20 / 2, f"{held_back / 2**20:.1f} MB read from the provider by a stalled agent"
        state = gw.state
        assert state.calls == 1 and state.spend.usage.output == 7 and state.spend.partial_calls == 0
    finally:
        await provider.stop()


async def test_an_agent_that_reads_nothing_for_the_calls_time_out_has_its_stream_given_up(tmp_path: Path) -> None:
    """An agent that stops reading (its socket full) for the call's time-out: the gateway gives the stream up, closes
    both connections, and the line says the agent read nothing, its spend a lower bound; it is never a whole answer,
    nor an error of the provider's, and the call does not hang for as long as the agent lives."""
    delta = json.dumps(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * 65536}}
    )
    event = b"event: content_block_delta\ndata: " + delta.encode() + b"\n\n"
    provider_cut = asyncio.Event()

    async def endless(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        start = b'event: message_start\ndata: {"type":"message_start","message":' + BODY + b"}\n\n"
        try:
            for piece in [start] + [event] * 4096:  # 256 MB: more than any socket buffers hold
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
        except ConnectionError:
            provider_cut.set()
        return False

    provider = RawProvider(endless)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, timeout_s=1.0) as gw:
            host, port = gw.url.removeprefix("http://").split(":")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
            request = json.dumps({**CALL, "stream": True}).encode()
            head = (
                f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
                f"content-length: {len(request)}\r\n\r\n"
            ).encode()
            await asyncio.get_running_loop().sock_sendall(sock, head + request)
            try:  # the agent reads nothing from here on
                for _ in range(300):
                    if gw.state.calls:
                        break
                    await asyncio.sleep(0.1)
                assert gw.state.calls == 1, "the gateway still waits on an agent that reads nothing"
                await asyncio.wait_for(provider_cut.wait(), 10)  # the provider's connection closed too
            finally:
                sock.close()
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        said = "the agent read nothing of the stream for 1 s; its usage is only what came before (a lower bound)"
        assert line["error"] == said and line["usage_partial"] is True
        assert gw.state.spend.partial_calls == 1 and gw.state.spend.steps == 0
    finally:
        await provider.stop()


async def test_close_cuts_a_call_still_in_flight_after_its_grace(tmp_path: Path) -> None:
    async def never(_n: int, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(60)
        return False

    provider = RawProvider(never)
    base = await provider.start()
    try:
        gw = await gateway(base, tmp_path).start()
        call = asyncio.create_task(sdk_call(gw))
        while not provider.requests:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await gw.close()
        assert time.monotonic() - started < CLOSE_GRACE_S + 1
        with pytest.raises(anthropic.APIConnectionError):
            await call
    finally:
        await provider.stop()


# -- the provider's side


async def test_a_compressed_answer_is_counted_and_passed_on_uncompressed(tmp_path: Path) -> None:
    async def gzipped(_n: int, writer: asyncio.StreamWriter) -> bool:
        data = gzip.compress(BODY)
        writer.write(answer(data, "content-encoding: gzip", f"content-length: {len(data)}"))
        return True

    provider = RawProvider(gzipped)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            message = await sdk_call(gw)
        assert message.content[0].text == "done"  # type: ignore[union-attr]
        head = provider.requests[0][0].lower()
        assert b"accept-encoding: identity\r\n" in head and b"x-api-key: sk-real\r\n" in head
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        assert line["usage"]["input"] == 10 and line["usage"]["output"] == 5 and "error" not in line
    finally:
        await provider.stop()


async def test_an_answer_ended_by_closing_the_connection_is_whole(tmp_path: Path) -> None:
    """An HTTP/1.1 server may end a body with no Content-Length and no chunks by closing (RFC 9112, 6.3)."""

    async def close_delimited(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(BODY, "connection: close"))
        return False

    provider = RawProvider(close_delimited)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
            assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
        assert provider.connections == 2
        assert [line.get("error") for line in read_jsonl(tmp_path / "transcript.jsonl")] == [None, None]
    finally:
        await provider.stop()


@pytest.mark.parametrize("body", [b'[{"usage": {"input_tokens": 10}}]', b"<html>upstream proxy</html>"])
async def test_a_model_calls_answer_that_is_not_a_json_object_leaves_its_cost_unknown_not_zero(
    tmp_path: Path, body: bytes
) -> None:
    """A 200 whose body the gateway cannot read (a JSON array, an HTML page from a proxy in front of the provider) is
    passed on as it came; the call is counted with its error, and the run's dollars become unknown rather than
    missing one call's cost (before, the array failed the call with a 500 and the HTML page counted as $0)."""

    async def unreadable(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(body, f"content-length: {len(body)}"))
        return True

    provider = RawProvider(unreadable)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path) as gw:
            call = json.dumps(CALL).encode()
            head = (
                f"POST /anthropic/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
                f"content-length: {len(call)}\r\nconnection: close\r\n\r\n"
            )
            reply = await raw_exchange(gw.url, head.encode() + call)
            spend = gw.state.spend
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(body)
        assert gw.state.calls == 1 and spend.steps == 0 and "not a JSON object" in (gw.state.last_error or "")
        assert spend.cost_usd is None and spend.unpriced == ["anthropic:claude-sonnet-4-6"]
        assert spend.partial_calls == 1 and spend.at_least  # and its tokens, counted as none, a lower bound
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        assert line["cost_usd"] is None and line["error"].endswith("its usage and cost are unknown")
        assert line["usage_partial"] is True
        assert line["request"]["model"] == "claude-sonnet-4-6"
    finally:
        await provider.stop()


async def test_a_kept_connection_the_provider_closed_while_idle_is_replaced_without_a_retry(tmp_path: Path) -> None:
    async def then_close(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(BODY, f"content-length: {len(BODY)}"))
        await writer.drain()
        return False  # closes after answering, without saying so: the gateway kept the connection

    provider = RawProvider(then_close)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, max_attempts=1) as gw:
            for _ in range(3):
                assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
        lines = read_jsonl(tmp_path / "transcript.jsonl")
        assert [(line["attempts"], line.get("error")) for line in lines] == [(1, None)] * 3
        assert provider.connections == 3
    finally:
        await provider.stop()


async def test_a_kept_connection_the_provider_closes_as_the_request_arrives_is_replaced_without_a_retry(
    tmp_path: Path,
) -> None:
    """The race a kept connection has: the provider closes it (its own idle timeout) just as the next request
    arrives, so the gateway has written the request before it learns. No byte of an answer came, so the call goes
    again at once on a new connection, as HTTP clients do, not counted as a failed attempt nor waiting a back-off."""

    async def close_the_second(n: int, writer: asyncio.StreamWriter) -> bool:
        if n == 2:
            return False  # read, and closed without a byte of an answer
        writer.write(answer(BODY, f"content-length: {len(BODY)}"))
        await writer.drain()
        return True  # keep-alive, as a provider's is

    provider = RawProvider(close_the_second)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, max_attempts=1) as gw:
            for _ in range(2):
                assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
        lines = read_jsonl(tmp_path / "transcript.jsonl")
        assert [(line["attempts"], line["backoff_s"], line.get("error")) for line in lines] == [(1, 0.0, None)] * 2
        assert len(provider.requests) == 3 and provider.connections == 2  # the second call's request went twice
    finally:
        await provider.stop()


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (answer(BODY[:40], f"content-length: {len(BODY)}"), "the provider's answer broke off: UpstreamBroke"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "failed 2 times (UpstreamBroke: the provider's answer is not HTTP/1.1"),
    ],
    ids=["cut-mid-body", "not-http"],
)
async def test_a_broken_answer_is_a_502_with_what_broke_never_a_result(
    tmp_path: Path, sent: bytes, expected: str
) -> None:
    async def broken(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(sent)
        await writer.drain()
        return False

    provider = RawProvider(broken)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, max_attempts=2) as gw:
            with pytest.raises(anthropic.InternalServerError) as raised:
                await sdk_call(gw)
        assert raised.value.status_code == 502 and expected in str(raised.value)
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        assert expected in line["error"] and line["usage"]["output"] == 0
        # Either way the request reached the provider, which may have generated an answer: a lower bound, not 0.
        assert line["usage_partial"] is True and gw.state.spend.at_least
        if sent.startswith(b"SSH"):  # no answer at all, twice
            assert gw.state.spend.partial_calls == 2
            assert line["usage_note"].startswith("2 attempts broke off after reaching the provider: counted as none")
        else:  # an answer that broke off: its error says so
            assert gw.state.spend.partial_calls == 1 and "usage_note" not in line
    finally:
        await provider.stop()


async def test_an_attempt_the_provider_closed_after_reading_it_is_a_lower_bound_a_refused_one_is_not(
    tmp_path: Path,
) -> None:
    """The provider reads the request and closes the connection without a byte of an answer (a crash, a proxy's
    time-out): the gateway tries again and the second attempt is answered. The first reached the provider, which may
    have generated an answer and billed it, so the call is a lower bound and its line says why. A provider that
    refuses the connection was never sent the request: its failed attempts cost nothing, and the spend stays exact."""

    async def close_the_first(n: int, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            return False  # read, and closed without a byte of an answer
        writer.write(answer(BODY, f"content-length: {len(BODY)}"))
        await writer.drain()
        return True

    provider = RawProvider(close_the_first)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, max_attempts=2) as gw:
            assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        assert line["attempts"] == 2 and line["usage_partial"] is True and "error" not in line
        assert line["usage_note"] == "1 attempt broke off after reaching the provider: counted as none, a lower bound"
        spend = gw.state.spend
        assert spend.partial_calls == 1 and spend.steps == 1 and spend.usage.output == 5
    finally:
        await provider.stop()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every connection is refused
    async with gateway(dead, tmp_path / "refused", max_attempts=2) as gw:
        with pytest.raises(anthropic.InternalServerError):
            await sdk_call(gw)
    (line,) = read_jsonl(tmp_path / "refused" / "transcript.jsonl")
    assert "ConnectionRefusedError" in line["error"] and "usage_partial" not in line
    assert gw.state.spend.partial_calls == 0 and gw.state.calls == 1


async def test_an_https_provider_is_verified_against_the_systems_trusted_cas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider over TLS, as every real one is: its certificate is checked (here against a CA of the test's own,
    trusted through SSL_CERT_FILE as a cluster's image trusts its CA bundle), and an untrusted one is refused."""
    tls = make_tls(tmp_path / "tls", hosts=("127.0.0.1",))

    async def ok(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(BODY, f"content-length: {len(BODY)}"))
        return True

    provider = RawProvider(ok)
    base = await provider.start(tls=tls.server_context())
    try:
        async with gateway(base, tmp_path / "untrusted", max_attempts=1) as gw:
            with pytest.raises(anthropic.InternalServerError, match="SSLCertVerificationError"):
                await sdk_call(gw)
        monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_cert))
        async with gateway(base, tmp_path / "trusted", max_attempts=1) as gw:
            assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
            assert (await sdk_call(gw)).content[0].text == "done"  # type: ignore[union-attr]
        assert provider.connections == 1  # the untrusted handshake never reached it; one connection kept for both
    finally:
        await provider.stop()


def test_the_gateway_process_binds_loopback_only_by_default() -> None:
    """Nothing else on the machine's network may reach a local run's gateway (its token aside)."""

    async def bound() -> str:
        async with ModelGateway(GatewayConfig(provider_prefix="anthropic")) as gw:
            host, port = gw.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=2):
                pass
            return host

    assert asyncio.run(bound()) == "127.0.0.1"


async def test_a_head_request_is_answered_without_waiting_for_a_body_its_head_announces(tmp_path: Path) -> None:
    """An answer to HEAD has no body even where its Content-Length says otherwise (RFC 9110, 9.3.2); a proxy that
    waited for one would hang the agent until the provider's timeout."""

    async def head_only(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(b"", f"content-length: {len(BODY)}"))
        return True

    provider = RawProvider(head_only)
    base = await provider.start()
    try:
        async with gateway(base, tmp_path, timeout_s=30) as gw:
            started = time.monotonic()
            head = f"HEAD /anthropic/v1/models HTTP/1.1\r\nhost: x\r\nx-api-key: {gw.config.token}\r\n"
            out = await raw_exchange(gw.url, (head + "connection: close\r\n\r\n").encode())
            assert time.monotonic() - started < 5
        assert out.startswith(b"HTTP/1.1 200 OK\r\n") and provider.requests[0][0].startswith(b"HEAD /v1/models ")
    finally:
        await provider.stop()


async def test_a_model_call_under_another_spelling_of_its_path_is_metered_and_held_to_the_budget(
    tmp_path: Path,
) -> None:
    """Providers' servers, and the proxies in front of them, decode percent-escapes and merge slashes before they
    route: `messag%65s` or `//messages` is a model call there, so it is one here, counted and refused once the
    budget is spent, and it goes upstream as the path that was metered. A '..' or ';' is refused outright."""
    from labkube.budgets import Budgets

    def post(url: str, path: str, token: str) -> tuple[int, bytes]:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", path, json.dumps(CALL), {"x-api-key": token, "content-type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()

    with FakeLLM() as server:
        async with gateway(server.base_url, tmp_path, budgets=Budgets(steps=2)) as gw:
            token = gw.config.token
            for path in ("/anthropic/v1/messag%65s", "/anthropic/v1//./messages/"):
                status, _ = await asyncio.to_thread(post, gw.url, path, token)
                assert status == 200, path
            status, body = await asyncio.to_thread(post, gw.url, "/anthropic/v1/%6Dessages", token)
            assert status == 400 and b"usage limits" in body  # the budget of 2 calls is spent
            for path in (
                "/anthropic/v1/x/../messages",
                "/anthropic/v1/messages;v=1",
                "/anthropic/v1/x/%2E%2E/messages",
            ):
                status, body = await asyncio.to_thread(post, gw.url, path, token)
                assert status == 400 and b"is not forwarded" in body, path
        seen = [request.path for request in server.requests]
    assert seen == ["/v1/messages", "/v1/messages"]
    lines = read_jsonl(tmp_path / "transcript.jsonl")
    assert [line["type"] for line in lines] == ["model_call", "model_call", "budget_stop"]
