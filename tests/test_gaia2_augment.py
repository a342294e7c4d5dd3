"""The Gaia2 world's model-driven parts and augmentations, with the real ARE virtualenv: agent2agent app agents,
ARE's own default agent (`POST /are_agent`), the soft (LLM) judge, and noise.

Every model is a FakeLLM on 127.0.0.1: ARE's agents and judge call it through LiteLLM (provider "openai",
non-streaming chat completions), so the replies are ARE's ReAct text or the judge's [[True]]/[[False]].
One warm world process serves the module. Select with `-m gaia2`.
"""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeLLM, Reply
from gaia2_helpers import MARCO, WELLS, WHITFIELD

from labkube.tasks.gaia2 import (
    WorldClient,
    WorldProcess,
    WorldRequestError,
    load_scenario,
    setup_world_env,
    start_world,
    world_python,
)

pytestmark = pytest.mark.gaia2

SCENARIO = "gaia2/execution_budget_email"
SEND_EMAIL = "EmailClientV2__send_email"
SEND_TO_USER = "AgentUserInterface__send_message_to_user"
APPS = ["Contacts", "Messages", "EmailClientV2"]  # the scenario's apps that can become agents, in its order
INJECTED = "failed with error: Internal error - Retry again later"  # ARE's tool-failure noise


def source() -> str:
    return load_scenario(SCENARIO).source


def oracle_args(event_id: str) -> dict[str, str]:
    events = json.loads(Path(source()).read_text())["events"]
    [event] = [e for e in events if e["event_id"] == event_id]
    return {a["name"]: a["value"] for a in event["action"]["args"]}


def email(recipient: str = WHITFIELD, content: str | None = None) -> dict[str, Any]:
    return {
        "recipients": [recipient],
        "cc": [MARCO],
        "subject": "Q3 budget final",
        "content": content or oracle_args("oracle-send-email")["content"],
    }


def react(tool: str, arguments: dict[str, Any]) -> Reply:
    """One step of ARE's ReAct agents (the main agent and app agents), in the text format they parse."""
    action = json.dumps({"action": tool, "action_input": arguments}, indent=2)
    return Reply.text(f"Thought: next, {tool}.\nAction:\n{action}<end_action>")


def llm_spec(endpoint: str, key: str = "sk-fake", model: str = "fake-model") -> dict[str, Any]:
    return {"model": model, "provider": "openai", "endpoint": endpoint, "api_key": key}


def spec_for(llm: FakeLLM, key: str = "sk-fake", model: str = "fake-model") -> dict[str, Any]:
    return llm_spec(llm.base_url + "/v1", key, model)


def said(llm: FakeLLM, text: str) -> bool:
    """Whether any request to the fake LLM carried `text` in its messages."""
    return any(text in json.dumps(r.body) for r in llm.requests)


@pytest.fixture(scope="module")
def world():
    setup_world_env()
    process = start_world(world_python())
    yield process
    process.stop()
    assert not process.alive()


@pytest.fixture
async def client(world: WorldProcess):
    async with world.client() as c:
        yield c


@pytest.fixture
def llm():
    with FakeLLM() as fake:
        yield fake


async def expert_tools(client: WorldClient) -> list[str]:
    return sorted(t.name for t in await client.list_tools() if t.name.endswith("__expert_agent"))


