"""The model gateway: a per-run HTTP proxy between any agent and the run's model provider.

An agent (rg-agent, Claude Code, Codex, anything that speaks OpenAI or Anthropic) is given the gateway's address as
its base URL and a per-run token as its API key; the gateway holds the real key and forwards

    /openai/v1/...      to the OpenAI-style upstream (OpenAI, or an OpenAI-compatible server), as OPENAI_BASE_URL
    /anthropic/v1/...   to Anthropic, as ANTHROPIC_BASE_URL

Every model call (POST `responses`, `chat/completions`, `messages`), streamed or not, is counted from the provider's
own usage fields (`labkube.agent.usage`), priced from the price table, written to the run's transcript as a
`model_call` line (the same record rg-agent writes) and to the run's Prometheus series. Once the run's token,
dollar or step budget is spent, a call is refused with the error the provider itself sends when an account's quota
is used up, which clients treat as final (OpenAI: 429 `insufficient_quota`; Anthropic: 400 `invalid_request_error`
"usage limits"; both with `x-should-retry: false`, which the SDKs obey). The provider's 429s, 5xx and dropped
connections are retried here with capped exponential back-off and jitter (honouring `retry-after`); the back-off
is reported so the run's wall budget does not pay for it. `before_call`/`after_call` hooks pause and resume a Gaia2
world's clock around each call.

The gateway's running totals are kept in `GatewayState`, written to `gateway.json` in the run directory after
every call, so a pod's agent container can read what its gateway sidecar counted. The file is written off the
call's path (in a thread, within milliseconds; `close()` waits for the last write): an atomic rename costs
milliseconds on a busy disk, more than the rest of the gateway's work on a call (benchmarks/gateway_overhead.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import random
import secrets
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp
import aiohttp.web
from pydantic import BaseModel, ConfigDict, Field

from labkube.agent.pricing import cost_usd
from labkube.agent.telemetry import RunTelemetry
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.agent.usage import anthropic_usage, chat_usage, responses_usage
from labkube.budgets import Budgets, Spend, StopReason, Usage
from labkube.model_ref import ModelRef, parse_model
from labkube.run_spec import RunSpec
from labkube.store import write_json_atomic

Family = Literal["openai", "anthropic"]
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_BASE = "https://api.anthropic.com"
MODEL_CALLS: dict[Family, tuple[str, ...]] = {
    "openai": ("responses", "chat/completions"),
    "anthropic": ("messages",),
}
# A Responses stream's last event holds the whole response: the hundreds of deltas before it need not be parsed.
RESPONSES_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# Request headers the client sends that go upstream as they are; the rest (its token, hop-by-hop headers, the
# SDK's own retry counters) stay here.
FORWARDED_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "user-agent")


class Upstream(BaseModel):
    """Where one API family's calls go, with the real key (None: an endpoint without authentication)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key: str | None = Field(default=None, repr=False)


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(default_factory=lambda: "lk-run-" + secrets.token_urlsafe(24), repr=False)
    openai: Upstream | None = None
    anthropic: Upstream | None = None
    provider_prefix: str = Field(
        default="", description="How calls are priced: '<prefix>:<model the API answered with>' in the price table."
    )
    budgets: Budgets = Field(default_factory=Budgets)
    prices: dict[str, tuple[float, ...]] = Field(default_factory=dict)
    max_attempts: int = Field(default=8, ge=1)
    base_delay_s: float = Field(default=1.0, ge=0)
    max_delay_s: float = Field(default=60.0, ge=0)
    timeout_s: float = Field(default=900.0, gt=0)


def run_config(spec: RunSpec, family: Family, upstream: Upstream) -> GatewayConfig:
    """A run's gateway: its provider, and the budgets a gateway enforces (tokens, dollars, model calls; wall time is
    the supervisor's), priced as the run's model is."""
    provider = parse_model(spec.model).provider
    return GatewayConfig(
        **{family: upstream},
        provider_prefix="openai" if provider == "openai-chat" else provider,
        budgets=Budgets(tokens=spec.budgets.tokens, usd=spec.budgets.usd, steps=spec.budgets.steps),
        prices=dict(spec.prices),
    )


