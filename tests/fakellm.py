"""A scripted fake LLM server speaking the OpenAI and Anthropic wire formats.

`FakeLLM` is a local HTTP/1.1 server on 127.0.0.1 (a free port) that answers

- `POST /v1/responses`        OpenAI Responses API (JSON, or SSE when `"stream": true`)
- `POST /v1/chat/completions` OpenAI Chat Completions (JSON, or SSE chunks ending `data: [DONE]`)
- `POST /v1/messages`         Anthropic Messages (JSON, or SSE when `"stream": true`)

faithfully enough for the real `openai` and `anthropic` SDKs, including their strict response validation
and their stream helpers (`client.responses.stream(...).get_final_response()`,
`client.chat.completions.stream(...)`, `client.messages.stream(...).get_final_message()`).

    with FakeLLM() as server:
        server.script(
            Reply.tool_call("bash", {"command": "ls"}, thinking="look first",
                            usage=Usage(input=100, output=20, reasoning=5, cached=30)),
            Reply.error(429, retry_after=0.01),
            Reply.text("all done"),
        )
        client = openai.OpenAI(api_key="k", base_url=server.base_url + "/v1")
        # anthropic.Anthropic(api_key="k", base_url=server.base_url)
        ...
        server.requests[0].body["model"]; server.unscripted_calls; server.remaining

Replies are consumed in order by whichever endpoint is called next and rendered in that endpoint's wire
format. With the script empty the server asks `responder(path, body)` when one is given (`FakeLLM(responder=
...)`: the request path and parsed JSON body; it returns a Reply or None), else or on None answers
`default` (`FakeLLM(default=...)`, `Reply.text("done")` unless given) and counts every such reply in
`unscripted_calls`, so a runaway agent loop ends. A responder suits callers whose order of requests is not
fixed (e.g. a judge asked several questions at once): it answers from what each request says.

Usage mapping (the numbers given in `Usage` come back exactly; `input` counts every prompt token,
`output` every generated token including reasoning):

    Responses API     input_tokens = input, input_tokens_details{cached_tokens = cached,
                      cache_write_tokens = cache_write}, output_tokens = output,
                      output_tokens_details{reasoning_tokens = reasoning}, total_tokens = input + output
    Chat Completions  prompt_tokens = input, prompt_tokens_details{cached_tokens = cached,
                      cache_write_tokens = cache_write}, completion_tokens = output,
                      completion_tokens_details{reasoning_tokens = reasoning}, total_tokens = input + output
    Anthropic         input_tokens = input - cached - cache_write, cache_read_input_tokens = cached,
                      cache_creation_input_tokens = cache_write, output_tokens = output,
                      output_tokens_details{thinking_tokens = reasoning}

Anthropic's `input_tokens` EXCLUDES cache reads and writes, so the server sends
`input_tokens = input - cached - cache_write`; the provider reconstructs `input` as the sum of the three.
In an Anthropic stream, `message_start` carries the input-side counts and `output_tokens: 1` (as the real
API sends a small placeholder) and `message_delta` carries the cumulative final usage, which overwrites it.

Thinking: Responses API -> a `reasoning` output item with one `summary_text` part; Anthropic -> a
`thinking` block (with a fake signature) before the other blocks; Chat Completions has no reasoning in
OpenAI's format, so it is sent as `message.reasoning_content` / `delta.reasoning_content` (the vLLM and
DeepSeek extension for OpenAI-compatible servers; the OpenAI SDK keeps it as an extra field).

Tool-call ids: `call_id` when given (the same id in every format), otherwise generated: `call_N`
(OpenAI) or `toolu_N` (Anthropic). Ids are unique per server.

Failure replies: `Reply.error(status)` answers with the status and the API's own error body
(`{"error": {"message", "type", "param", "code"}}` for OpenAI, `{"type": "error", "error": {"type",
"message"}}` for Anthropic) and a `retry-after` header when asked; `Reply.delay` sleeps first (the sleep
ends early when the server stops); `Reply.malformed()` answers 200 `application/json` with a body that is
not JSON (as one SSE event when streaming); `Reply.cut_stream(after_events=n)` sends n SSE events then
closes the connection without the terminating chunk (non-streaming: half of the declared Content-Length).
Streams use chunked transfer encoding, one chunk per event, so a cut is visible to the client.

`server.requests` lists `Recorded(path, headers, body)`: the path without query, lower-cased headers
(`authorization`, `x-api-key`, `x-stainless-retry-count`, ...) and the parsed JSON body. Other paths answer
404 in OpenAI's error format without consuming the script.

What the SDKs (openai 3.54, anthropic 2.12) need and do, as checked by tests/test_fakellm.py:
- `responses.stream()`: `response.created` must come first, `response.completed` (whose `response` becomes
  the final response) must come last; `response.output_item.added` must precede any delta of that item and
  `response.content_part.added` any `response.output_text.delta`. The `*.done`, `in_progress` and
  reasoning-summary events are optional (the real API sends them, so the fake does).
- Anthropic SSE events without an `event:` line are skipped silently; `ping` events are ignored.
- A 200 `application/json` body that is not JSON escapes both SDKs as `json.JSONDecodeError` (not retried).
- A cut stream is `openai.APIConnectionError` in openai but a raw `httpx2.RemoteProtocolError` from an
  anthropic stream; a cut non-streaming body is `APIConnectionError` in both, and is retried.
- anthropic 2.x sends the API key as `Authorization: Bearer ...`, not `x-api-key`.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from local_http import LocalHTTPServer

__all__ = ["FakeLLM", "Recorded", "Reply", "ToolCall", "Usage"]

Json = dict[str, Any]
Event = tuple[str | None, Json | str]  # (SSE `event:` name or None, `data:` payload)


@dataclass(frozen=True)
class Usage:
    """Token counts of one reply; `cached`/`cache_write` are part of `input`, `reasoning` part of `output`."""

    input: int
    output: int
    reasoning: int = 0
    cached: int = 0
    cache_write: int = 0

    def __post_init__(self) -> None:
        if min(self.input, self.output, self.reasoning, self.cached, self.cache_write) < 0:
            raise ValueError(f"negative token count in {self}")
        if self.cached + self.cache_write > self.input:
            raise ValueError(f"cached + cache_write exceed input in {self}")
        if self.reasoning > self.output:
            raise ValueError(f"reasoning exceeds output in {self}")


DEFAULT_USAGE = Usage(input=10, output=5)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Json
    call_id: str | None = None
    namespace: str | None = None  # Responses API: the `namespace` tool it belongs to (Codex's `mcp__<server>`)


@dataclass(frozen=True)
class Reply:
    """One scripted answer. Build it with the class methods."""

    kind: Literal["message", "error", "delay", "malformed", "cut"] = "message"
    content: str = ""  # the assistant's text
    calls: tuple[ToolCall, ...] = ()
    thinking: str | None = None
    usage: Usage = DEFAULT_USAGE
    status: int = 200
    message: str | None = None
    retry_after: float | None = None
    seconds: float = 0.0
    then: Reply | None = None
    after_events: int = 0
    says_usage: bool = True

    @classmethod
    def text(cls, text: str, *, usage: Usage = DEFAULT_USAGE, thinking: str | None = None) -> Reply:
        return cls(content=text, usage=usage, thinking=thinking)

    @classmethod
    def tool_call(
        cls,
        name: str,
        arguments: Json,
        *,
        call_id: str | None = None,
        text: str = "",
        usage: Usage = DEFAULT_USAGE,
        thinking: str | None = None,
    ) -> Reply:
        return cls.tool_calls([ToolCall(name, arguments, call_id)], text=text, usage=usage, thinking=thinking)

    @classmethod
    def tool_calls(
        cls,
        calls: Iterable[tuple[str, Json] | ToolCall],
        *,
        text: str = "",
        usage: Usage = DEFAULT_USAGE,
        thinking: str | None = None,
    ) -> Reply:
        made = tuple(c if isinstance(c, ToolCall) else ToolCall(*c) for c in calls)
        return cls(content=text, calls=made, usage=usage, thinking=thinking)

    @classmethod
    def error(cls, status: int, *, message: str | None = None, retry_after: float | None = None) -> Reply:
        return cls(kind="error", status=status, message=message, retry_after=retry_after)

    @classmethod
    def delay(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Sleep `seconds` before answering with `then` (default: the unscripted "done" reply)."""
        return cls(kind="delay", seconds=seconds, then=then)

    def without_usage(self) -> Reply:
        """This OpenAI answer saying nothing of its usage, whole or streamed, as an OpenAI-compatible server that
        ignores `stream_options.include_usage` does (the Responses API's `usage` is null, a Chat Completion has no
        `usage` field and no usage chunk). The Messages API always says its usage: not served there."""
        return replace(self, says_usage=False)

    @classmethod
    def malformed(cls) -> Reply:
        return cls(kind="malformed")

    @classmethod
    def cut_stream(cls, after_events: int = 2) -> Reply:
        return cls(kind="cut", after_events=after_events)


