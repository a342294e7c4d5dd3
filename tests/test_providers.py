"""Providers through the real `openai` and `anthropic` SDKs against a local server speaking their wire format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakellm import FakeLLM, Reply, Usage
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.messages import Message, ToolCall, ToolSpec
from labkube.agent.providers.anthropic_provider import AnthropicMessages
from labkube.agent.providers.openai_provider import OpenAIChat, OpenAIResponses
from labkube.agent.providers.provider import ModelClient, ProviderError
from labkube.budgets import Budgets, StopReason
from labkube.run_spec import RunPhase

BASH = ToolSpec(
    name="bash",
    description="run",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)
CONVERSATION = [
    Message(role="system", content="be brief"),
    Message(role="user", content="list files"),
    Message(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="c0", name="bash", arguments={"command": "pwd"})],
    ),
    Message(role="tool", content="/ws", tool_call_id="c0", name="bash"),
]
U = Usage(input=1200, output=300, reasoning=100, cached=200)


@pytest.fixture
def server():
    with FakeLLM() as s:
        yield s


def providers(server: FakeLLM) -> dict[str, object]:
    return {
        "responses": OpenAIResponses("gpt-5", "high", api_key="k", base_url=server.base_url + "/v1"),
        "chat": OpenAIChat("gpt-4.1", api_key="k", base_url=server.base_url + "/v1"),
        "anthropic": AnthropicMessages("claude-fake", "low", api_key="k", base_url=server.base_url),
    }


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
async def test_tool_call_usage_and_thinking_round_trip(server: FakeLLM, kind: str) -> None:
    server.script(
        Reply.tool_call(
            "bash",
            {"command": "ls -la"},
            call_id="c1",
            text="Listing.",
            usage=U,
            thinking="look around first",
        )
    )
    provider = providers(server)[kind]
    response = await provider.generate(CONVERSATION, [BASH])
    await provider.aclose()
    assert response.message.tool_calls == [ToolCall(id="c1", name="bash", arguments={"command": "ls -la"})]
    assert response.message.content == "Listing."
    assert response.message.thinking == "look around first"
    assert response.usage.input == 1200 and response.usage.output == 300 and response.usage.cached == 200
    if kind != "chat":
        assert response.usage.reasoning == 100
    body = server.requests[0].body
    tool_names = [t.get("name") or t.get("function", {}).get("name") for t in body["tools"]]
    assert tool_names == ["bash"]


async def test_responses_sends_reasoning_effort_and_replays_items(server: FakeLLM) -> None:
    server.script(
        Reply.tool_call("bash", {"command": "ls"}, call_id="c1", usage=U, thinking="hmm"),
        Reply.text("done", usage=U),
    )
    provider = OpenAIResponses("gpt-5", "high", api_key="k", base_url=server.base_url + "/v1")
    first = await provider.generate(CONVERSATION, [BASH])
    follow = [*CONVERSATION, first.message, Message(role="tool", content="x", tool_call_id="c1", name="bash")]
    await provider.generate(follow, [BASH])
    await provider.aclose()
    body = server.requests[1].body
    assert server.requests[0].body["reasoning"]["effort"] == "high"
    assert body["instructions"] == "be brief"
    types = [item.get("type") for item in body["input"]]
    assert "reasoning" in types and types.count("function_call_output") == 2


async def test_anthropic_merges_tool_results_and_sends_thinking_back(server: FakeLLM) -> None:
    server.script(
        Reply.tool_call("bash", {"command": "ls"}, call_id="t1", usage=U, thinking="plan"),
        Reply.text("ok", usage=U),
    )
    provider = AnthropicMessages("claude-fake", "low", api_key="k", base_url=server.base_url)
    first = await provider.generate(CONVERSATION, [BASH])
    follow = [
        *CONVERSATION,
        first.message,
        Message(role="tool", content="out", tool_call_id="t1", name="bash"),
    ]
    await provider.generate(follow, [BASH])
    await provider.aclose()
    body = server.requests[1].body
    assert body["system"] == "be brief"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][3]["content"][0]["type"] == "thinking"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
async def test_429_is_retried_and_backoff_reported(server: FakeLLM, kind: str) -> None:
    server.script(Reply.error(429), Reply.text("fine", usage=U))
    client = ModelClient(providers(server)[kind], "x", base_delay_s=0.2)
    outcome = await client.generate(CONVERSATION, [BASH])
    assert outcome.attempts == 2 and outcome.backoff_s >= 0.1
    assert outcome.response.message.content == "fine"


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
@pytest.mark.parametrize(
    "failure",
    [Reply.error(500), Reply.malformed(), Reply.cut_stream(after_events=2)],
    ids=["500", "malformed", "cut"],
)
async def test_transient_failures_are_retried(server: FakeLLM, kind: str, failure: Reply) -> None:
    server.script(failure, Reply.text("recovered", usage=U))
    client = ModelClient(providers(server)[kind], "x", base_delay_s=0.05)
    outcome = await client.generate(CONVERSATION, [BASH])
    assert outcome.response.message.content == "recovered"


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
async def test_401_is_an_auth_stop_and_404_a_model_error(server: FakeLLM, kind: str) -> None:
    server.script(Reply.error(401), Reply.error(404, message="model `nope` does not exist"))
    client = ModelClient(providers(server)[kind], "x", base_delay_s=0.05)
    with pytest.raises(ProviderError) as auth:
        await client.generate(CONVERSATION, [BASH])
    assert auth.value.reason is StopReason.auth and not auth.value.retryable
    with pytest.raises(ProviderError) as missing:
        await client.generate(CONVERSATION, [BASH])
    assert missing.value.reason is StopReason.model_error and "does not exist" in str(missing.value)


# -- whole runs through `labkube agent`'s loop -----------------------------------------------------

STEP_USAGE = [
    Usage(input=1000, output=100, cached=400),
    Usage(input=1500, output=200, reasoning=50, cached=1000),
    Usage(input=2000, output=50),
]


def script_run(server: FakeLLM) -> None:
    server.script(
        Reply.tool_call("bash", {"command": "echo 7 > result.txt"}, usage=STEP_USAGE[0]),
        Reply.error(429),
        Reply.tool_call("read_file", {"path": "result.txt"}, usage=STEP_USAGE[1], thinking="check it"),
        Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=STEP_USAGE[2]),
    )


@pytest.mark.parametrize(
    ("model", "env"),
    [
        ("openai:gpt-5", {"OPENAI_BASE_URL": "{url}/v1", "OPENAI_API_KEY": "sk-test"}),
        ("openai-chat:gpt-5", {"OPENAI_BASE_URL": "{url}/v1", "OPENAI_API_KEY": "sk-test"}),
        ("anthropic:claude-fake", {"ANTHROPIC_BASE_URL": "{url}", "ANTHROPIC_API_KEY": "sk-ant-test"}),
        ("openai-compatible:{url}/v1#qwen3", {}),
    ],
)
async def test_run_usage_and_dollars_match_the_server(server: FakeLLM, tmp_path: Path, monkeypatch, model, env) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(url=server.base_url))
    model = model.format(url=server.base_url)
    script_run(server)
    task = make_tiny_task(tmp_path, [])
    prices = {model: (2.0, 8.0, 0.5)}
    run_dir = make_run_dir(tmp_path, task, model=model, prices=prices)
    result = await run_agent(run_dir)
    assert result.status is RunPhase.finished and result.stop_reason is StopReason.done
    assert result.subtasks[0].raw == 7.0
    assert result.spend.steps == 3
    assert result.spend.usage.input == 4500 and result.spend.usage.output == 350
    assert result.spend.usage.cached == 1400
    expected = sum(((u.input - u.cached) * 2.0 + u.cached * 0.5 + u.output * 8.0) / 1e6 for u in STEP_USAGE)
    assert result.spend.usd == pytest.approx(expected, rel=1e-12)
    calls = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    model_calls = [c for c in calls if c["type"] == "model_call"]
    assert [c["attempts"] for c in model_calls] == [1, 2, 1]
    assert result.spend.partial_calls == 0  # a 429 is an answer that generated nothing: the spend is exact
    backoff = model_calls[1]["backoff_s"]
    assert backoff >= 0.4
    assert result.spend.wall_seconds < sum(c["duration_s"] for c in model_calls) + 2.0 - backoff + 0.5
    assert server.remaining == 0


@pytest.mark.parametrize("model", ["openai:gpt-5", "openai-chat:gpt-5"])
async def test_an_answer_that_never_says_its_usage_makes_the_runs_spend_a_lower_bound(
    server: FakeLLM, tmp_path: Path, monkeypatch, model: str
) -> None:
    """rg-agent's own calls: an OpenAI-compatible server that leaves `usage` out (or null) gives the SDK an answer
    without it. The step is taken and counted as no tokens, and the run's spend is a lower bound (`partial_calls`),
    never read as exact: the other call's usage is all its total holds."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server.script(
        Reply.tool_call("bash", {"command": "echo 7 > result.txt"}).without_usage(),
        Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=STEP_USAGE[1]),
    )
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model=model, prices={model: (2.0, 8.0, 0.5)})
    result = await run_agent(run_dir)
    assert result.status is RunPhase.finished and result.subtasks[0].raw == 7.0
    said_usage = STEP_USAGE[1]
    assert result.spend.steps == 2 and result.spend.usage.output == said_usage.output
    assert result.spend.usage.input == said_usage.input and result.spend.usage.cached == said_usage.cached
    assert result.spend.partial_calls == 1 and result.spend.at_least
    calls = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    unsaid, said = [c for c in calls if c["type"] == "model_call"]
    assert unsaid["usage_partial"] is True and unsaid["usage"]["input"] == 0
    assert unsaid["usage_note"] == "the provider's answer did not say its usage: counted as none, a lower bound"
    assert "usage_partial" not in said


