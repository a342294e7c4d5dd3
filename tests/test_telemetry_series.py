"""A run's series exist from its first scrape: every per-run series a dashboard panel or rule reads is in a
freshly constructed `RunTelemetry`'s output, before any step, grade or audit (issue #16, "live series from
the first scrape"). A new panel on a new per-run series fails here until `RunTelemetry` initialises it."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from monitoring_helpers import DASHBOARDS, alerting_rules, load_dashboards, queries, recording_rules, series_names
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.workspace import Workspace
from labkube.agent.telemetry import RunTelemetry
from labkube.budgets import Budgets
from labkube.integrity_report import ViolationType
from labkube.metrics import RUN_METRICS
from labkube.run_spec import RunSpec

# Series only something outside the agent's loop can give a value, with why a placeholder would be wrong.
NOT_AT_START = {
    "labkube_run_gaia2_passed": "only ARE's judge sets it, at the end; a 0 would count as a failed scenario",
    # A run without a GPU has none of these (a 0 would read as an idle GPU); one with a GPU has them from the
    # meter's first NVML sample, taken as the agent starts (agent/harness/gpu.py).
    "labkube_run_gpu_utilization_ratio": "absent without a GPU; from the first NVML sample with one",
    "labkube_run_gpu_memory_used_bytes": "absent without a GPU; from the first NVML sample with one",
    "labkube_run_gpu_memory_total_bytes": "absent without a GPU; from the first NVML sample with one",
}
ALL_BUDGETS = Budgets(wall_hours=1, tokens=1000, usd=2.0, steps=30)


def spec(budgets: Budgets = ALL_BUDGETS) -> RunSpec:
    return RunSpec(run_id="t--m--s0", campaign="c", task="t", task_path="/t", model="m", seed=0, budgets=budgets)


def rg_agent_tools(tmp_path: Path) -> list[str]:
    return [t.name for t in research_tools(ToolContext(workspace=Workspace(tmp_path)))]


def samples(telemetry: RunTelemetry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value) of the registry's exposition, as Prometheus would scrape it."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(telemetry.m.registry).decode()):  # type: ignore[arg-type]
        for s in family.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    return found


def run_series_read_by_dashboards() -> set[str]:
    """The per-run series names any panel reads, directly or through a recording rule, or any alert reads
    (sample names, so a histogram panel asks for `_bucket`)."""
    records = recording_rules()
    exprs = [t["expr"] for board in load_dashboards().values() for _p, t in queries(board)]
    exprs += [rule["expr"] for rule in alerting_rules().values()]
    names: set[str] = set()
    while exprs:
        for name in series_names(exprs.pop()):
            if name in records:
                exprs.append(records[name])
            names.add(name)

    def base(name: str) -> str:
        return re.sub(r"_(bucket|sum|count)$", "", name) if name not in RUN_METRICS else name

    return {n for n in names if base(n) in RUN_METRICS}


def test_the_dashboards_read_run_series() -> None:
    """The extraction below finds what it should (a guard against a parser that finds nothing)."""
    assert sorted(DASHBOARDS.glob("*.json"))
    read = run_series_read_by_dashboards()
    assert {"labkube_run_integrity_suspicious", "labkube_run_integrity_violations"} <= read
    assert "labkube_run_model_call_duration_seconds_bucket" in read
    assert "labkube_run_best_score" in read  # through the recording rules as well as directly
    assert not {n for n in read if n.startswith("labkube_campaign_")}
    raw = {n for board in load_dashboards().values() for _p, t in queries(board) for n in series_names(t["expr"])}
    assert {n for n in raw if n.startswith("labkube_run_")} <= read


def test_every_series_a_panel_reads_exists_before_the_first_step(tmp_path: Path) -> None:
    exported = samples(RunTelemetry(spec(), tools=rg_agent_tools(tmp_path)))
    missing = sorted(run_series_read_by_dashboards() - set(exported) - set(NOT_AT_START))
    assert not missing, f"panels read series a new run does not export yet (initialise them in RunTelemetry): {missing}"
    assert not set(NOT_AT_START) & set(exported)
    labels = {"campaign": "c", "run_id": "t--m--s0", "task": "t", "model": "m"}
    for name, series in exported.items():
        if name.startswith("labkube_run_"):
            assert all(s[0].items() >= labels.items() for s in series), name


def test_a_new_run_reads_zero_integrity_and_not_graded_yet() -> None:
    exported = samples(RunTelemetry(spec(), tools=["bash", "read_file"]))

    def one(name: str, **extra: str) -> float:
        wanted = [v for lab, v in exported[name] if all(lab.get(k) == x for k, x in extra.items())]
        assert len(wanted) == 1, (name, extra, exported[name])
        return wanted[0]

    assert one("labkube_run_integrity_suspicious") == 0
    violations = {lab["type"]: v for lab, v in exported["labkube_run_integrity_violations"]}
    assert violations == {t.value: 0 for t in ViolationType}
    assert {lab["budget"]: v for lab, v in exported["labkube_run_budget_used_ratio"]} == {
        "time": 0,
        "tokens": 0,
        "usd": 0,
        "steps": 0,
    }
    assert {lab["kind"]: v for lab, v in exported["labkube_run_tokens_total"]} == dict.fromkeys(
        ("input", "output", "reasoning", "cached"), 0
    )
    tools = {(lab["tool"], lab["outcome"]): v for lab, v in exported["labkube_run_tool_calls_total"]}
    assert tools == dict.fromkeys([(t, o) for t in ("bash", "read_file") for o in ("ok", "error")], 0)
    assert one("labkube_run_subtask_completion_ratio") == 0
    assert math.isnan(one("labkube_run_score")) and math.isnan(one("labkube_run_best_score"))  # not graded yet
    assert one("labkube_run_finished") == 0 and one("labkube_run_steps_total") == 0
    assert one("labkube_run_model_call_duration_seconds_count") == 0


def test_only_the_budgets_a_run_has_get_a_ratio() -> None:
    exported = samples(RunTelemetry(spec(Budgets(tokens=100))))
    assert [(lab["budget"], v) for lab, v in exported["labkube_run_budget_used_ratio"]] == [("tokens", 0)]
    assert "labkube_run_tool_calls_total" not in exported  # a CLI agent's tools appear with their first call


def test_the_audit_overwrites_the_zeros_and_a_re_audit_clears_them() -> None:
    telemetry = RunTelemetry(spec())
    telemetry.integrity("SUSPICIOUS", ["grader_modified", "fake_log", "grader_modified"])
    exported = samples(telemetry)
    assert exported["labkube_run_integrity_suspicious"][0][1] == 1
    violations = {lab["type"]: v for lab, v in exported["labkube_run_integrity_violations"]}
    assert violations == {**{t.value: 0 for t in ViolationType}, "grader_modified": 2, "fake_log": 1}

    telemetry.integrity("PASS", [])
    exported = samples(telemetry)
    assert exported["labkube_run_integrity_suspicious"][0][1] == 0
    assert {lab["type"]: v for lab, v in exported["labkube_run_integrity_violations"]} == {
        t.value: 0 for t in ViolationType
    }


def test_grades_replace_not_graded_yet_and_a_resume_keeps_the_best() -> None:
    telemetry = RunTelemetry(spec())
    telemetry.grade(None, 0.5)  # graded, no valid primary number yet
    exported = samples(telemetry)
    assert exported["labkube_run_subtask_completion_ratio"][0][1] == 0.5
    assert math.isnan(exported["labkube_run_best_score"][0][1])
    telemetry.grade(0.4, 1.0)
    assert samples(telemetry)["labkube_run_best_score"][0][1] == 0.4

    resumed = RunTelemetry(spec(), best_score=0.6)
    assert resumed.best == 0.6 and samples(resumed)["labkube_run_best_score"][0][1] == 0.6
    resumed.grade(0.3, 1.0)
    exported = samples(resumed)
    assert exported["labkube_run_best_score"][0][1] == 0.6 and exported["labkube_run_score"][0][1] == 0.3


def test_the_shared_multiprocess_endpoint_serves_them_too(tmp_path: Path) -> None:
    """Locally, agents write to a multiprocess dir and the campaign driver serves it: the initial series
    reach that endpoint as well (in a subprocess: prometheus_client picks its mode at import)."""
    script = textwrap.dedent(
        f"""
        import json
        from labkube.metrics import use_multiprocess_dir
        use_multiprocess_dir({str(tmp_path / "mp")!r})
        import prometheus_client as pc
        from prometheus_client import multiprocess
        from labkube.agent.telemetry import RunTelemetry
        from labkube.run_spec import RunSpec
        RunTelemetry(RunSpec(run_id="r", campaign="c", task="t", task_path="/t", model="m", seed=0))
        registry = pc.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        print(pc.generate_latest(registry).decode())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    found = {
        s.name: s.value
        for f in text_string_to_metric_families(proc.stdout)
        for s in f.samples
        if not s.labels.get("type")
    }
    assert found["labkube_run_integrity_suspicious"] == 0
    assert math.isnan(found["labkube_run_best_score"])
    violations = [
        s for f in text_string_to_metric_families(proc.stdout) for s in f.samples if s.name.endswith("_violations")
    ]
    assert {s.labels["type"] for s in violations} == {t.value for t in ViolationType}
    assert all(s.value == 0 for s in violations)