class Recorded(NamedTuple):
    """One request as received: path without query, lower-cased headers, JSON body (None if not JSON)."""

    path: str
    headers: dict[str, str]
    body: Any


# ---------------------------------------------------------------------------------------------------------
# Wire formats. Each renders a message reply as the API's JSON body; its stream is derived from that body.


@dataclass
class _Ctx:
    model: str
    new_id: Callable[[str], str]


def _pieces(text: str, n: int = 3) -> list[str]:
    """Split `text` into up to `n` deltas (none for empty text)."""
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def _responses_body(reply: Reply, ctx: _Ctx) -> Json:
    output: list[Json] = []
    if reply.thinking is not None:
        summary = [{"type": "summary_text", "text": reply.thinking}]
        output.append({"id": ctx.new_id("rs"), "type": "reasoning", "summary": summary})
    if reply.content:
        part = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
        message = {"id": ctx.new_id("msg"), "type": "message", "role": "assistant", "status": "completed"}
        output.append({**message, "content": [part]})
    for call in reply.calls:
        output.append(
            {
                "id": ctx.new_id("fc"),
                "type": "function_call",
                "call_id": call.call_id or ctx.new_id("call"),
                "name": call.name,
                **({"namespace": call.namespace} if call.namespace else {}),
                "arguments": _dumps(call.arguments),
                "status": "completed",
            }
        )
    u = reply.usage
    now = time.time()
    return {
        "id": ctx.new_id("resp"),
        "object": "response",
        "created_at": int(now),
        "completed_at": now,
        "status": "completed",
        "model": ctx.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": u.input,
            "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": u.cache_write},
            "output_tokens": u.output,
            "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.input + u.output,
        }
        if reply.says_usage
        else None,
    }


