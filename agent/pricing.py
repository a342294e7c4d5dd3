"""Dollar cost of a model call from the per-model price table (`prices.yaml`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from labkube.budgets import Usage
from labkube.model_ref import SCRIPTED, SCRIPTED_WITH_ARG

Price = tuple[float, float, float]  # USD per million tokens: input, output, cached input


@cache
def default_prices() -> dict[str, Price]:
    raw = yaml.safe_load((Path(__file__).parent / "prices.yaml").read_text())
    return {k: _price(v) for k, v in raw.items()}


def _price(v: list[float] | tuple[float, ...]) -> Price:
    values = [float(x) for x in v]
    return (values[0], values[1], values[2] if len(values) > 2 else values[0])


def price_for(model: str, overrides: dict[str, tuple[float, ...]] | None = None) -> Price | None:
    """Longest-prefix match over the override table first, then the defaults."""
    for table in ({k: _price(v) for k, v in (overrides or {}).items()}, default_prices()):
        matches = [k for k in table if model == k or model.startswith(k)]
        if matches:
            return table[max(matches, key=len)]
    # the same model through openai-chat is priced as openai
    if model.startswith("openai-chat:"):
        return price_for("openai:" + model.removeprefix("openai-chat:"), overrides)
    return None


def is_free(model: str) -> bool:
    """A scripted model (oracle, noop, replay, cheat) makes no paid calls."""
    return model.partition(":")[0] in SCRIPTED + SCRIPTED_WITH_ARG


def has_price(model: str, overrides: dict[str, tuple[float, ...]] | None = None) -> bool:
    return is_free(model) or price_for(model, overrides) is not None


def cost_usd(model: str, usage: Usage, overrides: dict[str, tuple[float, ...]] | None = None) -> float | None:
    """Cost of one call; None (unknown, never $0) for a model the table does not price. Cached input tokens are
    part of the input count and billed at the cached rate."""
    price = price_for(model, overrides)
    if price is None:
        return 0.0 if is_free(model) or (usage.input == 0 and usage.output == 0) else None
    p_in, p_out, p_cached = price
    cached = min(usage.cached, usage.input)
    return ((usage.input - cached) * p_in + cached * p_cached + usage.output * p_out) / 1_000_000
