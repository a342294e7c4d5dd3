"""The model gateway: a per-run HTTP proxy between any agent and the run's model provider, which every scaffold for
a third-party agent and the pods' `gateway` sidecar send model calls through.

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
every call, so a pod's agent container can read what its gateway sidecar counted. A call is counted in memory
before its answer's last bytes go out (budgets hold call by call, and `/healthz` answers with it); its transcript
line, series and the state file are written once no call is in flight (at most a second later while calls keep
overlapping; `close()` writes what is left), the file in a thread: an atomic rename costs milliseconds on a busy
disk, and the request's summary a parse of its JSON, work the calls in flight would otherwise queue behind
(benchmarks/gateway_overhead.py).

Its parts: `state` (the run's settings and totals, the refusals), `digest` (what a call's answer says: usage, model,
message, from JSON or server-sent events), `proxy` (`ModelGateway`: the routes, the metering, the retries), `wire`
(its HTTP/1.1 to the agent and to the provider, on asyncio's protocols with httptools' parser) and `sidecar`
(`labkube gateway` in a pod, and `GatewayView`, the agent container's view of it). The names below are the
gateway's public face; import them from here.
"""

from labkube.agent.gateway.digest import CallDigest, sse_events
from labkube.agent.gateway.proxy import AfterHook, GatewayAddress, Hook, ModelGateway
from labkube.agent.gateway.sidecar import GatewayView, serve_run_gateway, world_clock_hooks
from labkube.agent.gateway.state import (
    Family,
    GatewayConfig,
    GatewayError,
    GatewayState,
    Upstream,
    error_body,
    refusal,
    run_config,
    upstream_for,
)

__all__ = [
    "AfterHook",
    "CallDigest",
    "Family",
    "GatewayAddress",
    "GatewayConfig",
    "GatewayError",
    "GatewayState",
    "GatewayView",
    "Hook",
    "ModelGateway",
    "Upstream",
    "error_body",
    "refusal",
    "run_config",
    "serve_run_gateway",
    "sse_events",
    "upstream_for",
    "world_clock_hooks",
]