# Where each of them may be read: panels built for them, which say what their absence means.
OWN_BOARDS = {
    "labkube_run_gaia2_passed": {"gaia2.json"},
    "labkube_run_gpu_utilization_ratio": {"campaign-overview.json", "run-detail.json"},
    "labkube_run_gpu_memory_used_bytes": {"campaign-overview.json", "run-detail.json"},
    "labkube_run_gpu_memory_total_bytes": {"run-detail.json"},
}


@pytest.mark.parametrize("name", sorted(NOT_AT_START))
def test_series_left_unset_are_read_only_by_their_own_dashboard(name: str) -> None:
    readers = [(b, p) for b, board in load_dashboards().items() for p, t in queries(board) if name in t["expr"]]
    assert {b for b, _p in readers} == OWN_BOARDS[name], NOT_AT_START[name]
    if name.startswith("labkube_run_gpu_"):
        assert all("without a GPU" in p["description"] or "no GPU" in p["description"] for _b, p in readers)


def test_campaign_resumes_count_while_runs_go_on_and_once_each() -> None:
    """A resume shows in `labkube_campaign_run_resumes_total` at the tick after it (from the live run's status),
    not when the run ends: a campaign whose last run ends right after its last scrape still shows it. The
    result that follows the live status does not count it again."""
    from prometheus_client import CollectorRegistry

    from labkube.operator.telemetry import CampaignTelemetry
    from labkube.report import ReportRow

    telemetry = CampaignTelemetry("c", None, registry=CollectorRegistry())

    def row(status: str, resumes: int) -> ReportRow:
        return ReportRow(run_id="t--m--s1", task="t", model="m", seed=1, status=status, resumes=resumes)

    def total(name: str) -> float:
        (value,) = [v for labels, v in samples(telemetry)[name] if labels["campaign"] == "c"]  # type: ignore[arg-type]
        return value

    telemetry.update([row("Running", 0)], {})
    assert total("labkube_campaign_run_resumes_total") == 0
    telemetry.update([row("Running", 1)], {})  # the agent started a second time
    assert total("labkube_campaign_run_resumes_total") == 1
    telemetry.update([row("Finished", 1)], {})  # its result, with the same resume
    assert total("labkube_campaign_run_resumes_total") == 1
    assert total("labkube_campaign_run_restarts_total") == 1