@pytest.mark.parametrize(
    ("model", "env"),
    [
        ("openai:gpt-5", {"OPENAI_BASE_URL": "{url}/v1", "OPENAI_API_KEY": "sk-test"}),
        ("anthropic:claude-fake", {"ANTHROPIC_BASE_URL": "{url}", "ANTHROPIC_API_KEY": "sk-ant-test"}),
    ],
)
async def test_an_attempt_cut_after_reaching_the_provider_makes_the_runs_spend_a_lower_bound(
    server: FakeLLM, tmp_path: Path, monkeypatch, model: str, env: dict[str, str]
) -> None:
    """rg-agent's own calls: an answer cut mid-body (the Responses API, not streamed) or mid-stream (Messages,
    which rg-agent streams) is retried. The cut attempt reached the provider, which generated what it sent and may
    bill it, though its usage was never said: the run's spend counts it as none and says it is a lower bound, as
    the call's line does. (A 429 is not such an attempt: the test above.)"""
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(url=server.base_url))
    server.script(
        Reply.cut_stream(after_events=2),
        Reply.tool_call("bash", {"command": "echo 7 > result.txt"}, usage=STEP_USAGE[0]),
        Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=STEP_USAGE[1]),
    )
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model=model)
    result = await run_agent(run_dir)
    assert result.status is RunPhase.finished and result.subtasks[0].raw == 7.0
    assert result.spend.steps == 2 and result.spend.usage.output == STEP_USAGE[0].output + STEP_USAGE[1].output
    assert result.spend.partial_calls == 1 and result.spend.at_least
    calls = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    cut, whole = [c for c in calls if c["type"] == "model_call"]
    assert cut["attempts"] == 2 and cut["usage_partial"] is True
    assert cut["usage_note"] == "1 attempt broke off after reaching the provider: counted as none, a lower bound"
    assert "usage_partial" not in whole


