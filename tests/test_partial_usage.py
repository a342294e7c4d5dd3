"""A run with a model call whose answer did not say its usage (`Spend.partial_calls`, counted by the gateway:
tests/test_gateway.py, and rg-agent: tests/test_providers.py) shows its tokens and dollars as lower bounds ("≥")
wherever labkube shows them, never as exact figures; a run without one shows them as they are. The run's result is
written as the run writes it (a `RunResult` through the store), then read by the CLI a user runs."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from analyze_synth import write_run
from cli_helpers import labkube

from labkube.budgets import Spend, StopReason, Usage, format_tokens, format_usd
from labkube.campaign import CampaignSpec
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec
from labkube.store import CampaignDir

TASK = Path(__file__).resolve().parents[1] / "tasks" / "bundled" / "gaia2"
MODEL = "anthropic:claude-sonnet-4-6"


def test_a_spend_written_before_partial_calls_existed_reads_as_exact() -> None:
    spend = Spend.model_validate({"steps": 2, "usage": {"input": 5}, "usd": 0.25, "wall_seconds": 3.0})
    assert spend.partial_calls == 0 and not spend.at_least and spend.cost_usd == 0.25
    assert format_usd(0.25) == "0.25" and format_usd(0.25, at_least=True) == "≥0.25"
    assert format_usd(None, at_least=True) == "unknown"  # unknown stays unknown, bound or not
    assert format_tokens(12_345, at_least=True) == "≥12,345" and format_tokens(12_345) == "12,345"
    from labkube.results.html_report import template_env

    usd = template_env().filters["usd"]  # the pages' own
    assert usd(None, True) == "unknown" and usd(0.5, True) == "≥$0.5000" and usd(0.5) == "$0.5000"


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    root = tmp_path / "camp"
    cdir = CampaignDir(root)
    specs = [
        RunSpec(run_id=f"t--m--s{seed}", campaign="c", task="t", task_path=str(TASK), model=MODEL, seed=seed)
        for seed in (0, 1)
    ]
    cdir.write_campaign(CampaignSpec(name="c", tasks=[str(TASK)], models=[MODEL], seeds=2), specs)
    for spec, partial in zip(specs, (1, 0), strict=True):
        usage = Usage(input=4000, output=500)
        spend = Spend(steps=3, usage=usage, usd=0.0195, wall_seconds=12.0, partial_calls=partial)
        result = RunResult(
            run_id=spec.run_id,
            task=spec.task,
            model=MODEL,
            seed=spec.seed,
            status=RunPhase.finished,
            stop_reason=StopReason.done,
            score=0.5,
            spend=spend,
        )
        write_run(cdir, spec, result, [])
    return root


def test_a_runs_broken_off_call_makes_its_dollars_and_tokens_lower_bounds_everywhere(
    campaign: Path, tmp_path: Path
) -> None:
    def said(*args: str) -> str:
        proc = labkube(*args, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    status = said("status", str(campaign))
    assert status.count("≥0.02") == 1 and status.count("≥4,500") == 1  # the broken run's row; the other's is exact
    table = said("report", str(campaign))
    assert table.count("≥0.02") == 1 and table.count("≥0.04") == 1  # the run's row; the aggregate, a sum with it
    rows = {r["run_id"]: r for r in json.loads(said("report", str(campaign), "--format", "json"))}
    assert rows["t--m--s0"]["spend_at_least"] is True and rows["t--m--s1"]["spend_at_least"] is False
    (group,) = json.loads(said("report", str(campaign), "--format", "json", "--by", "scaffold"))
    assert group["spend_at_least"] is True and group["cost_usd"] == pytest.approx(0.039)
    csv_rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(said("report", str(campaign), "--format", "csv")))}
    assert csv_rows["t--m--s0"]["spend_at_least"] == "True" and csv_rows["t--m--s1"]["spend_at_least"] == "False"

    said("report", str(campaign), "--format", "html", "--out", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert '<div class="k">cost</div><div class="v">≥$0.0390</div>' in page
    assert '<div class="k">tokens</div><div class="v">≥9,000</div>' in page
    assert page.count(">≥$0.0195</td>") == 1 and page.count(">$0.0195</td>") == 1  # the two runs' rows

    run_dir = campaign / "runs" / "t--m--s0"
    said("view", str(run_dir), "--out", str(tmp_path / "v.html"))
    view = (tmp_path / "v.html").read_text()
    assert '<div class="v">≥$0.0195</div>' in view and "1 model answer did not say its usage" in view
    said("view", str(campaign / "runs" / "t--m--s1"), "--out", str(tmp_path / "v1.html"))
    assert "≥" not in (tmp_path / "v1.html").read_text()

    said("export", str(campaign), "--format", "atif", "--out", str(tmp_path / "atif"))
    extras = {
        json.loads(p.read_text())["session_id"]: json.loads(p.read_text())["final_metrics"]["extra"]
        for p in (tmp_path / "atif").glob("*.json")
    }
    assert extras["t--m--s0"]["partial_model_calls"] == 1 and "partial_model_calls" not in extras["t--m--s1"]


def test_a_run_resources_status_marks_a_lower_bound_and_the_k8s_table_shows_it() -> None:
    """The Run resource's status (what `kubectl get lkr -o yaml` and `labkube run --backend k8s` show), set as the
    operator sets it from the run's result or store (`RunStatus.show_spend`): a lower bound is marked
    `spendAtLeast` there, and the CLI's table shows it with "≥"; an exact spend is shown as it is."""
    from rich.console import Console

    from labkube.operator.k8s_models import RunStatus as KubeRunStatus
    from labkube.runs_cli import kube_runs_table

    runs = []
    for run_id, partial in (("broken", 2), ("whole", 0)):
        status = KubeRunStatus(phase=RunPhase.finished)
        status.show_spend(Spend(usage=Usage(input=4000, output=500), usd=0.0195, partial_calls=partial))
        dumped = status.model_dump(by_alias=True, mode="json")
        assert dumped["spendAtLeast"] is (partial > 0) and dumped["tokens"] == 4500 and dumped["costUsd"] == 0.0195
        runs.append({"metadata": {"name": run_id}, "spec": {"run_id": run_id}, "status": dumped})
    console = Console(width=200, record=True)
    console.print(kube_runs_table("Campaign c", runs))
    lines = {line.split()[1]: line for line in console.export_text().splitlines() if "Finished" in line}
    assert "≥4,500" in lines["broken"] and "≥0.0195" in lines["broken"]
    assert "≥" not in lines["whole"] and "4,500" in lines["whole"] and "0.0195" in lines["whole"]


