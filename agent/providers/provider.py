"""Model providers: a thin `Provider` per API, one `ModelClient` that wraps them all.

A provider converts the neutral conversation to its wire format and back in one
async `generate`. Retries with back-off, usage and cost accounting live in
`ModelClient`, once, for every provider.
"""

from __future__ import annotations

import abc
import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from labkube.agent.messages import Message, ModelResponse, ToolSpec
from labkube.agent.pricing import cost_usd
from labkube.budgets import StopReason


class ProviderError(Exception):
    """A model call that failed. `retryable` errors are retried with back-off; others end the run. `unsaid_usage`:
    the request reached the provider and its answer broke off or could not be read, so the provider may have
    generated (and billed) tokens whose usage was never said. `unsaid_attempts`, on the error a call finally raises:
    how many of its attempts were so."""

    def __init__(
        self, message: str, *, retryable: bool, reason: StopReason = StopReason.model_error, unsaid_usage: bool = False
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.reason = reason
        self.unsaid_usage = unsaid_usage
        self.unsaid_attempts = 0


class ContextOverflow(ProviderError):
    """The conversation no longer fits the model's context window."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Provider(abc.ABC):
    """One model API. Subclasses implement `generate`; scripted providers keep a cursor in `state`."""

    model: str = ""
    context_tokens: int = 200_000

    @abc.abstractmethod
    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse: ...

    def state(self) -> dict[str, Any]:
        """What must survive a crash (scripted cursors); API providers are stateless."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        return None

    async def aclose(self) -> None:
        return None


@dataclass
class CallOutcome:
    response: ModelResponse
    cost_usd: float | None  # None: the model has no price
    duration_s: float
    backoff_s: float
    attempts: int
    # Attempts before the answer that reached the provider and broke off before their usage was said: counted as
    # none, so the run's spend is a lower bound from then on (`Spend.partial_calls`).
    unsaid_attempts: int = 0


@dataclass
class ModelClient:
    """Retries, back-off and cost for any provider."""

    provider: Provider
    model_name: str
    prices: dict[str, tuple[float, ...]] | None = None
    max_attempts: int = 8
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0

    async def generate(self, messages: list[Message], tools: list[ToolSpec]) -> CallOutcome:
        backoff = 0.0
        started = time.monotonic()
        unsaid = 0
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = await self.provider.generate(messages, tools)
            except ProviderError as exc:
                unsaid += exc.unsaid_usage
                if not exc.retryable or attempt == self.max_attempts:
                    exc.unsaid_attempts = unsaid
                    raise
                delay = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                await asyncio.sleep(delay)
                backoff += delay
                continue
            usd = cost_usd(self.model_name, response.usage, self.prices)
            return CallOutcome(response, usd, time.monotonic() - started, backoff, attempt, unsaid)
        raise AssertionError("unreachable")
