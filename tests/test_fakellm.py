"""The fake LLM server (tests/fakellm.py) against the real openai and anthropic SDKs.

Clients use `_strict_response_validation=True`, so every body and stream event the fake sends must
validate against the SDKs' own pydantic types, not merely be tolerated.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import anthropic
import httpx2
import openai
import pytest
from fakellm import FakeLLM, Reply, ToolCall, Usage

USAGE = Usage(input=100, output=20, reasoning=5, cached=30)
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


@pytest.fixture
def oai(server: FakeLLM) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        api_key="sk-test", base_url=server.base_url + "/v1", max_retries=0, _strict_response_validation=True
    )
    yield client
    client.close()


@pytest.fixture
def claude(server: FakeLLM) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(
        api_key="sk-ant-test", base_url=server.base_url, max_retries=0, _strict_response_validation=True
    )
    yield client
    client.close()


def tool_turn() -> Reply:
    return Reply.tool_call(
        "bash", {"command": "ls -la"}, call_id="call_abc", text="Listing.", thinking="Look first", usage=USAGE
    )


# --- OpenAI Responses -------------------------------------------------------------------------------------


def check_response(response: openai.types.responses.Response) -> None:
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Look first"
    assert response.output_text == "Listing."
    assert call.type == "function_call" and (call.call_id, call.name) == ("call_abc", "bash")
    assert json.loads(call.arguments) == {"command": "ls -la"}
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (100, 30)
    assert (usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (20, 5)
    assert usage.total_tokens == 120


def test_responses_non_streaming(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(tool_turn())
    response = oai.responses.create(model="gpt-5", input="hi")
    check_response(response)
    assert response.model == "gpt-5"
    (request,) = server.requests
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {"model": "gpt-5", "input": "hi"}


def test_responses_stream_helper(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(tool_turn())
    with oai.responses.stream(model="gpt-5", input="hi") as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    check_response(final)
    assert events[0] == "response.created" and events[-1] == "response.completed"
    for needed in ("response.output_item.added", "response.content_part.added", "response.output_text.delta"):
        assert needed in events
    assert server.requests[0].body["stream"] is True


def test_responses_raw_stream(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(tool_turn())
    events = list(oai.responses.create(model="gpt-5", input="hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert (text, json.loads(arguments)) == ("Listing.", {"command": "ls -la"})
    assert events[-1].type == "response.completed"
    check_response(events[-1].response)


# --- OpenAI Chat Completions ------------------------------------------------------------------------------


TWO_CALLS = Reply.tool_calls(
    [("bash", {"command": "ls"}), ToolCall("read_file", {"path": "README.md"}, call_id="call_2")], usage=USAGE
)


def test_chat_non_streaming(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(TWO_CALLS)
    completion = oai.chat.completions.create(model="gpt-4o", messages=USER)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("bash", {"command": "ls"}),
        ("read_file", {"path": "README.md"}),
    ]
    assert calls[0].id.startswith("call_") and calls[1].id == "call_2"
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (100, 20, 120)
    assert usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens == 30
    assert usage.completion_tokens_details and usage.completion_tokens_details.reasoning_tokens == 5
    assert server.requests[0].path == "/v1/chat/completions"


def test_chat_text_with_reasoning_content(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.text("Hello.", thinking="be brief"))
    message = oai.chat.completions.create(model="m", messages=USER).choices[0].message
    assert message.content == "Hello." and message.tool_calls is None
    assert message.model_extra == {"reasoning_content": "be brief"}  # the vLLM/DeepSeek extension


def test_chat_raw_stream_with_tool_call_deltas_and_usage(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(TWO_CALLS)
    chunks = list(
        oai.chat.completions.create(model="gpt-4o", messages=USER, stream=True, stream_options={"include_usage": True})
    )
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks[:-1]:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("bash", {"command": "ls"}),
        ("read_file", {"path": "README.md"}),
    ]
    assert calls[1]["id"] == "call_2"
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (100, 20)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_stream_helper(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.text("streamed text", usage=USAGE))
    with oai.chat.completions.stream(model="gpt-4o", messages=USER, stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "streamed text"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.total_tokens == 120


def test_chat_stream_without_include_usage_has_no_usage_chunk(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.text("x"))
    chunks = list(oai.chat.completions.create(model="m", messages=USER, stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in chunks)


# --- Anthropic Messages -----------------------------------------------------------------------------------


def check_message(message: anthropic.types.Message) -> None:
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool = message.content
    assert thinking.type == "thinking" and thinking.thinking == "Look first" and thinking.signature
    assert text.type == "text" and text.text == "Listing."
    assert tool.type == "tool_use"
    assert (tool.id, tool.name, tool.input) == ("call_abc", "bash", {"command": "ls -la"})
    assert message.stop_reason == "tool_use"
    u = message.usage
    # Anthropic's input_tokens excludes cache reads/writes: input = the three together.
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (70, 30, 0)
    assert u.output_tokens == 20
    assert u.output_tokens_details is not None and u.output_tokens_details.thinking_tokens == 5


def test_anthropic_non_streaming(server: FakeLLM, claude: anthropic.Anthropic) -> None:
    server.script(tool_turn())
    message = claude.messages.create(model="claude-fake", max_tokens=100, messages=USER)
    check_message(message)
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["authorization"] == "Bearer sk-ant-test"  # anthropic 2.x: not x-api-key
    assert "anthropic-version" in request.headers
    assert request.body["max_tokens"] == 100


def test_anthropic_stream_helper(server: FakeLLM, claude: anthropic.Anthropic) -> None:
    server.script(tool_turn())
    with claude.messages.stream(model="claude-fake", max_tokens=100, messages=USER) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    check_message(final)
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "message_delta"} <= set(events)


def test_anthropic_raw_stream_deltas(server: FakeLLM, claude: anthropic.Anthropic) -> None:
    server.script(tool_turn())
    events = list(claude.messages.create(model="m", max_tokens=100, messages=USER, stream=True))
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} == set(deltas)
    start = events[0]
    assert start.type == "message_start" and start.message.usage.input_tokens == 70
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens == 20


def test_cache_write_tokens(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    usage = Usage(input=1000, output=10, cached=600, cache_write=300)
    server.script(Reply.text("a", usage=usage), Reply.text("b", usage=usage))
    details = oai.responses.create(model="m", input="x").usage.input_tokens_details
    assert (details.cached_tokens, details.cache_write_tokens) == (600, 300)
    got = claude.messages.create(model="m", max_tokens=5, messages=USER).usage
    assert (got.input_tokens, got.cache_read_input_tokens, got.cache_creation_input_tokens) == (100, 600, 300)


# --- failures ---------------------------------------------------------------------------------------------


def test_429_then_success_is_retried(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    server.script(Reply.error(429, retry_after=0.01), Reply.text("after openai retry"))
    response = oai.with_options(max_retries=2).responses.create(model="m", input="x")
    assert response.output_text == "after openai retry"
    server.script(Reply.error(429, retry_after=0.01), Reply.error(529), Reply.text("after anthropic retry"))
    message = claude.with_options(max_retries=2).messages.create(model="m", max_tokens=5, messages=USER)
    assert message.content[0].type == "text" and message.content[0].text == "after anthropic retry"
    retry_counts = [r.headers["x-stainless-retry-count"] for r in server.requests]
    assert retry_counts == ["0", "1", "0", "1", "2"]
    assert server.unscripted_calls == 0 and server.remaining == 0


def test_429_without_retries_raises_rate_limit_error(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.error(429, retry_after=7))
    with pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model="m", messages=USER)
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.code == "rate_limit_exceeded"


def test_401_raises_authentication_error(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    server.script(Reply.error(401), Reply.error(401), Reply.error(401))
    with pytest.raises(openai.AuthenticationError) as caught:
        oai.responses.create(model="m", input="x")
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError), oai.responses.stream(model="m", input="x") as stream:
        stream.get_final_response()
    with pytest.raises(anthropic.AuthenticationError) as caught_anthropic:
        claude.messages.create(model="m", max_tokens=5, messages=USER)
    assert caught_anthropic.value.body["error"]["type"] == "authentication_error"


def test_404_message(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    server.script(Reply.error(404, message="model not found"), Reply.error(404, message="model not found"))
    with pytest.raises(openai.NotFoundError, match="model not found"):
        oai.chat.completions.create(model="m", messages=USER)
    with pytest.raises(anthropic.NotFoundError, match="not_found_error"):
        claude.messages.create(model="m", max_tokens=5, messages=USER)


def test_500_raises_internal_server_error(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.error(500))
    with pytest.raises(openai.InternalServerError):
        oai.responses.create(model="m", input="x")


def test_malformed_json_is_not_wrapped_by_the_sdks(
    server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    # Both SDKs let json.JSONDecodeError (a ValueError) escape for an application/json body that is not
    # JSON, streaming or not; neither retries it.
    server.script(*[Reply.malformed()] * 4, Reply.text("never reached"))
    with pytest.raises(json.JSONDecodeError):
        oai.with_options(max_retries=2).responses.create(model="m", input="x")
    with pytest.raises(json.JSONDecodeError), oai.responses.stream(model="m", input="x") as stream:
        stream.get_final_response()
    with pytest.raises(json.JSONDecodeError):
        claude.messages.create(model="m", max_tokens=5, messages=USER)
    with (
        pytest.raises(json.JSONDecodeError),
        claude.messages.stream(model="m", max_tokens=5, messages=USER) as message_stream,
    ):
        message_stream.get_final_message()
    assert server.remaining == 1


def test_cut_stream(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    server.script(*[Reply.cut_stream(after_events=3)] * 3)
    with pytest.raises(openai.APIConnectionError), oai.responses.stream(model="m", input="x") as stream:
        stream.get_final_response()
    with pytest.raises(openai.APIConnectionError):
        list(oai.chat.completions.create(model="m", messages=USER, stream=True))
    # The anthropic SDK before 2.17 did not wrap errors raised while reading a stream (the raw httpx2 error escaped);
    # 2.17 wraps them as a connection error, as the openai SDK does. Either is a cut stream, never a whole answer.
    with (
        pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)),
        claude.messages.stream(model="m", max_tokens=5, messages=USER) as s,
    ):
        s.get_final_message()


def test_cut_stream_events_arrive_before_the_cut(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.cut_stream(after_events=2))
    seen = []
    with pytest.raises(openai.APIConnectionError):
        for event in oai.responses.create(model="m", input="x", stream=True):
            seen.append(event.type)
    assert seen == ["response.created", "response.in_progress"]


def test_cut_non_streaming_body_is_a_connection_error_and_retried(
    server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    server.script(Reply.cut_stream(), Reply.cut_stream())
    with pytest.raises(openai.APIConnectionError):
        oai.responses.create(model="m", input="x")
    with pytest.raises(anthropic.APIConnectionError):
        claude.messages.create(model="m", max_tokens=5, messages=USER)
    server.script(Reply.cut_stream(), Reply.text("whole"))
    assert oai.with_options(max_retries=1).responses.create(model="m", input="x").output_text == "whole"


def test_delay_triggers_client_timeout_then_retry(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.delay(5, then=Reply.text("too late")))
    with pytest.raises(openai.APITimeoutError):
        oai.with_options(timeout=0.3).responses.create(model="m", input="x")
    server.script(Reply.delay(5), Reply.text("in time"))
    client = oai.with_options(timeout=0.3, max_retries=1)
    assert client.responses.create(model="m", input="x").output_text == "in time"
    assert len(server.requests) == 3 and server.remaining == 0


def test_delay_then_answers(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.delay(0.05, then=Reply.text("slow")))
    assert oai.responses.create(model="m", input="x").output_text == "slow"


# --- scripting --------------------------------------------------------------------------------------------


def test_empty_script_answers_done_and_counts(server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    server.script(Reply.text("scripted"))
    assert oai.responses.create(model="m", input="x").output_text == "scripted"
    assert oai.responses.create(model="m", input="x").output_text == "done"
    message = claude.messages.create(model="m", max_tokens=5, messages=USER)
    assert message.content[0].type == "text" and message.content[0].text == "done"
    assert server.unscripted_calls == 2


def test_default_replaces_done_when_the_script_is_empty() -> None:
    with (
        FakeLLM(default=Reply.error(500, message="always down")) as down,
        openai.OpenAI(api_key="k", base_url=down.base_url + "/v1", max_retries=0) as client,
    ):
        down.script(Reply.text("scripted"))
        assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content == "scripted"
        for _ in range(2):
            with pytest.raises(openai.InternalServerError, match="always down"):
                client.chat.completions.create(model="m", messages=USER)
        assert down.unscripted_calls == 2 and len(down.requests) == 3


def test_responder_answers_from_the_request_and_falls_through_to_default() -> None:
    seen: list[tuple[str, object]] = []

    def respond(path: str, body: dict) -> Reply | None:
        seen.append((path, body.get("model")))
        text = body["messages"][-1]["content"] if "messages" in body else ""
        return Reply.text(f"echo: {text}") if text.startswith("say") else None

    with (
        FakeLLM(responder=respond, default=Reply.text("fallback")) as fake,
        openai.OpenAI(api_key="k", base_url=fake.base_url + "/v1", max_retries=0) as client,
    ):
        fake.script(Reply.text("scripted first"))
        ask = [{"role": "user", "content": "say hi"}]
        assert client.chat.completions.create(model="a", messages=ask).choices[0].message.content == "scripted first"
        assert seen == []  # the script goes first: the responder is not asked
        assert client.chat.completions.create(model="b", messages=ask).choices[0].message.content == "echo: say hi"
        assert client.chat.completions.create(model="c", messages=USER).choices[0].message.content == "fallback"
        assert client.responses.create(model="d", input="x").output_text == "fallback"
        assert seen == [("/v1/chat/completions", "b"), ("/v1/chat/completions", "c"), ("/v1/responses", "d")]
        assert fake.unscripted_calls == 3


def test_replies_are_shared_across_endpoints_in_order(
    server: FakeLLM, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    server.script(Reply.text("one"), Reply.text("two"), Reply.text("three"))
    assert oai.chat.completions.create(model="m", messages=USER).choices[0].message.content == "one"
    assert claude.messages.create(model="m", max_tokens=5, messages=USER).content[0].text == "two"
    assert oai.responses.create(model="m", input="x").output_text == "three"
    assert [r.path for r in server.requests] == ["/v1/chat/completions", "/v1/messages", "/v1/responses"]


def test_unknown_endpoint_is_404_and_keeps_the_script(server: FakeLLM, oai: openai.OpenAI) -> None:
    server.script(Reply.text("kept"))
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="m", input="x")
    assert server.remaining == 1


def test_generated_call_ids_are_unique(server: FakeLLM, claude: anthropic.Anthropic) -> None:
    server.script(Reply.tool_calls([("a", {}), ("b", {"x": [1, 2]})]))
    blocks = claude.messages.create(model="m", max_tokens=5, messages=USER).content
    ids = [b.id for b in blocks if b.type == "tool_use"]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)


def test_usage_is_validated() -> None:
    with pytest.raises(ValueError):
        Usage(input=10, output=5, cached=11)
    with pytest.raises(ValueError):
        Usage(input=10, output=5, reasoning=6)


async def test_async_clients(server: FakeLLM) -> None:
    server.script(tool_turn(), tool_turn())
    oai = openai.AsyncOpenAI(api_key="k", base_url=server.base_url + "/v1", max_retries=0)
    async with oai, oai.responses.stream(model="m", input="x") as stream:
        check_response(await stream.get_final_response())
    claude = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
    async with claude, claude.messages.stream(model="m", max_tokens=5, messages=USER) as message_stream:
        check_message(await message_stream.get_final_message())


# --- lifecycle --------------------------------------------------------------------------------------------


def test_server_threads_are_gone_after_exit() -> None:
    before = set(threading.enumerate())
    client = openai.OpenAI(api_key="k", max_retries=0, base_url="http://unused")
    with FakeLLM() as fake:
        client = client.with_options(base_url=fake.base_url + "/v1", timeout=10)
        # An open client keeps an idle keep-alive connection, and so a handler thread, on the server.
        assert client.responses.create(model="m", input="x").output_text == "done"
        # A handler still sleeping in a delay must not hold the exit up either.
        fake.script(Reply.delay(60))
        slow = threading.Thread(target=lambda: suppress_errors(client.responses.create, model="m", input="x"))
        slow.start()
        while len(fake.requests) < 2:
            time.sleep(0.01)
        port = int(fake.base_url.rsplit(":", 1)[1])
        serving = fake.thread
        assert serving is not None and serving.is_alive()
        exiting = time.monotonic()
    assert time.monotonic() - exiting < 2
    assert not serving.is_alive()
    slow.join(5)
    assert set(threading.enumerate()) <= before
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    client.close()


def suppress_errors(call: Callable[..., object], **kwargs: object) -> None:
    with contextlib.suppress(openai.APIError):
        call(**kwargs)