# -- agent2agent ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("recipient", "passes"), [(WHITFIELD, True), (WELLS, False)], ids=["right", "wrong-dana"])
async def test_agent2agent_apps_become_expert_agents_judged_by_are(
    client: WorldClient, llm: FakeLLM, recipient: str, passes: bool
):
    info = await client.load_scenario(
        source(), agent2agent={"proportion": 1.0, "llm": spec_for(llm, key="sk-a2a", model="app-agent-model")}
    )
    assert info.capabilities == ["agent2agent", "execution"]
    tools = {t.name: t for t in await client.list_tools()}
    assert sorted(tools) == sorted(
        [SEND_TO_USER, "SystemApp__get_current_time", "SystemApp__wait_for_notification"]
        + [f"{app}__expert_agent" for app in APPS]
    )  # no app tool is left: each app is reached through its agent
    assert tools["EmailClientV2__expert_agent"].parameters["required"] == ["task"]

    await client.pull_notifications()
    llm.script(react(SEND_EMAIL, email(recipient)), react("final_answer", {"answer": "task completed"}))
    task = "Email Dana from finance (marker 7731) that the Q3 budget is final, cc Marco Bianchi."
    delegated = await client.call_tool("EmailClientV2__expert_agent", {"task": task})
    assert delegated.ok and delegated.result == "task completed", delegated
    assert llm.remaining == 0 and llm.unscripted_calls == 0
    assert said(llm, "marker 7731")  # the app agent was given the expert task
    assert {r.body["model"] for r in llm.requests} == {"app-agent-model"}
    assert {r.headers["authorization"] for r in llm.requests} == {"Bearer sk-a2a"}  # the key from the request

    await client.send_message_to_user("Sent.")
    result = await client.finish()
    assert result.success is passes, result.rationale
    if not passes:
        assert result.rationale and SEND_EMAIL in result.rationale, result.rationale


async def test_agent2agent_share_of_apps_is_sampled_with_the_scenario_seed(client: WorldClient, llm: FakeLLM):
    a2a = {"proportion": 0.5, "llm": spec_for(llm)}
    chosen = {}
    for seed in (0, 5):
        await client.load_scenario(source(), seed=seed, agent2agent=a2a)
        chosen[seed] = await expert_tools(client)
        # ARE's own draw (scenario_runner._apply_a2a_config): random.Random(seed).sample(apps, int(n * share))
        expected = random.Random(seed).sample(APPS, int(len(APPS) * 0.5))
        assert chosen[seed] == [f"{app}__expert_agent" for app in expected]
        await client.load_scenario(source(), seed=seed, agent2agent=a2a)
        assert await expert_tools(client) == chosen[seed]  # the same seed, the same apps
    assert chosen[0] != chosen[5]
    await client.load_scenario(source(), seed=0, agent2agent=a2a)
    names = {t.name for t in await client.list_tools()}
    assert SEND_EMAIL in names and "Messages__send_message" not in names  # only the sampled app is an agent


async def test_agent2agent_refusals_are_one_line_400s_and_the_world_keeps_serving(client: WorldClient, llm: FakeLLM):
    bad = [
        ({"oracle": True, "agent2agent": {"proportion": 1.0, "llm": spec_for(llm)}}, "oracle"),
        ({"agent2agent": {"proportion": 1.0, "llm": {"provider": "openai", "endpoint": llm.base_url}}}, "model"),
        ({"agent2agent": {"proportion": 0, "llm": spec_for(llm)}}, "proportion"),
        ({"judge": {"provider": "openai"}}, "model"),
    ]
    for kwargs, word in bad:
        with pytest.raises(WorldRequestError) as refused:
            await client.load_scenario(source(), **kwargs)
        assert refused.value.status == 400, refused.value
        assert word in refused.value.message and "\n" not in refused.value.message, refused.value.message
    info = await client.load_scenario(source())
    assert info.capabilities == ["execution"]
    assert SEND_EMAIL in {t.name for t in await client.list_tools()}
    assert llm.requests == []  # nothing refused ever reached the model


# -- ARE's own agent: POST /are_agent -------------------------------------------------------------