def test_the_runs_series_say_when_its_dollars_are_unknown_or_lower_bounds() -> None:
    """The counters cannot say it (a counter only adds), so two gauges do, set from the run's whole spend
    (`RunTelemetry.spend`, which the gateway, rg-agent's loop and the CLI scaffolds call as they count a call)."""
    from labkube.agent.telemetry import RunTelemetry

    spec = RunSpec(run_id="t--m--s0", campaign="c", task="t", task_path=str(TASK), model=MODEL, seed=0)
    telemetry = RunTelemetry(spec)
    labels = {"campaign": "c", "run_id": "t--m--s0", "task": "t", "model": MODEL}

    def value(name: str) -> float | None:
        return telemetry.m.registry.get_sample_value(name, labels)

    assert value("labkube_run_cost_unknown") == 0 and value("labkube_run_model_calls_partial") == 0  # from the start
    spend = Spend(usd=0.5, partial_calls=2)
    telemetry.spend(spend)
    assert value("labkube_run_cost_unknown") == 0 and value("labkube_run_model_calls_partial") == 2
    spend.add_cost("openai-compatible:http://h/v1#mystery", None)
    telemetry.spend(spend)
    assert value("labkube_run_cost_unknown") == 1 and value("labkube_run_model_calls_partial") == 2
