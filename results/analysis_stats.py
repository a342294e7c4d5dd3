"""The statistics of `labkube analyze` (numpy only): ranks, Pearson and Spearman correlations with Fisher-z
intervals, percentile bootstrap intervals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel

BOOTSTRAP_RESAMPLES = 2000
Z95 = 1.959963984540054


class Interval(BaseModel):
    low: float | None
    high: float | None
    method: str


class Correlation(BaseModel):
    x: str
    y: str
    n: int
    pearson: float | None
    pearson_ci: Interval
    spearman: float | None
    spearman_ci: Interval


def ranks(values: list[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    a = np.asarray(values, dtype=float)
    order = a.argsort(kind="mergesort")
    r = np.empty(len(a))
    r[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):
        tied = a == v
        r[tied] = r[tied].mean()
    return r


def pearson(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1])


def fisher_interval(r: float | None, n: int, se_scale: float = 1.0) -> Interval:
    """95% interval of a correlation by Fisher's z (Spearman: se_scale = sqrt(1.06), Fieller et al.)."""
    method = "Fisher z, 95%" + (" (Fieller variance 1.06/(n-3))" if se_scale != 1.0 else "")
    if r is None or n < 4:
        return Interval(low=None, high=None, method=method + ": needs n >= 4")
    z = math.atanh(max(-0.999999, min(0.999999, r)))
    se = se_scale / math.sqrt(n - 3)
    return Interval(low=math.tanh(z - Z95 * se), high=math.tanh(z + Z95 * se), method=method)


def correlation(x_name: str, y_name: str, x: list[float], y: list[float]) -> Correlation:
    r = pearson(x, y)
    rho = pearson(list(ranks(x)), list(ranks(y))) if len(x) >= 3 else None
    return Correlation(
        x=x_name,
        y=y_name,
        n=len(x),
        pearson=r,
        pearson_ci=fisher_interval(r, len(x)),
        spearman=rho,
        spearman_ci=fisher_interval(rho, len(x), math.sqrt(1.06)),
    )


def bootstrap(values: list[float], stat: Any, seed: int = 0) -> Interval:
    """Percentile bootstrap (95%) of `stat(sample)` over resamples of the runs."""
    if len(values) < 2:
        return Interval(low=None, high=None, method="bootstrap: needs 2+ runs")
    rng = np.random.default_rng(seed)
    a = np.asarray(values, float)
    samples = a[rng.integers(0, len(a), size=(BOOTSTRAP_RESAMPLES, len(a)))]
    stats = np.array([stat(s) for s in samples])
    low, high = np.percentile(stats, [2.5, 97.5])
    return Interval(low=float(low), high=float(high), method=f"percentile bootstrap, {BOOTSTRAP_RESAMPLES} resamples")
