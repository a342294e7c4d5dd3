"""pass@1, pass@k and pass^k per capability, over the seeds of each scenario (Gaia2 reporting).

- pass@k: the chance that at least one of k attempts passes (the unbiased estimator
  1 - C(n-c, k) / C(n, k) from n attempts with c passes).
- pass^k: the chance that all k attempts pass, C(c, k) / C(n, k) (consistency, as tau-bench reports it).
Per capability the numbers are averaged over the scenarios tagged with it; the standard error of
pass@1 is taken over seeds (the spread of each seed's pass rate); the macro average weighs
every capability equally. An attempt that is not `counted` (an error outcome such as an unreachable
judge or a broken world, or no verdict at all) is neither a pass nor a fail: it is left out, and
`excluded` says how many were.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from math import comb

from pydantic import BaseModel


class Attempt(BaseModel):
    scenario: str
    model: str
    seed: int
    passed: bool
    capabilities: list[str]
    counted: bool = True


class CapabilityScore(BaseModel):
    capability: str
    model: str
    scenarios: int
    k: int
    pass_at_1: float | None
    pass_at_k: float | None
    pass_hat_k: float | None
    stderr: float | None
    excluded: int = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"k={k} is more than the {n} attempts")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"k={k} is more than the {n} attempts")
    return comb(c, k) / comb(n, k)


def capability_scores(attempts: list[Attempt], k: int | None = None) -> list[CapabilityScore]:
    """One row per capability and model; `k` defaults to the fewest attempts any scenario has."""
    by_scenario: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    excluded: dict[tuple[str, str], int] = defaultdict(int)
    for a in attempts:
        if a.counted:
            by_scenario[(a.model, a.scenario)].append(a)
        else:
            for cap in a.capabilities:
                excluded[(a.model, cap)] += 1
    out: list[CapabilityScore] = []
    models = sorted({a.model for a in attempts})
    for model in models:
        scenarios = {s: runs for (m, s), runs in by_scenario.items() if m == model}
        caps = sorted({c for runs in scenarios.values() for c in runs[0].capabilities})
        caps = sorted({*caps, *(c for (m, c) in excluded if m == model)})
        for cap in caps:
            tagged = {s: runs for s, runs in scenarios.items() if cap in runs[0].capabilities}
            if not tagged:  # every attempt at this capability ended in an error: nothing to estimate
                out.append(
                    CapabilityScore(
                        capability=cap,
                        model=model,
                        scenarios=0,
                        k=0,
                        pass_at_1=None,
                        pass_at_k=None,
                        pass_hat_k=None,
                        stderr=None,
                        excluded=excluded[(model, cap)],
                    )
                )
                continue
            kk = k or min(len(runs) for runs in tagged.values())
            p1, pk, phk = [], [], []
            for runs in tagged.values():
                n, c = len(runs), sum(r.passed for r in runs)
                p1.append(c / n)
                pk.append(pass_at_k(n, c, min(kk, n)))
                phk.append(pass_hat_k(n, c, min(kk, n)))
            per_seed: dict[int, list[bool]] = defaultdict(list)
            for runs in tagged.values():
                for r in runs:
                    per_seed[r.seed].append(r.passed)
            rates = [sum(v) / len(v) for v in per_seed.values()]
            stderr = statistics.stdev(rates) / len(rates) ** 0.5 if len(rates) > 1 else None
            out.append(
                CapabilityScore(
                    capability=cap,
                    model=model,
                    scenarios=len(tagged),
                    k=kk,
                    pass_at_1=statistics.fmean(p1),
                    pass_at_k=statistics.fmean(pk),
                    pass_hat_k=statistics.fmean(phk),
                    stderr=stderr,
                    excluded=excluded[(model, cap)],
                )
            )
    return out


def macro_average(scores: list[CapabilityScore]) -> dict[str, dict[str, float]]:
    """Per model: the mean over capabilities of pass@1, pass@k and pass^k."""
    out: dict[str, dict[str, float]] = {}
    for model in sorted({s.model for s in scores}):
        rows = [s for s in scores if s.model == model and s.pass_at_1 is not None]
        if not rows:
            continue
        out[model] = {
            "pass_at_1": statistics.fmean(s.pass_at_1 for s in rows if s.pass_at_1 is not None),
            "pass_at_k": statistics.fmean(s.pass_at_k for s in rows if s.pass_at_k is not None),
            "pass_hat_k": statistics.fmean(s.pass_hat_k for s in rows if s.pass_hat_k is not None),
        }
    return out
