"""Claude Code and Codex CLI as scaffolds: the real npm binaries (pinned, installed into the CLI cache) run by
`labkube run --agent ...` against the fake provider (tests/fakellm.py) through the run's model gateway.

The fake answers from what each request says (a responder): the main loop's request carries the CLI's shell tool
and gets a scripted call; once the tool's result is in the conversation it gets the final text; side requests
(Claude Code's title generation) get a short text."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply, ToolCall
from fakellm import Usage as FakeUsage
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.gateway.record import CALLS_FILE, RECORDS_VARIABLE
from labkube.agent.scaffolds.cli_events import ClaudeCodeEvents, CodexEvents
from labkube.agent.scaffolds.cli_hook import verdict
from labkube.agent.scaffolds.cli_install import CLI_AGENTS, ensure_installed
from labkube.agent.transcript import read_jsonl
from labkube.result import RunResult

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data" / "cli_agents"
REAL_KEY = "sk-real-provider-key-0123456789"
USAGE = FakeUsage(input=1000, output=100)


@pytest.fixture(scope="session")
def cli_binaries() -> dict[str, Path]:
    """Both CLIs at their pinned versions, installed from npm once per machine (the cache every run uses)."""
    return {name: ensure_installed(agent) for name, agent in CLI_AGENTS.items()}


def _last_has_tool_result(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else None
    return isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content)


def _has_output(body: dict[str, Any]) -> bool:
    return any(isinstance(i, dict) and i.get("type", "").endswith("_output") for i in body.get("input") or [])


def responder(command: str, final: str = "Done: result.txt is written.") -> Callable[[str, dict], Reply]:
    """One shell call running `command`, then the final answer, in whichever API the CLI speaks."""

    def answer(path: str, body: dict[str, Any]) -> Reply:
        tools = [t.get("name") or t.get("type") for t in body.get("tools") or []]
        if path.endswith("/messages"):  # Claude Code
            if "Bash" not in tools:
                return Reply.text('{"title": "Tiny task", "isNewTopic": true}', usage=USAGE)
            if _last_has_tool_result(body):
                return Reply.text(final, usage=USAGE)
            return Reply.tool_call("Bash", {"command": command, "description": "run it"}, usage=USAGE)
        if _has_output(body):  # Codex
            return Reply.text(final, usage=USAGE)
        if "exec_command" in tools:
            return Reply.tool_call("exec_command", {"cmd": command}, usage=USAGE)
        return Reply.tool_call("shell", {"command": ["bash", "-lc", command]}, usage=USAGE)

    return answer


MODELS = {"claude-code": "anthropic:claude-sonnet-4-6", "codex": "openai:gpt-5"}


def provider_env(agent: str, server: FakeLLM) -> dict[str, str]:
    """The run's provider as a user configures it: the real key and, here, the provider's base URL."""
    if agent == "claude-code":
        return {"ANTHROPIC_API_KEY": REAL_KEY, "ANTHROPIC_BASE_URL": server.base_url}
    return {"OPENAI_API_KEY": REAL_KEY, "OPENAI_BASE_URL": server.base_url + "/v1"}


def run_dir_of(out: Path) -> Path:
    (run,) = [p for p in (out / "runs").iterdir() if p.is_dir()]
    return run


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_cli_runs_a_task_through_the_gateway_with_no_key_of_its_own(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    task = make_tiny_task(tmp_path, [])
    command = "env > env.txt; echo 7 > result.txt"
    with FakeLLM(responder=responder(command)) as server:
        ran = labkube(
            "run", str(task), "--model", MODELS[agent], "--agent", agent, "--out", str(tmp_path / "c"),
            cwd=tmp_path, env=provider_env(agent, server), timeout=300,
        )  # fmt: skip
        requests = server.requests
    assert ran.returncode == 0, ran.stderr[-3000:]
    rd = run_dir_of(tmp_path / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert (result.agent, result.status.value, result.stop_reason.value) == (agent, "Finished", "done")
    assert result.subtasks[0].raw == 7.0 and result.beat_baseline
    cli = result.details["cli"]
    assert cli["version"] == CLI_AGENTS[agent].version and CLI_AGENTS[agent].version in cli["reported_version"]
    assert cli["session_id"] and cli["starts"] == 1
    # The provider saw the real key on every call; the CLI saw only its run token.
    assert requests and all(
        REAL_KEY in (r.headers.get("x-api-key") or r.headers.get("authorization", "")) for r in requests
    )
    seen_env = (rd / "workspace" / "env.txt").read_text()
    assert REAL_KEY not in seen_env and "_API_KEY=sk-real" not in seen_env
    token = json.loads((rd / "run.json").read_text()).get("run_id")
    assert token
    # Every model call counted by the gateway, every tool call in rg-agent's vocabulary.
    events = read_jsonl(rd / "transcript.jsonl")
    calls = [e for e in events if e["type"] == "model_call"]
    assert len(calls) == len([r for r in requests if r.path.endswith(("/messages", "/responses"))])
    assert all(c["via"] == "gateway" for c in calls)
    assert result.spend.usage.input == 1000 * len(calls) and result.spend.usage.output == 100 * len(calls)
    assert result.spend.usd > 0 and result.spend.steps == len(calls)
    (tool,) = [e for e in events if e["type"] == "tool_call"]
    assert tool["tool"] == "bash" and tool["args"]["command"] == command and tool["ok"]
    assert result.integrity_verdict == "PASS"
    assert (rd / "logs" / f"{agent}.jsonl").stat().st_size > 0
    # labkube export reads the CLI's run as it reads rg-agent's: the prompt, the answers, the tool result
    exported = labkube("export", str(tmp_path / "c"), "--format", "atif", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    import atif

    (path,) = (tmp_path / "x").glob("*.atif.json")
    trajectory = atif.Trajectory.model_validate_json(path.read_text())
    assert trajectory.agent.name == agent and trajectory.agent.version == cli["reported_version"]
    assert [s.source for s in trajectory.steps][:2] == ["user", "agent"] and "Tiny task" in trajectory.steps[0].message
    acting = next(s for s in trajectory.steps if s.tool_calls)
    (observed,) = acting.observation.results
    assert observed.source_call_id == acting.tool_calls[0].tool_call_id
    assert sum(s.metrics.prompt_tokens for s in trajectory.steps if s.metrics) == result.spend.usage.input
    sft = labkube("export", str(tmp_path / "c"), "--format", "sft-jsonl", "--out", str(tmp_path / "s"), cwd=tmp_path)
    (lines,) = [p.read_text().splitlines() for p in (tmp_path / "s").glob("*.jsonl")]
    roles = [m["role"] for m in json.loads(lines[0])["messages"]]
    assert sft.returncode == 0 and roles[:3] == ["user", "assistant", "tool"] and roles[-1] == "assistant"


def test_a_clis_spend_is_a_lower_bound_when_an_answer_did_not_say_its_usage(
    tmp_path: Path, cli_binaries: dict[str, Path]
) -> None:
    """Codex through the gateway, the provider's last answer saying nothing of its usage (`usage: null`, as an
    OpenAI-compatible server may): Codex takes the answer and the run finishes, and the run's spend, the gateway's
    counts copied by the CLI scaffold, says its tokens and dollars are lower bounds, as `labkube status` shows."""
    task = make_tiny_task(tmp_path, [])
    answer = responder("echo 7 > result.txt")

    def unmetered_last(path: str, body: dict[str, Any]) -> Reply:
        reply = answer(path, body)
        return reply.without_usage() if _has_output(body) else reply

    with FakeLLM(responder=unmetered_last) as server:
        ran = labkube(
            "run", str(task), "--model", MODELS["codex"], "--agent", "codex", "--out", str(tmp_path / "c"),
            cwd=tmp_path, env=provider_env("codex", server), timeout=300,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    rd = run_dir_of(tmp_path / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.status.value == "Finished" and result.subtasks[0].raw == 7.0
    calls = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] == "model_call"]
    assert len(calls) >= 2 and [c.get("usage_partial", False) for c in calls][-1] is True
    assert result.spend.partial_calls == 1 and result.spend.at_least and result.spend.steps == len(calls)
    assert result.spend.usage.input == 1000 * (len(calls) - 1)  # the unmetered answer counted as none
    status = labkube("status", str(tmp_path / "c"), cwd=tmp_path)
    assert status.returncode == 0 and "≥" in status.stdout, status.stdout


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_spent_dollar_budget_stops_the_cli_as_usd(tmp_path: Path, cli_binaries: dict[str, Path], agent: str) -> None:
    """The first call costs more than the budget: the next is refused with the provider's final quota error, the
    CLI gives up on it, and the run ends as `usd`, graded."""
    task = make_tiny_task(tmp_path, [])
    with FakeLLM(responder=responder("echo 3 > result.txt")) as server:
        ran = labkube(
            "run", str(task), "--model", MODELS[agent], "--agent", agent, "--out", str(tmp_path / "c"),
            "--budget-usd", "0.000001", cwd=tmp_path, env=provider_env(agent, server), timeout=300,
        )  # fmt: skip
    rd = run_dir_of(tmp_path / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.stop_reason.value == "usd", (result, ran.stderr[-2000:])
    gateway = json.loads((rd / "gateway.json").read_text())
    assert gateway["refused"] >= 1 and gateway["stop_reason"] == "usd"
    assert any(e["type"] == "budget_stop" and e["reason"] == "usd" for e in read_jsonl(rd / "transcript.jsonl"))


def test_the_wall_budget_interrupts_the_cli(tmp_path: Path, cli_binaries: dict[str, Path]) -> None:
    """A model that never answers in time: past the wall budget the supervisor interrupts the CLI (SIGINT, then
    SIGKILL) and the run ends as `time`, graded; with --grade-interval it was graded while it ran too."""
    task = make_tiny_task(tmp_path, [])
    with FakeLLM(responder=lambda path, body: Reply.delay(120, Reply.text("late"))) as server:
        started = time.monotonic()
        ran = labkube(
            "run", str(task), "--model", MODELS["claude-code"], "--agent", "claude-code", "--out", str(tmp_path / "c"),
            "--budget-hours", str(6 / 3600), "--grade-interval", "1",
            cwd=tmp_path, env=provider_env("claude-code", server), timeout=300,
        )  # fmt: skip
        took = time.monotonic() - started
    rd = run_dir_of(tmp_path / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.stop_reason.value == "time", ran.stderr[-2000:]
    assert took < 90
    events = read_jsonl(rd / "transcript.jsonl")
    assert any(e["type"] == "budget_stop" and e["reason"] == "time" for e in events)
    # graded while the CLI worked (every second of charged time), then once more at the end
    periodic = [e for e in events if e["type"] == "grade"]
    assert len(periodic) >= 3 and len(result.score_curve) == len(periodic) + 1
    assert [g.at_seconds for g in result.score_curve] == sorted(g.at_seconds for g in result.score_curve)


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_blocked_url_is_kept_from_the_agent_by_the_clis_own_settings(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """The task blocks a URL (here one on this machine, so that reaching it would succeed). Claude Code: its
    PreToolUse hook refuses the command that names it, with rg-agent's URL rules. Codex cannot refuse single
    URLs: the run's sandbox (unsandboxed, Codex's own) runs the command with no network, so the fetch fails (curl's
    code 000) and the rest runs."""
    task = make_tiny_task(tmp_path, [])
    answers: list[Callable[[str, dict], Reply]] = []  # the command names the server's own URL: known once it runs
    with FakeLLM(responder=lambda path, body: answers[0](path, body)) as server:
        paper = f"{server.base_url}/v1/responses"  # answers a POST (a 4xx for a bare one) when reachable
        (task / "blocked_urls.yaml").write_text(f"- {paper}\n")
        command = f"curl -s -X POST -o /dev/null -w '%{{http_code}}' {paper} > code.txt; echo 2 > result.txt"
        answers.append(responder(command))
        labkube(
            "run", str(task), "--model", MODELS[agent], "--agent", agent, "--out", str(tmp_path / "c"),
            cwd=tmp_path, env=provider_env(agent, server), timeout=300,
        )  # fmt: skip
        fetched = [r for r in server.requests if r.headers.get("user-agent", "").startswith("curl")]
    rd = run_dir_of(tmp_path / "c")
    workspace = rd / "workspace"
    assert fetched == []
    if agent == "claude-code":
        (tool,) = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] == "tool_call"]
        assert not tool["ok"] and "is blocked for this task" in tool["output"]
        assert not (workspace / "result.txt").exists()  # the whole command was refused
    else:
        assert (workspace / "code.txt").read_text() == "000"  # no network in the run's sandbox
        assert (workspace / "result.txt").read_text().strip() == "2"


def _answered_tool(path: str, body: dict[str, Any] | None) -> bool:
    """A request that carries a tool's result (the model is asked what next)."""
    return _last_has_tool_result(body or {}) if path.endswith("/messages") else _has_output(body or {})


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_terminated_run_resumes_the_clis_own_session(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """SIGTERM to the run's agent mid-run (a preempted pod, a stopped supervisor): it interrupts the CLI and exits
    resumable (143, no result); `--resume` continues the CLI's session (`claude --resume`, `codex exec resume`), so
    the next request carries the first part's tool call, and the result says the session was resumed."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model=MODELS[agent], agent=agent)
    first_part = responder("echo 5 > result.txt")

    def stall_after_tool(path: str, body: dict[str, Any]) -> Reply:
        return Reply.delay(120, Reply.text("late")) if _answered_tool(path, body) else first_part(path, body)

    with FakeLLM(responder=stall_after_tool) as server:
        env = {**os.environ, **provider_env(agent, server)}
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(rd)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not any(_answered_tool(r.path, r.body) for r in server.requests):
            assert time.monotonic() < deadline and process.poll() is None, process.communicate()
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 143, err[-2000:]
    first = json.loads((rd / "checkpoint.json").read_text())["provider_state"]["cli"]
    assert first["session_id"] and not (rd / "result.json").exists()
    assert read_jsonl(rd / "transcript.jsonl")[-1]["type"] == "terminated"
    with FakeLLM(responder=first_part) as server:
        ran = labkube("agent", "--run-dir", str(rd), "--resume", cwd=tmp_path, env=provider_env(agent, server))
        resumed = [r for r in server.requests if r.path.endswith(("/messages", "/responses")) and r.body.get("tools")]
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.details["cli"]["resumed"] == 1 and result.details["cli"]["starts"] == 2
    assert result.subtasks[0].raw == 5.0 and result.resumes == 1
    history = json.dumps(resumed[0].body.get("messages") or resumed[0].body.get("input"))
    assert "echo 5 > result.txt" in history  # the first part's tool call, from the CLI's own session
    starts = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] in ("start", "resume")]
    assert [e["type"] for e in starts] == ["start", "resume"] and starts[-1]["resumed_session"] == first["session_id"]


def test_the_captured_streams_become_rg_agent_tool_calls(tmp_path: Path) -> None:
    """The recorded event streams of both CLIs (one shell call writing out.txt) as transcript lines."""
    workspace = Path("/tmp/cli_study/ccs_success/ws")
    claude = ClaudeCodeEvents(workspace)
    lines = [
        r
        for raw in (DATA / "claude-code-stream.jsonl").read_text().splitlines()
        for r in claude.feed(json.loads(raw), 1)
    ]
    tools = [r for r in lines if r["type"] == "tool_call"]
    assert [(t["tool"], t["args"], t["ok"], t["native_tool"]) for t in tools] == [
        ("bash", {"command": "echo 42 > out.txt"}, True, "Bash")
    ]
    assert claude.session_id and claude.version == "2.1.331" and claude.failure() is None
    codex = CodexEvents(workspace)
    lines = [r for raw in (DATA / "codex-exec.jsonl").read_text().splitlines() for r in codex.feed(json.loads(raw), 1)]
    assert [(t["tool"], t["args"], t["ok"]) for t in lines] == [("bash", {"command": "echo 42 > out.txt"}, True)]
    assert codex.session_id == "01a20e62-572b-7620-bc3a-ef4128cb6945" and codex.failure() is None
    failed = CodexEvents(workspace)
    for raw in (DATA / "codex-exec-error.jsonl").read_text().splitlines():
        failed.feed(json.loads(raw), 1)
    assert failed.failure() == "Quota exceeded. Check your plan and billing details."
    errored = ClaudeCodeEvents(workspace)
    for raw in (DATA / "claude-code-error.jsonl").read_text().splitlines():
        errored.feed(json.loads(raw), 1)
    assert errored.failure()


def test_the_hook_uses_rg_agents_url_rules() -> None:
    blocked = ["https://arxiv.org/abs/2401.00001", "github.com/author/*"]
    assert verdict({"tool_name": "Bash", "tool_input": {"command": "curl https://arxiv.org/abs/2401.00001v2"}}, blocked)
    assert verdict({"tool_name": "WebFetch", "tool_input": {"url": "https://github.com/author/code"}}, blocked)
    assert (
        verdict({"tool_name": "Bash", "tool_input": {"command": "curl https://arxiv.org/abs/2401.00002"}}, blocked)
        is None
    )
    assert verdict({"tool_name": "Read", "tool_input": {"file_path": "x"}}, blocked) is None


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_in_a_pod_the_gateway_is_a_sidecar_and_the_agent_container_has_no_key(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """The pod's layout as processes: `labkube gateway` (the sidecar, with the key and its record folder) and
    `labkube agent` (the agent container, with only the sidecar's address and the token file of their shared
    volume). The run finishes, the sidecar's counts are the run's spend, and its model calls are in the run's
    transcript. The transcript the harness wrote from the CLI's events is then held against the sidecar's record of
    the model's tool calls, as a grading pod does: as written, it agrees; with the command's line erased from it (the
    agent's container can write the transcript), the audit finds the edit and still sees the command."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model=MODELS[agent], agent=agent, sandbox="pod")
    token_file, records = tmp_path / "gateway-volume" / "token", tmp_path / "gateway-records"
    command = "env > env.txt; echo 7 > result.txt"
    with FakeLLM(responder=responder(command)) as server:
        # the Run's spec as the pod manifest gives the sidecar: in its environment, not read from run.json
        spec = {"LABKUBE_RUN_SPEC": (rd / "run.json").read_text()}
        sidecar_env = {**os.environ, **provider_env(agent, server), **spec, RECORDS_VARIABLE: str(records)}
        sidecar = subprocess.Popen(
            [sys.executable, "-P", "-m", "labkube", "gateway", "--run-dir", str(rd), "--token-file", str(token_file)],
            env=sidecar_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert sidecar.stdout is not None
            listening = sidecar.stdout.readline()
            assert listening.startswith("LISTENING http://127.0.0.1:"), sidecar.communicate(timeout=10)
            agent_env = {
                "LABKUBE_GATEWAY_URL": listening.split()[1],
                "LABKUBE_GATEWAY_TOKEN_FILE": str(token_file),
            }
            assert not any(k.endswith("_API_KEY") for k in os.environ)
            ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path, env=agent_env, timeout=300)
        finally:
            sidecar.send_signal(signal.SIGTERM)
            sidecar.communicate(timeout=30)
        requests = server.requests
    assert sidecar.returncode == 0
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.subtasks[0].raw == 7.0 and result.stop_reason.value == "done"
    calls = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] == "model_call"]
    answered = [r for r in requests if r.path.endswith(("/messages", "/responses"))]
    assert len(calls) == len(answered) >= 2 and all(c["via"] == "gateway" for c in calls)
    assert result.spend.steps == len(calls) and result.spend.usage.input == 1000 * len(calls)
    assert all(REAL_KEY in (r.headers.get("x-api-key") or r.headers.get("authorization", "")) for r in requests)
    assert token_file.read_text().strip() not in {REAL_KEY, ""}
    assert REAL_KEY not in (rd / "workspace" / "env.txt").read_text()

    from labkube.integrity import audit_run

    def edits() -> list[dict[str, Any]]:
        report = audit_run(rd, gateway_records=records)
        return [v.model_dump(mode="json") for v in report.violations if v.type.value == "transcript_edited"]

    recorded = [c for line in read_jsonl(records / CALLS_FILE) for c in line["tool_calls"]]
    assert [c["name"] for c in recorded] == (["Bash"] if agent == "claude-code" else ["exec_command"])
    assert edits() == []
    transcript = rd / "transcript.jsonl"
    lines = transcript.read_text().splitlines(keepends=True)
    transcript.write_text("".join(line for line in lines if '"tool_call"' not in line))
    (edited,) = edits()
    assert "echo 7 > result.txt" in edited["evidence"], edited


