"""Context hand-off and overflow: the conversation restarts from the task and all summaries; dropping turns
never leaves a tool result without its call."""

from __future__ import annotations

import json
from pathlib import Path

from fakellm import FakeLLM, Reply, Usage
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.budgets import StopReason

READ = {"tool": "read_file", "args": {"path": "notes.txt"}}


def conversation(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "conversation.jsonl").read_text().splitlines()]


async def test_handoff_restarts_from_task_summaries_and_latest_state(tmp_path: Path) -> None:
    steps = [{"tool": "bash", "args": {"command": "echo 4 > result.txt"}}] + [READ] * 80
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, steps), context_threshold=900)
    result = await run_agent(run_dir)
    assert result.stop_reason is StopReason.done and result.subtasks[0].raw == 4.0
    records = [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]
    handoffs = [r for r in records if r["type"] == "handoff"]
    assert len(handoffs) >= 2
    assert sum(1 for r in records if r["type"] == "model_call" and r["purpose"] == "handoff") == len(handoffs)
    conv = conversation(run_dir)
    last_epoch = [m for m in conv if m["epoch"] == len(handoffs)]
    assert [m["role"] for m in last_epoch[:3]] == ["system", "user", "user"]
    assert "# Task: tiny-task" in last_epoch[1]["content"]
    restart = last_epoch[2]["content"]
    for n in range(1, len(handoffs) + 1):
        assert f"Hand-off summary {n}" in restart
    assert "result.txt" in restart  # the latest state: files changed since the start
    checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    assert len(checkpoint["summaries"]) == len(handoffs)


async def test_overflow_drops_oldest_turns_and_keeps_calls_with_results(tmp_path: Path, monkeypatch) -> None:
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        big = Usage(input=5000, output=10)
        server.script(
            *[
                Reply.tool_calls([("read_file", {"path": "notes.txt"}), ("bash", {"command": f"echo {i}"})], usage=big)
                for i in range(6)
            ],
            Reply.error(400, message="This model's maximum context length is 8192 tokens (context_length_exceeded)"),
            Reply.tool_call("end_task", {"summary": "ok"}, usage=big),
        )
        run_dir = make_run_dir(
            tmp_path, make_tiny_task(tmp_path, []), model="openai-chat:gpt-5", context_threshold=10**9
        )
        result = await run_agent(run_dir)
        after_drop = server.requests[-1].body["messages"]
    assert result.stop_reason is StopReason.done
    assert any("dropped to fit" in (m.get("content") or "") for m in after_drop)
    assert after_drop[0]["role"] == "system" and "# Task" in after_drop[1]["content"]
    seen_calls: set[str] = set()
    for m in after_drop:
        for call in m.get("tool_calls") or []:
            seen_calls.add(call["id"])
        if m["role"] == "tool":
            assert m["tool_call_id"] in seen_calls, "a tool result lost its call"
    n_assistant = sum(1 for m in after_drop if m["role"] == "assistant")
    assert 0 < n_assistant < 6
