"""The Gaia2 world: ARE's own runtime and judge behind our HTTP protocol, with the real ARE virtualenv.

One warm world process serves every scenario of the session. Select with `-m gaia2`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from gaia2_helpers import SCRIPTS

from labkube.tasks.gaia2 import (
    WorldClient,
    WorldDied,
    WorldEnvError,
    WorldPool,
    WorldProcess,
    WorldRequestError,
    WorldStartError,
    capability_tags,
    load_scenario,
    resolve_scenarios,
    start_world,
    world_python,
)

pytestmark = pytest.mark.gaia2

# ARE's built-in scenarios that run offline (scenario_hf_demo_mcp pulls from the hub).
ARE_BUILTIN = [
    "scenario_tutorial",
    "scenario_apps_tutorial",
    "scenario_events_tutorial",
    "scenario_find_image_file",
    "scenario_validation_tutorial",
    "scenario_mcp_demo",  # are-run hangs at exit after this one; our world must not
]
BUNDLED = sorted(SCRIPTS)


@pytest.fixture(scope="session")
def world(are_python: Path):
    process = start_world(are_python)
    yield process
    process.stop()
    assert not process.alive()


@pytest.fixture
async def client(world: WorldProcess):
    async with world.client() as c:
        yield c


def bundled_source(name: str) -> str:
    return load_scenario(f"gaia2/{name}").source


# -- oracle mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario_id", ARE_BUILTIN)
async def test_oracle_passes_on_are_builtin_scenario(client: WorldClient, scenario_id: str):
    info = await client.load_scenario(scenario_id, oracle=True)
    assert info.kind == "registry" and info.oracle
    result = await client.run_oracle()
    assert result.success, result
    assert result.checks == ["scenario.validate"]


@pytest.mark.parametrize("name", BUNDLED)
async def test_bundled_scenario_passes_in_oracle_mode(client: WorldClient, name: str):
    info = await client.load_scenario(bundled_source(name), oracle=True)
    assert info.capabilities == [name.split("_")[0]]
    result = await client.run_oracle()
    assert result.success, result.rationale
    assert result.judge == "hard checks only"
    assert "time_window" in result.checks and result.soft_checks.startswith("not judged")


# -- agent mode: ARE's judge on scripted agents -----------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
async def test_bundled_scenario_passes_for_a_correct_agent(client: WorldClient, name: str):
    right, _, _ = SCRIPTS[name]
    await client.load_scenario(bundled_source(name))
    await right(client)
    result = await client.finish()
    assert result.success, result.rationale
    assert not result.oracle and result.turns_completed == result.nb_turns


@pytest.mark.parametrize("name", BUNDLED)
async def test_bundled_scenario_fails_for_a_wrong_agent_with_ares_rationale(client: WorldClient, name: str):
    _, wrong, tool = SCRIPTS[name]
    await client.load_scenario(bundled_source(name))
    await wrong(client)
    result = await client.finish()
    assert not result.success
    assert result.rationale and tool in result.rationale, result.rationale


async def test_tools_are_namespaced_app_tools_with_json_schemas(client: WorldClient):
    await client.load_scenario(bundled_source("execution_budget_email"))
    tools = {t.name: t for t in await client.list_tools()}
    send = tools["EmailClientV2__send_email"]
    assert send.write and send.app == "EmailClientV2"
    assert send.parameters["properties"]["recipients"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert "SystemApp__wait_for_notification" in tools and "SystemApp__get_current_time" in tools
    assert "AgentUserInterface__get_all_messages" not in tools  # user messages arrive as notifications
    assert not any(t.write for t in tools.values() if t.name.startswith("Contacts__get"))


async def test_tool_errors_go_back_to_the_agent(client: WorldClient):
    await client.load_scenario(bundled_source("search_pediatrician_message"))
    unknown = await client.call_tool("Messages__teleport", {})
    assert not unknown.ok and "unknown tool" in unknown.error
    bad = await client.call_tool("Contacts__get_contact", {"contact_id": "nobody"})
    assert not bad.ok and bad.error


# -- the clock ------------------------------------------------------------------------------------


async def test_scheduled_event_arrives_with_its_simulated_timestamp_without_waiting_in_wall_time(
    client: WorldClient,
):
    info = await client.load_scenario(bundled_source("time_door_code"))
    first = await client.pull_notifications()
    assert [n.type for n in first.notifications] == ["user_message"]
    wall = time.monotonic()
    waited = await client.wait_for_notification(600)
    assert time.monotonic() - wall < 5
    assert 100 <= waited.advanced <= 121  # Bob's message is scheduled 120 s after the task
    pulled = await client.pull_notifications()
    [bob] = [n for n in pulled.notifications if n.type == "environment"]
    assert "conv-bob" in bob.message
    assert bob.timestamp == pytest.approx(info.start_time + 120, abs=3)
    assert bob.datetime.startswith("2024-10-15 07:02")


async def test_clock_pause_charges_the_think_time_asked_for(client: WorldClient):
    await client.load_scenario(bundled_source("execution_budget_email"))
    before = await client.pause_clock()
    await asyncio.sleep(0.3)  # the scenario: real time passes while paused, and a fixed charge ignores it
    assert (await client.time()).paused
    resumed = await client.resume_clock("fixed", 42)
    assert resumed.charged == 42 and resumed.time == pytest.approx(before + 42, abs=0.5)
    again = await client.pause_clock()
    await asyncio.sleep(0.2)  # the scenario: the think time a measured resume charges
    measured = await client.resume_clock("measured")
    assert 0.15 < measured.charged < 2 and measured.time == pytest.approx(again + measured.charged, abs=0.2)


async def test_protocol_errors_are_json_with_a_status(client: WorldClient, world: WorldProcess):
    with pytest.raises(WorldRequestError) as missing:
        await client.load_scenario("scenario_that_does_not_exist")
    assert missing.value.status == 422 and "registry" in missing.value.message
    assert all(sid in missing.value.message for sid in [*ARE_BUILTIN, "scenario_hf_demo_mcp"])  # nothing new
    with pytest.raises(WorldRequestError) as bad:
        await client.load_scenario('{"version": "are_simulation_v1"}')
    assert bad.value.status == 422
    await client.load_scenario("scenario_tutorial", oracle=True)
    with pytest.raises(WorldRequestError) as wrong_mode:
        await client.list_tools()
    assert wrong_mode.value.status == 409
    async with httpx.AsyncClient(base_url=world.base_url) as raw:
        response = await raw.get("/nope")
        assert response.status_code == 404 and "endpoints" in response.json()["error"]
        response = await raw.post("/tools/call", content=b"not json")
        assert response.status_code == 400 and "error" in response.json()


# -- process lifecycle ----------------------------------------------------------------------------


async def test_killing_the_world_mid_run_raises_world_died_within_seconds(are_python: Path):
    doomed = start_world(are_python)
    try:
        async with doomed.client() as c:
            await c.load_scenario(bundled_source("time_door_code"))
            await c.pull_notifications()
            os.killpg(doomed.pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(WorldDied):
                await c.wait_for_notification(600)
            with pytest.raises(WorldDied):
                await c.time()
            assert time.monotonic() - started < 5
    finally:
        doomed.stop()


def test_a_world_that_cannot_start_says_why_from_its_log():
    started = time.monotonic()
    with pytest.raises(WorldStartError, match="ModuleNotFoundError: No module named 'are'"):
        start_world(Path(sys.executable))  # labkube's own python has no ARE
    assert time.monotonic() - started < 30


def test_pool_reuses_warm_worlds_and_replaces_dead_ones(are_python: Path):
    with WorldPool(are_python, max_idle=1) as pool:
        with pool.world() as first:
            pass
        with pool.world() as second:
            assert second is first
        first.stop()
        with pool.world() as third:
            assert third is not first and third.alive()
    assert not third.alive()


def test_labkube_worlds_serve_listens_where_the_sidecar_env_says(tmp_path: Path):
    """The world image's entrypoint: `labkube worlds serve`, on $LABKUBE_WORLD_PORT, loopback only."""
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "LABKUBE_WORLD_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "worlds", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().split() == ["LISTENING", str(port)]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["status"] == "ok" and health["pid"] == proc.pid  # exec'd: the world is this process
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_world_python_says_how_to_set_up(tmp_path: Path):
    with pytest.raises(WorldEnvError, match="setup_world_env"):
        world_python(tmp_path / "missing")


