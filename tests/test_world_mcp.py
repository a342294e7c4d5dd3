"""`labkube world-mcp`: a Gaia2 world's tools as an MCP server on stdio, for agent CLIs.

A real world process with a bundled scenario loaded; the bridge is the real command as a subprocess. It is driven
first by the MCP SDK's own stdio client, then by the real Claude Code binary (`--mcp-config`) against the fake
provider (tests/fakellm.py), which calls one world tool under Claude Code's `mcp__world__` prefix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeLLM, Reply, ToolCall
from fakellm import Usage as FakeUsage
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from labkube.agent.scaffolds.cli_install import CLI_AGENTS, ensure_installed
from labkube.tasks.gaia2 import WorldClient, WorldProcess, load_scenario, setup_world_env, start_world, world_python

pytestmark = pytest.mark.gaia2

SCENARIO = "gaia2/execution_budget_email"  # "email Dana Whitfield, cc Marco": two Danas among the contacts
WHITFIELD = "dana.whitfield@northwind.example"
MARCO = "marco.bianchi@northwind.example"
HARNESS_TOOLS = {"wait_for_notification", "get_current_time"}


@pytest.fixture(scope="module")
def world():
    setup_world_env()
    process = start_world(world_python())
    yield process
    process.stop()
    assert not process.alive()


@pytest.fixture
async def loaded(world: WorldProcess):
    """The world with the scenario loaded in agent mode, as the run's agent process leaves it for the CLI."""
    async with world.client() as client:
        await client.load_scenario(load_scenario(SCENARIO).source)
        yield client


