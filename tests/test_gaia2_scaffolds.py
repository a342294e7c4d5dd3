"""Gaia2 through labkube beyond rg-agent's plain runs: ARE's own agent as a reference scaffold
(`--agent are-default`), agent2agent and noise augmentation, the soft (LLM) judge and fixed think time.

Every model here is a FakeLLM on 127.0.0.1 reached through `openai-compatible:URL#MODEL`: rg-agent calls
it through the openai SDK, ARE's agent, app agents and judge through LiteLLM in the world's virtualenv.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply, Usage

from labkube.agent.harness.entrypoint import run_agent
from labkube.budgets import Budgets
from labkube.model_ref import parse_model
from labkube.results.trajectory_view import build_trajectory, read_transcript
from labkube.run_spec import RunSpec, make_run_id
from labkube.store import write_model
from labkube.task_card import TaskFamily
from labkube.tasks import resolve_tasks
from labkube.tasks.gaia2 import WorldLLM, WorldLLMError, setup_world_env, world_llm

pytestmark = pytest.mark.gaia2

SCENARIO = "gaia2/execution_budget_email"
WHITFIELD, WELLS, MARCO = (
    "dana.whitfield@northwind.example",
    "dana.wells@mailbox.example",
    "marco.bianchi@northwind.example",
)
NO_KEY = {"OPENAI_API_KEY": ""}
RIGHT_EMAIL = {"recipients": [WHITFIELD], "cc": [MARCO], "subject": "Q3 budget final", "content": "Final."}


@pytest.fixture(scope="module", autouse=True)
def world_env() -> None:
    setup_world_env()


def model_of(llm: FakeLLM) -> str:
    return f"openai-compatible:{llm.base_url}/v1#fake-model"


def run_dir_for(root: Path, model: str, ref: str = SCENARIO, seed: int = 0, **spec: Any) -> Path:
    (card,) = resolve_tasks(ref)
    run = RunSpec(
        run_id=make_run_id(card.ref, model, seed, spec.get("agent", "rg-agent")),
        campaign="g2",
        task=card.ref,
        task_path=card.path,
        model=model,
        seed=seed,
        family=TaskFamily.gaia2,
        **spec,
    )
    run_dir = root / run.run_id
    write_model(run_dir / "run.json", run)
    return run_dir


def replay(path: Path, calls: list[tuple[str, dict]]) -> str:
    lines = [
        json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) for n, a in calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return f"replay:{path}"


def react(tool: str, arguments: dict[str, Any]) -> Reply:
    """A step of ARE's ReAct agents, in the text format they parse."""
    action = json.dumps({"action": tool, "action_input": arguments}, indent=2)
    return Reply.text(f"Thought: next, {tool}.\nAction:\n{action}<end_action>")


def transcript(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]


# -- ARE's own agent -------------------------------------------------------------------------------