# -- scenario references --------------------------------------------------------------------------


def test_bundled_scenarios_cover_the_five_capabilities():
    found = resolve_scenarios("gaia2")
    assert sorted(c for s in found for c in s.capabilities) == [
        "adaptability",
        "ambiguity",
        "execution",
        "search",
        "time",
    ]
    assert load_scenario("gaia2/scenario_tutorial").source == "scenario_tutorial"  # ARE's registry


def test_dataset_rows_and_folders_resolve_with_their_capabilities(tmp_path: Path):
    data = json.loads(Path(bundled_source("search_pediatrician_message")).read_text())
    data["metadata"]["definition"]["tags"] = []
    data["metadata"]["definition"]["has_env_events_augmentation"] = True
    rows = tmp_path / "search" / "validation.jsonl"
    rows.parent.mkdir()
    rows.write_text(json.dumps({"scenario_id": "row-1", "data": json.dumps(data)}) + "\n")
    [row] = resolve_scenarios(str(tmp_path))
    assert row.scenario_id == "row-1" and row.capabilities == ("search", "noise")
    assert json.loads(row.source)["metadata"]["definition"]["scenario_id"] == "labkube_search_pediatrician_message"
    assert load_scenario(f"{rows}#row-1").ref == f"{rows}#row-1"
    assert capability_tags({"metadata": {"definition": {"has_a2a_augmentation": True}}}) == ("agent2agent",)
