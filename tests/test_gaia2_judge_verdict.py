"""ARE's judge gives a verdict or an error (issue 43, item 5): a soft judge whose model answers without a verdict
token (prose, an empty reply) or never answers within `--judge-timeout` makes the run a `judge_error` naming what
came back, exit 1, left out of pass@k and counted as excluded; never a 0.0 that reads as the agent's failure.

The real world process and ARE's real judge (through LiteLLM) call a local fake model endpoint (tests/fakellm.py);
the agent is a replay whose email words differ from the oracle's, so the soft check has to ask the judge model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply

from labkube.run_spec import DEFAULT_JUDGE_TIMEOUT_S, WORLD_VALIDATION_LIMIT_S

SEND = {
    "recipients": ["dana.whitfield@northwind.example"],
    "cc": ["marco.bianchi@northwind.example"],
    "subject": "Q3 budget final",
    "content": "Reworded.",
}
CALLS = [("EmailClientV2__send_email", SEND), ("AgentUserInterface__send_message_to_user", {"content": "Sent."})]


def replay_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.jsonl"
    plan.write_text(
        "".join(
            json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) + "\n"
            for n, a in CALLS
        )
    )
    return plan


def run_judged(tmp_path: Path, judge: FakeLLM, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "c"
    proc = labkube(
        "run", "gaia2/execution_budget_email", "--model", f"replay:{replay_plan(tmp_path)}", "--judge-model",
        f"openai-compatible:{judge.base_url}/v1#judge", "--out", str(out), *extra, cwd=tmp_path,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, out


def assert_judge_error_left_out(out: Path, tmp_path: Path, said: str) -> dict:
    (row,) = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert row["outcome"] == "judge_error" and row["status"] == "Failed", row
    assert row["score"] is None and row["beat_baseline"] is None and row["completion"] is None
    assert said in row["error"], row["error"]
    table = labkube("report", str(out), cwd=tmp_path).stdout
    (execution,) = [line for line in table.splitlines() if line.startswith("│ execution")]
    cells = [c.strip() for c in execution.strip("│").split("│")]
    assert cells[3] == "unknown" and cells[-1] == "1"  # pass@1 unknown, 1 attempt excluded: not a failure
    return json.loads((out / "runs" / row["run_id"] / "result.json").read_text())


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            "The agent's email says the same thing as the oracle's in other words, so I would accept it.",
            "the judge model answered without a verdict ([[True]] or [[False]]): `The agent's email says the same",
        ),
        ("", "the judge model answered without a verdict ([[True]] or [[False]]): an empty reply"),
    ],
)
def test_a_judge_answer_without_a_verdict_is_a_judge_error(tmp_path: Path, answer: str, said: str) -> None:
    with FakeLLM(default=Reply.text(answer)) as judge:
        code, printed, out = run_judged(tmp_path, judge)
        assert judge.unscripted_calls >= 1  # the soft check asked the model

    assert code == 1, printed
    assert " judge_error: ARE's judge failed: JudgeGaveNoVerdict: " in printed
    result = assert_judge_error_left_out(out, tmp_path, said)
    verdict = result["details"]["gaia2"]
    assert verdict["success"] is False and verdict["soft_checks"].startswith("failed")


def test_a_judge_that_says_false_is_still_a_verdict(tmp_path: Path) -> None:
    """The near miss: a judge model that answers `[[False]]` fails the run, as ARE means it to (scored 0)."""
    with FakeLLM(default=Reply.text("The email differs in substance. [[False]]")) as judge:
        code, printed, out = run_judged(tmp_path, judge)
    assert code == 0, printed
    (row,) = json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)
    assert row["outcome"] == "scored" and row["score"] == 0.0


def test_a_judge_that_never_answers_is_a_judge_error_at_its_own_time_out(tmp_path: Path) -> None:
    with FakeLLM(default=Reply.delay(60, Reply.text("[[True]]"))) as judge:
        started = time.monotonic()
        code, printed, out = run_judged(tmp_path, judge, "--judge-timeout", "3")
        took = time.monotonic() - started

    assert code == 1, printed
    assert took < 60, "the run waited for the judge model beyond its time-out"
    assert_judge_error_left_out(out, tmp_path, "judge did not answer within 3 s")


def test_the_judge_time_out_is_shorter_than_the_worlds_validation_limit(tmp_path: Path) -> None:
    from labkube.tasks.gaia2 import world_protocol

    assert world_protocol.VALIDATION_DEADLINE_S == WORLD_VALIDATION_LIMIT_S  # the world keeps its own copy
    assert world_protocol.DEFAULT_JUDGE_TIMEOUT_S == DEFAULT_JUDGE_TIMEOUT_S < WORLD_VALIDATION_LIMIT_S
    proc = labkube("run", "gaia2/execution_budget_email", "--model", "noop", "--judge-timeout", "300", cwd=tmp_path)
    assert proc.returncode == 2 and "--judge-timeout" in proc.stderr and "300" in proc.stderr