def test_a_run_whose_series_nothing_can_read_builds_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither shared with a campaign's `/metrics` (LABKUBE_METRICS_DIR) nor served (LABKUBE_METRICS_PORT): the
    agent's telemetry takes every call and builds no series; a `RunTelemetry` has its series as before."""
    from labkube.agent.budget import BudgetTracker
    from labkube.agent.telemetry import UnreadTelemetry, start_telemetry
    from labkube.budgets import Usage

    monkeypatch.delenv("LABKUBE_METRICS_DIR", raising=False)
    monkeypatch.delenv("LABKUBE_METRICS_PORT", raising=False)
    unread = start_telemetry(spec(), tools=["bash"], best_score=0.5)
    assert isinstance(unread, UnreadTelemetry) and not hasattr(unread, "m")
    unread.model_call(Usage(input=3, output=2), 0.01, 0.5)
    unread.tool_call("bash", ok=True)
    unread.step(BudgetTracker(ALL_BUDGETS))
    unread.grade(0.7, 1.0)
    unread.integrity("SUSPICIOUS", ["tests_modified"])
    unread.gaia2(True, ["search"])
    unread.finished()
    assert unread.best == 0.7

    served = RunTelemetry(spec(), tools=["bash"])
    assert not isinstance(served, UnreadTelemetry) and "labkube_run_finished" in samples(served)