async def test_cut_attempts_before_a_context_overflow_still_count_after_the_turns_are_dropped(
    server: FakeLLM, tmp_path: Path, monkeypatch
) -> None:
    """A call's first attempt is cut, its second says the context overflows: the loop drops old turns and calls
    again, a new call whose outcome alone would not know the cut attempt. The run's spend still counts it."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server.script(
        Reply.tool_call("bash", {"command": "echo 1 > a.txt"}, usage=STEP_USAGE[0]),
        Reply.tool_call("bash", {"command": "echo 7 > result.txt"}, usage=STEP_USAGE[0]),
        Reply.cut_stream(),
        Reply.error(400, message="This model's maximum context length is 128000 tokens"),
        Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=STEP_USAGE[1]),
    )
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="openai:gpt-5")
    result = await run_agent(run_dir)
    assert result.status is RunPhase.finished and result.subtasks[0].raw == 7.0
    assert result.spend.partial_calls == 1 and result.spend.steps == 3
    events = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    assert any(e["type"] == "context_drop" for e in events)
    last = [e for e in events if e["type"] == "model_call"][-1]
    assert last["usage_note"] == "1 attempt broke off after reaching the provider: counted as none, a lower bound"


async def test_a_refused_connection_is_not_a_lower_bound_and_a_cut_is_even_when_it_ends_the_run(
    server: FakeLLM,
) -> None:
    """Which failed attempts may have cost something: one that never reached the provider (a refused connection)
    did not; a cut answer did, and a call whose every attempt was cut says how many (`unsaid_attempts`), which the
    loop adds to the run's spend as it ends the run."""
    dead = OpenAIResponses("gpt-5", api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ProviderError) as refused:
        await ModelClient(dead, "openai:gpt-5", max_attempts=2, base_delay_s=0.01).generate(CONVERSATION, [BASH])
    assert refused.value.retryable and not refused.value.unsaid_usage and refused.value.unsaid_attempts == 0
    server.script(Reply.cut_stream(), Reply.cut_stream())
    client = ModelClient(providers(server)["responses"], "openai:gpt-5", max_attempts=2, base_delay_s=0.01)
    with pytest.raises(ProviderError) as cut:
        await client.generate(CONVERSATION, [BASH])
    assert cut.value.unsaid_usage and cut.value.unsaid_attempts == 2


