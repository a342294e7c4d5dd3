"""The run's own Prometheus series (see `labkube.metrics` for names and how they are served)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from typing import Any

from labkube.agent.budget import BudgetTracker
from labkube.budgets import Budgets, Spend, Usage
from labkube.integrity_report import ViolationType
from labkube.interventions import InterventionKind
from labkube.metrics import RUN_LABELS, RUN_METRICS, MetricSet, serve, use_multiprocess_dir
from labkube.run_spec import RunSpec

TOKEN_KINDS = ("input", "output", "reasoning", "cached")
TOOL_OUTCOMES = ("ok", "error")


def budget_kinds(budgets: Budgets) -> list[str]:
    """The `budget` label values of the budgets a run has (an unlimited budget has no ratio)."""
    limits = {"time": budgets.wall_seconds, "tokens": budgets.tokens, "usd": budgets.usd, "steps": budgets.steps}
    return [kind for kind, limit in limits.items() if limit]


class RunTelemetry:
    """The run's series. Every series a dashboard panel or rule reads exists from construction, so a
    healthy running run never shows "No data" (tests/test_telemetry_series.py holds the dashboards to
    that). The one exception is `labkube_run_gaia2_passed`, which only ARE's judge can set: a 0 would
    count as a failed scenario in the pass rates.

    `tools` are the tool names the agent offers, when they are known before its first call (rg-agent's
    tool set); a CLI agent's tools appear with their first call. `best_score` is the best score of an
    earlier attempt of the same run (a resume), so that a restarted process does not hide it.
    """

    def __init__(self, spec: RunSpec, tools: Iterable[str] = (), best_score: float | None = None) -> None:
        self.labels: dict[str, Any] = {
            "campaign": spec.campaign,
            "run_id": spec.run_id,
            "task": spec.task,
            "model": spec.model,
        }
        self.m = MetricSet(RUN_METRICS, RUN_LABELS)
        # prometheus_client's labels() checks and sorts the labels on every lookup; a gateway meters each model call
        # on its event loop, which the calls in flight share (a call's series: 0.03 ms looked up, 0.01 ms kept).
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self.best: float | None = best_score
        # Present from the start, so that "missing" never has to stand in for zero.
        self._l("labkube_run_finished").set(0)
        self._l("labkube_run_last_step_timestamp_seconds").set(time.time())
        self._l("labkube_run_cost_dollars_total").inc(0)
        self._l("labkube_run_cost_unknown").set(0)
        self._l("labkube_run_model_calls_partial").set(0)
        self._l("labkube_run_steps_total").inc(0)
        for kind in TOKEN_KINDS:
            self._l("labkube_run_tokens_total", kind=kind).inc(0)
        self.declare_tools(tools)
        for budget in budget_kinds(spec.budgets):
            self._l("labkube_run_budget_used_ratio", budget=budget).set(0)
        # The audit runs once the run has ended; until then no check has flagged anything, which is
        # what 0 says (the run detail's Integrity panel words it "not flagged").
        self._l("labkube_run_integrity_suspicious").set(0)
        for violation in ViolationType:
            self._l("labkube_run_integrity_violations", type=violation.value).set(0)
        # At 0 from the start: the dashboards' annotations look for an increase, which a series born at 1 never shows.
        for kind in InterventionKind:
            self._l("labkube_run_interventions_total", kind=kind.value).inc(0)
        # Not graded yet: no subtask has a valid number, so completion is a true 0. The score is NaN,
        # not 0: a normalized score of 0 is a real grade (nothing of SOTA reached) and would drag the
        # seeds' mean down; NaN is "no number yet", which `max` skips, the mean rules drop
        # (`> -Inf`), and the panels show as "not graded yet".
        self._l("labkube_run_subtask_completion_ratio").set(0)
        self._l("labkube_run_score").set(math.nan)
        self._l("labkube_run_best_score").set(math.nan if best_score is None else best_score)
        # The histogram's buckets exist (at 0) from creating its child.
        self._l("labkube_run_model_call_duration_seconds")

    def declare_tools(self, tools: Iterable[str]) -> None:
        """Tool-call counters at 0 for the run's tools (known once its tools are built)."""
        for tool in tools:
            for outcome in TOOL_OUTCOMES:
                self._l("labkube_run_tool_calls_total", tool=tool, outcome=outcome).inc(0)

    def _l(self, name: str, **extra: str) -> Any:
        key = (name, tuple(extra.items()))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.m[name].labels(**self.labels, **extra)  # type: ignore[attr-defined]
        return child

    def model_call(self, usage: Usage, cost_usd: float | None, duration_s: float | None) -> None:
        """One model call; `duration_s` None when only its counts are known (a gateway in another container)."""
        for kind in TOKEN_KINDS:
            value = getattr(usage, kind)
            if value:
                self._l("labkube_run_tokens_total", kind=kind).inc(value)
        if cost_usd:
            self._l("labkube_run_cost_dollars_total").inc(cost_usd)
        if duration_s is not None:
            self._l("labkube_run_model_call_duration_seconds").observe(duration_s)

    def spend(self, spend: Spend) -> None:
        """What the run's counters cannot say: that its dollars are unknown (a model with no price), or that its
        tokens and dollars are lower bounds (calls whose answer did not say its usage). Set from the run's whole
        spend, so a resumed run's pod says so too."""
        self._l("labkube_run_cost_unknown").set(1 if spend.cost_usd is None else 0)
        self._l("labkube_run_model_calls_partial").set(spend.partial_calls)

    def tool_call(self, tool: str, ok: bool) -> None:
        self._l("labkube_run_tool_calls_total", tool=tool, outcome="ok" if ok else "error").inc()

    def step(self, tracker: BudgetTracker) -> None:
        self._l("labkube_run_steps_total").inc()
        self._l("labkube_run_last_step_timestamp_seconds").set(time.time())
        self.budgets(tracker)

    def budgets(self, tracker: BudgetTracker) -> None:
        b, s = tracker.budgets, tracker.spend
        used = {
            "time": s.wall_seconds / b.wall_seconds if b.wall_seconds else None,
            "tokens": s.usage.total / b.tokens if b.tokens else None,
            "usd": s.usd / b.usd if b.usd else None,
            "steps": s.steps / b.steps if b.steps else None,
        }
        for kind, ratio in used.items():
            if ratio is not None:
                self._l("labkube_run_budget_used_ratio", budget=kind).set(ratio)

    def grade(self, score: float | None, completion: float | None) -> None:
        self._l("labkube_run_subtask_completion_ratio").set(math.nan if completion is None else completion)
        if score is None:
            return
        self._l("labkube_run_score").set(score)
        self.best = score if self.best is None else max(self.best, score)
        self._l("labkube_run_best_score").set(self.best)

    def integrity(self, verdict: str, violation_types: list[str]) -> None:
        """The audit's verdict: every known type is set (0 when not found), so a re-audit clears too."""
        self._l("labkube_run_integrity_suspicious").set(1 if verdict == "SUSPICIOUS" else 0)
        for kind in {*(t.value for t in ViolationType), *violation_types}:
            self._l("labkube_run_integrity_violations", type=kind).set(violation_types.count(kind))

    def gaia2(self, passed: bool, capabilities: list[str]) -> None:
        for capability in capabilities:
            self._l("labkube_run_gaia2_passed", capability=capability).set(1 if passed else 0)

    def gpus(self, readings: Iterable[Any]) -> None:
        """One NVML sample of the run's GPUs (`agent/harness/gpu.py`); never called for a run without one."""
        for r in readings:
            self._l("labkube_run_gpu_utilization_ratio", gpu=r.device).set(r.utilization_gpu / 100)
            self._l("labkube_run_gpu_memory_used_bytes", gpu=r.device).set(r.memory_used)
            self._l("labkube_run_gpu_memory_total_bytes", gpu=r.device).set(r.memory_total)

    def intervention(self, kind: str) -> None:
        """The harness applied one of the run's interventions (`InterventionKind`'s values)."""
        self._l("labkube_run_interventions_total", kind=kind).inc()

    def finished(self) -> None:
        self._l("labkube_run_finished").set(1)


