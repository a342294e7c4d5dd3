"""Dollar cost of a model call from the per-model price table (`prices.yaml`)."""

from __future__ import annotations

from functools import cache, lru_cache
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
    if overrides:
        table = {k: _price(v) for k, v in overrides.items()}
        if matches := [k for k in table if model.startswith(k)]:
            return table[max(matches, key=len)]
    if (price := default_price(model)) is not None:
        return price
    # the same model through openai-chat is priced as openai
    if model.startswith("openai-chat:"):
        return price_for("openai:" + model.removeprefix("openai-chat:"), overrides)
    return None


@lru_cache(maxsize=256)  # bounded: the gateway prices the model an answer names, which an agent's code can choose
def default_price(model: str) -> Price | None:
    """The defaults' longest-prefix match, once per model name (the gateway prices every call on its event loop)."""
    table = default_prices()
    matches = [k for k in table if model.startswith(k)]
    return table[max(matches, key=len)] if matches else None


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
