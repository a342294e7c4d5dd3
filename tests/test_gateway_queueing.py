"""The gateway under calls in flight at once: a finished call's transcript line, series and state file wait until no
call is in flight (or `MAX_DEFER_S` at most), while its usage counts at once; and a provider that falls silent is cut
after the run's `timeout_s`, the gateway timing the silence itself rather than aiohttp's per-chunk read timer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp.web
import anthropic
import openai
import pytest
from fakellm import FakeLLM, Reply
from fakellm import Usage as FakeUsage
from test_gateway import gateway_for

from labkube.agent.gateway import GatewayConfig, GatewayState, GatewayView, ModelGateway, Upstream
from labkube.agent.gateway.proxy import MAX_DEFER_S
from labkube.agent.transcript import JsonlLog, read_jsonl
from labkube.budgets import Usage

PLANTED = FakeUsage(input=1200, output=300, reasoning=40, cached=200)
EXPECTED = Usage(input=1200, output=300, reasoning=40, cached=200)


def ask(gw: ModelGateway) -> str:
    client = anthropic.Anthropic(api_key=gw.config.token, base_url=gw.anthropic_base_url, max_retries=0)
    answer = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    return "".join(b.text for b in answer.content if b.type == "text")


async def until(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_a_calls_line_waits_for_the_calls_in_flight_and_its_usage_does_not(tmp_path: Path) -> None:
    """A slow call is in flight when a quick one ends: the quick one is counted at once (budgets, /healthz), and its
    transcript line and gateway.json follow when the slow one has ended, in the order the calls ended."""
    transcript = tmp_path / "transcript.jsonl"
    with FakeLLM() as server:
        server.script(Reply.delay(0.6, Reply.text("slow", usage=PLANTED)), Reply.text("quick", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            slow = asyncio.create_task(asyncio.to_thread(ask, gw))
            await until(lambda: len(server.requests) == 1)
            assert await asyncio.to_thread(ask, gw) == "quick"
            assert gw.state.calls == 1 and gw.state.spend.usage == EXPECTED  # counted before the answer went out
            await asyncio.sleep(0.1)
            assert not slow.done()
            assert read_jsonl(transcript) == [] and not (tmp_path / "gateway.json").exists()
            assert await slow == "slow"
            await until(lambda: len(read_jsonl(transcript)) == 2 and (tmp_path / "gateway.json").exists())
            assert [line["message"]["content"] for line in read_jsonl(transcript)] == ["quick", "slow"]
    state = GatewayState.model_validate_json((tmp_path / "gateway.json").read_text())
    assert state.calls == 2 and state.spend.usage == EXPECTED + EXPECTED


async def test_flush_writes_a_finished_calls_line_while_another_is_in_flight(tmp_path: Path) -> None:
    """What a checkpoint relies on (`cli_agents.CliRun.sync` flushes before it takes the transcript's position): once
    `flush()` returns, every call the spend counts has its line, even with another call in flight."""
    transcript = tmp_path / "transcript.jsonl"
    with FakeLLM() as server:
        server.script(Reply.delay(0.8, Reply.text("slow")), Reply.text("quick", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            slow = asyncio.create_task(asyncio.to_thread(ask, gw))
            await until(lambda: len(server.requests) == 1)
            await asyncio.to_thread(ask, gw)
            assert read_jsonl(transcript) == []  # held back: a call is in flight
            gw.flush()
            assert not slow.done()
            assert [line["message"]["content"] for line in read_jsonl(transcript)] == ["quick"]
            assert gw.state.spend.usage == EXPECTED
            await slow
        assert len(read_jsonl(transcript)) == 2


async def test_with_no_deferral_a_line_is_written_while_another_call_is_in_flight(tmp_path: Path) -> None:
    """The sidecar's gateway (`max_defer_s=0`, `agent/gateway/sidecar.py`): a finished call's line goes out on the
    next turn of the event loop, so the transcript a person follows in the pod is current."""
    transcript = tmp_path / "transcript.jsonl"
    with FakeLLM() as server:
        server.script(Reply.delay(0.8, Reply.text("slow")), Reply.text("quick"))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            gw.max_defer_s = 0.0
            slow = asyncio.create_task(asyncio.to_thread(ask, gw))
            await until(lambda: len(server.requests) == 1)
            await asyncio.to_thread(ask, gw)
            await until(lambda: len(read_jsonl(transcript)) == 1, timeout_s=0.5)
            assert not slow.done()
            await slow


async def test_calls_that_keep_overlapping_hold_a_line_back_for_max_defer_s_at_most(tmp_path: Path) -> None:
    transcript = tmp_path / "transcript.jsonl"
    slow_s = MAX_DEFER_S + 1.0
    with FakeLLM() as server:
        server.script(Reply.delay(slow_s, Reply.text("slow")), Reply.text("quick"))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            slow = asyncio.create_task(asyncio.to_thread(ask, gw))
            await until(lambda: len(server.requests) == 1)
            await asyncio.to_thread(ask, gw)
            ended = time.monotonic()
            await until(lambda: len(read_jsonl(transcript)) == 1, timeout_s=MAX_DEFER_S + 0.5)
            assert time.monotonic() - ended >= MAX_DEFER_S - 0.05
            assert not slow.done()  # written while the slow call was still in flight
            assert read_jsonl(transcript)[0]["message"]["content"] == "quick"
            await slow
        assert len(read_jsonl(transcript)) == 2  # close() writes what is left


async def silent_provider(after_first_event: bool) -> aiohttp.web.AppRunner:
    """An OpenAI-style provider that answers a Responses call with its headers and one event and then says nothing
    (`after_first_event`), or says nothing at all."""

    async def responses(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        await request.read()
        if not after_first_event:
            await asyncio.sleep(30)
        response = aiohttp.web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n')
        await asyncio.sleep(30)
        return response

    app = aiohttp.web.Application()
    app.router.add_post("/v1/responses", responses)
    runner = aiohttp.web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize("after_first_event", [False, True], ids=["before-answering", "mid-stream"])
async def test_a_provider_silent_for_timeout_s_is_cut(tmp_path: Path, after_first_event: bool) -> None:
    runner = await silent_provider(after_first_event)
    try:
        port = runner.addresses[0][1]
        config = GatewayConfig(
            openai=Upstream(base_url=f"http://127.0.0.1:{port}/v1", api_key="k"),
            provider_prefix="openai",
            timeout_s=0.5,
            max_attempts=1,
        )
        async with ModelGateway(config, transcript=JsonlLog(tmp_path / "transcript.jsonl")) as gw:
            client = openai.OpenAI(api_key=gw.config.token, base_url=gw.openai_base_url, max_retries=0, timeout=10)

            def stream() -> None:
                with client.responses.stream(model="gpt-5", input="hi") as events:
                    for _ in events:
                        pass

            started = time.monotonic()
            if after_first_event:  # the agent's stream is cut where the provider's broke off, not ended as if whole
                with pytest.raises(openai.APIConnectionError):
                    await asyncio.to_thread(stream)
            else:
                with pytest.raises(openai.InternalServerError, match="failed 1 times"):
                    await asyncio.to_thread(stream)
            assert time.monotonic() - started < 3  # cut at timeout_s, not at the provider's 30 s
        (line,) = read_jsonl(tmp_path / "transcript.jsonl")
        expected = "the provider's stream broke: TimeoutError" if after_first_event else "failed 1 times (TimeoutError"
        assert expected in line["error"]
    finally:
        await runner.cleanup()


async def test_a_pods_checkpoint_keeps_every_line_of_the_calls_its_spend_counts(tmp_path: Path) -> None:
    """In a pod the gateway sidecar and the agent container append to one transcript, each through a file of its own.
    The agent's own offset ends at its own last line; a checkpoint taking it would cut the sidecar's lines written
    after, and a resumed run truncates the transcript there, so the calls its spend counts would lose their lines.
    `GatewayView.checkpoint` has the gateway write every counted call's line (one still held back by a call in
    flight included) and say where its writes end: the checkpoint keeps up to the later of the two ends."""
    transcript = tmp_path / "transcript.jsonl"
    agent_log = JsonlLog(transcript)  # the agent container's
    with FakeLLM() as server:
        server.script(Reply.delay(0.8, Reply.text("slow")), Reply.text("quick", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            view = GatewayView(gw.url, gw.config.token, tmp_path / "gateway.json")
            agent_log.append({"type": "start"})
            slow = asyncio.create_task(asyncio.to_thread(ask, gw))
            await until(lambda: len(server.requests) == 1)
            await asyncio.to_thread(ask, gw)
            assert [line["type"] for line in read_jsonl(transcript)] == ["start"]  # held back: a call is in flight
            end = await asyncio.to_thread(view.checkpoint)
            assert view.state.calls == 1 and view.state.spend.usage == EXPECTED
            assert end == transcript.stat().st_size > agent_log.offset
            offset = max(agent_log.offset, end)  # as `CliRun.sync` takes it
            assert not slow.done()
            refused = GatewayView(gw.url, "not-the-token", tmp_path / "gateway.json")
            assert await asyncio.to_thread(refused.checkpoint) is None  # 401: the file's counts, nothing flushed
            await slow
        JsonlLog(transcript).truncate(offset)  # the resumed run's first step
        kept = read_jsonl(transcript)
        assert [(line["type"], (line.get("message") or {}).get("content")) for line in kept] == [
            ("start", None),
            ("model_call", "quick"),
        ]
        assert await asyncio.to_thread(view.checkpoint) is None, "a gateway that is gone: no end to keep"
    agent_log.close()


async def test_a_resumed_pods_checkpoint_is_not_pushed_past_the_truncated_transcripts_end(tmp_path: Path) -> None:
    """A resumed pod: the new gateway sidecar opens the transcript before the agent container truncates it to the
    checkpoint's offset (dropping the crashed step's lines), so the gateway's file position is past the new end.
    The gateway reports where its own lines end, and none until it writes one: a checkpoint taking its file
    position would keep the next crash's partial step, which a resume must drop."""
    transcript = tmp_path / "transcript.jsonl"
    before = JsonlLog(transcript)
    for step in range(3):
        before.append({"type": "step", "step": step})
    kept = len(transcript.read_bytes().splitlines(keepends=True)[0])  # the checkpoint kept step 0 only
    before.close()
    with FakeLLM() as server:
        server.script(Reply.text("after the resume", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:  # opens the transcript: 3 lines long
            agent_log = JsonlLog(transcript)
            agent_log.truncate(kept)  # the resumed agent's start
            view = GatewayView(gw.url, gw.config.token, tmp_path / "gateway.json")
            assert await asyncio.to_thread(view.checkpoint) is None, "no line of its own yet"
            await asyncio.to_thread(ask, gw)
            end = await asyncio.to_thread(view.checkpoint)
            assert end == transcript.stat().st_size
            agent_log.close()
    assert [line["type"] for line in read_jsonl(transcript)] == ["step", "model_call"]