class _NoSeries:
    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


class UnreadTelemetry(RunTelemetry):
    """A run's telemetry where nothing can read its series (neither shared with a campaign's `/metrics` nor served):
    every call is taken and none builds a series. Building them (17 metrics and their labelled children) was a
    millisecond of a short forked run's CPU, for numbers nobody could see."""

    def __init__(self, spec: RunSpec, tools: Iterable[str] = (), best_score: float | None = None) -> None:
        self.labels = {"campaign": spec.campaign, "run_id": spec.run_id, "task": spec.task, "model": spec.model}
        self.best = best_score

    def _l(self, name: str, **extra: str) -> Any:
        return _NO_SERIES


_NO_SERIES = _NoSeries()


def start_telemetry(spec: RunSpec, tools: Iterable[str] = (), best_score: float | None = None) -> RunTelemetry:
    """Series for this run; shared with the campaign driver (`LABKUBE_METRICS_DIR`) or served by this
    process (`LABKUBE_METRICS_PORT`, as in a pod); with neither, an `UnreadTelemetry`."""
    shared = os.environ.get("LABKUBE_METRICS_DIR")
    port = os.environ.get("LABKUBE_METRICS_PORT")
    if not shared and not port:
        return UnreadTelemetry(spec, tools, best_score)
    if shared:
        use_multiprocess_dir(shared)
    telemetry = RunTelemetry(spec, tools, best_score)
    if port and not shared:
        serve(int(port), telemetry.m.registry)
    return telemetry