class GatewayState(BaseModel):
    """What the gateway has counted for the run (spend carried over from earlier attempts included)."""

    spend: Spend = Field(default_factory=Spend)
    backoff_s: float = 0.0
    calls: int = 0
    refused: int = 0
    stop_reason: StopReason | None = None
    last_error: str | None = None


class GatewayError(RuntimeError):
    pass


def upstream_for(ref: ModelRef, key: str | None, environ: dict[str, str] | None = None) -> tuple[Family, Upstream]:
    """The run's provider as the SDKs resolve it: OPENAI_BASE_URL / ANTHROPIC_BASE_URL when set (proxies,
    self-hosted endpoints), the URL of an `openai-compatible:` model string, else the provider's own."""
    env = os.environ if environ is None else environ
    if ref.provider in ("openai", "openai-chat"):
        return "openai", Upstream(base_url=env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE, api_key=key)
    if ref.provider == "openai-compatible":
        assert ref.base_url, "an openai-compatible model string carries its URL"
        return "openai", Upstream(base_url=ref.base_url, api_key=key)
    if ref.provider == "anthropic":
        return "anthropic", Upstream(base_url=env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_BASE, api_key=key)
    raise GatewayError(f"model {ref} has no model API for the gateway to forward to; use an API model")


def refusal(family: Family, reason: StopReason, detail: str) -> tuple[int, dict[str, Any]]:
    """The provider's own 'quota used up' answer, which clients do not retry."""
    message = f"labkube: this run's {reason.value} budget is spent ({detail}); the run is over"
    if family == "openai":
        code = "insufficient_quota"
        return 429, {"error": {"message": message, "type": code, "param": None, "code": code}}
    return 400, {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"You have reached your specified API usage limits. {message}",
        },
    }


def error_body(family: Family, status: int, kind: str, message: str) -> dict[str, Any]:
    if family == "openai":
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"type": "error", "error": {"type": kind, "message": message}}


