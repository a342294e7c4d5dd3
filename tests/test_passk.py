"""pass@k and pass^k estimators and their per-capability aggregation."""

from __future__ import annotations

import pytest

from labkube.results.passk import Attempt, capability_scores, macro_average, pass_at_k, pass_hat_k


@pytest.mark.parametrize(
    ("n", "c", "k", "at_k", "hat_k"),
    [
        (4, 0, 1, 0.0, 0.0),
        (4, 4, 4, 1.0, 1.0),
        (4, 2, 1, 0.5, 0.5),
        (4, 2, 2, 1 - 1 / 6, 1 / 6),
        (3, 1, 3, 1.0, 0.0),
        (5, 3, 2, 1 - 1 / 10, 3 / 10),
    ],
)
def test_estimators(n: int, c: int, k: int, at_k: float, hat_k: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(at_k)
    assert pass_hat_k(n, c, k) == pytest.approx(hat_k)


def test_k_larger_than_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="more than"):
        pass_at_k(2, 1, 3)


def test_per_capability_scores_and_macro_average() -> None:
    attempts = [
        Attempt(scenario="s1", model="m", seed=s, passed=p, capabilities=["execution", "time"])
        for s, p in enumerate([True, True, False])
    ] + [
        Attempt(scenario="s2", model="m", seed=s, passed=p, capabilities=["execution"])
        for s, p in enumerate([False, False, False])
    ]
    scores = {s.capability: s for s in capability_scores(attempts)}
    ex, time_ = scores["execution"], scores["time"]
    assert ex.scenarios == 2 and ex.k == 3
    assert ex.pass_at_1 == pytest.approx((2 / 3 + 0) / 2)
    assert ex.pass_at_k == pytest.approx((1.0 + 0.0) / 2)
    assert ex.pass_hat_k == pytest.approx(0.0)
    # per-seed pass rates over the two scenarios: 0.5, 0.5, 0.0
    assert ex.stderr == pytest.approx(0.28867513 / 3**0.5)
    assert time_.pass_at_1 == pytest.approx(2 / 3)
    macro = macro_average(list(scores.values()))["m"]
    assert macro["pass_at_1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