def bridge_command() -> list[str]:
    return [sys.executable, "-P", "-m", "labkube", "world-mcp"]


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def test_an_mcp_client_lists_and_calls_the_worlds_tools(world: WorldProcess, loaded: WorldClient):
    world_specs = {t.name: t for t in await loaded.list_tools()}
    server = StdioServerParameters(
        command=bridge_command()[0],
        args=[*bridge_command()[1:], "--world-url", world.base_url],
        env={**os.environ, "LABKUBE_WORLD_URL": "http://127.0.0.1:9"},  # the option wins over the variable
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        app_tools = {n for n in world_specs if not n.startswith("SystemApp__")}
        assert set(tools) == app_tools | HARNESS_TOOLS  # no end_task: a CLI ends by itself
        send = tools["EmailClientV2__send_email"]
        assert send.input_schema == world_specs["EmailClientV2__send_email"].parameters
        assert send.description == world_specs["EmailClientV2__send_email"].description
        assert not send.annotations.read_only_hint and tools["Contacts__search_contacts"].annotations.read_only_hint
        assert tools["wait_for_notification"].input_schema["properties"]["timeout"]["type"] == "number"

        task = await mcp.call_tool("wait_for_notification", {"timeout": 60})
        assert not task.is_error and "Message from the user" in text_of(task)
        clock = await mcp.call_tool("get_current_time", {})
        assert not clock.is_error and "'current_weekday': 'Tuesday'" in text_of(clock)  # ARE's SystemApp
        found = await mcp.call_tool("Contacts__search_contacts", {"query": "Whitfield"})
        assert not found.is_error and WHITFIELD in text_of(found)

        sent = await mcp.call_tool(
            "EmailClientV2__send_email",
            {
                "recipients": [WHITFIELD],
                "cc": [MARCO],
                "subject": "Q3 budget final",
                "content": "The numbers are final.",
            },
        )
        assert not sent.is_error, text_of(sent)
        outbox = await mcp.call_tool("EmailClientV2__list_emails", {"folder_name": "SENT"})
        assert "Q3 budget final" in text_of(outbox)

        missing = await mcp.call_tool("Contacts__get_contact", {})
        assert missing.is_error and "missing required argument(s) contact_id" in text_of(missing)
        wrong_type = await mcp.call_tool("Contacts__search_contacts", {"query": 7})
        assert wrong_type.is_error and "'query' must be string" in text_of(wrong_type)
        unknown = await mcp.call_tool("end_task", {})
        assert unknown.is_error and "no tool named 'end_task'" in text_of(unknown)

        done = await mcp.call_tool("AgentUserInterface__send_message_to_user", {"content": "Sent to Dana Whitfield."})
        assert not done.is_error, text_of(done)
    # ARE's judge saw the email the bridge sent: the scenario passes.
    result = await loaded.finish()
    assert result.success, result.rationale


def test_world_mcp_says_why_when_the_world_is_unreachable(tmp_path: Path):
    ran = subprocess.run(
        [*bridge_command(), "--world-url", "http://127.0.0.1:9"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert ran.returncode == 2 and ran.stdout == ""
    assert "world-mcp:" in ran.stderr and "scenario loaded" in ran.stderr


def run_in_own_session(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str, int]:
    """Run an agent CLI in a session of its own and kill the whole group after, so the MCP server it spawned goes
    down with it whatever happens."""
    cli = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = cli.communicate(timeout=300)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()
    return out, err, cli.returncode


# -- Claude Code -----------------------------------------------------------------------------------

USAGE = FakeUsage(input=1000, output=100)
CALL = ("mcp__world__Contacts__search_contacts", {"query": "Whitfield"})


def _tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every tool_result in the request's last message."""
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else None
    out = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            out.append(inner if isinstance(inner, str) else json.dumps(inner))
    return out


def claude_responder(path: str, body: dict[str, Any]) -> Reply:
    """The main loop (it carries the world's tools) calls one world tool, then answers; side calls get a title."""
    tools = [t.get("name") for t in body.get("tools") or []]
    if CALL[0] not in tools:
        return Reply.text('{"title": "Gaia2", "isNewTopic": true}', usage=USAGE)
    if _tool_results(body):
        return Reply.text("Dana Whitfield is dana.whitfield@northwind.example.", usage=USAGE)
    return Reply.tool_call(*CALL, usage=USAGE)


async def test_claude_code_calls_world_tools_through_mcp_config(
    tmp_path: Path, world: WorldProcess, loaded: WorldClient
):
    exe = ensure_installed(CLI_AGENTS["claude-code"])
    mcp_config = {
        "mcpServers": {
            "world": {
                "command": bridge_command()[0],
                "args": bridge_command()[1:],
                "env": {"LABKUBE_WORLD_URL": world.base_url},
            }
        }
    }
    model = "claude-sonnet-4-6"
    with FakeLLM(responder=claude_responder) as server:
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "CLAUDE_CODE_MAX_RETRIES": "2",
            "MCP_TIMEOUT": "60000",  # ms for the server to start: a cold `python -m labkube` takes seconds
        }
        command = [
            str(exe), "-p", "Find Dana Whitfield's email address.", "--output-format", "stream-json", "--verbose",
            "--permission-mode", "bypassPermissions", "--strict-mcp-config", "--mcp-config", json.dumps(mcp_config),
        ]  # fmt: skip
        out, err, returncode = run_in_own_session(command, tmp_path, env)
        requests = [r for r in server.requests if r.path.endswith("/messages")]
    assert returncode == 0, err[-3000:]
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    init = next(e for e in events if e.get("type") == "system" and e.get("subtype") == "init")
    assert [(s["name"], s["status"]) for s in init["mcp_servers"]] == [("world", "connected")], init["mcp_servers"]

    # The model saw every world tool, named mcp__world__<the world's name> (ARE's `App__method` kept whole).
    main_loop = [r for r in requests if CALL[0] in [t.get("name") for t in r.body.get("tools") or []]]
    assert len(main_loop) == 2, [r.body.get("tools") for r in requests]
    offered = {t["name"]: t for t in main_loop[0].body["tools"] if t["name"].startswith("mcp__world__")}
    app_tools = {t.name for t in await loaded.list_tools() if not t.name.startswith("SystemApp__")}
    assert set(offered) == {f"mcp__world__{n}" for n in app_tools | HARNESS_TOOLS}
    assert offered["mcp__world__Contacts__search_contacts"]["input_schema"]["required"] == ["query"]
    # The call went to the world and its result came back to the model in the next request.
    (result,) = _tool_results(main_loop[1].body)
    assert WHITFIELD in result


# -- Codex -----------------------------------------------------------------------------------------


def codex_responder(path: str, body: dict[str, Any]) -> Reply:
    """Codex offers MCP tools as a Responses `namespace` tool (`mcp__world`) holding the world's tools by their own
    names; the call names the namespace apart."""
    if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in body.get("input") or []):
        return Reply.text("Dana Whitfield is dana.whitfield@northwind.example.", usage=USAGE)
    call = ToolCall("Contacts__search_contacts", {"query": "Whitfield"}, namespace="mcp__world")
    return Reply.tool_calls([call], usage=USAGE)


async def test_codex_calls_world_tools_through_its_mcp_servers_config(
    tmp_path: Path, world: WorldProcess, loaded: WorldClient
):
    exe = ensure_installed(CLI_AGENTS["codex"])
    codex_home = tmp_path / ".codex"
    codex_home.mkdir()
    with FakeLLM(responder=codex_responder) as server:
        (codex_home / "config.toml").write_text(
            "\n".join(
                [
                    'model = "gpt-5"',
                    'model_provider = "fake"',
                    'web_search = "disabled"',
                    "[analytics]",
                    "enabled = false",
                    "[features]",
                    "plugins = false",
                    "[model_providers.fake]",
                    'name = "fake"',
                    f"base_url = {json.dumps(server.base_url + '/v1')}",
                    'env_key = "FAKE_OPENAI_KEY"',
                    'wire_api = "responses"',
                    "request_max_retries = 0",
                    "stream_max_retries = 0",
                    "[mcp_servers.world]",
                    f"command = {json.dumps(bridge_command()[0])}",
                    f"args = {json.dumps(bridge_command()[1:])}",
                    "startup_timeout_sec = 60",
                    "required = true",  # as labkube writes it: Codex waits for the server before its first request
                    "[mcp_servers.world.env]",
                    f"LABKUBE_WORLD_URL = {json.dumps(world.base_url)}",
                    "",
                ]
            )
        )
        env = {**os.environ, "CODEX_HOME": str(codex_home), "FAKE_OPENAI_KEY": "sk-test"}
        command = [
            str(exe), "exec", "-C", str(tmp_path), "--json", "--skip-git-repo-check", "-m", "gpt-5",
            "--dangerously-bypass-approvals-and-sandbox", "Find Dana Whitfield's email address.",
        ]  # fmt: skip
        out, err, returncode = run_in_own_session(command, tmp_path, env)
        requests = [r for r in server.requests if r.path.endswith("/responses")]
    assert returncode == 0, err[-3000:]
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    (namespace,) = [t for t in requests[0].body["tools"] if t.get("name") == "mcp__world"]
    assert namespace["type"] == "namespace"
    offered = {t["name"]: t for t in namespace["tools"]}
    app_tools = {t.name for t in await loaded.list_tools() if not t.name.startswith("SystemApp__")}
    assert set(offered) == app_tools | HARNESS_TOOLS
    assert offered["Contacts__search_contacts"]["parameters"]["required"] == ["query"]
    # Its JSON stream reports the call as an mcp_tool_call item; the result reached the model.
    (call,) = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "mcp_tool_call"]
    assert (call["server"], call["tool"], call["status"]) == ("world", "Contacts__search_contacts", "completed")
    (output,) = [i for i in requests[1].body["input"] if i.get("type") == "function_call_output"]
    assert WHITFIELD in json.dumps(output["output"])
