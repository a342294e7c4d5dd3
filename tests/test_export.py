"""`labkube export`: ATIF trajectories with rewards and OpenAI chat fine-tuning JSONL, from real campaigns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import atif
import pytest
from analyze_synth import OUTCOME_GAIA2, OUTCOME_PAPER, write_outcomes_campaign
from cli_helpers import labkube
from export_helpers import WELLS, WHITFIELD, export, gaia2_campaign, paper_campaign, replay_model, rewards, trajectories
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from labkube.store import CampaignDir

ORACLE = "continual-learning-lite--oracle--s0"
CHEAT_RUN = "continual-learning-lite--cheat-hardcode--s0"
MESSAGES = TypeAdapter(list[ChatCompletionMessageParam])


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return paper_campaign(tmp_path_factory.mktemp("export"))


def test_atif_of_a_paper_campaign_validates(paper: Path, tmp_path: Path):
    export(str(paper), "--format", "atif", "--out", str(tmp_path), cwd=tmp_path)
    found = trajectories(tmp_path)
    assert set(found) == {ORACLE, CHEAT_RUN}
    for data in found.values():
        trajectory = atif.Trajectory.model_validate(data)
        assert trajectory.schema_version == "ATIF-v1.8"
    oracle = atif.Trajectory.model_validate(found[ORACLE])
    assert [s.source for s in oracle.steps[:3]] == ["system", "user", "agent"]
    agent_steps = [s for s in oracle.steps if s.source == "agent"]
    assert all(s.metrics and s.metrics.prompt_tokens for s in agent_steps)
    assert all(
        s.observation and s.observation.results[0].source_call_id == s.tool_calls[0].tool_call_id for s in agent_steps
    )
    labkube = oracle.extra["labkube"]
    assert labkube["task"] == "researchgym/continual-learning-lite" and labkube["seed"] == 0
    assert labkube["integrity_verdict"] == "PASS" and labkube["stop_reason"] == "done"
    assert oracle.final_metrics.total_prompt_tokens == sum(s.metrics.prompt_tokens for s in agent_steps)


def test_step_rewards_sum_to_the_final_score_minus_the_first_grading(paper: Path, tmp_path: Path):
    export(str(paper), "--format", "atif", "--out", str(tmp_path), cwd=tmp_path)
    oracle = trajectories(tmp_path)[ORACLE]
    result = CampaignDir(paper).result(ORACLE)
    assert result is not None and len(result.score_curve) >= 3
    step_sum = sum(v for s in oracle["steps"] for v in rewards(s, "score_change"))
    ran = [g for g in result.score_curve if g.error is None]
    first = ran[0].score or 0.0  # a clean grading without a value counts as 0, marked so
    assert step_sum == pytest.approx(result.score - first)
    assert step_sum > 0  # the first grading came before the oracle's method ran
    assert oracle["extra"]["rewards"]["step_reward_sum"] == pytest.approx(step_sum)
    last = oracle["steps"][-1]
    assert rewards(last, "final_score") == [result.score] and rewards(last, "beat_baseline") == [True]
    # each change sits on the agent step at which its grading was taken
    graded = {g.step for g in ran[1:]}
    placed = {s["extra"]["run_step"] for s in oracle["steps"] if rewards(s, "score_change")}
    assert placed == graded


def test_exclude_suspicious_drops_the_scripted_cheat(paper: Path, tmp_path: Path):
    proc = export(str(paper), "--format", "atif", "--exclude-suspicious", "--out", str(tmp_path), cwd=tmp_path)
    assert set(trajectories(tmp_path)) == {ORACLE}
    assert f"skipped {CHEAT_RUN}: integrity verdict SUSPICIOUS" in proc.stdout


def test_min_score_drops_runs_below_it(paper: Path, tmp_path: Path):
    cdir = CampaignDir(paper)
    scores = {r: cdir.result(r).score for r in (ORACLE, CHEAT_RUN)}
    threshold = sum(scores.values()) / 2  # between the two runs' scores
    assert scores[ORACLE] != scores[CHEAT_RUN]
    export(str(paper), "--format", "sft-jsonl", "--min-score", str(threshold), "--out", str(tmp_path), cwd=tmp_path)
    kept = {p.name.split("--", 1)[1].removesuffix(".sft.jsonl") for p in tmp_path.glob("*.jsonl")}
    assert kept == {r for r, s in scores.items() if s >= threshold}


def test_sft_lines_load_as_openai_chat_messages(paper: Path, tmp_path: Path):
    export(str(paper), "--format", "sft-jsonl", "--out", str(tmp_path), cwd=tmp_path)
    (path,) = tmp_path.glob(f"*{ORACLE}.sft.jsonl")
    (line,) = path.read_text().splitlines()
    messages = json.loads(line)["messages"]
    MESSAGES.validate_python(messages)
    assert [m["role"] for m in messages[:4]] == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"]
    json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])


def with_handoff(paper: Path, dest: Path) -> Path:
    """A copy of the paper campaign whose oracle run handed off its context after its second step."""
    shutil.copytree(paper, dest, symlinks=True)
    run = dest / "runs" / ORACLE
    lines = [json.loads(x) for x in (run / "conversation.jsonl").read_text().splitlines()]
    head, cut = lines[:2], 6  # system, user, then two assistant/tool pairs
    rest = [{**m, "epoch": 1} for m in lines[cut:]]
    restart = [{**m, "epoch": 1} for m in head]
    restart[1]["content"] += "\n\nSummary of earlier work: reproduced the baseline, added replay."
    conversation = [*lines[:cut], *restart, *rest]
    (run / "conversation.jsonl").write_text("".join(json.dumps(m) + "\n" for m in conversation))
    records = [json.loads(x) for x in (run / "transcript.jsonl").read_text().splitlines()]
    at = next(i for i, r in enumerate(records) if r["type"] == "model_call" and r["step"] == 3)
    handoff_call = {**records[at], "purpose": "handoff", "message": {"role": "assistant", "content": "summary"}}
    handoff = {"type": "handoff", "ts": records[at]["ts"], "n": 1, "summary": "reproduced the baseline, added replay"}
    records[at:at] = [handoff_call, handoff]
    (run / "transcript.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return dest


def test_a_handoff_is_a_separate_sft_conversation_and_an_atif_step(paper: Path, tmp_path: Path):
    campaign = with_handoff(paper, tmp_path / "handoff")
    export(str(campaign), "--format", "sft-jsonl", "--out", str(tmp_path / "sft"), cwd=tmp_path)
    (path,) = (tmp_path / "sft").glob(f"*{ORACLE}.sft.jsonl")
    first, second = (json.loads(x)["messages"] for x in path.read_text().splitlines())
    for messages in (first, second):
        MESSAGES.validate_python(messages)
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert "Summary of earlier work" in second[1]["content"]
    export(str(campaign), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    trajectory = atif.Trajectory.model_validate(trajectories(tmp_path / "atif")[ORACLE])
    sources = [(s.source, (s.extra or {}).get("handoff")) for s in trajectory.steps]
    at = sources.index(("agent", 1))
    assert sources[at + 1][0] == "system" and trajectory.steps[at + 1].extra["epoch"] == 1
    assert trajectory.steps[at].metrics is not None
    assert trajectory.extra["labkube"]["handoffs"][0]["n"] == 1


def test_export_of_a_missing_campaign_is_bad_usage(tmp_path: Path):
    proc = labkube("export", str(tmp_path / "nope"), "--format", "atif", cwd=tmp_path)
    assert proc.returncode == 2 and "not a campaign directory" in proc.stderr


@pytest.mark.gaia2
def test_gaia2_oracle_campaign_exports_with_ares_verdict(tmp_path: Path):
    campaign = gaia2_campaign(tmp_path)
    export(str(campaign), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    (data,) = trajectories(tmp_path / "atif").values()
    trajectory = atif.Trajectory.model_validate(data)
    terminal = {r["kind"]: r for r in trajectory.extra["rewards"]["terminal"]}
    assert terminal["scenario_verdict"]["value"] == 1.0 and "ARE judge" in terminal["scenario_verdict"]["source"]
    assert terminal["soft_check_verdict"]["value"].startswith("not judged")
    assert rewards(trajectory.model_dump()["steps"][-1], "scenario_verdict") == [1.0]


@pytest.mark.gaia2
@pytest.mark.parametrize(("recipient", "matched"), [(WHITFIELD, 1.0), (WELLS, 0.0)], ids=["right", "wrong"])
def test_gaia2_write_actions_carry_ares_oracle_match(tmp_path: Path, recipient: str, matched: float):
    model = replay_model(tmp_path / "plan.jsonl", recipient)
    out = tmp_path / "camp"
    proc = labkube("run", "gaia2/execution_budget_email", "--model", model, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    export(str(out), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    (data,) = trajectories(tmp_path / "atif").values()
    atif.Trajectory.model_validate(data)
    found = {
        r["tool_call_id"]: r
        for s in data["steps"]
        for r in (s.get("extra") or {}).get("rewards", [])
        if r["kind"] == "oracle_match"
    }
    send = next(r for call_id, r in found.items() if "send_email" in call_id)
    assert send["value"] == matched and (send["oracle_event_id"] == "oracle-send-email") == bool(matched)
    if not matched:  # the wrong write carries ARE's own reason
        assert "Agent did not perform the following oracle tool call" in send["reason"]
    else:
        assert "reason" not in send
    terminal = {r["kind"]: r["value"] for r in data["extra"]["rewards"]["terminal"]}
    assert terminal["scenario_verdict"] == matched
    assert (terminal["hard_check_failure"] is None) == bool(matched)


@pytest.mark.gaia2
def test_one_agent_with_a_right_and_a_wrong_write_gets_ares_count_check_on_both(tmp_path: Path):
    """ARE's GraphPerEventJudge checks each turn's tool counts before it matches anything: an agent that sends the
    right email and a wrong one fails that check, so ARE matches neither. The export says so on both writes, with
    ARE's reason, rather than inventing a 1 ARE never gave."""
    wrong, right = tmp_path / "wrong.jsonl", tmp_path / "right.jsonl"
    replay_model(wrong, WELLS)  # [send to the wrong Dana, tell the user]
    replay_model(right, WHITFIELD)
    plan = tmp_path / "plan.jsonl"
    send_wrong, tell_user = wrong.read_text().splitlines()
    plan.write_text("\n".join([send_wrong, right.read_text().splitlines()[0], tell_user]) + "\n")
    out = tmp_path / "camp"
    proc = labkube("run", "gaia2/execution_budget_email", "--model", f"replay:{plan}", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    export(str(out), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    (data,) = trajectories(tmp_path / "atif").values()
    atif.Trajectory.model_validate(data)
    sends = [
        r
        for s in data["steps"]
        for r in (s.get("extra") or {}).get("rewards", [])
        if r["kind"] == "oracle_match" and "send_email" in r["tool_call_id"]
    ]
    assert [r["value"] for r in sends] == [0.0, 0.0]
    assert all("counters do not match" in r["reason"] for r in sends)


def test_gaia_scorer_result_is_the_terminal_reward(tmp_path: Path):
    out = tmp_path / "gaia"
    proc = labkube("run", "gaia/demo/demo-sum-sales", "--model", "oracle", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    export(str(out), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    (data,) = trajectories(tmp_path / "atif").values()
    atif.Trajectory.model_validate(data)
    assert rewards(data["steps"][-1], "answer_correct") == [1.0]
    assert not any(rewards(s, "score_change") for s in data["steps"])


@pytest.mark.gaia2
def test_ares_own_agent_exports_from_its_log_with_oracle_matches(tmp_path: Path):
    from fakellm import FakeLLM
    from test_gaia2_scaffolds import SCENARIO, model_of, responder_for_both_scaffolds

    with FakeLLM(responder=responder_for_both_scaffolds) as llm:
        out = tmp_path / "cmp"
        args = ("run", SCENARIO, "--model", model_of(llm), "--agent", "are-default", "--out", str(out))
        ran = labkube(*args, cwd=tmp_path, timeout=900)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    export(str(out), "--format", "atif", "--out", str(tmp_path / "atif"), cwd=tmp_path)
    (data,) = trajectories(tmp_path / "atif").values()
    trajectory = atif.Trajectory.model_validate(data)
    assert trajectory.agent.name == "are-default"
    assert [s.source for s in trajectory.steps[:3]] == ["system", "user", "agent"]
    send = next(s for s in data["steps"] if s.get("tool_calls") and "send_email" in s["tool_calls"][0]["function_name"])
    assert rewards(send, "oracle_match") == [0.0]  # the responder sends ARE's agent to the wrong Dana
    assert rewards(data["steps"][-1], "scenario_verdict") == [0.0]


# -- outcomes: a run that ended in an error is no reward-0 trajectory; unknown is null ---------------------------

ERRORS = {p.run_id: p.outcome.value for p in OUTCOME_PAPER if p.is_error} | {
    f"oc-time_door_code--s{seed}": outcome.value for seed, outcome, _ in OUTCOME_GAIA2 if outcome.is_error
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Planted results (tests/analyze_synth.py): scored, no value, grader/setup/judge/world errors."""
    root = tmp_path_factory.mktemp("outcomes") / "outcomes"
    write_outcomes_campaign(root)
    return root


def test_error_outcomes_are_left_out_by_default_and_counted(outcomes: Path, tmp_path: Path):
    proc = export(str(outcomes), "--format", "atif", "--out", str(tmp_path), cwd=tmp_path)
    every = set(CampaignDir(outcomes).run_ids())
    assert set(trajectories(tmp_path)) == every - set(ERRORS)
    assert "skipped oc--gpt5--s4: outcome grader_error: ModuleNotFoundError: No module named 'sklearn'" in proc.stdout
    assert (
        "left out: 4 runs that ended in an error outcome (1 grader_error, 1 judge_error, 1 setup_error, "
        "1 world_error); --include-errors" in proc.stdout
    )


def test_include_errors_carries_the_outcome_with_null_rewards(outcomes: Path, tmp_path: Path):
    export(str(outcomes), "--format", "atif", "--include-errors", "--out", str(tmp_path), cwd=tmp_path)
    found = trajectories(tmp_path)
    assert set(ERRORS) <= set(found)
    for run_id, outcome in ERRORS.items():
        data = found[run_id]
        atif.Trajectory.model_validate(data)
        assert data["extra"]["labkube"]["outcome"] == outcome
        terminal = data["extra"]["rewards"]["terminal"]
        assert terminal and all(r["value"] is None and r["outcome"] == outcome for r in terminal), terminal
    judged = {r["kind"] for r in found["oc-time_door_code--s2"]["extra"]["rewards"]["terminal"]}
    assert "scenario_verdict" in judged  # a judge error's verdict is null, not a failed attempt (0.0)
    # the grader error's last grading failed: no score change from its earlier value to "0"
    assert not any(rewards(s, "score_change") for s in found["oc--gpt5--s4"]["steps"])
    assert found["oc--gpt5--s4"]["extra"]["rewards"]["gradings_failed"] == 1


def test_a_grading_without_a_value_gives_no_reward_and_a_run_without_one_null_terminal_rewards(
    outcomes: Path, tmp_path: Path
):
    proc = export(str(outcomes), "--format", "atif", "--min-score", "0.1", "--out", str(tmp_path), cwd=tmp_path)
    assert "skipped oc--gpt5--s2: no score (outcome no_value), --min-score 0.1" in proc.stdout
    export(str(outcomes), "--format", "atif", "--out", str(tmp_path / "all"), cwd=tmp_path)
    found = trajectories(tmp_path / "all")
    scored = found["oc--gpt5--s0"]  # gradings: no value, 0.3, 0.6
    changes = [r for s in scored["steps"] for r in rewards_of(s, "score_change")]
    assert [r["value"] for r in changes] == [pytest.approx(0.3), pytest.approx(0.3)]
    assert [r.get("no_value_as_zero", False) for r in changes] == [True, False]  # the convention, labelled
    assert scored["extra"]["rewards"]["gradings_without_value"] == 1
    nothing = found["oc--gpt5--s2"]
    assert nothing["extra"]["labkube"]["outcome"] == "no_value"
    terminal = {r["kind"]: r for r in nothing["extra"]["rewards"]["terminal"]}
    assert terminal["final_score"]["value"] is None and terminal["beat_baseline"]["value"] is None
    assert terminal["final_score"]["outcome"] == "no_value"
    changes = [r for s in nothing["steps"] for r in rewards_of(s, "score_change")]  # gradings: no value, no value
    assert [(r["value"], r["no_value_as_zero"]) for r in changes] == [(0.0, True)]


def rewards_of(step: dict, kind: str) -> list[dict]:
    return [r for r in (step.get("extra") or {}).get("rewards", []) if r["kind"] == kind]
