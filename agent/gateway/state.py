"""The gateway's settings and running totals: which upstream a run's model calls go to, with what token and
budgets (`GatewayConfig`), what it has counted so far (`GatewayState`, written to `gateway.json`), and the refusals
it answers with once a budget is spent, in each provider's own words."""

from __future__ import annotations

import os
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from labkube.budgets import BUDGET_REFUSAL, Budgets, Spend, StopReason
from labkube.model_ref import ModelRef, parse_model
from labkube.run_spec import RunSpec

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
    message = f"{BUDGET_REFUSAL.format(reason=reason.value)} ({detail}); the run is over"
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
