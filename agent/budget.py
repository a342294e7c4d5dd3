"""Budget accounting: one tracker per run, one exception for every limit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from labkube.budgets import Budgets, Spend, StopReason, Usage


class BudgetExceeded(Exception):
    def __init__(self, kind: StopReason, used: float, limit: float) -> None:
        super().__init__(f"{kind.value} budget exhausted: used {used:g} of {limit:g}")
        self.kind = kind
        self.used = used
        self.limit = limit


@dataclass
class BudgetTracker:
    """Charges wall time (minus retry back-off), tokens, dollars and steps against the budgets.

    `clock` is injectable so tests and Gaia2 pauses need not sleep.
    """

    budgets: Budgets
    spend: Spend = field(default_factory=Spend)
    clock: object = time.monotonic
    _mark: float = 0.0

    def start(self) -> None:
        self._mark = self.clock()  # type: ignore[operator]

    def tick(self) -> None:
        """Charge the wall time since the last tick."""
        now = self.clock()  # type: ignore[operator]
        self.spend.wall_seconds += max(0.0, now - self._mark)
        self._mark = now

    def exclude(self, seconds: float) -> None:
        """Give back time that must not count (retry back-off, sandbox start-up)."""
        self.spend.wall_seconds = max(0.0, self.spend.wall_seconds - seconds)

    def charge_model(self, usage: Usage, usd: float | None, model: str = "") -> None:
        self.spend.usage = self.spend.usage + usage
        self.spend.add_cost(model, usd)

    def charge_step(self) -> None:
        self.spend.steps += 1

    def exceeded(self) -> BudgetExceeded | None:
        self.tick()
        b, s = self.budgets, self.spend
        if b.wall_seconds is not None and s.wall_seconds >= b.wall_seconds:
            return BudgetExceeded(StopReason.time, s.wall_seconds, b.wall_seconds)
        if b.tokens is not None and s.usage.total >= b.tokens:
            return BudgetExceeded(StopReason.tokens, s.usage.total, b.tokens)
        if b.usd is not None and s.usd >= b.usd:
            return BudgetExceeded(StopReason.usd, s.usd, b.usd)
        if b.steps is not None and s.steps >= b.steps:
            return BudgetExceeded(StopReason.steps, s.steps, b.steps)
        return None

    def remaining_text(self) -> str:
        """What is left, for the periodic reminder to the agent."""
        b, s = self.budgets, self.spend
        parts = []
        if b.wall_seconds is not None:
            parts.append(f"time {max(0.0, b.wall_seconds - s.wall_seconds) / 60:.1f} min")
        if b.tokens is not None:
            parts.append(f"tokens {max(0, b.tokens - s.usage.total):,}")
        if b.usd is not None:
            parts.append(f"dollars ${max(0.0, b.usd - s.usd):.2f}")
        if b.steps is not None:
            parts.append(f"steps {max(0, b.steps - s.steps)}")
        return ", ".join(parts) or "no limits"

    def used_fraction(self) -> float:
        """The largest fraction used of any budget."""
        b, s = self.budgets, self.spend
        fractions = [0.0]
        if b.wall_seconds:
            fractions.append(s.wall_seconds / b.wall_seconds)
        if b.tokens:
            fractions.append(s.usage.total / b.tokens)
        if b.usd:
            fractions.append(s.usd / b.usd)
        if b.steps:
            fractions.append(s.steps / b.steps)
        return max(fractions)
