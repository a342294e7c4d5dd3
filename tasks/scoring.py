"""Scores: raw metric, fraction of SOTA, gap closed between baseline and SOTA."""

from __future__ import annotations

import math

from labkube.result import SubtaskScore
from labkube.task_card import Direction, Subtask, TaskCard
from labkube.tasks.numbers import PLAUSIBLE_FRACTION_OF_SOTA


def fraction_of_sota(raw: float, subtask: Subtask) -> float | None:
    """ResearchGym's convention: 0 is a zero score, 1 is SOTA (inverted for lower-is-better)."""
    if subtask.sota is None:
        return None
    if subtask.direction is Direction.higher:
        return raw / subtask.sota if subtask.sota != 0 else None
    if raw <= 0:
        return None if subtask.sota > 0 else 1.0
    return subtask.sota / raw


def gap_closed(raw: float, subtask: Subtask) -> float | None:
    """(score - baseline) / (SOTA - baseline): 0 at the baseline, 1 at SOTA, either direction."""
    if subtask.sota is None or subtask.baseline is None or subtask.sota == subtask.baseline:
        return None
    return (raw - subtask.baseline) / (subtask.sota - subtask.baseline)


def beats(raw: float, subtask: Subtask) -> bool | None:
    if subtask.baseline is None:
        return None
    if subtask.direction is Direction.higher:
        return raw > subtask.baseline
    return raw < subtask.baseline


def implausibility(raw: float, fraction: float | None, subtask: Subtask) -> str | None:
    """Why a value cannot be a result of this task: its fraction of SOTA outside `PLAUSIBLE_FRACTION_OF_SOTA`."""
    low, high = PLAUSIBLE_FRACTION_OF_SOTA
    if fraction is None or low <= fraction <= high:
        return None
    return (
        f"{raw:g} is {fraction:.3g}x SOTA ({subtask.sota:g}), outside the plausible {low:g}-{high:g}x (a unit or "
        "scale mistake?): shown, not averaged"
    )


def score_subtask(raw: float | None, subtask: Subtask) -> SubtaskScore:
    if raw is None or not math.isfinite(raw):
        return SubtaskScore(id=subtask.id)
    fraction = fraction_of_sota(raw, subtask)
    implausible = implausibility(raw, fraction, subtask)
    return SubtaskScore(
        id=subtask.id,
        raw=raw,
        fraction_of_sota=fraction,
        gap_closed=gap_closed(raw, subtask),
        beat_baseline=None if implausible else beats(raw, subtask),
        implausible=implausible,
    )


def headline(score: SubtaskScore) -> float | None:
    """What a subtask's score is as a run's number: its fraction of SOTA where SOTA is known, else its raw value;
    none for a value flagged as implausible."""
    if score.implausible:
        return None
    return score.fraction_of_sota if score.fraction_of_sota is not None else score.raw


def primary_scores(card: TaskCard, scores: list[SubtaskScore]) -> dict[str, float | None]:
    """The score of each primary group the task tags (`TaskCard.primary_groups`), by name; None when the grading
    gave its subtask no value."""
    by_id = {s.id: s for s in scores}
    return {name: headline(by_id[s.id]) if s.id in by_id else None for name, s in card.primary_groups.items()}