def _responses_events(final: Json, request: Json) -> Iterator[Event]:
    seq = itertools.count()

    def ev(type_: str, **fields: Any) -> Event:
        return type_, {"type": type_, "sequence_number": next(seq), **fields}

    pending = {**final, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    yield ev("response.created", response=pending)
    yield ev("response.in_progress", response=pending)
    for index, item in enumerate(final["output"]):
        ref = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            yield ev("response.output_item.added", output_index=index, item={**item, "summary": []})
            for s, part in enumerate(item["summary"]):
                empty = {**part, "text": ""}
                yield ev("response.reasoning_summary_part.added", **ref, summary_index=s, part=empty)
                for piece in _pieces(part["text"]):
                    yield ev("response.reasoning_summary_text.delta", **ref, summary_index=s, delta=piece)
                yield ev("response.reasoning_summary_text.done", **ref, summary_index=s, text=part["text"])
                yield ev("response.reasoning_summary_part.done", **ref, summary_index=s, part=part)
        elif item["type"] == "message":
            added = {**item, "status": "in_progress", "content": []}
            yield ev("response.output_item.added", output_index=index, item=added)
            for c, part in enumerate(item["content"]):
                yield ev("response.content_part.added", **ref, content_index=c, part={**part, "text": ""})
                for piece in _pieces(part["text"]):
                    yield ev("response.output_text.delta", **ref, content_index=c, delta=piece, logprobs=[])
                yield ev("response.output_text.done", **ref, content_index=c, text=part["text"], logprobs=[])
                yield ev("response.content_part.done", **ref, content_index=c, part=part)
        else:  # function_call
            added = {**item, "status": "in_progress", "arguments": ""}
            yield ev("response.output_item.added", output_index=index, item=added)
            for piece in _pieces(item["arguments"]):
                yield ev("response.function_call_arguments.delta", **ref, delta=piece)
            yield ev("response.function_call_arguments.done", **ref, arguments=item["arguments"])
        yield ev("response.output_item.done", output_index=index, item=item)
    yield ev("response.completed", response=final)


def _chat_body(reply: Reply, ctx: _Ctx) -> Json:
    message: Json = {
        "role": "assistant",
        "content": reply.content or (None if reply.calls else ""),
        "refusal": None,
        "annotations": [],
    }
    if reply.thinking is not None:
        message["reasoning_content"] = reply.thinking
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": call.call_id or ctx.new_id("call"),
                "type": "function",
                "function": {"name": call.name, "arguments": _dumps(call.arguments)},
            }
            for call in reply.calls
        ]
    u = reply.usage
    return {
        "id": ctx.new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": ctx.model,
        "system_fingerprint": None,
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if reply.calls else "stop",
            }
        ],
        **(
            {
                "usage": {
                    "prompt_tokens": u.input,
                    "completion_tokens": u.output,
                    "total_tokens": u.input + u.output,
                    "prompt_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": u.cache_write},
                    "completion_tokens_details": {"reasoning_tokens": u.reasoning},
                }
            }
            if reply.says_usage
            else {}
        ),
    }