@pytest.mark.parametrize(("recipient", "passes"), [(WHITFIELD, True), (WELLS, False)])
async def test_are_default_agent_runs_in_the_world_and_is_judged_by_ares_judge(
    tmp_path: Path, recipient: str, passes: bool
) -> None:
    with FakeLLM() as llm:
        llm.script(
            react("EmailClientV2__send_email", {**RIGHT_EMAIL, "recipients": [recipient]}),
            react("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
        )
        run_dir = run_dir_for(tmp_path, model_of(llm), agent="are-default")
        result = await run_agent(run_dir)
        prompts = [r.body["messages"][0]["content"] for r in llm.requests]
    assert result.status.value == "Finished" and result.agent == "are-default"
    assert result.score == (1.0 if passes else 0.0), result.details
    verdict = result.details["gaia2"]
    assert verdict["success"] is passes and verdict["agent"]["name"] == "are-default"
    if not passes:
        assert "EmailClientV2__send_email" in verdict["rationale"]
    assert len(prompts) == 2 and all("<end_action>" in p for p in prompts)  # ARE's ReAct system prompt
    entries = transcript(run_dir)
    calls = [e for e in entries if e["type"] == "are_agent" and e.get("tool") == "EmailClientV2__send_email"]
    assert calls and calls[0]["arguments"]["recipients"] == [recipient]
    assert result.spend.steps == 2 and result.spend.usage.total > 0
    # the trajectory viewer shows ARE's log entry by entry
    shown = build_trajectory(read_transcript(run_dir / "transcript.jsonl")).events
    titles = [e.title for e in shown if e.type == "are_agent"]
    assert "ARE's agent calls EmailClientV2__send_email" in titles and "ARE's agent: llm output" in titles


async def test_are_default_with_a_failing_model_fails_with_the_models_error(tmp_path: Path) -> None:
    with FakeLLM(default=Reply.error(400, message="model fake-model does not exist")) as llm:
        result = await run_agent(run_dir_for(tmp_path, model_of(llm), agent="are-default"))
    # an error outcome carries no score (issue 43): ARE's verdict on what the agent did is kept apart
    assert result.status.value == "Failed" and result.score is None and result.completion is None
    assert [s.raw for s in result.values_before_error] == [0.0]
    assert result.stop_reason.value == "model_error"
    assert "the model never answered ARE's agent" in (result.error or "") and "does not exist" in result.error


async def test_are_default_stops_at_the_step_budget(tmp_path: Path) -> None:
    with FakeLLM(default=react("Contacts__get_contacts", {})) as llm:  # it never gets round to the email
        result = await run_agent(run_dir_for(tmp_path, model_of(llm), agent="are-default", budgets=Budgets(steps=3)))
        calls = len(llm.requests)
    assert result.status.value == "Finished" and result.stop_reason.value == "steps"
    assert calls == 3 and result.spend.steps == 3 and result.score == 0.0
    assert "reached max_iterations (3)" in result.details["gaia2"]["agent"]["error"]


async def test_are_default_out_of_time_is_stopped_and_judged_on_what_it_did(tmp_path: Path) -> None:
    with FakeLLM() as llm:
        llm.script(
            react("EmailClientV2__send_email", RIGHT_EMAIL),
            Reply.delay(60, then=react("AgentUserInterface__send_message_to_user", {"content": "Sent."})),
        )
        started = time.monotonic()
        run_dir = run_dir_for(tmp_path, model_of(llm), agent="are-default", budgets=Budgets(wall_hours=4 / 3600))
        result = await run_agent(run_dir)
        took = time.monotonic() - started
    assert took < 40, took  # the 4 s budget, the world's start, the judge: not the model's 60 s
    assert result.status.value == "Finished" and result.stop_reason.value == "time"
    assert "did not finish within 4 s" in result.details["gaia2"]["agent"]["error"]
    assert result.details["gaia2"]["turns_completed"] == 0  # judged as it stood: the email sent, no reply


async def test_are_default_needs_the_models_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = await run_agent(run_dir_for(tmp_path, "openai:gpt-4o", agent="are-default"))
    assert result.status.value == "Failed" and result.stop_reason.value == "auth"
    assert "OPENAI_API_KEY is not set" in (result.error or "")


def responder_for_both_scaffolds(path: str, body: dict[str, Any]) -> Reply:
    """One model for rg-agent (tool calls) and ARE's agent (ReAct text), whatever order their calls come in:
    rg-agent does the right write, ARE's agent emails the other Dana."""
    done = sum(1 for m in body.get("messages", []) if m["role"] == "assistant")
    send, reply = (
        ("EmailClientV2__send_email", RIGHT_EMAIL),
        ("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
    )
    if body.get("tools"):  # rg-agent
        return Reply.tool_call(*(send, reply)[done]) if done < 2 else Reply.text("done")
    wrong = (send[0], {**RIGHT_EMAIL, "recipients": [WELLS]})
    return react(*(wrong, reply)[min(done, 1)])


def test_one_campaign_compares_rg_agent_and_ares_agent_on_the_same_model(tmp_path: Path) -> None:
    with FakeLLM(responder=responder_for_both_scaffolds) as llm:
        model = model_of(llm)
        out = tmp_path / "cmp"
        args = ("run", SCENARIO, "--model", model, "--agent", "rg-agent", "--agent", "are-default", "--out", str(out))
        ran = labkube(*args, cwd=tmp_path, timeout=900)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    results = {json.loads(p.read_text())["agent"]: json.loads(p.read_text()) for p in out.glob("runs/*/result.json")}
    assert set(results) == {"rg-agent", "are-default"}
    assert results["rg-agent"]["score"] == 1.0 and results["are-default"]["score"] == 0.0
    report = labkube("report", str(out), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows: list[str] = []  # by capability; a long model name folds onto the next line (the table is 150 wide)
    current: int | None = None
    for line in report.stdout.splitlines():
        continuation = line.startswith("│ ") and line.split("│")[1].strip() == ""
        if line.startswith("│ execution "):
            rows.append(line)
            current = len(rows) - 1
        elif continuation and current is not None:
            rows[current] += line
        else:
            current = None
    assert any("(are-default)" in r and re.search(r"\b0\.000\b", r) for r in rows), report.stdout
    assert any("(are-default)" not in r and re.search(r"\b1\.000\b", r) for r in rows), report.stdout


# -- augmentations, judge and think time through labkube ----------------------------------------------


async def test_agent2agent_run_talks_to_app_agents_and_counts_as_agent2agent(tmp_path: Path) -> None:
    task = "Email Dana Whitfield (cc Marco Bianchi) that the Q3 budget is final."
    model = replay(
        tmp_path / "a2a.jsonl",
        [
            ("EmailClientV2__expert_agent", {"task": task}),
            ("AgentUserInterface__send_message_to_user", {"content": "Done."}),
        ],
    )
    with FakeLLM() as app_llm:
        app_llm.script(react("EmailClientV2__send_email", RIGHT_EMAIL), react("final_answer", {"answer": "sent"}))
        run_dir = run_dir_for(tmp_path, model, gaia2_a2a=1.0, gaia2_a2a_model=model_of(app_llm))
        result = await run_agent(run_dir)
        asked = [r.body for r in app_llm.requests]
    assert result.score == 1.0, result.details
    assert result.capabilities == ["agent2agent", "execution"]
    assert asked and task in json.dumps(asked[0])  # the app agent got rg-agent's task
    world = next(e for e in transcript(run_dir) if e["type"] == "world")
    assert "agent2agent" in world["scenario"]["capabilities"]


async def test_noise_runs_fail_tools_where_their_seed_says_and_count_under_noise(tmp_path: Path) -> None:
    calls = [("Contacts__get_contacts", {})] * 40 + [("AgentUserInterface__send_message_to_user", {"content": "."})]
    model = replay(tmp_path / "noise.jsonl", calls)

    async def failures(seed: int, name: str) -> str:
        run_dir = run_dir_for(tmp_path / name, model, gaia2_noise=True, seed=seed)
        result = await run_agent(run_dir)
        assert result.status.value == "Finished" and result.capabilities == ["execution", "noise"]
        world = next(e for e in transcript(run_dir) if e["type"] == "world")
        assert "noise" in world["scenario"]["capabilities"]
        outputs = [e["output"] for e in transcript(run_dir) if e.get("tool") == "Contacts__get_contacts"]
        assert len(outputs) == 40
        return "".join("x" if "Internal error - Retry again later" in o else "." for o in outputs)

    first, again, other = await failures(0, "a"), await failures(0, "b"), await failures(1, "c")
    assert "x" in first and first == again and first != other, (first, again, other)


@pytest.mark.parametrize(("says", "passes"), [("[[True]] [[Success]]", True), ("[[False]] [[Failure]]", False)])
async def test_judge_model_turns_on_ares_soft_checks(tmp_path: Path, says: str, passes: bool) -> None:
    paraphrase = {**RIGHT_EMAIL, "content": "Hello Dana - quick note: Q3's budget numbers are now locked."}
    model = replay(
        tmp_path / "soft.jsonl",
        [
            ("EmailClientV2__send_email", paraphrase),
            ("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
        ],
    )
    with FakeLLM(default=Reply.text(f"Evaluation: {says}")) as judge:
        result = await run_agent(run_dir_for(tmp_path, model, judge_model=model_of(judge)))
        asked = json.dumps([r.body for r in judge.requests])
    verdict = result.details["gaia2"]
    assert verdict["judge"].startswith("hard and soft checks") and verdict["soft_checks"] == "judged"
    assert verdict["success"] is passes and result.score == (1.0 if passes else 0.0), verdict
    assert "locked" in asked  # the judge was shown the agent's own words


@pytest.mark.parametrize("budget", [10.0, 1e-9])
async def test_the_soft_judge_spends_its_own_budget(tmp_path: Path, budget: float) -> None:
    """ARE's soft judge has dollars of its own: counted in the world from the provider's usage at the judge's
    price, reported beside the verdict, and a spent budget stops the judging (a judge_error, not a failed run)."""
    paraphrase = {**RIGHT_EMAIL, "content": "Hello Dana - quick note: Q3's budget numbers are now locked."}
    model = replay(
        tmp_path / "soft.jsonl",
        [
            ("EmailClientV2__send_email", paraphrase),
            ("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
        ],
    )
    with FakeLLM(default=Reply.text("Evaluation: [[True]] [[Success]]", usage=Usage(input=1000, output=100))) as judge:
        judge_ref = model_of(judge)
        prices = {judge_ref: (2.0, 8.0)}  # USD per million input and output tokens
        run_dir = run_dir_for(tmp_path, model, judge_model=judge_ref, gaia2_judge_budget_usd=budget, prices=prices)
        result = await run_agent(run_dir)
        calls = len(judge.requests)
    verdict = result.details["gaia2"]
    assert calls >= 1
    if budget == 10.0:
        assert verdict["exception"] is None and result.outcome.value == "scored" and result.score == 1.0
        assert verdict["judge_usd"] == pytest.approx(calls * (1000 * 2.0 + 100 * 8.0) / 1e6)
    else:  # the first call spends past a budget of a billionth of a dollar; the judge stops there
        assert "budget of $1e-09" in verdict["exception"] and verdict["soft_checks"].startswith("failed")
        assert result.outcome.value == "judge_error" and result.score is None
        assert calls == 1 or verdict["judge_usd"] > budget


async def test_fixed_think_time_is_charged_in_simulated_time(tmp_path: Path) -> None:
    calls = [("get_current_time", {}), ("get_current_time", {}), ("end_task", {})]

    async def clock_readings(think_time: float | None, name: str) -> list[float]:
        run_dir = run_dir_for(tmp_path / name, replay(tmp_path / f"{name}.jsonl", calls), think_time_s=think_time)
        await run_agent(run_dir)
        outputs = [e["output"] for e in transcript(run_dir) if e.get("tool") == "get_current_time"]
        return [float(re.search(r"\d{9,}(\.\d+)?", o).group()) for o in outputs]  # type: ignore[union-attr]

    fixed = await clock_readings(45.0, "fixed")
    measured = await clock_readings(None, "measured")
    assert 45.0 <= fixed[1] - fixed[0] < 50.0  # one model call between the two readings
    assert measured[1] - measured[0] < 5.0


# -- the CLI refuses what cannot run, before anything is written --------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--model", "oracle", "--agent", "are-default"), "agent are-default runs ARE's own agent on a model API"),
        (("--model", "noop", "--gaia2-a2a", "0.5"), "pass --gaia2-a2a-model"),
        (("--model", "oracle", "--gaia2-a2a", "0.5", "--gaia2-a2a-model", "noop"), "app agents need a model API"),
        (
            (
                "--model",
                "noop",
                "--judge-model",
                "openai-compatible:http://127.0.0.1:9/v1#j",
                "--gaia2-judge-budget-usd",
                "1",
            ),
            "so the judge's dollar budget cannot be kept",  # an unpriced judge: a budget that could not be kept
        ),
    ],
)
def test_cli_refuses_scripted_models_where_the_world_needs_a_real_one(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    ran = labkube("run", SCENARIO, *args, "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert ran.returncode == 2 and says in ran.stderr, ran.stderr
    assert not (tmp_path / "c").exists()


def test_cli_refuses_a_world_model_without_its_key_before_anything_runs(tmp_path: Path) -> None:
    for flags in (("--judge-model", "openai:gpt-4o"), ("--gaia2-a2a", "0.5", "--gaia2-a2a-model", "openai:gpt-4o")):
        out = tmp_path / "c"
        ran = labkube("run", SCENARIO, "--model", "oracle", *flags, "--out", str(out), cwd=tmp_path, env=NO_KEY)
        assert ran.returncode == 2 and "OPENAI_API_KEY is not set" in ran.stderr, ran.stderr
        assert not out.exists()


def test_cli_refuses_a_key_with_a_character_no_key_has_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "c"
    bad_key = {"OPENAI_API_KEY": "sk-pasted\twith a tab"}
    ran = labkube(
        "run",
        SCENARIO,
        "--model",
        "oracle",
        "--judge-model",
        "openai:gpt-4o",
        "--out",
        str(out),
        cwd=tmp_path,
        env=bad_key,
    )
    assert ran.returncode == 2, ran.stderr
    (line,) = ran.stderr.strip().splitlines()
    assert "model openai:gpt-4o: OPENAI_API_KEY holds a character no API key has" in line and "sk-pasted" not in line
    assert not out.exists()


def test_a_model_string_means_the_same_model_to_the_world() -> None:
    key = "sk-test"
    compatible = world_llm(parse_model("openai-compatible:http://10.0.0.5:8000/v1#llama-3@high"), None, "x")
    assert compatible == WorldLLM(
        model="llama-3", provider="openai", endpoint="http://10.0.0.5:8000/v1", api_key="not-needed"
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/anthropic")
        env.delenv("OPENAI_BASE_URL", raising=False)
        claude = world_llm(parse_model("anthropic:claude-sonnet-4-5"), key, "x")
        gpt = world_llm(parse_model("openai-chat:gpt-4o"), key, "x")
    assert claude == WorldLLM(
        model="claude-sonnet-4-5", provider="anthropic", endpoint="http://127.0.0.1:9/anthropic", api_key=key
    )
    assert gpt == WorldLLM(model="gpt-4o", provider="openai", endpoint=None, api_key=key)
    with pytest.raises(WorldLLMError, match=r"the judge needs a model API.*replay:x is scripted"):
        world_llm(parse_model("replay:x"), None, "the judge")


def test_cli_refuses_are_default_on_a_paper_task(tmp_path: Path) -> None:
    model = "openai-compatible:http://127.0.0.1:9/v1#m"
    ran = labkube(
        "run", "researchgym/continual-learning-lite", "--model", model, "--agent", "are-default", cwd=tmp_path
    )
    assert ran.returncode == 2 and "runs Gaia2 scenarios only" in ran.stderr, ran.stderr
