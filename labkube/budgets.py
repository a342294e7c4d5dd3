"""Budgets a run may spend, and what it has spent so far."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Budgets(BaseModel):
    """Limits for one run. `None` means unlimited."""

    model_config = ConfigDict(extra="forbid")

    wall_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    tokens: int | None = Field(default=None, gt=0)
    usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    steps: int | None = Field(default=None, gt=0)

    def merged(self, override: Budgets | None) -> Budgets:
        """`override`'s set fields win over ours."""
        if override is None:
            return self
        data = self.model_dump()
        data.update({k: v for k, v in override.model_dump().items() if v is not None})
        return Budgets(**data)

    @property
    def wall_seconds(self) -> float | None:
        return None if self.wall_hours is None else self.wall_hours * 3600.0


class StopReason(StrEnum):
    """Why a run's agent loop ended."""

    done = "done"  # the agent called end_task
    time = "time"
    tokens = "tokens"
    usd = "usd"
    steps = "steps"
    auth = "auth"  # the model API refused our credentials
    model_error = "model_error"  # unknown model or a non-retryable API error
    world_error = "world_error"  # the Gaia2 world process died or failed
    error = "error"  # harness error
    killed = "killed"  # terminated from outside with no checkpoint to resume
    setup_error = "setup_error"  # the task environment could not be built; the agent never started
    cancelled = "cancelled"  # a person cancelled the run (`labkube runs cancel`)


class Usage(BaseModel):
    """Tokens by kind, as the model APIs report them."""

    input: int = 0
    output: int = 0
    reasoning: int = 0
    cached: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output

    def __add__(self, other: Usage) -> Usage:
        return Usage.model_construct(  # sums of counts already checked: no validation (the gateway adds every call)
            input=self.input + other.input,
            output=self.output + other.output,
            reasoning=self.reasoning + other.reasoning,
            cached=self.cached + other.cached,
        )


# A model call's transcript line, where its answer was whole but never said its usage (`Spend.partial_calls`).
UNSAID_ANSWER = "the provider's answer did not say its usage"
COUNTED_AS_NONE = "counted as none, a lower bound"


def unsaid_note(attempts: int, answer_unsaid: bool) -> str:
    """A model call's transcript note on the usage its provider never said (`Spend.partial_calls`): `attempts` that
    broke off after reaching the provider, and an answer that did not say its usage."""
    notes = (
        [f"{attempts} attempt{'s' if attempts != 1 else ''} broke off after reaching the provider"] if attempts else []
    )
    if answer_unsaid:
        notes.append(UNSAID_ANSWER)
    return f"{'; '.join(notes)}: {COUNTED_AS_NONE}"


class Spend(BaseModel):
    """What a run has used; carried across resumes."""

    steps: int = 0
    usage: Usage = Field(default_factory=Usage)
    usd: float = Field(default=0.0, description="Dollars of the calls the price table could price.")
    unpriced: list[str] = Field(
        default_factory=list,
        description="Models called that the price table does not know: their dollars are unknown, and so is the "
        "run's cost (`cost_usd`).",
    )
    partial_calls: int = Field(
        default=0,
        description="Model calls, and retried attempts of them, whose answer did not say its usage: it broke off "
        "before it did (a stream cut, an answer lost mid-body, none at all after the request reached the provider), or "
        "never says it (an OpenAI-compatible server that ignores include_usage). They count what came, so when this "
        "is above 0 the run's tokens and dollars are lower bounds.",
    )
    wall_seconds: float = Field(default=0.0, description="Charged wall time (back-off excluded).")

    @property
    def cost_usd(self) -> float | None:
        """The run's dollars; None (unknown, never $0) when a model it called has no price. A lower bound when
        `partial_calls` (`at_least`)."""
        return None if self.unpriced else self.usd

    @property
    def at_least(self) -> bool:
        """The tokens and dollars are lower bounds: a call's answer did not say its usage."""
        return self.partial_calls > 0

    def add_cost(self, model: str, usd: float | None) -> None:
        """Charge one call's dollars; `None` (no price for `model`) makes the cost unknown."""
        if usd is not None:
            self.usd += usd
        elif model not in self.unpriced:
            self.unpriced.append(model)


# The gateway's words when it refuses a call because a budget of the run is spent (agent/gateway/state.py `refusal`),
# which a provider of rg-agent's reads back as that budget's stop (`refused_budget`), never as a rate limit to retry.
BUDGET_REFUSAL = "labkube: this run's {reason} budget is spent"
_REFUSED = re.compile(r"labkube: this run's (tokens|usd|steps) budget is spent")


def refused_budget(text: str) -> StopReason | None:
    """The budget a gateway refusal in `text` names; None for any other error."""
    found = _REFUSED.search(text)
    return StopReason(found.group(1)) if found else None


def spend_floor(*spends: Spend | None) -> Spend:
    """The least spend consistent with every account in `spends`: field by field the largest (the models without a
    price, all of them). Spend only grows, so an account lower than another one seen is stale or forged: a run
    resumed on a cluster starts from this over the cluster's record and its own checkpoint, never from the lower."""
    known = [s for s in spends if s is not None]
    if not known:
        return Spend()
    return Spend(
        steps=max(s.steps for s in known),
        usage=Usage(
            input=max(s.usage.input for s in known),
            output=max(s.usage.output for s in known),
            reasoning=max(s.usage.reasoning for s in known),
            cached=max(s.usage.cached for s in known),
        ),
        usd=max(s.usd for s in known),
        unpriced=sorted({m for s in known for m in s.unpriced}),
        partial_calls=max(s.partial_calls for s in known),
        wall_seconds=max(s.wall_seconds for s in known),
    )


def total_cost(costs: Iterable[float | None]) -> float | None:
    """The sum of dollar amounts; unknown when any of them is."""
    total = 0.0
    for cost in costs:
        if cost is None:
            return None
        total += cost
    return total


def lower_bound(text: str, at_least: bool) -> str:
    """A known figure as shown, with "≥" before it when it is a lower bound (`Spend.at_least`)."""
    return f"≥{text}" if at_least else text


def format_usd(cost: float | None, digits: int = 2, at_least: bool = False) -> str:
    """Dollars; "unknown" for None (a bound or not), and "≥" before a lower bound."""
    return "unknown" if cost is None else lower_bound(f"{cost:.{digits}f}", at_least)


def format_tokens(tokens: int, at_least: bool = False) -> str:
    return lower_bound(f"{tokens:,}", at_least)


def rounded_usd(usd: float | None) -> float | None:
    """Dollars as statuses keep them (to the micro-dollar); None stays unknown."""
    return None if usd is None else round(usd, 6)