class CallDigest:
    """What one call's response says (usage, model, the assistant message in labkube's form), read from a JSON body
    or fed SSE events one at a time."""

    def __init__(self, family: Family, endpoint: str) -> None:
        self.family, self.endpoint = family, endpoint
        self.usage: Usage | None = None
        self.model: str | None = None
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int | str, dict[str, Any]] = {}
        self.stop_reason: str | None = None
        self.backoff_s = 0.0
        self._anthropic_usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}

    @property
    def stream_events(self) -> frozenset[bytes] | None:
        """The names of the streamed events this digest reads (None: all of them)."""
        if self.family == "openai" and self.endpoint == "responses":
            return frozenset(name.encode() for name in RESPONSES_FINAL_EVENTS)
        return None

    def message(self) -> dict[str, Any]:
        calls = []
        for call in self.calls.values():
            raw = call.get("arguments") or ""
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                args = {"__raw_arguments__": raw}
            calls.append({"id": call.get("id") or "", "name": call.get("name") or "", "arguments": args})
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if calls:
            out["tool_calls"] = calls
        if self.thinking:
            out["thinking"] = "\n".join(self.thinking)
        return out

    # -- whole bodies
    def body(self, data: dict[str, Any]) -> None:
        self.model = data.get("model") or self.model
        if self.family == "anthropic":
            self.usage = anthropic_usage(data.get("usage"))
            self.stop_reason = data.get("stop_reason")
            for i, block in enumerate(data.get("content") or []):
                self._block(i, block)
        elif self.endpoint == "responses":
            self.usage = responses_usage(data.get("usage"))
            self.stop_reason = data.get("status")
            for item in data.get("output") or []:
                self._responses_item(item)
        else:
            self.usage = chat_usage(data.get("usage"))
            choice = (data.get("choices") or [{}])[0]
            self.stop_reason = choice.get("finish_reason")
            msg = choice.get("message") or {}
            self.text.append(msg.get("content") or "")
            if msg.get("reasoning_content"):
                self.thinking.append(msg["reasoning_content"])
            for i, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function") or {}
                self.calls[i] = {"id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}

    def _responses_item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "message":
            self.text.extend(c.get("text", "") for c in item.get("content") or [] if c.get("type") == "output_text")
        elif kind == "function_call":
            key = item.get("call_id") or len(self.calls)
            self.calls[key] = {"id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")}
        elif kind in ("custom_tool_call", "local_shell_call"):
            key = item.get("call_id") or len(self.calls)
            args = item.get("input") if kind == "custom_tool_call" else item.get("action")
            self.calls[key] = {"id": item.get("call_id"), "name": item.get("name") or kind, "arguments": args}
        elif kind == "reasoning":
            self.thinking.extend(s.get("text", "") for s in item.get("summary") or [])

    def _block(self, index: int, block: dict[str, Any]) -> None:
        kind = block.get("type")
        if kind == "text":
            self.text.append(block.get("text", ""))
        elif kind in ("tool_use", "server_tool_use"):
            self.calls[index] = {"id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")}
        elif kind == "thinking":
            self.thinking.append(block.get("thinking", ""))

    # -- streams
    def event(self, data: dict[str, Any]) -> None:
        if self.family == "anthropic":
            self._anthropic_event(data)
        elif self.endpoint == "responses":
            if data.get("type") in RESPONSES_FINAL_EVENTS:
                self.body(data.get("response") or {})
        else:
            self._chat_chunk(data)

    def _anthropic_event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model") or self.model
            self._anthropic_usage.update(message.get("usage") or {})
        elif kind == "message_delta":
            # cumulative: the final counts overwrite message_start's placeholders
            self._anthropic_usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            self.stop_reason = (data.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind == "content_block_start":
            block = dict(data.get("content_block") or {})
            if block.get("type") in ("tool_use", "server_tool_use"):
                block["partial"] = ""
            self._blocks[data.get("index", len(self._blocks))] = block
        elif kind == "content_block_delta":
            block = self._blocks.setdefault(data.get("index", 0), {"type": "text", "text": ""})
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                block["partial"] = block.get("partial", "") + delta.get("partial_json", "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "message_stop":
            for i, block in sorted(self._blocks.items()):
                if "partial" in block:
                    block["input"] = block.pop("partial") or "{}"
                self._block(i, block)
            self._blocks.clear()
        self.usage = anthropic_usage(self._anthropic_usage)

    def _chat_chunk(self, data: dict[str, Any]) -> None:
        self.model = data.get("model") or self.model
        if data.get("usage"):
            self.usage = chat_usage(data["usage"])
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            self.text.append(delta.get("content") or "")
            if delta.get("reasoning_content"):
                self.thinking.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(call.get("index", 0), {"id": None, "name": None, "arguments": ""})
                fn = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            self.stop_reason = choice.get("finish_reason") or self.stop_reason


class SseReader:
    """Server-sent events from a byte stream fed in arbitrary chunks: each complete event's JSON `data`; with
    `names`, only the events named so (or not named at all), so that the others are not parsed."""

    def __init__(self, names: frozenset[bytes] | None = None) -> None:
        self._buffer = b""
        self._names = names

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        *complete, self._buffer = (self._buffer + chunk.replace(b"\r\n", b"\n")).split(b"\n\n")
        events = []
        for raw in complete:
            lines = raw.split(b"\n")
            if self._names is not None:
                name = next((line[6:].strip() for line in lines if line.startswith(b"event:")), None)
                if name is not None and name not in self._names:
                    continue
            data = b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
            if not data or data == b"[DONE]":
                continue
            with contextlib.suppress(ValueError):
                parsed = json.loads(data)
                if isinstance(parsed, dict):
                    events.append(parsed)
        return events


Hook = Callable[[], Awaitable[None]]
AfterHook = Callable[[float], Awaitable[None]]  # given the call's model seconds


class GatewayAddress:
    """Where agents reach a gateway (`url`): the base URLs they are given, as the SDKs and CLIs expect them."""

    url: str

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/openai/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"{self.url}/anthropic"


class ModelGateway(GatewayAddress):
    """One run's gateway. `await start()` binds 127.0.0.1 (or `host`) on a free port (or `port`); `url` is then the
    base for agents (`openai_base_url`, `anthropic_base_url`)."""

    def __init__(
        self,
        config: GatewayConfig,
        transcript: JsonlLog | None = None,
        telemetry: RunTelemetry | None = None,
        state: GatewayState | None = None,
        state_path: Path | None = None,
        before_call: Hook | None = None,
        after_call: AfterHook | None = None,
        on_refusal: Callable[[StopReason], None] | None = None,
    ) -> None:
        self.config = config
        self.transcript = transcript
        self.telemetry = telemetry
        self.state = state or GatewayState()
        self.state_path = state_path
        self.before_call, self.after_call = before_call, after_call
        self.on_refusal = on_refusal
        self._runner: aiohttp.web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._state_writer: asyncio.Task[None] | None = None
        self._state_changed = False
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ModelGateway:
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{family:openai|anthropic}/v1/{tail:.*}", self._handle)
        app.router.add_get("/healthz", self._health)
        # On close, a call still in flight (the agent was stopped mid-call) is cut after 2 s, not aiohttp's 60.
        self._runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.config.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=True)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.sleep(0)  # the last calls' transcript lines (written on the loop's next turn) go out first
        if self._state_writer is not None:
            await self._state_writer
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> ModelGateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _health(self, _request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(self.state.model_dump(mode="json"))

    # -- accounting
    def spent(self) -> tuple[StopReason, str] | None:
        b, s = self.config.budgets, self.state.spend
        if b.tokens is not None and s.usage.total >= b.tokens:
            return StopReason.tokens, f"{s.usage.total:,} of {b.tokens:,} tokens"
        if b.usd is not None and s.usd >= b.usd:
            return StopReason.usd, f"${s.usd:.4f} of ${b.usd:g}"
        if b.steps is not None and s.steps >= b.steps:
            return StopReason.steps, f"{s.steps} of {b.steps} model calls"
        return None

    def _save(self) -> None:
        """Have `gateway.json` rewritten, off the call's path: a writer task writes the latest state in a thread, and
        once more if it changed meanwhile (a burst of calls costs a write or two, not one each)."""
        if self.state_path is None:
            return
        self._state_changed = True
        if self._state_writer is None or self._state_writer.done():
            self._state_writer = asyncio.get_running_loop().create_task(self._write_state(self.state_path))

    async def _write_state(self, path: Path) -> None:
        while self._state_changed:
            self._state_changed = False
            snapshot = self.state.model_dump(mode="json")
            try:
                await asyncio.to_thread(write_json_atomic, path, snapshot)
            except OSError as exc:  # the call was counted in memory, and budgets are enforced from there
                logging.getLogger(__name__).warning("labkube gateway: could not write %s: %s", path, exc)

    def _authorized(self, request: aiohttp.web.Request) -> bool:
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(given.strip().encode(), self.config.token.encode())

    # -- the proxy
    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        family: Family = request.match_info["family"]  # type: ignore[assignment]
        tail = request.match_info["tail"]
        if not self._authorized(request):
            kind = "authentication_error" if family == "anthropic" else "invalid_request_error"
            body = error_body(family, 401, kind, "labkube gateway: wrong or missing run token")
            return aiohttp.web.json_response(body, status=401)
        upstream = getattr(self.config, family)
        if upstream is None:
            message = f"labkube gateway: this run's model is not served over the {family} API"
            return aiohttp.web.json_response(error_body(family, 404, "not_found_error", message), status=404)
        raw = await request.read()
        endpoint = tail.rstrip("/")
        if request.method != "POST" or endpoint not in MODEL_CALLS[family]:
            return await self._forward(request, family, upstream, tail, raw, None)
        spent = self.spent()
        if spent is not None:
            return self._refuse(family, *spent)
        # The request goes upstream as it came (a long session's is hundreds of kB of JSON, milliseconds to parse);
        # only a Chat Completion is read first, and it is the provider that answers a body that is not JSON.
        if endpoint == "chat/completions":
            try:
                raw = with_stream_usage(raw)
            except ValueError:
                message = "request body is not a JSON object"
                return aiohttp.web.json_response(error_body(family, 400, "invalid_request_error", message), status=400)
        digest = CallDigest(family, endpoint)
        if self.before_call is not None:
            await self.before_call()
        started = time.monotonic()
        try:
            return await self._forward(request, family, upstream, tail, raw, digest)
        finally:
            if self.after_call is not None:  # the world is charged the model's time, not the retries' back-off
                await self.after_call(max(0.0, time.monotonic() - started - digest.backoff_s))

    def _refuse(self, family: Family, reason: StopReason, detail: str) -> aiohttp.web.Response:
        self.state.refused += 1
        self.state.stop_reason = self.state.stop_reason or reason
        self._save()
        if self.transcript is not None:
            self.transcript.append({"type": "budget_stop", "ts": now_iso(), "reason": reason.value, "detail": detail})
        if self.on_refusal is not None:
            self.on_refusal(reason)
        status, body = refusal(family, reason, detail)
        return aiohttp.web.json_response(body, status=status, headers={"x-should-retry": "false"})

    def _headers(self, request: aiohttp.web.Request, family: Family, upstream: Upstream) -> dict[str, str]:
        headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}
        if upstream.api_key:
            if family == "anthropic":
                headers["x-api-key"] = upstream.api_key
            else:
                headers["authorization"] = f"Bearer {upstream.api_key}"
        return headers

    async def _forward(
        self,
        request: aiohttp.web.Request,
        family: Family,
        upstream: Upstream,
        tail: str,
        raw: bytes,
        digest: CallDigest | None,
    ) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        base = upstream.base_url.rstrip("/")
        url = f"{base}/{tail}" if family == "openai" else f"{base}/v1/{tail}"
        headers = self._headers(request, family, upstream)
        started = time.monotonic()
        backoff = 0.0
        attempt = 0
        upstream_response = None
        failure = ""
        while True:
            attempt += 1
            wait = None
            try:
                upstream_response = await self._session.request(
                    request.method, url, data=raw or None, headers=headers, params=request.query
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure, upstream_response = f"{type(exc).__name__}: {exc}", None
            else:
                if upstream_response.status not in RETRY_STATUSES or attempt >= self.config.max_attempts:
                    break  # an answer, or the provider's own error once the retries are used up
                failure = f"HTTP {upstream_response.status}"
                wait = self._delay(attempt, upstream_response.headers.get("retry-after"))
                upstream_response.release()
                upstream_response = None
            if attempt >= self.config.max_attempts:
                break
            wait = self._delay(attempt, None) if wait is None else wait
            await asyncio.sleep(wait)
            backoff += wait
        if upstream_response is None:
            message = f"labkube gateway: the provider at {base} failed {attempt} times ({failure})"
            self.state.last_error = message
            self._record(digest, raw, started, backoff, attempt, error=message, path=tail)
            return aiohttp.web.json_response(error_body(family, 502, "api_error", message), status=502)
        try:
            if "text/event-stream" in upstream_response.headers.get("content-type", ""):
                return await self._relay_stream(
                    request, upstream_response, digest, raw, started, backoff, attempt, tail
                )
            data = await upstream_response.read()
            error = None
            if digest is not None and upstream_response.status < 400:
                with contextlib.suppress(ValueError):
                    digest.body(json.loads(data))
            elif upstream_response.status >= 400:
                error = f"HTTP {upstream_response.status}: {data[:500].decode(errors='replace')}"
            if digest is not None:
                self._record(digest, raw, started, backoff, attempt, error=error, path=tail)
            content_type = upstream_response.headers.get("content-type", "application/json")
            return aiohttp.web.Response(
                body=data, status=upstream_response.status, headers=_passed_back(upstream_response, content_type)
            )
        finally:
            upstream_response.release()

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            with contextlib.suppress(ValueError):
                return min(self.config.max_delay_s, max(0.0, float(retry_after)))
        base = min(self.config.max_delay_s, self.config.base_delay_s * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)

    async def _relay_stream(
        self,
        request: aiohttp.web.Request,
        upstream_response: aiohttp.ClientResponse,
        digest: CallDigest | None,
        raw: bytes,
        started: float,
        backoff: float,
        attempt: int,
        tail: str,
    ) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(
            status=upstream_response.status,
            headers=_passed_back(upstream_response, upstream_response.headers.get("content-type", "text/event-stream")),
        )
        await response.prepare(request)
        reader = SseReader(digest.stream_events if digest is not None else None)
        error = None
        try:
            async for chunk in upstream_response.content.iter_any():
                try:
                    await response.write(chunk)  # to the agent first; it is counted after
                finally:
                    if digest is not None:
                        for event in reader.feed(chunk):
                            digest.event(event)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"the provider's stream broke: {type(exc).__name__}: {exc}"
        except ConnectionResetError:
            error = "the agent closed the stream"
        finally:
            if digest is not None:
                self._record(digest, raw, started, backoff, attempt, error=error, path=tail)
        if error is None:
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        return response

    def _record(
        self,
        digest: CallDigest | None,
        raw: bytes,
        started: float,
        backoff: float,
        attempts: int,
        error: str | None,
        path: str,
    ) -> None:
        """Count one model call (even a failed one: its back-off and attempts are real) at once, before the answer's
        last bytes go out, so that the next call's budget check sees it. Its transcript line, series and state file
        are written on the event loop's next turn, once aiohttp has sent the answer: they are no part of what the
        agent waits for."""
        if digest is None:
            return
        digest.backoff_s = backoff
        usage = digest.usage or Usage()
        body = None
        model = digest.model
        if not model:  # an answer that does not name its model: the request does
            body = request_body(raw)
            model = str(body.get("model") or "")
        priced_as = f"{self.config.provider_prefix}:{model}"
        usd = cost_usd(priced_as, usage, self.config.prices) if model else 0.0
        s = self.state
        s.spend.usage = s.spend.usage + usage
        s.spend.add_cost(priced_as, usd)
        s.backoff_s += backoff
        s.calls += 1
        if error is None:
            s.spend.steps += 1
        else:
            s.last_error = error
        self._save()
        duration = time.monotonic() - started
        line = {
            "type": "model_call",
            "purpose": "step",
            "step": s.spend.steps,
            "ts": now_iso(),
            "model": model,
            "via": "gateway",
            "request": body,  # summarized when the line is written
            "message": None,
            "stop_reason": digest.stop_reason,
            "usage": usage.model_dump(),
            "cost_usd": usd,
            "duration_s": round(duration, 4),
            "backoff_s": round(backoff, 4),
            "attempts": attempts,
            **({"error": error} if error else {}),
        }
        asyncio.get_running_loop().call_soon(self._log_call, line, digest, raw, path, usage, usd, duration - backoff)

    def _log_call(
        self,
        line: dict[str, Any],
        digest: CallDigest,
        raw: bytes,
        path: str,
        usage: Usage,
        usd: float | None,
        model_seconds: float,
    ) -> None:
        if self.transcript is not None:
            body = line["request"] if line["request"] is not None else request_body(raw)
            line["request"] = request_summary(path, body)
            line["message"] = digest.message()
            self.transcript.append(line)
        if self.telemetry is not None:
            self.telemetry.model_call(usage, usd, max(0.0, model_seconds))


def request_body(raw: bytes) -> dict[str, Any]:
    """The request as the agent sent it ({} when it is not a JSON object: the provider said so)."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def with_stream_usage(raw: bytes) -> bytes:
    """A Chat Completion request as sent upstream: streamed, it asks for the usage chunk, without which a streamed
    Chat Completion carries no usage at all. ValueError when the body is not a JSON object."""
    body = json.loads(raw) if raw else {}
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    if not body.get("stream"):
        return raw
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body).encode()


def request_summary(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What was asked, without the whole conversation (the agent's own log has that)."""
    turns = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return {
        "path": path,
        "model": body.get("model"),
        "stream": bool(body.get("stream")),
        "turns": len(turns) if isinstance(turns, list) else (1 if turns else 0),
        "tools": [t.get("name") or (t.get("function") or {}).get("name") or t.get("type") for t in tools],
        "max_tokens": body.get("max_tokens") or body.get("max_output_tokens") or body.get("max_completion_tokens"),
    }


def _passed_back(response: aiohttp.ClientResponse, content_type: str) -> dict[str, str]:
    headers = {"content-type": content_type}
    for name in ("retry-after", "x-request-id", "request-id", "x-should-retry", "openai-processing-ms"):
        if name in response.headers:
            headers[name] = response.headers[name]
    for name, value in response.headers.items():
        if name.lower().startswith(("x-ratelimit-", "anthropic-ratelimit-")):
            headers[name] = value
    return headers


STATE_TIMEOUT_S = 2.0  # a sidecar on the pod's loopback answers in milliseconds; a dead one must not stall a sync


class GatewayView(GatewayAddress):
    """A gateway in another container of the pod (the `gateway` sidecar): its address, the token it wrote, and the
    totals it keeps in `gateway.json`, with the same attributes the CLI supervisor reads from a `ModelGateway`."""

    def __init__(self, url: str, token: str, state_path: Path) -> None:
        self.url = url.rstrip("/")
        self.config = GatewayConfig(token=token)
        self.state_path = state_path
        self.state = GatewayState()
        self.refresh()

    def refresh(self) -> None:
        """The gateway's totals as it counts them now (`/healthz`: every answered call, counted before its last
        bytes went out); only when it does not answer, as it last wrote them to `gateway.json`, which it rewrites
        off the calls' path, a moment after an answer: a final look at the file could miss the last call."""
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=STATE_TIMEOUT_S) as answer:
                self.state = GatewayState.model_validate_json(answer.read())
            return
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError, ValueError):
            self.state = GatewayState.model_validate_json(self.state_path.read_text())

    async def close(self) -> None:
        return None