@pytest.mark.parametrize(("recipient", "passes"), [(WHITFIELD, True), (WELLS, False)], ids=["right", "wrong-dana"])
async def test_are_default_agent_is_judged_and_reports_its_log(
    client: WorldClient, llm: FakeLLM, recipient: str, passes: bool
):
    await client.load_scenario(source())
    llm.script(react(SEND_EMAIL, email(recipient)), react(SEND_TO_USER, {"content": "Sent."}))
    run = await client.run_are_agent(spec_for(llm, key="sk-agent", model="agent-model"), timeout=60)
    assert run.success is passes, run.rationale
    if not passes:
        assert run.rationale and SEND_EMAIL in run.rationale, run.rationale
    agent = run.agent
    assert (agent.name, agent.model, agent.error, agent.stopped) == ("are-default", "agent-model", None, "finished")
    assert llm.remaining == 0 and llm.unscripted_calls == 0
    assert {r.headers["authorization"] for r in llm.requests} == {"Bearer sk-agent"}
    assert said(llm, "Q3 budget final")  # ARE gave its agent the user's task
    [send] = [e for e in agent.logs if e.type == "tool_call" and e.tool == SEND_EMAIL]
    assert send.arguments["recipients"] == [recipient]
    outputs = [e for e in agent.logs if e.type == "llm_output"]
    assert len(outputs) == 2 and SEND_EMAIL in outputs[0].content and SEND_TO_USER in outputs[1].content
    assert run.turns_completed == 1


async def test_are_agent_fixed_think_time_charges_each_model_call(client: WorldClient, llm: FakeLLM):
    await client.load_scenario(source())
    llm.script(react(SEND_EMAIL, email()), react(SEND_TO_USER, {"content": "Sent."}))
    run = await client.run_are_agent(spec_for(llm), think_time=30, timeout=60)
    assert run.success, run.rationale
    assert run.simulated_seconds >= 60 and run.wall_seconds < 30
    first, second = (e.timestamp for e in run.agent.logs if e.type == "llm_output")
    assert second - first >= 30


async def test_are_agent_measured_think_time_charges_the_real_generation_time(client: WorldClient, llm: FakeLLM):
    await client.load_scenario(source())
    llm.script(
        Reply.delay(0.4, then=react(SEND_EMAIL, email())),
        Reply.delay(0.4, then=react(SEND_TO_USER, {"content": "Sent."})),
    )
    run = await client.run_are_agent(spec_for(llm), timeout=60)
    assert run.success, run.rationale
    durations = [e.completion_duration for e in run.agent.logs if e.type == "llm_output"]
    assert len(durations) == 2 and all(d is not None and d >= 0.4 for d in durations), durations
    # the world's clock is paused while the model generates, then charged what it took
    assert sum(durations) <= run.simulated_seconds < 20  # far from the 2 x 30 s of the fixed mode


async def test_are_agent_stops_at_max_iterations_and_says_so(client: WorldClient, llm: FakeLLM):
    await client.load_scenario(source())
    llm.script(*[react("Contacts__get_contacts", {})] * 2, react(SEND_EMAIL, email()))
    run = await client.run_are_agent(spec_for(llm), timeout=60, max_iterations=2)
    assert not run.success and run.rationale
    assert run.agent.error == "ARE's agent reached max_iterations (2) without finishing the task"
    assert run.agent.stopped == "max_iterations"
    assert llm.remaining == 1  # the third step was never taken
    # ARE ends the turn itself with a message to the user
    assert any(
        e.type == "tool_call" and e.tool == SEND_TO_USER and "Max iterations" in str(e.arguments)
        for e in run.agent.logs
    )


async def test_are_agent_on_a_failing_model_ends_with_an_error(client: WorldClient):
    with FakeLLM(default=Reply.error(500)) as down:
        await client.load_scenario(source())
        started = time.monotonic()
        run = await client.run_are_agent(spec_for(down), timeout=60, max_iterations=2)
        assert time.monotonic() - started < 30
    # ARE counts a failed model call as an iteration and, at max_iterations, tells the user and stops.
    assert not run.success and run.rationale
    error = run.agent.error or ""
    assert run.agent.stopped == "model_failed"
    assert error.startswith("the model never answered ARE's agent") and "max_iterations (2)" in error, error
    assert "Internal Server Error" in error
    assert sum(e.type == "llm_output" for e in run.agent.logs) == 0
    assert sum(e.type == "step" for e in run.agent.logs) == 2


