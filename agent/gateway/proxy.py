"""The HTTP proxy itself (`ModelGateway`): one run's server that checks the agent's token, forwards each call
upstream with retries and back-off, counts and prices it, writes it to the transcript and refuses calls once a
budget is spent."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from labkube.agent.gateway.digest import CallDigest, request_body, request_summary, with_stream_usage
from labkube.agent.gateway.record import CallRecord
from labkube.agent.gateway.state import (
    FORWARDED_HEADERS,
    MODEL_CALLS,
    RETRY_STATUSES,
    Family,
    GatewayConfig,
    GatewayState,
    Upstream,
    error_body,
    refusal,
)
from labkube.agent.gateway.wire import (
    AgentClosed,
    AgentStalled,
    HttpServer,
    Reply,
    Request,
    Sent,
    UpstreamPool,
    UpstreamResponse,
    unix_listener,
)
from labkube.agent.pricing import cost_usd
from labkube.agent.telemetry import RunTelemetry
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.budgets import StopReason, Usage, unsaid_note
from labkube.store import write_json_atomic

Hook = Callable[[], Awaitable[None]]
AfterHook = Callable[[float], Awaitable[None]]  # given the call's model seconds
# How long a finished call's transcript line, series and state file may wait for the gateway to have no call in
# flight before they are written anyway (calls that keep overlapping would otherwise hold them back for good).
MAX_DEFER_S = 1.0
MAX_REQUEST_BYTES = 64 * 1024 * 1024
# On close, a call still in flight (the agent was stopped mid-call) is cut after this.
CLOSE_GRACE_S = 2.0
ROUTE = re.compile(r"/(openai|anthropic)/v1/(.*)", re.DOTALL)
JSON = {"content-type": "application/json"}
PATH_SAFE = ":@!$&'()*+,;=-._~"  # what a path segment may hold unescaped (RFC 3986, 3.3)


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
    base for agents (`openai_base_url`, `anthropic_base_url`). A finished call's bookkeeping waits for the calls in
    flight `max_defer_s` at most (`_defer`); 0: the next turn of the event loop."""

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
        max_defer_s: float = MAX_DEFER_S,
        keep_state: Callable[[GatewayState], None] | None = None,
        call_record: CallRecord | None = None,
    ) -> None:
        self.config = config
        # A pod's record of the tool calls the model issued (`record.py`), where the agent's container cannot write
        self.call_record = call_record
        self.max_defer_s = max_defer_s
        self.transcript = transcript
        self.telemetry = telemetry
        self.state = state or GatewayState()
        self.state_path = state_path
        self.keep_state = keep_state  # called in a thread with every state written (a pod's `ledger.keep_report`)
        self.before_call, self.after_call = before_call, after_call
        self.on_refusal = on_refusal
        self._server: HttpServer | None = None
        self._upstream: UpstreamPool | None = None
        self._state_writer: asyncio.Task[None] | None = None
        self._state_changed = False
        self._state_write_queued = False
        self._in_flight = 0
        self._deferred: deque[tuple[float, Callable[[], None]]] = deque()
        self._deferred_handle: asyncio.Handle | None = None
        self._unix_paths: list[Path] = []
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ModelGateway:
        # The provider's silence is timed per call (`_forward`, `_relay_stream`), not per chunk received.
        self._upstream = UpstreamPool(connect_timeout_s=30.0)
        self._server = HttpServer(self._serve, max_body=MAX_REQUEST_BYTES, admit=self._admit)
        bound = await self._server.start(host, port)
        self.url = f"http://{host}:{bound}"
        return self

    async def listen_unix(self, path: Path) -> None:
        """Serve on a unix socket at `path` too (after `start`), with the same routes and token check: the way in
        for an agent in the run's sandbox, whose network has no host loopback. Removed again by `close`."""
        assert self._server is not None, "start the gateway first"
        await self._server.start_unix(unix_listener(path))
        self._unix_paths.append(path)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close(CLOSE_GRACE_S)
            self._server = None
        for path in self._unix_paths:
            path.unlink(missing_ok=True)
        self._unix_paths = []
        self.flush()  # the last calls' transcript lines, series and state file
        if self._state_writer is not None:
            await self._state_writer
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    def flush(self) -> None:
        """Write down now every finished call's bookkeeping still waiting (`_defer`): its transcript line and series
        (and start the state file's write). A checkpoint takes the transcript's position after this, so that a run
        resumed from it keeps every call its spend counts."""
        if self._deferred_handle is not None:
            self._deferred_handle.cancel()
            self._deferred_handle = None
        while self._deferred:
            try:
                self._deferred.popleft()[1]()
            except Exception:  # one failed line must not keep the others, the state file or the session open
                logging.getLogger(__name__).exception("labkube gateway: a call's bookkeeping failed")

    async def __aenter__(self) -> ModelGateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, request: Request, reply: Reply) -> None:
        if (route := ROUTE.fullmatch(request.path)) is not None:
            self._in_flight += 1
            try:
                await self._handle_call(request, reply, route[1], route[2])  # type: ignore[arg-type]
            finally:
                self._call_ended()
        elif request.path in ("/healthz", "/checkpoint"):
            allowed = "GET" if request.path == "/healthz" else "POST"
            if request.method != allowed:
                _send_json(reply, 405, {"error": f"labkube gateway: {request.path} takes {allowed}"})
            elif request.path == "/healthz":
                _send_json(reply, 200, self.state.model_dump(mode="json"))
            else:
                self._checkpoint(request, reply)
        else:
            _send_json(reply, 404, {"error": f"labkube gateway: no such endpoint: {request.path}"})

    def _admit(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """Every request but a bodiless `GET /healthz` carries the run's token, checked from its head: one without it
        is answered 401 and its connection closed before a byte of its body is read (a pod's loopback is the agent's
        too, and a body held before the check would let anything there fill the sidecar's memory)."""
        bodiless = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
        if (path == "/healthz" and method == "GET" and bodiless) or self._token_in(headers):
            return None
        route = ROUTE.fullmatch(path)
        if route is None:
            return 401, json.dumps({"error": "labkube gateway: wrong or missing run token"}).encode()
        family: Family = route[1]  # type: ignore[assignment]
        kind = "authentication_error" if family == "anthropic" else "invalid_request_error"
        return 401, json.dumps(error_body(family, 401, kind, "labkube gateway: wrong or missing run token")).encode()

    def _checkpoint(self, request: Request, reply: Reply) -> None:
        """What `flush` is in-process, for an agent in another container (a pod's `GatewayView`): every counted
        call's transcript line written now, then the counts and where this gateway's transcript writes end, taken at
        one moment, so that a checkpoint keeping that end keeps every call its spend counts (a resumed run truncates
        the transcript at its checkpoint's offset)."""
        if not self._authorized(request):
            return _send_json(reply, 401, {"error": "labkube gateway: wrong or missing run token"})
        self.flush()
        # Where its own last line ended (None: none since it started): not its file object's position, which the
        # agent's truncation of the transcript, when it resumes, leaves past the end of the file.
        end = self.transcript.written_end if self.transcript is not None else None
        _send_json(reply, 200, {"state": self.state.model_dump(mode="json"), "transcript_end": end})

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
        """Have `gateway.json` rewritten, off the calls' path (with the transcript's lines, `_defer`): a writer task
        writes the latest state in a thread, and once more if it changed meanwhile (a burst of calls costs a write
        or two, not one each)."""
        if (self.state_path is None and self.keep_state is None) or self._state_write_queued:
            return
        self._state_write_queued = True
        self._defer(self._start_state_writer)

    def _start_state_writer(self) -> None:
        self._state_write_queued = False
        self._state_changed = True
        if self._state_writer is None or self._state_writer.done():
            self._state_writer = asyncio.get_running_loop().create_task(self._write_state())

    # -- work that waits for the calls in flight
    def _defer(self, job: Callable[[], None]) -> None:
        """Run `job` (a finished call's bookkeeping) once no call is in flight, one job a turn of the event loop, so
        that the calls of a burst do not wait for the ones before them to be written down; at most `max_defer_s`
        later under calls that keep overlapping."""
        self._deferred.append((time.monotonic(), job))
        self._wake_deferred()

    def _wake_deferred(self) -> None:
        if self._deferred_handle is not None or not self._deferred:
            return
        loop = asyncio.get_running_loop()
        if self._in_flight == 0:
            self._deferred_handle = loop.call_soon(self._run_deferred)
        else:
            due = self._deferred[0][0] + self.max_defer_s - time.monotonic()
            self._deferred_handle = loop.call_later(max(0.0, due), self._run_deferred)

    def _run_deferred(self) -> None:
        self._deferred_handle = None
        try:
            if self._deferred and (self._in_flight == 0 or self._deferred[0][0] + self.max_defer_s <= time.monotonic()):
                self._deferred.popleft()[1]()
        finally:
            self._wake_deferred()

    def _call_ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._deferred_handle is not None:  # a timer set while calls were in flight
            self._deferred_handle.cancel()
            self._deferred_handle = None
        self._wake_deferred()

    async def _write_state(self) -> None:
        while self._state_changed:
            self._state_changed = False
            snapshot = self.state.model_copy(deep=True)
            try:
                await asyncio.to_thread(self.write_state, snapshot)
            except OSError as exc:  # the call was counted in memory, and budgets are enforced from there
                logging.getLogger(__name__).warning("labkube gateway: could not write its state: %s", exc)

    def write_state(self, state: GatewayState | None = None) -> None:
        """Write `state` (now's, by default) to `gateway.json` and wherever `keep_state` keeps it."""
        state = state or self.state
        if self.state_path is not None:
            write_json_atomic(self.state_path, state.model_dump(mode="json"))
        if self.keep_state is not None:
            self.keep_state(state)

    def _authorized(self, request: Request) -> bool:
        return self._token_in(request.headers)

    def _token_in(self, headers: dict[str, str]) -> bool:
        given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(given.strip().encode(), self.config.token.encode())

    # -- the proxy
    async def _handle_call(self, request: Request, reply: Reply, family: Family, tail: str) -> None:
        if not self._authorized(request):
            kind = "authentication_error" if family == "anthropic" else "invalid_request_error"
            body = error_body(family, 401, kind, "labkube gateway: wrong or missing run token")
            return _send_json(reply, 401, body)
        upstream = getattr(self.config, family)
        if upstream is None:
            message = f"labkube gateway: this run's model is not served over the {family} API"
            return _send_json(reply, 404, error_body(family, 404, "not_found_error", message))
        tail = canonical_tail(tail)
        if tail is None:
            message = "labkube gateway: a path with a '..' segment or ';' parameters is not forwarded"
            return _send_json(reply, 400, error_body(family, 400, "invalid_request_error", message))
        raw = request.body
        endpoint = tail
        if request.method != "POST" or endpoint not in MODEL_CALLS[family]:
            return await self._forward(request, reply, family, upstream, tail, raw, None)
        spent = self.spent()
        if spent is not None:
            return self._refuse(reply, family, *spent)
        # The request goes upstream as it came (a long session's is hundreds of kB of JSON, milliseconds to parse);
        # only a Chat Completion is read first, and it is the provider that answers a body that is not JSON.
        if endpoint == "chat/completions":
            try:
                raw = with_stream_usage(raw)
            except ValueError:
                message = "request body is not a JSON object"
                return _send_json(reply, 400, error_body(family, 400, "invalid_request_error", message))
        digest = CallDigest(family, endpoint)
        if self.before_call is not None:
            await self.before_call()
        started = time.monotonic()
        try:
            return await self._forward(request, reply, family, upstream, tail, raw, digest)
        finally:
            if self.after_call is not None:  # the world is charged the model's time, not the retries' back-off
                await self.after_call(max(0.0, time.monotonic() - started - digest.backoff_s))

    def _refuse(self, reply: Reply, family: Family, reason: StopReason, detail: str) -> None:
        self.state.refused += 1
        self.state.stop_reason = self.state.stop_reason or reason
        self._save()
        if self.transcript is not None:  # after the model_call lines still waiting to be written
            transcript = self.transcript
            line = {"type": "budget_stop", "ts": now_iso(), "reason": reason.value, "detail": detail}
            self._defer(lambda: transcript.append(line))
        if self.on_refusal is not None:
            self.on_refusal(reason)
        status, body = refusal(family, reason, detail)
        _send_json(reply, status, body, {"x-should-retry": "false"})

    def _headers(self, request: Request, family: Family, upstream: Upstream) -> dict[str, str]:
        headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}
        if upstream.api_key:
            if family == "anthropic":
                headers["x-api-key"] = upstream.api_key
            else:
                headers["authorization"] = f"Bearer {upstream.api_key}"
        return headers

    async def _forward(
        self,
        request: Request,
        reply: Reply,
        family: Family,
        upstream: Upstream,
        tail: str,
        raw: bytes,
        digest: CallDigest | None,
    ) -> None:
        assert self._upstream is not None
        base = upstream.base_url.rstrip("/")
        url = f"{base}/{tail}" if family == "openai" else f"{base}/v1/{tail}"
        headers = self._headers(request, family, upstream)
        started = time.monotonic()
        backoff = 0.0
        attempt = 0
        upstream_response = None
        failure = ""
        sent, unsaid = Sent(), 0  # attempts that reached the provider and got no answer: it may have generated one
        while True:
            attempt += 1
            wait = None
            try:
                async with asyncio.timeout(self.config.timeout_s):  # until the provider's answer begins
                    upstream_response = await self._upstream.request(
                        request.method, url, headers, raw, query=request.query, sent=sent
                    )
            except OSError as exc:  # a refused or broken connection, TLS, a timeout (TimeoutError is one)
                failure, upstream_response = f"{type(exc).__name__}: {exc}", None
                unsaid += sent.value
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
        if digest is not None:
            digest.unsaid_attempts = unsaid
        if upstream_response is None:
            message = f"labkube gateway: the provider at {base} failed {attempt} times ({failure})"
            self.state.last_error = message
            self._record(digest, raw, started, backoff, attempt, error=message, path=tail)
            return _send_json(reply, 502, error_body(family, 502, "api_error", message))
        try:
            if "text/event-stream" in upstream_response.headers.get("content-type", ""):
                return await self._relay_stream(reply, upstream_response, digest, raw, started, backoff, attempt, tail)
            try:
                arrived = upstream_response.arrived  # then there is nothing to time (a timer costs its heap pushes)
                async with contextlib.nullcontext() if arrived else asyncio.timeout(self.config.timeout_s):
                    data = await upstream_response.read()
            except OSError as exc:
                message = f"labkube gateway: the provider's answer broke off: {type(exc).__name__}: {exc}"
                self.state.last_error = message
                # A model's answer that broke off was generated, and may be billed: its usage is not known to be 0.
                partial = upstream_response.status < 400
                self._record(digest, raw, started, backoff, attempt, error=message, path=tail, partial=partial)
                return _send_json(reply, 502, error_body(family, 502, "api_error", message))
            error = None
            if digest is not None and upstream_response.status < 400:
                answer = None
                with contextlib.suppress(ValueError):
                    answer = json.loads(data)
                if isinstance(answer, dict):
                    digest.body(answer)
                else:  # passed on as it came; what it cost is not known, and not taken as nothing
                    digest.usage_unknown = True
                    error = "the provider's answer is not a JSON object; its usage and cost are unknown"
            elif upstream_response.status >= 400:
                error = f"HTTP {upstream_response.status}: {data[:500].decode(errors='replace')}"
            if digest is not None:
                partial = upstream_response.status < 400 and not digest.usage_final
                self._record(digest, raw, started, backoff, attempt, error=error, path=tail, partial=partial)
            content_type = upstream_response.headers.get("content-type", "application/json")
            reply.send(upstream_response.status, _passed_back(upstream_response, content_type), data)
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
        reply: Reply,
        upstream_response: UpstreamResponse,
        digest: CallDigest | None,
        raw: bytes,
        started: float,
        backoff: float,
        attempt: int,
        tail: str,
    ) -> None:
        content_type = upstream_response.headers.get("content-type", "text/event-stream")
        reply.start(upstream_response.status, _passed_back(upstream_response, content_type))
        relayed: list[bytes] = []  # read once the stream ends (`CallDigest.stream`), not chunk by chunk
        error = None
        try:
            # Each chunk goes to the agent from the provider connection's own callback; the stream is cut once the
            # provider has sent nothing for timeout_s.
            await upstream_response.relay(reply, relayed.append, self.config.timeout_s)
        except AgentStalled as exc:
            error = str(exc)
        except AgentClosed:
            error = "the agent closed the stream"
        except OSError as exc:  # the provider's connection broke, or fell silent (TimeoutError)
            error = f"the provider's stream broke: {type(exc).__name__}: {exc}"
        finally:
            if digest is not None:
                digest.stream(b"".join(relayed))
                partial = upstream_response.status < 400 and not digest.usage_final
                self._record(digest, raw, started, backoff, attempt, error=error, path=tail, partial=partial)
        if error is None:
            reply.end()

    def _record(
        self,
        digest: CallDigest | None,
        raw: bytes,
        started: float,
        backoff: float,
        attempts: int,
        error: str | None,
        path: str,
        partial: bool = False,
    ) -> None:
        """Count one model call (even a failed one: its back-off and attempts are real) at once, before the answer's
        last bytes go out, so that the next call's budget check sees it. Its transcript line, series and state file
        are written once the answer is sent and no other call is in flight (`_defer`): they are no part of what any
        agent waits for. A `partial` call's answer did not say its usage (it broke off before, or never says it): it
        counts what came, and the run's spend says its usage and dollars are lower bounds (`Spend.partial_calls`),
        never an exact figure."""
        if digest is None:
            return
        unsaid = digest.unsaid_attempts + partial
        self.state.spend.partial_calls += unsaid
        if partial and error is not None and not digest.usage_unknown:  # an unreadable answer's error says so already
            error = f"{error}; its usage is only what came before (a lower bound)"
        digest.backoff_s = backoff
        usage = digest.usage or Usage()
        body = None
        model = digest.model
        if not model:  # an answer that does not name its model: the request does
            body = request_body(raw)
            model = str(body.get("model") or "")
        priced_as = f"{self.config.provider_prefix}:{model}"
        usd = None if digest.usage_unknown else cost_usd(priced_as, usage, self.config.prices) if model else 0.0
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
        if self.call_record is not None and error is None:
            # Written now, before the answer's last bytes go to the agent: a tool call the agent runs is on record
            # before it can run (the grading pod compares the transcript with it).
            tool_calls = digest.message().get("tool_calls") or []
            self.call_record.append(now_iso(), s.calls, s.spend.steps, tool_calls)
        duration = time.monotonic() - started
        line = {
            "type": "model_call",
            "purpose": "step",
            "step": s.spend.steps,
            "ts": time.time(),  # written as ISO 8601 with the line
            "model": model,
            "via": "gateway",
            "request": body,  # summarized when the line is written
            "message": None,
            "stop_reason": digest.stop_reason,
            "usage": usage,  # dumped when the line is written
            "cost_usd": usd,
            "duration_s": round(duration, 4),
            "backoff_s": round(backoff, 4),
            "attempts": attempts,
            **({"error": error} if error else {}),
            **({"usage_partial": True} if unsaid else {}),
            **({"usage_note": note} if (note := self._unsaid_note(digest, partial, error)) else {}),
        }
        self._defer(lambda: self._log_call(line, digest, raw, path, usage, usd, duration - backoff))

    @staticmethod
    def _unsaid_note(digest: CallDigest, partial: bool, error: str | None) -> str | None:
        """The line's note on usage never said: attempts that broke off after reaching the provider, and a whole
        answer that did not say its usage (a broken answer's error says so itself)."""
        answer_unsaid = partial and error is None
        return unsaid_note(digest.unsaid_attempts, answer_unsaid) if digest.unsaid_attempts or answer_unsaid else None

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
            line["ts"] = datetime.fromtimestamp(line["ts"], UTC).isoformat()
            line["usage"] = usage.model_dump()
            line["request"] = request_summary(path, body)
            line["message"] = digest.message()
            self.transcript.append(line)
        if self.telemetry is not None:
            self.telemetry.model_call(usage, usd, max(0.0, model_seconds))
            self.telemetry.spend(self.state.spend)


def canonical_tail(tail: str) -> str | None:
    """The path below /v1/ as the provider routes it, which is what is metered and what is sent: percent-escapes
    decoded and written again only where a path needs them, empty and "." segments dropped (servers, and the proxies
    in front of them, merge slashes). Otherwise `messag%65s` or `/v1//responses` would reach the model uncounted and
    past a spent budget. None with a ".." segment or a ";" (path parameters, which some servers drop)."""
    segments = [segment for segment in unquote(tail).split("/") if segment not in ("", ".")]
    if ".." in segments or any(";" in segment for segment in segments):
        return None
    return "/".join(quote(segment, safe=PATH_SAFE) for segment in segments)


def _send_json(reply: Reply, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    reply.send(status, {**JSON, **headers} if headers else JSON, json.dumps(body).encode())


def _passed_back(response: UpstreamResponse, content_type: str) -> dict[str, str]:
    headers = {"content-type": content_type}
    for name in ("retry-after", "x-request-id", "request-id", "x-should-retry", "openai-processing-ms"):
        if name in response.headers:
            headers[name] = response.headers[name]
    for name, value in response.headers.items():
        if name.lower().startswith(("x-ratelimit-", "anthropic-ratelimit-")):
            headers[name] = value
    return headers
