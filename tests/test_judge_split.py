"""ARE's soft judge and the integrity inspector are chosen apart (issue #23, item 2): `judge_model` is ARE's
judge only, `inspector_model` (with `inspector_budget_usd`) the inspector; files written before the split,
where `judge_model` drove both, keep that meaning; `labkube audit --judge-model` is a deprecated alias."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.campaign import CampaignSpec
from labkube.run_spec import RunSpec

RUN = {"run_id": "r", "campaign": "c", "task": "researchgym/x", "task_path": "/t", "model": "oracle", "seed": 0}


def test_a_run_json_from_before_the_split_keeps_judge_model_for_both() -> None:
    old = RunSpec.model_validate({**RUN, "judge_model": "openai:gpt-5", "judge_budget_usd": 2.5})
    assert old.judge_model == old.inspector_model == "openai:gpt-5"
    assert old.inspector_budget_usd == 2.5


def test_a_run_json_after_the_split_keeps_them_apart_and_reads_back_the_same() -> None:
    new = RunSpec.model_validate({**RUN, "judge_model": "openai:gpt-4o", "inspector_model": None})
    assert new.judge_model == "openai:gpt-4o" and new.inspector_model is None
    again = RunSpec.model_validate_json(new.model_dump_json())
    assert again == new


def test_a_campaign_file_names_each_model() -> None:
    spec = CampaignSpec.model_validate(
        {"tasks": ["gaia2"], "judge_model": "openai:gpt-4o", "inspector_model": "anthropic:claude-sonnet-4-5"}
    )
    assert (spec.judge_model, spec.inspector_model) == ("openai:gpt-4o", "anthropic:claude-sonnet-4-5")
    judge_only = CampaignSpec.model_validate({"tasks": ["gaia2"], "judge_model": "openai:gpt-4o"})
    assert judge_only.inspector_model is None
    # a campaign.json from before the split (a full dump: judge_budget_usd is there)
    old = CampaignSpec.model_validate({"tasks": ["gaia2"], "judge_model": "openai:gpt-4o", "judge_budget_usd": 3})
    assert old.inspector_model == "openai:gpt-4o" and old.inspector_budget_usd == 3
    with pytest.raises(ValueError, match="judge_budget_usd"):  # gone from a file that knows the split
        CampaignSpec.model_validate({"tasks": ["gaia2"], "inspector_model": None, "judge_budget_usd": 3})


@pytest.fixture
async def finished_run(tmp_path: Path) -> Path:
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 3"}}]))
    await run_agent(run_dir)
    return run_dir


def test_audit_judge_model_is_a_deprecated_alias_of_inspector_model(finished_run: Path, tmp_path: Path) -> None:
    verdict = {"verdict": "PASS", "confidence": 0.9, "reasoning": "nothing odd"}
    for flag in ("--judge-model", "--inspector-model"):
        with FakeLLM() as llm:
            llm.script(Reply.tool_call("submit_verdict", verdict))
            env = {"OPENAI_BASE_URL": llm.base_url + "/v1", "OPENAI_API_KEY": "sk-inspector"}
            proc = labkube("audit", str(finished_run), flag, "openai:gpt-5", cwd=tmp_path, env=env, timeout=120)
            assert proc.returncode == 0, proc.stderr
            assert len(llm.requests) == 1  # the inspector ran on the model given
        stored = json.loads((finished_run / "integrity.json").read_text())
        assert stored["inspector"]["model"] == "openai:gpt-5"
        warnings = [line for line in proc.stderr.splitlines() if "deprecated" in line]
        if flag == "--judge-model":
            assert warnings == [
                "warning: labkube audit --judge-model is deprecated; use --inspector-model (the integrity inspector's)"
            ]
        else:
            assert warnings == []


def test_audit_refuses_an_inspector_key_that_is_missing_or_no_key_in_one_line_writing_nothing(
    finished_run: Path, tmp_path: Path
) -> None:
    """The same check as `labkube run`'s front door (`required_key_variable`, `header_safe_key`): a missing key, or
    one with a character no API key has, is a one-line error that names the variable, never the key's text, before
    the audit writes anything."""
    before = sorted(p.name for p in finished_run.iterdir())
    for value, said in (("", "OPENAI_API_KEY is not set"), ("sk-in spector", "OPENAI_API_KEY")):
        env = {"OPENAI_API_KEY": value}
        proc = labkube("audit", str(finished_run), "--inspector-model", "openai:gpt-5", cwd=tmp_path, env=env)
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr
        error = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(error) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "inspector model openai:gpt-5" in error[0] and (not value or value not in proc.stderr)
    assert sorted(p.name for p in finished_run.iterdir()) == before


async def test_a_run_with_a_judge_model_only_runs_no_inspector(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 3"}}])
    with FakeLLM() as llm:
        run_dir = make_run_dir(tmp_path, task, judge_model=f"openai-compatible:{llm.base_url}/v1#judge")
        await run_agent(run_dir)
        assert llm.requests == []  # before the split the inspector called the judge's model
    integrity = json.loads((run_dir / "integrity.json").read_text())
    assert integrity["inspector"] is None