async def test_are_agent_on_an_unreachable_model_stops_at_its_timeout(client: WorldClient, llm: FakeLLM):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens there
    await client.load_scenario(source())
    started = time.monotonic()
    run = await client.run_are_agent(llm_spec(f"http://127.0.0.1:{port}/v1"), timeout=3)
    assert time.monotonic() - started < 20
    assert not run.success and run.rationale and SEND_EMAIL in run.rationale
    assert run.agent.error == "ARE's agent did not finish within 3 s" and run.agent.stopped == "timeout"
    assert any(e.type == "error" and "Connection error" in str(e.content) for e in run.agent.logs)
    # the world serves the next run normally
    await client.load_scenario(source())
    llm.script(react(SEND_EMAIL, email()), react(SEND_TO_USER, {"content": "Sent."}))
    assert (await client.run_are_agent(spec_for(llm), timeout=60)).success


# -- the soft (LLM) judge -------------------------------------------------------------------------

PARAPHRASE = "Dana - quick heads-up (para-0412): our Q3 budget figures are now locked. Sam"


async def send_paraphrase(client: WorldClient, judge: dict[str, Any] | None, content: str = PARAPHRASE) -> Any:
    await client.load_scenario(source(), judge=judge)
    await client.pull_notifications()
    sent = await client.call_tool(SEND_EMAIL, email(content=content))
    assert sent.ok, sent
    await client.send_message_to_user(oracle_args("oracle-reply")["content"])
    return await client.finish()


async def test_a_paraphrased_email_passes_the_hard_checks_alone(client: WorldClient):
    assert oracle_args("oracle-send-email")["content"] != PARAPHRASE
    result = await send_paraphrase(client, None)
    assert result.success, result.rationale
    assert result.judge == "hard checks only" and result.soft_checks.startswith("not judged")
    assert "soft_llm_checks" not in result.checks


@pytest.mark.parametrize(
    ("verdict", "passes"),
    [("[[False]] [[Failure]]", False), ("[[True]] [[Success]]", True)],
    ids=["judge-rejects", "judge-accepts"],
)
async def test_the_soft_judge_decides_on_a_paraphrase(client: WorldClient, verdict: str, passes: bool):
    with FakeLLM(default=Reply.text(f"Reasoning: checked.\nEvaluation: {verdict}")) as judge:
        result = await send_paraphrase(client, spec_for(judge, key="sk-judge", model="judge-model"))
    assert result.success is passes, result.rationale
    assert result.soft_checks == "judged" and "soft_llm_checks" in result.checks
    assert "judge-model" in result.judge
    assert judge.requests and said(judge, "para-0412")  # the judge read the agent's own words
    assert {r.headers["authorization"] for r in judge.requests} == {"Bearer sk-judge"}
    if not passes:
        assert result.rationale and SEND_EMAIL in result.rationale, result.rationale


async def test_the_soft_judge_is_not_asked_when_the_writes_equal_the_oracles(client: WorldClient):
    with FakeLLM(default=Reply.text("[[False]] [[Failure]]")) as judge:
        result = await send_paraphrase(client, spec_for(judge), content=oracle_args("oracle-send-email")["content"])
    assert result.success, result.rationale
    assert judge.requests == []


# -- noise ----------------------------------------------------------------------------------------


async def test_tool_failure_noise_fails_app_tools_with_ares_injected_error(client: WorldClient):
    info = await client.load_scenario(source(), noise={"tool_failure_probability": 1.0, "env_events_per_minute": 0})
    assert "noise" in info.capabilities
    failed = await client.call_tool("Contacts__get_contacts", {})
    assert not failed.ok and failed.error == f"Exception: Calling Contacts__get_contacts {INJECTED}"
    # ARE sets the failure probability on every app, the user interface included
    with pytest.raises(WorldRequestError) as refused:
        await client.send_message_to_user("Sent.")
    assert refused.value.status == 409 and f"{SEND_TO_USER} {INJECTED}" in refused.value.message


