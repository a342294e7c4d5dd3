"""The rewards of an exported run, each with its source (the module docstring of results/export.py says which come
from where). Unknown is null, never 0: a grading that failed is skipped, a run without a value has null terminal
rewards, and a run that ended in an error outcome or was cancelled has every terminal reward and every Gaia2 action
match null. The
one place a missing value counts as 0 is labelled on the reward itself: a score change from or to a clean grading
that gave no value (ResearchGym's convention: the workspace had no result yet), `no_value_as_zero: true`."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from labkube.result import AGENT_POD_CURVE_LABEL, Outcome, RunResult

STEP_REWARD_SOURCE = (
    "result.json score_curve: normalised score change since the previous grading that ran (a failed grading is "
    "skipped; a clean grading that gave no value counts as 0, marked no_value_as_zero)"
)


def step_rewards(result: RunResult) -> dict[int, list[dict[str, Any]]]:
    """Rewards per agent step number (the run's own step counter), with their source: the change between
    consecutive gradings that ran. A grading that failed (the grader crashed) says nothing about the workspace and is
    skipped; one that ran cleanly and gave no value counts as 0, and the reward says so."""
    out: dict[int, list[dict[str, Any]]] = {}
    curve = [g for g in result.score_curve if g.error is None]
    if "gaia2" in result.details or result.capabilities or is_gaia(result) or len(curve) < 2:
        return out
    for before, after in pairwise(curve):
        reward: dict[str, Any] = {
            "kind": "score_change",
            "value": (after.score or 0.0) - (before.score or 0.0),
            "source": STEP_REWARD_SOURCE,
            "graded_at_step": after.step,
            "graded_at_seconds": after.at_seconds,
            "score": after.score,
        }
        if before.score is None or after.score is None:
            reward["no_value_as_zero"] = True
        if result.curve_is_agent_claim:
            reward["agent_pod_claim"] = AGENT_POD_CURVE_LABEL
        out.setdefault(after.step, []).append(reward)
    return out


def is_gaia(result: RunResult) -> bool:
    """A GAIA (v1) question: one subtask, `correct` (tasks/gaia.py)."""
    return [s.id for s in result.subtasks] == ["correct"] and "gaia2" not in result.details


def terminal_rewards(result: RunResult) -> list[dict[str, Any]]:
    """The run's end rewards; each is null where the value is unknown. A run that ended in an error outcome (carried
    with `--include-errors`) has every terminal reward null and the outcome beside it."""
    rewards = _terminal_rewards(result)
    if result.is_error or result.outcome is Outcome.cancelled:
        ended = "a person cancelled it" if result.outcome is Outcome.cancelled else f"it ended in {result.outcome}"
        why = f"{ended}: the run is not a measurement of the agent"
        return [{**r, "value": None, "outcome": str(result.outcome), "reason": why} for r in rewards]
    if result.outcome is Outcome.no_value:
        return [{**r, "outcome": str(result.outcome)} for r in rewards]
    return rewards


def _terminal_rewards(result: RunResult) -> list[dict[str, Any]]:
    gaia2 = result.details.get("gaia2")
    if gaia2 is not None:
        success = bool(gaia2.get("success"))
        return [
            {
                "kind": "scenario_verdict",
                "value": 1.0 if success else 0.0,
                "source": "ARE judge (result.json details.gaia2.success)",
                "judge": gaia2.get("judge"),
                "checks": gaia2.get("checks"),
            },
            {
                "kind": "hard_check_failure",
                "value": None if success else gaia2.get("rationale") or gaia2.get("exception"),
                "source": "ARE judge rationale of the first failed hard check (details.gaia2.rationale)",
            },
            {
                "kind": "soft_check_verdict",
                "value": gaia2.get("soft_checks"),
                "source": "ARE judge soft (LLM) checks (details.gaia2.soft_checks)",
            },
        ]
    if is_gaia(result):
        return [{"kind": "answer_correct", "value": result.score, "source": "GAIA scorer 0/1 (result.json score)"}]
    first = result.score_curve[0].score if result.score_curve else None
    return [
        {
            "kind": "final_score",
            "value": result.score,
            "source": "result.json score: normalised score (fraction of SOTA) of the final grading",
        },
        {
            "kind": "first_grading_score",
            "value": first,
            "source": "result.json score_curve[0].score",
            **({"agent_pod_claim": AGENT_POD_CURVE_LABEL} if result.curve_is_agent_claim else {}),
        },
        {"kind": "beat_baseline", "value": result.beat_baseline, "source": "result.json beat_baseline"},
    ]


USER_EVENT = "AgentUserInterface__send_message_to_agent"  # the user's message: in ARE's list, not the agent's


class Gaia2Matcher:
    """Pairs the agent's world write calls, in order, with the events ARE's judge weighed (details.gaia2.matches,
    stored by the world since the export work; older results have none)."""

    def __init__(self, verdict: dict[str, Any], error_outcome: str | None = None) -> None:
        matches = verdict.get("matches")
        self.error_outcome = error_outcome  # a run whose judge or world failed: ARE's matching is no verdict
        self.stored = matches is not None
        self._events = [m for m in matches or [] if m.get("tool") != USER_EVENT]
        self.tools = {str(m.get("tool")) for m in self._events}
        self._next = 0
        # ARE's reason when it matched nothing to an action: the failed check's rationale (a count mismatch stops
        # its judge before any matching, so then no action of the turn is matched)
        self.rationale = None if verdict.get("success") else (str(verdict.get("rationale") or "").strip() or None)

    def reward(self, tool: str, access: str | None, ok: bool | None) -> dict[str, Any] | None:
        if access != "write" or "__" not in tool:
            return None
        if self.error_outcome is not None:
            return {
                "kind": "oracle_match",
                "value": None,
                "source": f"not judged: the run ended in {self.error_outcome}",
            }
        if not self.stored:
            return {
                "kind": "oracle_match",
                "value": None,
                "source": "not stored: this result predates per-action matching in details.gaia2.matches",
            }
        found = None
        if ok is not False:  # a failed call leaves no event in ARE's log
            for i in range(self._next, len(self._events)):
                if self._events[i].get("tool") == tool:
                    found, self._next = self._events[i], i + 1
                    break
        oracle_id = (found or {}).get("oracle_event_id")
        reward: dict[str, Any] = {
            "kind": "oracle_match",
            "value": 1.0 if oracle_id else 0.0,
            "oracle_event_id": oracle_id,
            "source": "ARE GraphPerEventJudge matching of agent events to oracle events (details.gaia2.matches)",
        }
        if not oracle_id and self.rationale:
            reward["reason"] = self.rationale
        return reward
