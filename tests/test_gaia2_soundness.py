"""A Gaia2 run is judged only on a sound world that showed the agent its task (issue #23, items 3, 4, 8).

- The agent's first model request holds the scenario's first user message, whenever it is sent: ARE's
  registry tutorials send it seconds after t=0, and a scenario of our own at t=60 s.
- A broken world is a world error for every agent: an oracle event for an app the scenario lacks (ARE's
  event loop dies on it with `KeyError: 'Messages'`), an oracle run cut short, an event loop that dies
  mid-run. Never a pass.
- `get_current_time` is ARE's SystemApp tool: weekday included, logged by ARE.

Real ARE in its own virtualenv, real world processes, rg-agent calling a FakeLLM (tests/fakellm.py) over
the OpenAI wire format, which records what each model request held.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeLLM, Reply
from gaia2_helpers import MARCO, WHITFIELD

from labkube.agent.harness.entrypoint import run_agent
from labkube.budgets import StopReason
from labkube.run_spec import RunSpec, make_run_id
from labkube.store import write_model
from labkube.task_card import TaskFamily
from labkube.tasks import resolve_tasks
from labkube.tasks.gaia2 import (
    CONTROL_TOKEN_VARIABLE,
    WorldBroken,
    WorldClient,
    WorldProcess,
    load_scenario,
    setup_world_env,
    start_world,
    world_python,
)

pytestmark = pytest.mark.gaia2

# ARE's registry tutorials and the first user message of each (from their scenario.py).
TUTORIALS = {
    "scenario_tutorial": "transferring the pdf Greg will send me to John",  # sent at t=6 s
    "scenario_apps_tutorial": "create a new high-priority task titled 'Prepare presentation'",  # t=2 s
    "scenario_events_tutorial": "count how many emails I have received",  # t=9 s
    "scenario_find_image_file": "find the image file in the current directory",  # t=0
    "scenario_validation_tutorial": 'Tell me "I am a robot"',  # t=1 s
}
LATE_TASK = "Email Dana Whitfield from finance"


@pytest.fixture(scope="module")
def world() -> Any:
    setup_world_env()
    process = start_world(world_python())
    yield process
    process.stop()


@pytest.fixture
async def client(world: WorldProcess) -> Any:
    async with world.client() as c:
        yield c


def scenario_json(name: str) -> dict[str, Any]:
    return json.loads(Path(load_scenario(f"gaia2/{name}").source).read_text())


def late_task_scenario(folder: Path) -> Path:
    """Our own scenario whose only user message comes 60 simulated seconds after the start."""
    data = scenario_json("execution_budget_email")
    data["metadata"]["definition"]["scenario_id"] = "labkube_late_task"
    user_task = next(e for e in data["events"] if e["event_id"] == "user-task")
    user_task["event_relative_time"] = 60.0
    path = folder / "late_task.json"
    path.write_text(json.dumps(data))
    return path


def without_messages(folder: Path) -> Path:
    """search_pediatrician_message with its Messages app removed: its oracle texts through Messages."""
    data = scenario_json("search_pediatrician_message")
    data["apps"] = [a for a in data["apps"] if a["name"] != "Messages"]
    path = folder / "no_messages.json"
    path.write_text(json.dumps(data))
    return path


def run_dir_for(root: Path, ref: str, model: str) -> Path:
    (card,) = resolve_tasks(ref)
    run = RunSpec(
        run_id=make_run_id(card.ref, model, 0),
        campaign="g2",
        task=card.ref,
        task_path=card.path,
        model=model,
        seed=0,
        family=TaskFamily.gaia2,
    )
    run_dir = root / run.run_id
    write_model(run_dir / "run.json", run)
    return run_dir


def first_request_text(llm: FakeLLM) -> str:
    messages = llm.requests[0].body["messages"]
    return "\n".join(m["content"] if isinstance(m["content"], str) else json.dumps(m["content"]) for m in messages)


# -- the agent always sees its task ------------------------------------------------------------------


@pytest.mark.parametrize("scenario_id", sorted(TUTORIALS))
async def test_first_model_request_holds_the_tutorials_first_user_message(
    tmp_path: Path, world: WorldProcess, monkeypatch: pytest.MonkeyPatch, scenario_id: str
) -> None:
    monkeypatch.setenv("LABKUBE_WORLD_URL", world.base_url)  # the warm world, as a pod's sidecar would be
    monkeypatch.setenv(CONTROL_TOKEN_VARIABLE, world.control_token or "")  # the supervisor hands it over on stdin
    with FakeLLM(default=Reply.tool_call("end_task", {"summary": "seen"})) as llm:
        await run_agent(run_dir_for(tmp_path, f"gaia2/{scenario_id}", f"openai-compatible:{llm.base_url}/v1#m"))
        assert llm.requests, "the agent made no model request"
        first = first_request_text(llm)
    assert TUTORIALS[scenario_id] in first, first
    assert "Message from the user" in first


async def test_a_task_sent_at_60_simulated_seconds_is_in_the_first_request(
    tmp_path: Path, world: WorldProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABKUBE_WORLD_URL", world.base_url)
    monkeypatch.setenv(CONTROL_TOKEN_VARIABLE, world.control_token or "")
    scenario = late_task_scenario(tmp_path)
    with FakeLLM(default=Reply.tool_call("end_task", {"summary": "seen"})) as llm:
        result = await run_agent(run_dir_for(tmp_path, str(scenario), f"openai-compatible:{llm.base_url}/v1#m"))
        first = first_request_text(llm)
    assert "[2024-10-15 07:01:00] Message from the user: Received at: 2024-10-15 07:01:00" in first, first
    assert LATE_TASK in first
    # Delivering it cost the agent nothing: its budgets count from its first request.
    assert result.spend.steps == 1 and result.spend.wall_seconds < 60


async def test_loading_returns_once_the_late_first_message_is_delivered(client: WorldClient, tmp_path: Path) -> None:
    info = await client.load_scenario(str(late_task_scenario(tmp_path)))
    assert info.start_time is not None and info.time is not None
    assert 60.0 <= info.time - info.start_time < 62.0  # the clock jumped; no wall time was spent
    pulled = await client.pull_notifications()
    assert [n.type for n in pulled.notifications] == ["user_message"]
    assert pulled.notifications[0].datetime == "2024-10-15 07:01:00"


# -- a broken world is an error, for every agent ------------------------------------------------------


@pytest.mark.parametrize("oracle", [True, False])
async def test_an_oracle_event_for_a_missing_app_is_refused_at_load(
    client: WorldClient, tmp_path: Path, oracle: bool
) -> None:
    with pytest.raises(WorldBroken, match="apps it does not have: Messages") as caught:
        await client.load_scenario(str(without_messages(tmp_path)), oracle=oracle)
    assert caught.value.status == 503


@pytest.mark.parametrize("model", ["oracle", "noop"])
async def test_the_messages_less_scenario_is_a_world_error_for_oracle_and_noop(tmp_path: Path, model: str) -> None:
    setup_world_env()
    result = await run_agent(run_dir_for(tmp_path, str(without_messages(tmp_path)), model))
    assert result.stop_reason is StopReason.world_error, result
    assert result.score is None and result.status.value == "Failed"
    assert result.error is not None and "apps it does not have: Messages" in result.error
    assert "world log (" in result.error  # with the world log's last lines


async def test_an_oracle_run_cut_short_by_the_duration_is_a_world_error(client: WorldClient, tmp_path: Path) -> None:
    data = scenario_json("time_door_code")  # the oracle forwards Bob's code 240 s in
    data["metadata"]["definition"]["duration"] = 100
    await client.load_scenario(json.dumps(data), oracle=True)
    with pytest.raises(WorldBroken, match="did not execute 2 of the scenario's oracle events"):
        await client.run_oracle()


async def test_an_event_loop_that_dies_mid_run_breaks_every_later_request(client: WorldClient) -> None:
    data = scenario_json("execution_budget_email")
    # 30 s after the turn ends, a message to the agent whose attachment is not one: ARE's app ignores it, so the
    # event itself runs; then ARE's notification system validates the attachment outside the event's error
    # handling, raises, and the event loop thread dies. (ARE's own oracle run at load dies there too, after
    # every oracle event, so it passes the load's checks.)
    data["events"].append(
        {
            "class_name": "Event",
            "event_type": "ENV",
            "event_time": None,
            "event_id": "env-bad-attachment",
            "dependencies": ["oracle-reply"],
            "event_relative_time": 30.0,
            "action": {
                "action_id": "env-bad-attachment-action",
                "app": "AgentUserInterface",
                "function": "send_message_to_agent",
                "operation_type": "write",
                "args": [
                    {"name": "content", "value": "see attached", "value_type": "str"},
                    {"name": "base64_utf8_encoded_attachment_contents", "value": '[{"x": 1}]', "value_type": "list"},
                ],
            },
        }
    )
    await client.load_scenario(json.dumps(data))
    await client.pull_notifications()
    email = {"recipients": [WHITFIELD], "cc": [MARCO], "subject": "Q3 budget final", "content": "Final."}
    await client.call_tool("EmailClientV2__send_email", email)
    end = await client.send_message_to_user("Sent.")
    assert end.turns_completed == 1 and not end.world_stopped  # ARE's judge accepted the turn
    with pytest.raises(WorldBroken, match="ARE's event loop died: ValidationError"):
        await client.wait_for_notification(60)
    for call in (client.pull_notifications(), client.finish()):
        with pytest.raises(WorldBroken, match="event loop died"):
            await call


# -- get_current_time is ARE's SystemApp tool ---------------------------------------------------------


async def test_get_current_time_is_ares_system_app_tool_with_the_weekday(tmp_path: Path) -> None:
    calls = [("get_current_time", {}), ("end_task", {"summary": "done"})]
    with FakeLLM() as llm:
        llm.script(*[Reply.tool_call(name, args) for name, args in calls])
        run_dir = run_dir_for(tmp_path, "gaia2/execution_budget_email", f"openai-compatible:{llm.base_url}/v1#m")
        await run_agent(run_dir)
        tool_result = json.dumps(llm.requests[1].body["messages"][-1])
    # 2024-10-15 is a Tuesday; the text is ARE's own dict, as its agents see it.
    assert "'current_weekday': 'Tuesday'" in tool_result and "'current_datetime': '2024-10-15 07:00:" in tool_result
    assert WHITFIELD not in tool_result
    events = [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]
    [call] = [e for e in events if e.get("type") == "tool_call" and e["tool"] == "get_current_time"]
    assert call["ok"] and "'current_weekday': 'Tuesday'" in call["output"]


async def test_system_apps_get_current_time_answers_with_the_weekday(client: WorldClient) -> None:
    await client.load_scenario(load_scenario("gaia2/execution_budget_email").source)
    result = await client.call_tool("SystemApp__get_current_time")
    assert result.ok and result.result["current_weekday"] == "Tuesday", result
    assert result.result["current_datetime"].startswith("2024-10-15 07:00:")


# -- a judge that failed says so ------------------------------------------------------------------------


async def test_a_judge_that_cannot_be_reached_fails_the_soft_checks_and_keeps_its_exception(
    client: WorldClient,
) -> None:
    refused = {"model": "judge", "provider": "openai", "endpoint": "http://127.0.0.1:9/v1", "api_key": "k"}
    await client.load_scenario(load_scenario("gaia2/execution_budget_email").source, judge=refused)
    await client.pull_notifications()
    email = {"recipients": [WHITFIELD], "cc": [MARCO], "subject": "Q3 budget final", "content": "Reworded."}
    await client.call_tool("EmailClientV2__send_email", email)  # content differs: a soft check asks the model
    await client.send_message_to_user("Sent.")
    verdict = await client.finish()
    assert verdict.exception and "Connection" in verdict.exception, verdict
    assert verdict.soft_checks.startswith("failed"), verdict.soft_checks
    assert not verdict.success