async def test_401_ends_the_run_with_reason_auth_and_it_is_still_graded(
    server: FakeLLM, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-bad")
    server.script(Reply.tool_call("bash", {"command": "echo 3 > result.txt"}, usage=STEP_USAGE[0]), Reply.error(401))
    task = make_tiny_task(tmp_path, [])
    result = await run_agent(make_run_dir(tmp_path, task, model="openai:gpt-5"))
    assert result.stop_reason is StopReason.auth
    assert result.status is RunPhase.failed and "authentication" in (result.error or "")
    # graded all the same; a model error is an error outcome, so what the grader read is kept apart, not a score
    assert result.score is None and result.values_before_error[0].raw == 3.0


async def test_missing_api_key_is_an_auth_stop(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    task = make_tiny_task(tmp_path, [])
    result = await run_agent(make_run_dir(tmp_path, task, model="anthropic:claude-fake"))
    assert result.stop_reason is StopReason.auth and "ANTHROPIC_API_KEY is not set" in (result.error or "")


async def test_a_key_read_from_a_file_reaches_the_api_without_its_newline(
    server: FakeLLM, tmp_path: Path, monkeypatch
) -> None:
    """A Kubernetes Secret made with --from-file, or `export KEY="$(cat key)\n"`, ends with a newline; the SDK would
    refuse the header, and the gateway would have sent a malformed request."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-a-file\n")
    server.script(
        Reply.tool_call("bash", {"command": "echo 7 > result.txt"}, usage=STEP_USAGE[0]),
        Reply.tool_call("end_task", {"summary": "wrote 7"}, usage=STEP_USAGE[1]),
    )
    result = await run_agent(make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="openai:gpt-5"))
    assert result.status is RunPhase.finished and result.subtasks[0].raw == 7.0
    assert {r.headers["authorization"] for r in server.requests} == {"Bearer sk-from-a-file"}


@pytest.mark.parametrize("key", ["sk-one\r\nx-injected: 1", "sk-two words", "sk-\u00e9t\u00e9"])
async def test_a_key_with_a_character_no_key_has_is_an_auth_stop_naming_the_variable_not_the_key(
    server: FakeLLM, tmp_path: Path, monkeypatch, key: str
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    result = await run_agent(make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="openai:gpt-5"))
    assert result.stop_reason is StopReason.auth and result.status is RunPhase.failed
    assert "OPENAI_API_KEY holds a character no API key has" in (result.error or "")
    assert "set it to the key alone" in (result.error or "") and key.split()[0].strip() not in (result.error or "")
    assert server.requests == []  # nothing was sent with it


@pytest.mark.parametrize(
    ("budget", "reason"), [(Budgets(tokens=2000), StopReason.tokens), (Budgets(usd=0.001), StopReason.usd)]
)
async def test_token_and_dollar_budgets_stop_api_runs(
    server: FakeLLM, tmp_path: Path, monkeypatch, budget, reason
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server.script(
        *[
            Reply.tool_call("bash", {"command": "echo 2 > result.txt"}, usage=Usage(input=900, output=100))
            for _ in range(10)
        ]
    )
    task = make_tiny_task(tmp_path, [])
    run_dir = make_run_dir(tmp_path, task, model="openai:gpt-5", budgets=budget, prices={"openai:gpt-5": (0.5, 2.0)})
    result = await run_agent(run_dir)
    assert result.stop_reason is reason
    assert result.spend.steps == 2  # 1,000 tokens and $0.00065 per step
    assert result.subtasks[0].raw == 2.0