def _chat_events(final: Json, request: Json) -> Iterator[Event]:
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    head = {k: final[k] for k in ("id", "created", "model", "system_fingerprint", "service_tier")}
    head["object"] = "chat.completion.chunk"
    choice = final["choices"][0]
    message = choice["message"]

    def chunk(delta: Json, finish_reason: str | None = None) -> Event:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        return None, {**head, "choices": choices, **({"usage": None} if include_usage else {})}

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(message.get("reasoning_content") or ""):
        yield chunk({"reasoning_content": piece})
    for piece in _pieces(message["content"] or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls", [])):
        function = call["function"]
        start = {"index": index, "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**start, "function": {**function, "arguments": ""}}]})
        for piece in _pieces(function["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage and "usage" in final:  # a server that ignores include_usage sends no usage chunk
        yield None, {**head, "choices": [], "usage": final["usage"]}
    yield None, "[DONE]"


def _messages_body(reply: Reply, ctx: _Ctx) -> Json:
    assert reply.says_usage, "the Messages API always says its usage"
    content: list[Json] = []
    if reply.thinking is not None:
        content.append({"type": "thinking", "thinking": reply.thinking, "signature": ctx.new_id("sig")})
    if reply.content:
        content.append({"type": "text", "text": reply.content, "citations": None})
    for call in reply.calls:
        block_id = call.call_id or ctx.new_id("toolu")
        content.append({"type": "tool_use", "id": block_id, "name": call.name, "input": call.arguments})
    u = reply.usage
    return {
        "id": ctx.new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": u.input - u.cached - u.cache_write,
            "cache_read_input_tokens": u.cached,
            "cache_creation_input_tokens": u.cache_write,
            "output_tokens": u.output,
            "output_tokens_details": {"thinking_tokens": u.reasoning},
        },
    }


def _block_stream(block: Json) -> tuple[Json, list[Json]]:
    """An Anthropic content block as (its `content_block_start` form, its deltas)."""
    if block["type"] == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"])]
        signature = {"type": "signature_delta", "signature": block["signature"]}
        return {**block, "thinking": "", "signature": ""}, [*deltas, signature]
    if block["type"] == "text":
        return {**block, "text": ""}, [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
    # tool_use: the real API opens with an empty partial_json
    pieces = ["", *_pieces(_dumps(block["input"]))]
    return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": p} for p in pieces]


def _messages_events(final: Json, request: Json) -> Iterator[Event]:
    def ev(type_: str, **fields: Any) -> Event:
        return type_, {"type": type_, **fields}

    usage = final["usage"]
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens_details"} | {"output_tokens": 1}
    message = {**final, "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    yield ev("message_start", message=message)
    yield ev("ping")
    for index, block in enumerate(final["content"]):
        start, deltas = _block_stream(block)
        yield ev("content_block_start", index=index, content_block=start)
        for delta in deltas:
            yield ev("content_block_delta", index=index, delta=delta)
        yield ev("content_block_stop", index=index)
    delta = {"stop_reason": final["stop_reason"], "stop_sequence": None}
    yield ev("message_delta", delta=delta, usage=usage)
    yield ev("message_stop")


_OPENAI_ERRORS = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _openai_error(status: int, message: str, ctx: _Ctx) -> Json:
    default = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    type_, code = _OPENAI_ERRORS.get(status, default)
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _anthropic_error(status: int, message: str, ctx: _Ctx) -> Json:
    type_ = _ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": ctx.new_id("req")}


@dataclass(frozen=True)
class _Format:
    body: Callable[[Reply, _Ctx], Json]
    events: Callable[[Json, Json], Iterator[Event]]
    error: Callable[[int, str, _Ctx], Json]


_FORMATS = {
    "/v1/responses": _Format(_responses_body, _responses_events, _openai_error),
    "/v1/chat/completions": _Format(_chat_body, _chat_events, _openai_error),
    "/v1/messages": _Format(_messages_body, _messages_events, _anthropic_error),
}

_MALFORMED = b'{"id": "broken", "output": [{"type": "mess'
_CUT_SHORT = Reply.text("this answer is cut short", thinking="a thought")  # what a cut reply starts sending


# ---------------------------------------------------------------------------------------------------------
# HTTP plumbing.


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked encoding so a cut is detectable
    server: LocalHTTPServer

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    do_GET = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_body(self, status: int, body: bytes, headers: dict[str, str] | None = None, cut: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)
        self.close_connection = cut

    def send_events(self, events: Iterable[Event], cut_after: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for count, (name, data) in enumerate(events):
            if count == cut_after:
                self.close_connection = True  # no terminating chunk: the client sees an incomplete body
                return
            payload = data if isinstance(data, str) else _dumps(data)
            self._chunk(((f"event: {name}\n" if name else "") + f"data: {payload}\n\n").encode())
        self._chunk(b"")

    def _chunk(self, payload: bytes) -> None:
        self.wfile.write(f"{len(payload):X}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()


class FakeLLM:
    """The fake server; a context manager. See the module docstring.

    `thread` is the serving thread while the server runs; on exit it and every connection thread are joined.
    """

    def __init__(
        self, *, default: Reply | None = None, responder: Callable[[str, Json], Reply | None] | None = None
    ) -> None:
        self._default = default or Reply.text("done")
        self._responder = responder
        self._script: deque[Reply] = deque()
        self._requests: list[Recorded] = []
        self._unscripted = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: LocalHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> FakeLLM:
        self._httpd = LocalHTTPServer(self, _Handler)
        self.thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fakellm", daemon=True
        )
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self.thread is not None
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.drop_connections()
        self._httpd.server_close()
        self.thread.join()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "use FakeLLM as a context manager"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    @property
    def unscripted_calls(self) -> int:
        return self._unscripted

    @property
    def remaining(self) -> int:
        """Scripted replies not yet consumed."""
        with self._lock:
            return len(self._script)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"

    def _handle(self, handler: _Handler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = urlsplit(handler.path).path
        with self._lock:
            self._requests.append(Recorded(path, {k.lower(): v for k, v in handler.headers.items()}, body))
            known = handler.command == "POST" and path in _FORMATS
            if not known:
                reply = Reply.error(404, message=f"no such endpoint: {handler.command} {path}")
            elif self._script:
                reply = self._script.popleft()
            else:
                self._unscripted += 1
                reply = None
        request = body if isinstance(body, dict) else {}
        if reply is None:  # the responder runs outside the lock: it may look at `requests`
            reply = (self._responder(path, request) if self._responder else None) or self._default
        ctx = _Ctx(model=str(request.get("model", "fake-model")), new_id=self._new_id)
        fmt = _FORMATS[path] if known else _FORMATS["/v1/chat/completions"]  # unknown paths: OpenAI's 404
        self._answer(handler, fmt, reply, request, ctx)

    def _answer(self, handler: _Handler, fmt: _Format, reply: Reply, request: Json, ctx: _Ctx) -> None:
        while reply.kind == "delay":
            self._stopping.wait(reply.seconds)
            reply = reply.then or Reply.text("done")
        stream = request.get("stream") is True
        if reply.kind == "error":
            message = reply.message or _reason(reply.status)
            headers = {} if reply.retry_after is None else {"retry-after": f"{reply.retry_after:g}"}
            handler.send_body(reply.status, _dumps(fmt.error(reply.status, message, ctx)).encode(), headers)
        elif reply.kind == "malformed":
            if stream:
                handler.send_events([("message", _MALFORMED.decode())])
            else:
                handler.send_body(200, _MALFORMED)
        else:
            cut = reply.kind == "cut"
            final = fmt.body(_CUT_SHORT if cut else reply, ctx)
            if stream:
                handler.send_events(fmt.events(final, request), cut_after=reply.after_events if cut else None)
            else:
                handler.send_body(200, _dumps(final).encode(), cut=cut)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Overloaded" if status == 529 else f"Error {status}"