async def test_tool_failure_noise_is_seeded_by_the_scenario_seed(client: WorldClient):
    # ARE leaves each tool's failure draws unseeded (Random(None)); the world seeds them from the scenario
    # seed and the tool's name, so a seed fixes which calls fail and another seed moves them.
    async def pattern(seed: int) -> str:
        noise = {"tool_failure_probability": 0.5, "env_events_per_minute": 0}
        await client.load_scenario(source(), seed=seed, noise=noise)
        calls = [await client.call_tool("Contacts__get_contacts", {}) for _ in range(30)]
        assert all(c.ok or INJECTED in (c.error or "") for c in calls)
        return "".join("." if c.ok else "x" for c in calls)

    first, again, other = await pattern(7), await pattern(7), await pattern(8)
    assert "x" in first and "." in first, first
    assert first == again
    assert first != other  # equal by chance with probability 2**-30


async def wait_and_collect(client: WorldClient, horizon: float) -> list[tuple[float, str]]:
    """Wait `horizon` simulated seconds; every environment notification as (seconds after the start, message)."""
    start = (await client.time()).time
    seen = []
    for _ in range(50):  # a wait can itself fail under noise: try again
        elapsed = (await client.time()).time - start
        if elapsed >= horizon - 1:
            break
        waited = await client.wait_for_notification(horizon - elapsed)
        pulled = await client.pull_notifications()
        seen += [(round(n.timestamp - start), n.message) for n in pulled.notifications if n.type == "environment"]
        if waited.world_stopped:
            break
    assert (await client.time()).time - start >= horizon - 1
    return seen


async def test_default_noise_adds_no_environment_events_to_a_scenario_without_augmentation_data(
    client: WorldClient,
):
    # ARE's env-event noise replays items from the scenario's `augmentation` data; the bundled scenarios have none
    info = await client.load_scenario(source(), noise=True)
    assert info.capabilities == ["execution", "noise"]
    first = await client.pull_notifications()
    assert [n.type for n in first.notifications] == ["user_message"]
    seen = await wait_and_collect(client, 300)
    assert seen and all(m.startswith("SystemApp: Wait for notification timeout") for _, m in seen), seen


def with_inbox_noise(count: int) -> str:
    """The scenario plus ARE augmentation data: `count` newsletters ARE's env-event noise may deliver."""
    data = json.loads(Path(source()).read_text())
    emails = [
        {
            "email_id": f"noise-{i}",
            "sender": f"news{i}@letters.example",
            "recipients": ["sam.rivera@lumen.example"],
            "subject": f"Newsletter {i}",
            "content": f"Issue {i}.",
            "timestamp": 1728900000.0 + i,
        }
        for i in range(count)
    ]
    inbox = {"folders": {"INBOX": {"folder_name": "INBOX", "emails": emails}}}
    data["augmentation"] = {"apps": [{"name": "EmailClientV2", "app_state": inbox}]}
    return json.dumps(data)


async def test_environment_event_noise_delivers_augmentation_data_on_a_seeded_schedule(client: WorldClient):
    scenario = with_inbox_noise(6)
    runs = []
    for seed in (0, 0, 3):
        await client.load_scenario(
            scenario, duration=600, noise={"tool_failure_probability": 0, "env_events_seed": seed}
        )
        runs.append([(t, m) for t, m in await wait_and_collect(client, 300) if m.startswith("EmailClientV2")])
    assert runs[0] and all("New email received from news" in m for _, m in runs[0]), runs[0]
    assert runs[0] == runs[1]  # env_events_seed fixes which items arrive and when
    assert runs[2] != runs[0]
    await client.load_scenario(
        scenario, duration=600, noise={"tool_failure_probability": 0, "env_events_per_minute": 0}
    )
    assert [m for _, m in await wait_and_collect(client, 300) if m.startswith("EmailClientV2")] == []
