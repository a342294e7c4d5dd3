"""The audit of a finished run: rule checks always, the LLM inspector when a judge model is set."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from labkube.integrity.evidence import Evidence, WorkspaceChanges, gather
from labkube.integrity.rules import CHECKS
from labkube.integrity_report import InspectorResult, IntegrityReport, Severity, Verdict, Violation
from labkube.result import RunResult
from labkube.run_spec import RunSpec
from labkube.store import RunDir, read_model, utcnow, write_model
from labkube.task_card import TaskCard
from labkube.tasks import card_for_run

T = TypeVar("T")
RANK = {Verdict.PASS: 0, Verdict.NEEDS_REVIEW: 1, Verdict.SUSPICIOUS: 2}


def rule_verdict(violations: list[Violation]) -> Verdict:
    """A critical or high violation makes the run SUSPICIOUS, a medium one NEEDS_REVIEW; low ones leave it PASS."""
    severities = {v.severity for v in violations}
    if severities & {Severity.critical, Severity.high}:
        return Verdict.SUSPICIOUS
    if Severity.medium in severities:
        return Verdict.NEEDS_REVIEW
    return Verdict.PASS


def combine(rules: Verdict, inspector: InspectorResult | None) -> Verdict:
    """The graver of the rules' verdict and the inspector's."""
    if inspector is None:
        return rules
    return max(rules, inspector.verdict, key=RANK.__getitem__)


def run_checks(ev: Evidence) -> tuple[list[Violation], list[str]]:
    violations: list[Violation] = []
    for check in CHECKS.values():
        violations.extend(check(ev))
    return violations, list(CHECKS)


def audit_run(
    run_dir: Path,
    judge_model: str | None = None,
    judge_budget_usd: float = 1.0,
    *,
    card: TaskCard | None = None,
    changed: WorkspaceChanges | None = None,
    spec: RunSpec | None = None,
    result: RunResult | None = None,
    gateway_records: Path | None = None,
) -> IntegrityReport:
    """Audit the run in `run_dir`, write `integrity.json` and put the verdict into `result.json`. The run's agent,
    auditing as it ends, passes what it holds: its `spec`, the task's `card`, the `result` it has just written and
    the workspace's changes it has just recorded (`changed`, when nothing ran in the workspace since); otherwise
    each is read here. `gateway_records`: the folder of the gateway's record of the model's tool calls (a grading pod's,
    `agent/gateway/record.py`), held against the transcript, in the run's agent's vocabulary (`gateway_calls.py`)."""
    rd = RunDir(run_dir)
    if spec is None:
        spec = rd.spec()
    if card is None:
        card = card_for_run(spec.task, spec.task_path, spec.task_id, spec.family, spec.task_overlay)
    ev = gather(card, rd.root, changed, result, spec.idea_hint, gateway_records, spec.agent)
    violations, checks = run_checks(ev)
    inspector = None
    if judge_model:
        from labkube.integrity.inspector import inspect_run

        inspector = run_blocking(inspect_run(ev, violations, judge_model, judge_budget_usd, spec.api_key_env))
        checks.append("llm_inspector")
        violations.extend(inspector.violations)
    verdict = combine(rule_verdict(violations), inspector.result if inspector else None)
    report = IntegrityReport(
        verdict=verdict,
        rules_verdict=rule_verdict([v for v in violations if v.check != "llm_inspector"]),
        violations=violations,
        checks_run=checks,
        inspector=inspector.result if inspector else None,
        audited_at=utcnow(),
    )
    write_model(rd.root / "integrity.json", report)
    if result is None:
        result = read_model(rd.result_json, RunResult)
    if result is not None:
        result.integrity_verdict = verdict.value
        write_model(rd.result_json, result)
    return report


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, even when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
