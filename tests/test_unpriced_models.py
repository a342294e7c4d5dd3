"""A model the price table does not know costs "unknown", never $0.00, wherever labkube shows dollars; a dollar
budget on one is refused up front unless the campaign gives its price (issue #23, item 8)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from cli_helpers import labkube, tree_digest
from fakellm import FakeLLM, Reply, Usage
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.pricing import cost_usd, has_price
from labkube.budgets import Budgets, Spend
from labkube.budgets import Usage as TokenUsage
from labkube.campaign import CampaignSpec
from labkube.operator.campaign_run import CampaignError, plan_campaign
from labkube.result import RunResult
from labkube.run_spec import RunSpec
from labkube.store import CampaignDir

CALL = TokenUsage(input=1000, output=100)


def test_an_unknown_model_costs_unknown_and_a_scripted_one_nothing() -> None:
    assert cost_usd("openai-compatible:http://gpu-box:8000/v1#qwen", CALL) is None
    assert cost_usd("openai-compatible:http://gpu-box:8000/v1#qwen", CALL, {"openai-compatible:http://gpu-box": (1, 2)})
    assert cost_usd("oracle", CALL) == 0.0 and cost_usd("replay:/x/transcript.jsonl", CALL) == 0.0
    assert cost_usd("openai:gpt-5", CALL) == pytest.approx((1000 * 1.25 + 100 * 10.0) / 1e6)
    assert not has_price("anthropic:claude-unreleased-9") and has_price("anthropic:claude-sonnet-4-5")


def test_a_result_written_before_unpriced_existed_reads_with_its_dollars() -> None:
    spend = Spend.model_validate({"steps": 2, "usage": {"input": 5}, "usd": 0.25, "wall_seconds": 3.0})
    assert spend.cost_usd == 0.25 and spend.unpriced == []
    spend.add_cost("openai-compatible:http://h/v1#m", None)
    spend.add_cost("openai:gpt-5", 0.5)
    assert spend.cost_usd is None and spend.usd == 0.75  # the priced part is kept, the total is unknown


async def test_a_run_on_an_unpriced_model_shows_unknown_dollars_everywhere(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [])
    with FakeLLM() as llm:
        model = f"openai-compatible:{llm.base_url}/v1#local-qwen"
        llm.script(
            Reply.tool_call("bash", {"command": "echo 7 > result.txt"}, usage=Usage(input=900, output=40)),
            Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=Usage(input=950, output=20)),
        )
        campaign = tmp_path / "c"
        run_dir = make_run_dir(campaign, task, model=model)
        spec = CampaignSpec(name="t", tasks=[str(task)], models=[model])
        CampaignDir(campaign).write_campaign(spec, [RunSpec.model_validate_json((run_dir / "run.json").read_text())])
        result = await run_agent(run_dir)
    stored = RunResult.model_validate_json((run_dir / "result.json").read_text())
    assert result.score is not None and stored.spend.unpriced == [model] and stored.spend.cost_usd is None
    calls = [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]
    assert [c["cost_usd"] for c in calls if c["type"] == "model_call"] == [None, None]

    def said(*args: str) -> str:
        proc = labkube(*args, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "unknown" in said("status", str(campaign))
    table = said("report", str(campaign))
    assert table.count("unknown") == 2  # the run's row and its model's aggregate
    (row,) = json.loads(said("report", str(campaign), "--format", "json"))
    assert row["cost_usd"] is None
    (group,) = json.loads(said("report", str(campaign), "--format", "json", "--by", "scaffold"))
    assert group["cost_usd"] is None
    (csv_row,) = csv.DictReader(io.StringIO(said("report", str(campaign), "--format", "csv")))
    assert csv_row["cost_usd"] == ""
    said("report", str(campaign), "--format", "html", "--out", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert '<div class="k">cost</div><div class="v">unknown</div>' in page and "$0.00" not in page
    said("view", str(run_dir), "--out", str(tmp_path / "v.html"))
    assert '<div class="k">cost</div><div class="v">unknown</div>' in (tmp_path / "v.html").read_text()
    said("export", str(campaign), "--format", "atif", "--out", str(tmp_path / "atif"))
    (trajectory,) = (tmp_path / "atif").glob("*.json")
    assert "total_cost_usd" not in json.loads(trajectory.read_text())["final_metrics"]  # ATIF: absent is unknown


def test_a_dollar_budget_on_an_unpriced_model_is_refused_up_front(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [])
    out = tmp_path / "c"
    out.mkdir()
    before = tree_digest(out)
    model = "openai-compatible:http://127.0.0.1:9/v1#local-qwen"
    proc = labkube("run", str(task), "--model", model, "--budget-usd", "2", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"model {model}: labkube's price table does not know it" in line and "prices:" in line
    assert tree_digest(out) == before


def test_a_dollar_budget_with_the_campaigns_price_or_a_known_model_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_tiny_task(tmp_path, [])
    model = "openai-compatible:http://127.0.0.1:9/v1#local-qwen"
    budgets = Budgets(usd=2)
    priced = CampaignSpec(tasks=[str(task)], models=[model], budgets=budgets, prices={model: (0.1, 0.2)})
    _, (run,), _ = plan_campaign(priced, tmp_path / "a")
    assert run.budgets.usd == 2
    with pytest.raises(CampaignError, match="price table does not know it"):
        plan_campaign(priced.model_copy(update={"prices": {}}), tmp_path / "b")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    plan_campaign(CampaignSpec(tasks=[str(task)], models=["openai:gpt-5"], budgets=budgets), tmp_path / "c")


def test_a_run_status_on_kubernetes_keeps_an_unknown_cost_unknown() -> None:
    """The Run resource's status (what `kubectl get lkr` and `labkube run --backend k8s` show): an unpriced
    model's cost is null there too, and the CLI's table says unknown."""
    from labkube.budgets import Spend, format_usd, rounded_usd
    from labkube.operator.k8s_models import RunStatus as KubeRunStatus
    from labkube.operator.k8s_submit import run_rows

    spend = Spend(usd=0.5)
    spend.add_cost("openai-compatible:http://h/v1#mystery", None)
    status = KubeRunStatus(cost_usd=rounded_usd(spend.cost_usd))
    assert status.model_dump(by_alias=True, mode="json")["costUsd"] is None
    run = {"metadata": {"name": "r"}, "spec": {"run_id": "r"}, "status": status.model_dump(by_alias=True, mode="json")}
    (row,) = run_rows([run])
    assert row["cost_usd"] is None and format_usd(row["cost_usd"], digits=4) == "unknown"
