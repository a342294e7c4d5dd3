"""The model gateway between the real `openai` and `anthropic` SDKs and the fake provider (tests/fakellm.py): the
agent side holds only the run token, the provider sees only the real key; usage, dollars, budgets, retries,
transcript lines and Prometheus series are the gateway's, whatever the client."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anthropic
import openai
import pytest
from fakellm import FakeLLM, Reply
from fakellm import Usage as FakeUsage

from labkube.agent.gateway import GatewayConfig, GatewayState, GatewayView, ModelGateway, Upstream, upstream_for
from labkube.agent.gateway.sidecar import RUN_SPEC_VARIABLE
from labkube.agent.pricing import cost_usd
from labkube.agent.telemetry import RunTelemetry
from labkube.agent.transcript import JsonlLog, read_jsonl
from labkube.budgets import Budgets, StopReason, Usage
from labkube.model_ref import parse_model
from labkube.run_spec import RunSpec
from labkube.store import write_model

REPO = Path(__file__).resolve().parents[1]
REAL_KEY = "sk-real-provider-key"
PLANTED = FakeUsage(input=1200, output=300, reasoning=40, cached=200)
EXPECTED = Usage(input=1200, output=300, reasoning=40, cached=200)


def gateway_for(server: FakeLLM, tmp_path: Path, family: str, **config: object) -> ModelGateway:
    upstream = Upstream(base_url=server.base_url + ("/v1" if family == "openai" else ""), api_key=REAL_KEY)
    cfg = GatewayConfig(**{family: upstream}, provider_prefix=family, base_delay_s=0.01, **config)  # type: ignore[arg-type]
    spec = RunSpec(run_id="gw--m--s0", campaign="gw", task="t", task_path=str(tmp_path), model=f"{family}:m", seed=0)
    return ModelGateway(
        cfg,
        transcript=JsonlLog(tmp_path / "transcript.jsonl"),
        telemetry=RunTelemetry(spec),
        state_path=tmp_path / "gateway.json",
    )


def call(gw: ModelGateway, api: str, stream: bool, model: str) -> tuple[str, list[str]]:
    """One model call through the gateway with the vendor's SDK; the answer's text and tool names."""
    if api == "responses":
        client = openai.OpenAI(api_key=gw.config.token, base_url=gw.openai_base_url, max_retries=0)
        kwargs = {"model": model, "input": "hi", "tools": [{"type": "function", "name": "bash", "parameters": {}}]}
        if stream:
            with client.responses.stream(**kwargs) as s:
                resp = s.get_final_response()
        else:
            resp = client.responses.create(**kwargs)
        return resp.output_text, [i.name for i in resp.output if i.type == "function_call"]
    if api == "chat":
        client = openai.OpenAI(api_key=gw.config.token, base_url=gw.openai_base_url, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        if stream:
            with client.chat.completions.stream(model=model, messages=messages) as s:
                chat = s.get_final_completion()
        else:
            chat = client.chat.completions.create(model=model, messages=messages)
        msg = chat.choices[0].message
        return msg.content or "", [c.function.name for c in msg.tool_calls or []]
    aclient = anthropic.Anthropic(api_key=gw.config.token, base_url=gw.anthropic_base_url, max_retries=0)
    kwargs = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        with aclient.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = aclient.messages.create(**kwargs)
    text = "".join(b.text for b in message.content if b.type == "text")
    return text, [b.name for b in message.content if b.type == "tool_use"]


CASES = [
    ("responses", False, "openai", "gpt-5"),
    ("responses", True, "openai", "gpt-5"),
    ("chat", False, "openai", "gpt-4.1"),
    ("chat", True, "openai", "gpt-4.1"),
    ("messages", False, "anthropic", "claude-sonnet-4-6"),
    ("messages", True, "anthropic", "claude-sonnet-4-6"),
]


@pytest.mark.parametrize(("api", "stream", "family", "model"), CASES)
async def test_a_call_is_forwarded_with_the_real_key_and_counted_from_the_providers_usage(
    tmp_path: Path, api: str, stream: bool, family: str, model: str
) -> None:
    import asyncio

    with FakeLLM() as server:
        server.script(Reply.tool_call("bash", {"command": "ls"}, text="looking", usage=PLANTED, thinking="plan"))
        async with gateway_for(server, tmp_path, family) as gw:
            text, tools = await asyncio.to_thread(call, gw, api, stream, model)
        seen = server.requests
    assert (text, tools) == ("looking", ["bash"])  # the SDK parsed the relayed answer as the provider's own
    assert len(seen) == 1
    auth = seen[0].headers.get("x-api-key") or seen[0].headers.get("authorization", "")
    assert REAL_KEY in auth and gw.config.token not in json.dumps(seen[0].headers)
    if api == "chat" and stream:  # the gateway asks for the usage chunk a stream otherwise lacks
        assert seen[0].body["stream_options"] == {"include_usage": True}
    state = GatewayState.model_validate_json((tmp_path / "gateway.json").read_text())
    assert state.spend.usage == EXPECTED and state.spend.steps == 1 and state.calls == 1
    assert state.spend.partial_calls == 0 and not state.spend.at_least  # the answer said its usage: exact
    usd = cost_usd(f"{family}:{model}", EXPECTED)
    assert usd > 0 and state.spend.usd == pytest.approx(usd)
    (line,) = read_jsonl(tmp_path / "transcript.jsonl")
    assert line["type"] == "model_call" and line["via"] == "gateway"
    assert line["usage"] == EXPECTED.model_dump() and line["cost_usd"] == pytest.approx(usd)
    assert line["message"]["content"] == "looking"
    assert [c["name"] for c in line["message"]["tool_calls"]] == ["bash"]
    assert line["message"]["tool_calls"][0]["arguments"] == {"command": "ls"}
    if api == "messages":  # streamed: the thinking and the tool's input come in deltas, joined at message_stop
        assert line["message"]["thinking"] == "plan"
    assert line["request"]["stream"] is stream and line["request"]["model"] == model
    assert gw.telemetry is not None
    registry = gw.telemetry.m.registry
    output = registry.get_sample_value(
        "labkube_run_tokens_total",
        {"campaign": "gw", "run_id": "gw--m--s0", "task": "t", "model": f"{family}:m", "kind": "output"},
    )
    assert output == 300


@pytest.mark.parametrize(("api", "stream", "family", "model"), CASES)
async def test_an_answer_that_breaks_off_before_its_usage_is_a_lower_bound_never_an_exact_count(
    tmp_path: Path, api: str, stream: bool, family: str, model: str
) -> None:
    """A model's answer that broke off (a stream cut before its closing usage event, a body lost midway) was
    generated, and the provider may bill it: the call counts the usage that came (an Anthropic stream's input), and
    the run's spend says its tokens and dollars are lower bounds (`partial_calls`), as the call's transcript line
    does. A whole answer after it is counted exactly. The fake provider breaks off as a dropped connection does: no
    closing chunk, or fewer bytes than its content-length."""
    import asyncio

    with FakeLLM() as server:
        server.script(Reply.cut_stream(after_events=2), Reply.text("whole", usage=PLANTED))
        async with gateway_for(server, tmp_path, family) as gw:
            with pytest.raises(Exception) as broke:  # the SDK sees a broken call, not an answer
                await asyncio.to_thread(call, gw, api, stream, model)
            # a 502 (a body lost midway), or the stream's own cut (Anthropic's streams raise their HTTP client's error)
            sdk_errors = (openai.APIError, anthropic.APIError)
            assert isinstance(broke.value, sdk_errors) or "incomplete chunked read" in str(broke.value), broke.value
            cut = gw.state.model_copy(deep=True)
            text, _ = await asyncio.to_thread(call, gw, api, stream, model)
    assert text == "whole"
    assert cut.calls == 1 and cut.spend.steps == 0 and cut.spend.partial_calls == 1 and cut.spend.at_least
    counted_input = cut.spend.usage.input
    assert (counted_input > 0) == (family == "anthropic" and stream)  # message_start said the input; nothing else came
    state = GatewayState.model_validate_json((tmp_path / "gateway.json").read_text())
    assert state.calls == 2 and state.spend.partial_calls == 1  # still a lower bound: the broken call's output
    assert state.spend.usage == cut.spend.usage + EXPECTED
    broken, whole = read_jsonl(tmp_path / "transcript.jsonl")
    assert broken["usage_partial"] is True and broken["error"].endswith(
        "its usage is only what came before (a lower bound)"
    )
    assert "usage_partial" not in whole and "error" not in whole
    assert gw.telemetry is not None  # the run's series say so too
    labels = {"campaign": "gw", "run_id": "gw--m--s0", "task": "t", "model": f"{family}:m"}
    assert gw.telemetry.m.registry.get_sample_value("labkube_run_model_calls_partial", labels) == 1
    assert gw.telemetry.m.registry.get_sample_value("labkube_run_cost_unknown", labels) == 0


@pytest.mark.parametrize(("api", "stream", "family", "model"), [c for c in CASES if c[2] == "openai"])
async def test_an_answer_that_never_says_its_usage_is_a_lower_bound_not_zero_tokens(
    tmp_path: Path, api: str, stream: bool, family: str, model: str
) -> None:
    """An OpenAI-compatible server that ignores `stream_options.include_usage` (the gateway asks for it) ends a
    streamed Chat Completion without a usage chunk, and may leave `usage` out of a whole body; a Responses answer's
    `usage` may be null. The answer is whole and the agent gets it, but what it cost was never said: the call is a step
    counted as no tokens, and the run's spend says that is a lower bound, not an exact 0 (before, such a run read as
    exactly $0). The answer after it, which says its usage, is counted exactly."""
    import asyncio

    with FakeLLM() as server:
        server.script(Reply.text("unmetered").without_usage(), Reply.text("metered", usage=PLANTED))
        async with gateway_for(server, tmp_path, family) as gw:
            first, _ = await asyncio.to_thread(call, gw, api, stream, model)
            # A streamed Chat Completion's SDK returns at `data: [DONE]`, which can reach it before the gateway has
            # read the end of the provider's stream and counted the call: wait for the count, not for the SDK.
            for _ in range(100):
                if gw.state.calls:
                    break
                await asyncio.sleep(0.05)
            unsaid = gw.state.model_copy(deep=True)
            second, _ = await asyncio.to_thread(call, gw, api, stream, model)
    assert (first, second) == ("unmetered", "metered")
    assert unsaid.calls == 1 and unsaid.spend.steps == 1 and unsaid.last_error is None
    assert unsaid.spend.usage.total == 0 and unsaid.spend.partial_calls == 1 and unsaid.spend.at_least
    state = GatewayState.model_validate_json((tmp_path / "gateway.json").read_text())
    assert state.spend.usage == EXPECTED and state.spend.steps == 2 and state.spend.partial_calls == 1
    unmetered, metered = read_jsonl(tmp_path / "transcript.jsonl")
    assert unmetered["usage_partial"] is True and "error" not in unmetered
    assert unmetered["usage_note"] == "the provider's answer did not say its usage: counted as none, a lower bound"
    assert unmetered["message"]["content"] == "unmetered"
    assert "usage_partial" not in metered and "usage_note" not in metered


async def test_a_wrong_token_is_refused_and_nothing_reaches_the_provider(tmp_path: Path) -> None:
    import asyncio

    with FakeLLM() as server:
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            client = anthropic.Anthropic(api_key=REAL_KEY, base_url=gw.anthropic_base_url, max_retries=0)
            with pytest.raises(anthropic.AuthenticationError):
                await asyncio.to_thread(
                    client.messages.create, model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
        assert server.requests == []


async def test_on_a_unix_socket_the_gateway_serves_the_same_routes_and_checks_the_same_token(tmp_path: Path) -> None:
    """A sandboxed CLI's way in (`listen_unix`), at a path longer than a unix socket's address holds (a run folder
    deep in a campaign's): a wrong token is refused before the provider, the run's token is forwarded and counted,
    and the socket is gone once the gateway closes."""
    import asyncio
    import os

    import httpx2 as httpx  # the anthropic SDK's own HTTP client

    folder = tmp_path / ("deep-" * 20) / "sockets"
    folder.mkdir(parents=True)
    path = folder / "gateway.sock"
    assert len(str(path)) > 108
    with FakeLLM() as server:
        server.script(Reply.text("over the socket", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            await gw.listen_unix(path)
            fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
            try:
                transport = httpx.HTTPTransport(uds=f"/proc/self/fd/{fd}/gateway.sock")
                base = "http://sandbox/anthropic"  # the host is not looked at: the socket is the way
                args = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
                wrong = anthropic.Anthropic(
                    api_key=REAL_KEY, base_url=base, max_retries=0, http_client=httpx.Client(transport=transport)
                )
                with pytest.raises(anthropic.AuthenticationError):
                    await asyncio.to_thread(wrong.messages.create, **args)
                assert server.requests == []
                right = anthropic.Anthropic(
                    api_key=gw.config.token, base_url=base, max_retries=0, http_client=httpx.Client(transport=transport)
                )
                message = await asyncio.to_thread(right.messages.create, **args)
            finally:
                os.close(fd)
            assert message.content[0].text == "over the socket"
            assert gw.state.spend.steps == 1 and gw.state.spend.usage.input == EXPECTED.input
        assert REAL_KEY in server.requests[0].headers["x-api-key"]
        assert not path.exists()


@pytest.mark.parametrize("family", ["openai", "anthropic"])
async def test_a_spent_token_budget_is_the_providers_final_quota_error(tmp_path: Path, family: str) -> None:
    """Two calls of 1,500 tokens against a 2,000-token budget: the second passes (1,500 < 2,000), the third is
    refused with the error the SDK does not retry, the provider never sees it, and the state says why."""
    import asyncio

    with FakeLLM(default=Reply.text("ok", usage=PLANTED)) as server:
        async with gateway_for(server, tmp_path, family, budgets=Budgets(tokens=2000)) as gw:
            api = "responses" if family == "openai" else "messages"
            for _ in range(2):
                await asyncio.to_thread(call, gw, api, False, "gpt-5" if family == "openai" else "claude-sonnet-4-6")
            client_error = openai.RateLimitError if family == "openai" else anthropic.BadRequestError
            with pytest.raises(client_error) as refused:
                # the SDK's own retries on: the refusal says not to retry, and the SDK obeys
                if family == "openai":
                    client = openai.OpenAI(api_key=gw.config.token, base_url=gw.openai_base_url, max_retries=3)
                    await asyncio.to_thread(client.responses.create, model="gpt-5", input="more")
                else:
                    aclient = anthropic.Anthropic(
                        api_key=gw.config.token, base_url=gw.anthropic_base_url, max_retries=3
                    )
                    await asyncio.to_thread(
                        aclient.messages.create,
                        model="claude-sonnet-4-6",
                        max_tokens=5,
                        messages=[{"role": "user", "content": "x"}],
                    )
        assert len(server.requests) == 2
    assert "tokens budget is spent" in str(refused.value)
    if family == "openai":
        assert refused.value.code == "insufficient_quota"
    assert gw.state.refused == 1 and gw.state.stop_reason is StopReason.tokens
    events = read_jsonl(tmp_path / "transcript.jsonl")
    assert [e["type"] for e in events] == ["model_call", "model_call", "budget_stop"]


async def test_the_providers_429s_are_retried_with_back_off_reported_apart(tmp_path: Path) -> None:
    import asyncio

    with FakeLLM() as server:
        server.script(Reply.error(429, retry_after=0.2), Reply.error(503), Reply.text("fine", usage=PLANTED))
        async with gateway_for(server, tmp_path, "openai") as gw:
            text, _ = await asyncio.to_thread(call, gw, "responses", False, "gpt-5")
        assert len(server.requests) == 3
    assert text == "fine"
    (line,) = read_jsonl(tmp_path / "transcript.jsonl")
    assert line["attempts"] == 3 and line["backoff_s"] >= 0.2
    assert gw.state.backoff_s == pytest.approx(line["backoff_s"], abs=1e-3)
    assert gw.state.spend.usage == EXPECTED


async def test_retries_used_up_pass_the_providers_own_error_back(tmp_path: Path) -> None:
    import asyncio

    with FakeLLM(default=Reply.error(500, message="upstream is down")) as server:
        async with gateway_for(server, tmp_path, "anthropic", max_attempts=2) as gw:
            with pytest.raises(anthropic.InternalServerError, match="upstream is down"):
                await asyncio.to_thread(call, gw, "messages", False, "claude-sonnet-4-6")
        assert len(server.requests) == 2
    (line,) = read_jsonl(tmp_path / "transcript.jsonl")
    assert line["error"].startswith("HTTP 500") and gw.state.spend.steps == 0


async def test_hooks_pause_and_resume_around_each_model_call_only(tmp_path: Path) -> None:
    """A Gaia2 world's clock stops while the model thinks: before_call and after_call bracket each model call
    (and not other API paths)."""
    import asyncio

    order: list[str] = []

    async def pause() -> None:
        order.append("pause")

    async def resume(model_seconds: float) -> None:
        assert model_seconds >= 0
        order.append("resume")

    with FakeLLM() as server:
        gw = gateway_for(server, tmp_path, "openai")
        gw.before_call, gw.after_call = pause, resume
        async with gw:
            await asyncio.to_thread(call, gw, "chat", True, "gpt-4.1")
            client = openai.OpenAI(api_key=gw.config.token, base_url=gw.openai_base_url, max_retries=0)
            with pytest.raises(openai.NotFoundError):  # the fake has no /v1/models: its 404 comes back as it is
                await asyncio.to_thread(client.models.list)
    assert order == ["pause", "resume"]
    assert gw.state.calls == 1


def test_the_upstream_is_resolved_as_the_sdks_resolve_it() -> None:
    env = {"OPENAI_BASE_URL": "http://proxy:4000/v1", "ANTHROPIC_BASE_URL": "http://claude-proxy:8080"}
    assert upstream_for(parse_model("openai:gpt-5"), "k", env) == (
        "openai",
        Upstream(base_url="http://proxy:4000/v1", api_key="k"),
    )
    assert upstream_for(parse_model("anthropic:claude-sonnet-4-6"), "k", env)[1].base_url == "http://claude-proxy:8080"
    assert upstream_for(parse_model("anthropic:claude-sonnet-4-6"), "k", {})[1].base_url == "https://api.anthropic.com"
    family, up = upstream_for(parse_model("openai-compatible:http://gpu-box:8000/v1#qwen"), None, env)
    assert (family, up.base_url, up.api_key) == ("openai", "http://gpu-box:8000/v1", None)
    with pytest.raises(Exception, match="no model API"):
        upstream_for(parse_model("oracle"), None, env)


def test_the_overhead_benchmark_measures_every_case_and_writes_its_table(tmp_path: Path) -> None:
    """benchmarks/gateway_overhead.py end to end with two calls a case: the real SDKs, a gateway process and the fake
    provider, every API, streamed and not, at each concurrency and in flight, and its tables written into the docs
    block."""
    doc = tmp_path / "doc.md"
    doc.write_text("# Gateway\n\n<!-- benchmark:gateway_overhead -->\nold\n<!-- /benchmark -->\n")
    argv = [sys.executable, str(REPO / "benchmarks" / "gateway_overhead.py"), "--calls", "2", "--rounds", "1"]
    argv += ["--warmup", "0", "--concurrency", "1,2", "--request-kb", "1", "--event-interval-ms", "0"]
    argv += ["--pause-ms", "1", "--in-flight", "2", "--in-flight-pairs", "1", "--model-ms", "5", "--think-ms", "1"]
    proc = subprocess.run([*argv, "--write-docs", "--doc", str(doc)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert "<!-- benchmark:gateway_overhead_own_cpu -->" not in text  # the CPUs shared: the first block only
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if re.match(r"\| (OpenAI|Anthropic)", line)]
    cases = [
        (api, streamed, calls)
        for calls in ("1", "2 at once", "2 in flight")
        for api in ("OpenAI Responses", "Anthropic Messages")
        for streamed in ("no", "yes")
    ]
    added, shifted = rows[: len(cases)], rows[len(cases) :]
    assert [tuple(r[:4]) for r in added] == [(*case, "2") for case in cases]  # 2 pairs each: 1 a caller in flight
    assert [tuple(r[:3]) for r in shifted] == cases
    number = r"-?\d+\.\d\d"
    for r in added:  # latencies, and the first token's only where the call streamed
        assert all(re.fullmatch(number, cell) for cell in r[4:10] + r[14:]), r
        assert all(re.fullmatch(number, cell) if r[1] == "yes" else cell == "" for cell in r[10:14]), r
    for r in shifted:
        assert all(re.fullmatch(number, cell) for cell in r[3:11]), r
        assert all(re.fullmatch(number, cell) if r[1] == "yes" else cell == "" for cell in r[11:]), r
        assert float(r[7]) == pytest.approx(float(r[6]) - float(r[5]), abs=0.011)  # the shift: gateway p95 - direct p95
    in_flight = [r for r in added if r[2] == "2 in flight"]
    assert all(float(r[4]) >= 5 for r in in_flight), "an in-flight call takes the provider's --model-ms at least"
    assert "old" not in text
    assert "Written by `python benchmarks/gateway_overhead.py --calls 2 --rounds 1 --concurrency 1,2" in text
    assert "--concurrency 1,2 --in-flight 2 --in-flight-pairs 1 --model-ms 5 --think-ms 1 --warmup 0" in text
    assert "--pause-ms 1 --loop asyncio`" in text and "1 ms pause after each side's call or round" in text


def test_the_overhead_benchmark_can_give_the_gateway_a_cpu_of_its_own(tmp_path: Path) -> None:
    """`--gateway-cpus`: the gateway process on those CPUs alone and the client and the provider on the others, as
    a pod's gateway sidecar has a CPU of its own; its tables go to their own block, and a CPU list that leaves the
    others none is refused in one line."""
    import os

    usable = sorted(os.sched_getaffinity(0))
    script = [sys.executable, str(REPO / "benchmarks" / "gateway_overhead.py")]
    refused = subprocess.run([*script, "--gateway-cpus", ",".join(map(str, usable))], capture_output=True, text=True)
    assert refused.returncode == 2 and "--gateway-cpus must leave the client and provider a CPU" in refused.stderr
    if len(usable) < 2:
        pytest.skip("one CPU: nothing to give the gateway alone")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- benchmark:gateway_overhead_own_cpu -->\nold\n<!-- /benchmark -->\n")
    argv = [*script, "--calls", "2", "--concurrency", "1", "--in-flight", "", "--warmup", "0", "--request-kb", "1"]
    argv += ["--event-interval-ms", "0", "--gateway-cpus", str(usable[-1]), "--write-docs", "--doc", str(doc)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    others = ", ".join(map(str, usable[:-1]))
    assert f"The gateways on CPU {usable[-1]} alone, the client and the provider on {others}." in text
    assert f"--gateway-cpus {usable[-1]}`" in text and f"{len(usable)} CPUs" in text  # the machine as it is


def nginx_pids() -> set[int]:
    return {int(p.parent.name) for p in Path("/proc").glob("[0-9]*/comm") if _read(p) == "nginx\n"}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # a process that ended meanwhile
        return ""


def test_the_overhead_benchmark_measures_a_bare_nginx_relay_beside_the_gateway(tmp_path: Path) -> None:
    """`--nginx`: the real nginx (Debian's, installed by scripts/test.sh) as a bare reverse proxy in the same
    alternation, the floor any proxy hop adds on the machine. Its calls must come back whole through it (the
    benchmark checks every answer's text), its rows sit beside the gateway's in the last table with their shifts,
    each miss names nginx's figure, and the nginx process is stopped. Without nginx on PATH: one line saying what to
    install."""
    import os

    script = [sys.executable, str(REPO / "benchmarks" / "gateway_overhead.py")]
    no_nginx = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    refused = subprocess.run([*script, "--nginx"], capture_output=True, text=True, env=no_nginx)
    assert (
        refused.returncode == 2
        and "--nginx needs nginx on PATH (Debian: apt-get install nginx-light, into /usr/sbin)" in refused.stderr
    )
    before = nginx_pids()
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- benchmark:gateway_overhead -->\nold\n<!-- /benchmark -->\n")
    argv = [*script, "--calls", "3", "--rounds", "1", "--concurrency", "1,2", "--in-flight", "", "--warmup", "1"]
    argv += ["--request-kb", "1", "--event-interval-ms", "0", "--nginx", "--write-docs", "--doc", str(doc)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert nginx_pids() <= before, "the benchmark left its nginx running"
    text = doc.read_text()
    compared = [line.strip("| ").split(" | ") for line in text.splitlines() if re.match(r"\| (OpenAI|Anthropic)", line)]
    compared = [r for r in compared if len(r) == 12]  # the last table's rows
    cases = [
        (api, s, c)
        for c in ("1", "2 at once")
        for api in ("OpenAI Responses", "Anthropic Messages")
        for s in ("no", "yes")
    ]
    assert [tuple(r[:4]) for r in compared] == [
        (*case, way) for case in cases for way in ("nginx, a bare relay", "now")
    ]
    number = r"-?\d+\.\d\d"
    for r in compared:
        assert all(re.fullmatch(number, cell) for cell in r[4:8] + r[11:]), r
        assert all(re.fullmatch(number, cell) if r[1] == "yes" else cell == "" for cell in r[8:11]), r
    assert "--nginx`" in text and "nginx is a bare reverse proxy" in text
    missed = [line for line in proc.stdout.splitlines() if line.startswith("missed:")]
    assert all("nginx's " in line for line in missed), missed


async def test_a_sidecars_view_asks_the_gateway_for_its_counts_before_reading_its_file(tmp_path: Path) -> None:
    """In a pod the agent's container reads the gateway sidecar's totals. The gateway rewrites `gateway.json` a moment
    after each answer, off the call's path, so the view asks the gateway itself (`POST /checkpoint`) and reads the
    file only when it does not answer: a file still holding the state before the last call does not hide that call."""
    import asyncio

    with FakeLLM() as server:
        server.script(Reply.text("done", usage=PLANTED))
        async with gateway_for(server, tmp_path, "anthropic") as gw:
            await asyncio.to_thread(call, gw, "messages", False, "claude-sonnet-4-6")
            stale = tmp_path / "stale-gateway.json"
            stale.write_text(GatewayState().model_dump_json())  # as the file is just before its rewrite lands
            view = GatewayView(gw.url, gw.config.token, stale)
            assert view.state.calls == 0  # the file as it stands
            assert await asyncio.to_thread(view.checkpoint) == (tmp_path / "transcript.jsonl").stat().st_size
            assert view.state.spend.usage == EXPECTED and view.state.calls == 1
        assert await asyncio.to_thread(view.checkpoint) is None  # the gateway has ended: what it last wrote is all
        assert view.state.calls == 0


def test_a_request_jiter_refuses_is_still_read_for_the_transcript_as_json_reads_it() -> None:
    """The request's summary is read by jiter, and by `json` where jiter refuses what `json` reads (a lone
    surrogate's escape, which an agent's text can hold): the line still names the model, not an empty request."""
    from labkube.agent.gateway.digest import request_body

    raw = b'{"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "\\ud800"}]}'
    assert request_body(raw)["model"] == "claude-sonnet-4-6"
    assert request_body(b"[1, 2]") == {} and request_body(b"not json") == {}


class Listener:
    """A socket on loopback that records every connection made to it and every byte sent (the agent's own
    listener, which a pod's containers share with the gateway); it answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                data = b""
                with contextlib.suppress(OSError):
                    data = conn.recv(65536)
                self.received.append(data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def _start_sidecar(run_dir: Path, token_file: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-P", "-m", "labkube", "gateway", "--run-dir", str(run_dir)]
    argv += ["--token-file", str(token_file)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("LISTENING http://127.0.0.1:"), proc.communicate(timeout=10)
    return proc, line.split()[1]


def _stop_sidecar(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def _chat(url: str, token: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(api_key=token, base_url=f"{url}/openai/v1", max_retries=0, timeout=30)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_a_rewritten_run_json_and_a_sidecar_restart_never_send_the_key_to_the_agents_listener(tmp_path: Path) -> None:
    """Issue 41: the sidecar read its model and base URL from run.json, which the agent's container writes. The agent
    rewrites it to a model on its own loopback listener and has the sidecar restart (a kubelet restarts a native
    sidecar with the same command and environment, which this does): the gateway must still send every call, and its
    key, to the provider the Run named, and nothing to the planted listener. Its spec is its own environment's
    (`LABKUBE_RUN_SPEC`, which the pod manifest sets)."""
    planted = Listener()
    try:
        with FakeLLM() as server:
            server.script(Reply.text("one"), Reply.text("two"))
            model = f"openai-compatible:{server.base_url}/v1#m"
            spec = RunSpec(run_id="gw--m--s0", campaign="gw", task="t", task_path=str(tmp_path), model=model, seed=0)
            run_dir = tmp_path / "run"
            write_model(run_dir / "run.json", spec)
            token_file = tmp_path / "gateway-volume" / "token"
            env = {**os.environ, "OPENAI_COMPATIBLE_API_KEY": REAL_KEY, RUN_SPEC_VARIABLE: spec.model_dump_json()}
            replies = []
            proc, url = _start_sidecar(run_dir, token_file, env)
            try:
                replies.append(_chat(url, token_file.read_text()))
                # The agent's move: the run's model now at its own listener, with a key variable of its choosing.
                hostile = f"openai-compatible:http://127.0.0.1:{planted.port}/v1#m"
                keys = {hostile: "OPENAI_COMPATIBLE_API_KEY"}
                rewritten = spec.model_copy(update={"model": hostile, "api_key_env": keys})
                write_model(run_dir / "run.json", rewritten)
            finally:
                _stop_sidecar(proc)
            proc, url = _start_sidecar(run_dir, token_file, env)  # the kubelet's restart
            try:
                replies.append(_chat(url, token_file.read_text()))
            finally:
                _stop_sidecar(proc)
            requests = server.requests
    finally:
        planted.close()
    assert [r.choices[0].message.content for r in replies] == ["one", "two"]
    assert planted.received == [], "the gateway reached the agent's listener"
    assert len(requests) == 2 and all(r.headers.get("authorization") == f"Bearer {REAL_KEY}" for r in requests)


def test_labkube_gateway_refuses_to_start_without_its_spec_in_its_environment(tmp_path: Path) -> None:
    """No fallback to run.json: a sidecar started without `LABKUBE_RUN_SPEC` exits 2 with a one-line reason."""
    spec = RunSpec(run_id="gw--m--s0", campaign="gw", task="t", task_path=str(tmp_path), model="openai:gpt-5", seed=0)
    write_model(tmp_path / "run" / "run.json", spec)
    env = {k: v for k, v in os.environ.items() if k != RUN_SPEC_VARIABLE}
    argv = [sys.executable, "-P", "-m", "labkube", "gateway", "--run-dir", str(tmp_path / "run")]
    ran = subprocess.run([*argv, "--token-file", str(tmp_path / "token")], env=env, capture_output=True, text=True)
    assert ran.returncode == 2 and "LABKUBE_RUN_SPEC is not set" in ran.stderr, ran.stderr
    assert not (tmp_path / "token").exists()