def world_clock_hooks(world_url: str | None, think_time_s: float | None) -> tuple[Hook | None, AfterHook | None]:
    """In a Gaia2 pod the gateway sidecar stops the world sidecar's clock around each model call, as rg-agent does:
    the clock is charged the call's measured time (or the run's fixed think time)."""
    if not world_url:
        return None, None
    from labkube.tasks.gaia2 import WorldClient

    client = WorldClient(world_url)

    async def pause() -> None:
        await client.pause_clock()

    async def resume(model_seconds: float) -> None:
        if think_time_s is None:
            await client.resume_clock("measured", seconds=model_seconds)
        else:
            await client.resume_clock("fixed", seconds=think_time_s)

    return pause, resume


async def serve_run_gateway(run_dir: Path, host: str, port: int, token_file: Path) -> None:
    """The pod's gateway sidecar: the run's provider and budgets from run.json, its key from this container's
    environment, the spend so far from the run's checkpoint (a resumed run goes on counting); the token written to
    `token_file` (a volume shared with the agent container only), then serve until SIGTERM."""
    import signal

    from labkube.agent.checkpoint import Checkpoint
    from labkube.agent.registry import api_key_for
    from labkube.store import RunDir, read_model

    rd = RunDir(run_dir)
    spec = rd.spec()
    ref = parse_model(spec.model)
    family, upstream = upstream_for(ref, api_key_for(ref, spec))
    ckpt = read_model(rd.checkpoint_json, Checkpoint)
    config = run_config(spec, family, upstream)
    state = GatewayState(spend=ckpt.spend.model_copy(deep=True) if ckpt else Spend())
    before, after = world_clock_hooks(os.environ.get("LABKUBE_WORLD_URL"), spec.think_time_s)
    gateway = ModelGateway(
        config,
        transcript=JsonlLog(rd.transcript),
        state=state,
        state_path=rd.root / "gateway.json",
        before_call=before,
        after_call=after,
    )
    await gateway.start(host, port)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    staged = token_file.with_suffix(".tmp")
    staged.write_text(config.token)
    staged.replace(token_file)
    print(f"LISTENING {gateway.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await gateway.close()