WHITFIELD, MARCO = "dana.whitfield@northwind.example", "marco.bianchi@northwind.example"
EMAIL = {"recipients": [WHITFIELD], "cc": [MARCO], "subject": "Q3 budget final", "content": "The numbers are final."}


def gaia2_responder(path: str, body: dict[str, Any]) -> Reply:
    """The scenario's one write (the email ARE's oracle sends), then the message to the user that ends the turn,
    then a closing text; through whichever tool naming the CLI uses for the `world` MCP server."""
    if path.endswith("/messages"):  # Claude Code: mcp__world__<tool>
        done = sum(
            1 for m in body.get("messages") or [] if isinstance(m.get("content"), list)
            for c in m["content"] if isinstance(c, dict) and c.get("type") == "tool_result"
        )  # fmt: skip
        steps = [
            Reply.tool_call("mcp__world__EmailClientV2__send_email", EMAIL, usage=USAGE),
            Reply.tool_call("mcp__world__AgentUserInterface__send_message_to_user", {"content": "Sent."}, usage=USAGE),
        ]
    else:  # Codex: a `mcp__world` namespace holding the world's own names
        done = sum(
            1 for i in body.get("input") or [] if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        steps = [
            Reply.tool_calls([ToolCall("EmailClientV2__send_email", EMAIL, namespace="mcp__world")], usage=USAGE),
            Reply.tool_calls(
                [ToolCall("AgentUserInterface__send_message_to_user", {"content": "Sent."}, namespace="mcp__world")],
                usage=USAGE,
            ),
        ]
    return steps[done] if done < len(steps) else Reply.text("The email is sent.", usage=USAGE)


@pytest.mark.gaia2
@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_cli_in_a_gaia2_world_uses_its_apps_and_aress_judge_decides(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """`--agent claude-code|codex` on a Gaia2 scenario: the world's apps reach the CLI as the `world` MCP server
    (`labkube world-mcp`), the world's clock stops during model calls (the gateway's hooks), the turn ends with the
    message to the user, and ARE's judge passes the run on the write it saw."""
    with FakeLLM(responder=gaia2_responder) as server:
        ran = labkube(
            "run", "gaia2/execution_budget_email", "--model", MODELS[agent], "--agent", agent,
            "--out", str(tmp_path / "c"), cwd=tmp_path, env=provider_env(agent, server), timeout=400,
        )  # fmt: skip
        calls = [r for r in server.requests if r.path.endswith(("/messages", "/responses"))]
    assert ran.returncode == 0, ran.stderr[-3000:]
    rd = run_dir_of(tmp_path / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.details["gaia2"]["success"] is True, result.details["gaia2"]
    assert result.score == 1.0 and result.stop_reason.value == "done"
    events = read_jsonl(rd / "transcript.jsonl")
    tools = [e["tool"] for e in events if e["type"] == "tool_call"]
    assert tools == ["EmailClientV2__send_email", "AgentUserInterface__send_message_to_user"]
    assert "Message from the user" in events[next(i for i, e in enumerate(events) if e["type"] == "start")]["prompt"]
    assert len([e for e in events if e["type"] == "model_call"]) == len(calls) == 3
    # the write's per-action reward in the export, from ARE's own matching
    exported = labkube("export", str(tmp_path / "c"), "--format", "atif", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    (path,) = (tmp_path / "x").glob("*.atif.json")
    rewards = [
        r for step in json.loads(path.read_text())["steps"] for r in (step.get("extra") or {}).get("rewards", [])
    ]
    matched = [r for r in rewards if r["kind"] == "oracle_match"]
    # both writes (the email, the message to the user) matched to the oracle's events by ARE's judge
    assert [r["value"] for r in matched] == [1.0, 1.0] and all(r["oracle_event_id"] for r in matched)


def test_a_resume_with_no_session_to_continue_restarts_and_says_so(
    tmp_path: Path, cli_binaries: dict[str, Path]
) -> None:
    """A run interrupted before the CLI reported its session (no session id in the checkpoint) cannot continue it:
    the resumed run starts the CLI anew with the whole task prompt, and the result and transcript say so."""
    from labkube.agent.checkpoint import Checkpoint
    from labkube.store import utcnow, write_model

    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model=MODELS["claude-code"], agent="claude-code")
    write_model(rd / "checkpoint.json", Checkpoint(started_at=utcnow()))  # an attempt that left no CLI state
    with FakeLLM(responder=responder("echo 4 > result.txt")) as server:
        ran = labkube("agent", "--run-dir", str(rd), "--resume", cwd=tmp_path, env=provider_env("claude-code", server))
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.details["cli"]["restarted"] == 1 and result.details["cli"]["resumed"] == 0
    assert result.subtasks[0].raw == 4.0
    events = read_jsonl(rd / "transcript.jsonl")
    assert any(e["type"] == "agent_restart" and e["why"] == "no session to resume" for e in events)
    started = next(e for e in events if e["type"] in ("start", "resume"))
    assert started["resumed_session"] is None and "Tiny task" in started["prompt"]


def test_claude_codes_settings_deny_blocked_domains_and_hook_every_network_tool(tmp_path: Path) -> None:
    from labkube.agent.scaffolds.cli_agents import GatewayRoute, claude_setup

    gw = GatewayRoute("http://127.0.0.1:9", "tok")
    env: dict[str, str] = {}
    blocked = ["https://arxiv.org", "github.com/author/code", "*.author.example"]
    flags = claude_setup(tmp_path, env, gw, "claude-sonnet-4-6", blocked)
    settings = json.loads(Path(flags[flags.index("--settings") + 1]).read_text())
    # whole hosts become WebFetch deny rules; paths and globs are the hook's (rg-agent's matching)
    assert settings["permissions"]["deny"] == ["WebFetch(domain:arxiv.org)"]
    (hook,) = settings["hooks"]["PreToolUse"]
    assert (
        hook["matcher"] == "Bash|WebFetch|WebSearch"
        and "labkube.agent.scaffolds.cli_hook" in hook["hooks"][0]["command"]
    )
    assert (tmp_path / "blocked_urls.txt").read_text().split() == blocked
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/anthropic" and env["ANTHROPIC_API_KEY"] == "tok"
    assert "--mcp-config" not in flags  # no world, no MCP server


async def test_a_pods_checkpoint_keeps_the_sidecars_lines_past_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod the gateway sidecar appends its model calls to the transcript through a file of its own, so the agent
    container's own offset ends at its own last line. `CliRun.sync` checkpoints at the later of that and where the
    sidecar's writes end once it has written every call it counts (`GatewayView.checkpoint`): a resumed run, which
    truncates the transcript at the checkpoint's offset, keeps the line of every call its spend counts."""
    from labkube.agent.checkpoint import Checkpoint
    from labkube.agent.gateway import GatewayState, GatewayView, ModelGateway, run_config, upstream_for
    from labkube.agent.scaffolds.cli_agents import CliRun, CliState, RunHooks
    from labkube.agent.telemetry import RunTelemetry
    from labkube.agent.transcript import JsonlLog
    from labkube.model_ref import parse_model
    from labkube.store import RunDir
    from labkube.tasks import card_for_run

    task = make_tiny_task(tmp_path, [])
    rd = RunDir(make_run_dir(tmp_path, task, model=MODELS["claude-code"], agent="claude-code"))
    spec = rd.spec()
    with FakeLLM() as server:
        server.script(Reply.text("hello", usage=USAGE))
        for name, value in provider_env("claude-code", server).items():
            monkeypatch.setenv(name, value)
        family, upstream = upstream_for(parse_model(spec.model), REAL_KEY)
        sidecar = ModelGateway(
            run_config(spec, family, upstream),
            transcript=JsonlLog(rd.transcript),  # the sidecar's own file object, as in its own container
            state=GatewayState(),
            state_path=rd.root / "gateway.json",
        )
        async with sidecar:
            view = GatewayView(sidecar.url, sidecar.config.token, rd.root / "gateway.json")
            saved: list[int] = []
            agent = CLI_AGENTS["claude-code"]
            run = CliRun(
                rd=rd,
                spec=spec,
                card=card_for_run(spec.task, spec.task_path, spec.task_id),
                ckpt=Checkpoint(),
                transcript=JsonlLog(rd.transcript),  # the agent container's
                telemetry=RunTelemetry(spec),
                hooks=RunHooks(
                    take_grade=lambda *_: pytest.fail("no grade is due"),
                    write_status=lambda *_args, **_kw: None,
                    save_checkpoint=lambda _rd, ckpt: saved.append(ckpt.transcript_offset),
                ),
                agent=agent,
                exe=Path("/nonexistent"),
                home=tmp_path / "home",
                env={},
                state=CliState(agent=agent.name, package=agent.package, version=agent.version),
                gw=view,
            )
            run.transcript.append({"type": "start", "ts": "t"})
            import anthropic

            client = anthropic.AsyncAnthropic(api_key=sidecar.config.token, base_url=sidecar.anthropic_base_url)
            await client.messages.create(
                model="claude-sonnet-4-6", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
            await asyncio.to_thread(run.sync, ClaudeCodeEvents(rd.workspace))
        assert run.ckpt.spend.steps == 1 and run.ckpt.spend.usage.input == USAGE.input
        assert saved == [rd.transcript.stat().st_size] and saved[0] > run.transcript.offset
        run.transcript.close()
    JsonlLog(rd.transcript).truncate(saved[0])  # the resumed run's start
    assert [line["type"] for line in read_jsonl(rd.transcript)] == ["start", "model_call"]


@pytest.mark.gaia2
def test_a_cli_in_a_gaia2_pod_drives_its_world_sidecar_with_the_token_the_world_left_for_it(
    tmp_path: Path, cli_binaries: dict[str, Path]
) -> None:
    """The Gaia2 pod's layout as processes, each with its container's environment: the world sidecar (it publishes
    its control token to the `world-control` volume), `labkube gateway` (reads it, and stops the world's clock with
    it around each model call: a refused pause would fail the call) and `labkube agent` (reads it, loads the scenario
    with it, and has it judged). The world removes the token file at that load, before the CLI starts: the CLI's
    shell, which first tries to read the token and to stop the world's clock, finds no file, no token in its
    environment, and a 403; the run then passes ARE's judge."""
    from test_world_control import Sidecar

    from labkube.run_spec import RunSpec
    from labkube.store import write_model
    from labkube.task_card import TaskFamily
    from labkube.tasks import resolve_tasks
    from labkube.tasks.gaia2 import setup_world_env, world_python
    from labkube.tasks.gaia2.verdict_message import CONTROL_FILE_VARIABLE

    setup_world_env()
    (card,) = resolve_tasks("gaia2/execution_budget_email")
    spec = RunSpec(
        run_id="pod--claude-code--s0", campaign="pod", task=card.ref, task_path=card.path, model=MODELS["claude-code"],
        seed=0, family=TaskFamily.gaia2, agent="claude-code", sandbox="pod",
    )  # fmt: skip
    rd = tmp_path / "runs" / spec.run_id
    write_model(rd / "run.json", spec)
    control_file, token_file = tmp_path / "world-control" / "token", tmp_path / "gateway-volume" / "token"
    world = Sidecar(world_python(), tmp_path / "world-tmp", control_file)
    (tmp_path / "gateway-tmp").mkdir()
    try:
        probe = (
            f'cat {control_file} > probe-token.txt 2>&1; env > probe-env.txt; python3 -c "import urllib.request as u\n'
            f"try: u.urlopen(u.Request('{world.url}/clock/pause', data=b'{{}}', method='POST')); print(200)\n"
            "except Exception as e: print(getattr(e, 'code', e))\" > probe-pause.txt"
        )

        def hostile(path: str, body: dict[str, Any]) -> Reply:
            if any(
                isinstance(c, dict) and c.get("type") == "tool_result"
                for m in body.get("messages") or []
                if isinstance(m.get("content"), list)
                for c in m["content"]
            ):
                messages = body["messages"]
                trimmed = {**body, "messages": messages[:1] + messages[3:]}  # less the probe's call and result
                return gaia2_responder(path, trimmed)
            return Reply.tool_call("Bash", {"command": probe, "description": "probe"}, usage=USAGE)

        with FakeLLM(responder=hostile) as server:
            world_env = {"LABKUBE_WORLD_URL": world.url, CONTROL_FILE_VARIABLE: str(control_file)}
            gateway = subprocess.Popen(
                [sys.executable, "-P", "-m", "labkube", "gateway", "--run-dir", str(rd), "--token-file",
                 str(token_file)],
                env={**os.environ, **provider_env("claude-code", server), **world_env,
                     "HOME": str(tmp_path / "gateway-tmp"), "LABKUBE_RUN_SPEC": (rd / "run.json").read_text()},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert gateway.stdout is not None
                listening = gateway.stdout.readline()
                assert listening.startswith("LISTENING http://127.0.0.1:"), gateway.communicate(timeout=10)
                assert control_file.exists(), "the gateway read the token; the harness has yet to"
                agent_env = {
                    **world_env,
                    "LABKUBE_GATEWAY_URL": listening.split()[1],
                    "LABKUBE_GATEWAY_TOKEN_FILE": str(token_file),
                }
                ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path, env=agent_env, timeout=400)
            finally:
                gateway.send_signal(signal.SIGTERM)
                _, gateway_err = gateway.communicate(timeout=30)
            calls = [r for r in server.requests if r.path.endswith("/messages")]
    finally:
        world.stop()
    assert ran.returncode == 0, ran.stderr[-3000:] + gateway_err[-2000:]
    assert not control_file.exists(), "removed at the harness's load, before the CLI started"
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.details["gaia2"]["success"] is True, result.details["gaia2"]
    events = read_jsonl(rd / "transcript.jsonl")
    assert len([e for e in events if e["type"] == "model_call"]) == len(calls) == 4
    assert "control token" not in gateway_err
    workspace = rd / "workspace"
    assert "No such file" in (workspace / "probe-token.txt").read_text()
    assert (workspace / "probe-pause.txt").read_text().strip() == "403"
    assert "LABKUBE_WORLD_CONTROL" not in (workspace / "probe-env.txt").read_text()
