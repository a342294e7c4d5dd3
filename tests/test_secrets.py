"""API keys never appear in transcripts, logs, results, metrics or status; file tools stay in the workspace.

A real local campaign runs through the CLI (`labkube run ... --model openai:gpt-5 --metrics-port N`)
against the fake OpenAI server, with a distinctive key planted in its environment. Its agent is
scripted to try to exfiltrate the key (`env`, `printenv`, `/proc/self/environ`, `os.environ`,
dumps into a workspace file, a run log and a background job's log), a second run fails with
401, and a third reads the agent process's own environment through `/proc/$PPID/environ`.
The metrics endpoint is scraped while the campaign runs. Afterwards every file under the
campaign directory (git objects decompressed), the CLI's output, `status`/`report` and the
scraped metrics are searched for the key, and the fake server must have received that key.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import stat
import subprocess
import sys
import time
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakellm import FakeLLM, Recorded, Reply
from tinytask import GRADE_SH, make_run_dir, make_tiny_task

from labkube.agent.jobs import JobManager
from labkube.agent.rg.tool import ToolError
from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.workspace import Workspace

RUNS = ("tiny-task--openai-gpt-5--s0", "tiny-task--openai-gpt-5--s1", "tiny-task--openai-gpt-5--s2")
EXFIL, AUTH_FAIL, PARENT_ENV = RUNS

EXFILTRATION = [
    Reply.tool_call("bash", {"command": "env"}),
    Reply.tool_call("bash", {"command": "printenv OPENAI_API_KEY; echo exit=$?"}),
    Reply.tool_call("bash", {"command": "cat /proc/self/environ | tr '\\0' '\\n'"}),
    Reply.tool_call("bash", {"command": "python -c 'import os; print(dict(os.environ))'"}),
    Reply.tool_call("python", {"code": "import os\nprint(os.environ)\nprint(os.environ.get('OPENAI_API_KEY'))"}),
    Reply.tool_call(
        "bash", {"command": "env > leaked_env.txt; env > ../logs/leaked.log; cat leaked_env.txt >> notes.txt"}
    ),
    Reply.tool_call("start_async", {"command": "env; printenv OPENAI_API_KEY"}),
    Reply.tool_call("bash", {"command": "sleep 0.3; echo 5 > result.txt"}),
    Reply.tool_call("check_async", {"job_id": "job1"}),
    Reply.tool_call("read_file", {"path": "leaked_env.txt"}),
    Reply.tool_call("end_task", {"summary": "done"}),
]
PARENT = "cat /proc/$PPID/environ | tr '\\0' '\\n'; echo 4 > result.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unpack(path: Path, data: bytes) -> bytes:
    """A loose git object's content (zlib), so a committed key cannot hide in compression: the agent's repository's
    (`workspace/.git`) and labkube's record's (`workspace.git`, where labkube's own `git add` stores the files)."""
    if any(part.endswith(".git") for part in path.parts) and "objects" in path.parts:
        try:
            return data + zlib.decompress(data)
        except zlib.error:
            return data
    return data


def files_holding(root: Path, needle: str, skip: tuple[str, ...] = ()) -> list[str]:
    found = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink() or not p.is_file() or rel.startswith(skip):
            continue
        if needle.encode() in unpack(p, p.read_bytes()):
            found.append(rel)
    return found


@dataclass
class LeakRun:
    key: str
    out: Path
    returncode: int
    stdout: str
    stderr: str
    scraped: list[str] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-P", "-m", "labkube", *args],
            cwd=self.out.parent,
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory: pytest.TempPathFactory) -> LeakRun:
    work = tmp_path_factory.mktemp("secrets")
    key = f"sk-labkube-canary-{secrets.token_hex(16)}"
    task = make_tiny_task(work, [])
    # A grader that logs its environment, as some do.
    grade = task / "grading" / "grade.sh"
    grade.write_text(GRADE_SH.replace("set -euo pipefail\n", "set -euo pipefail\nenv | sort\n"))
    port = free_port()
    out = work / "camp"
    masked = f"{key[:8]}{'*' * 20}{key[-4:]}"  # how OpenAI quotes a wrong key
    with FakeLLM() as server:
        server.script(
            *EXFILTRATION,
            Reply.error(401, message=f"Incorrect API key provided: {masked}."),
            Reply.tool_call("bash", {"command": PARENT}),
            Reply.tool_call("end_task", {"summary": "done"}),
        )
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "COLUMNS": "200",
            "OPENAI_API_KEY": key,
            "OPENAI_BASE_URL": server.base_url + "/v1",
        }
        argv = [sys.executable, "-P", "-m", "labkube", "run", str(task), "--model", "openai:gpt-5"]
        argv += ["--seeds", "3", "--concurrency", "1", "--out", str(out), "--metrics-port", str(port)]
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        scraped = []
        deadline = time.monotonic() + 300
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                        scraped.append(resp.read().decode())
                except OSError:
                    pass
                time.sleep(0.25)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        requests = server.requests
    return LeakRun(key, out, proc.returncode, stdout, stderr, scraped, requests)


@pytest.mark.slow
def test_the_planted_key_reached_the_model_api(leak_run: LeakRun) -> None:
    calls = [r for r in leak_run.requests if r.path == "/v1/responses"]
    assert len(calls) == len(EXFILTRATION) + 3, [r.path for r in leak_run.requests]
    assert {r.headers.get("authorization") for r in calls} == {f"Bearer {leak_run.key}"}


@pytest.mark.slow
def test_the_exfiltration_attempts_ran(leak_run: LeakRun) -> None:
    run = leak_run.out / "runs" / EXFIL
    assert "OPENAI_BASE_URL=" in (run / "workspace" / "leaked_env.txt").read_text()
    # the run's own folder is outside the agent's sandbox (docs/sandbox.md): `../logs` is not there to write into
    assert not (run / "logs" / "leaked.log").exists()
    assert "PATH=" in (run / "jobs" / "job1.log").read_text()
    assert "PATH=" in (run / "logs" / "grader.log").read_text()
    transcript = (run / "transcript.jsonl").read_text()
    assert transcript.count('"type": "tool_call"') == len(EXFILTRATION)
    assert "environ({" in transcript and "OPENAI_BASE_URL" in transcript
    assert '"ok": false' not in transcript


@pytest.mark.slow
def test_no_file_of_the_campaign_holds_the_key(leak_run: LeakRun) -> None:
    """Transcripts, conversation, checkpoint, status, result, logs, workspace, integrity.json, metrics."""
    names = {p.name for p in (leak_run.out / "runs" / EXFIL).iterdir()}
    assert {"transcript.jsonl", "conversation.jsonl", "checkpoint.json", "status.json", "result.json"} <= names
    assert {"integrity.json", "logs", "workspace", "jobs"} <= names
    assert (leak_run.out / "metrics").is_dir() and (leak_run.out / "campaign.json").is_file()
    skip = (f"runs/{PARENT_ENV}/",)  # see test_commands_cannot_read_the_key_from_the_agent_process
    for needle in (leak_run.key, leak_run.key.removeprefix("sk-labkube-canary-")):
        assert files_holding(leak_run.out, needle, skip) == []


@pytest.mark.slow
def test_cli_output_status_report_and_metrics_hold_no_key(leak_run: LeakRun) -> None:
    scraped = "\n".join(leak_run.scraped)
    assert "labkube_run_tool_calls_total" in scraped and "labkube_campaign_runs" in scraped
    outputs = [leak_run.stdout, leak_run.stderr, scraped]
    for args in (["status", str(leak_run.out)], ["report", str(leak_run.out), "--format", "json"]):
        proc = leak_run.cli(*args)
        assert proc.returncode == 0, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    for text in outputs:
        assert leak_run.key not in text
        assert leak_run.key.removeprefix("sk-labkube-canary-") not in text


@pytest.mark.slow
def test_a_401_run_fails_with_reason_auth(leak_run: LeakRun) -> None:
    import json

    assert leak_run.returncode == 1, leak_run.stderr
    assert f"run {AUTH_FAIL} model_error:" in leak_run.stderr and "authentication failed" in leak_run.stderr
    result = json.loads((leak_run.out / "runs" / AUTH_FAIL / "result.json").read_text())
    assert result["status"] == "Failed" and result["stop_reason"] == "auth"
    status = json.loads((leak_run.out / "runs" / AUTH_FAIL / "status.json").read_text())
    assert status["phase"] == "Failed"


@pytest.mark.slow
def test_commands_cannot_read_the_key_from_the_agent_process(leak_run: LeakRun) -> None:
    run = leak_run.out / "runs" / PARENT_ENV
    assert "/proc/$PPID/environ" in (run / "transcript.jsonl").read_text()
    assert files_holding(run, leak_run.key) == []


# -- a key in a variable of the campaign's choosing ---------------------------------------------


async def test_a_key_in_a_custom_variable_is_hidden_from_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labkube.agent.harness.entrypoint import run_agent

    key = f"sk-labkube-canary-{secrets.token_hex(16)}"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("LAB_OPENAI_TOKEN", key)
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
        server.script(
            Reply.tool_call("bash", {"command": "env; echo 5 > result.txt"}),
            Reply.tool_call("end_task", {"summary": "done"}),
        )
        task = make_tiny_task(tmp_path, [])
        run_dir = make_run_dir(tmp_path, task, model="openai:gpt-5", api_key_env={"openai:gpt-5": "LAB_OPENAI_TOKEN"})
        await run_agent(run_dir)
    assert {r.headers.get("authorization") for r in server.requests} == {f"Bearer {key}"}
    assert "PATH=" in (run_dir / "transcript.jsonl").read_text()
    assert files_holding(run_dir, key) == []


def test_a_pods_keys_from_secrets_leave_the_agents_environment(tmp_path: Path) -> None:
    """In a pod the keys arrive as environment variables from Secrets (named in LABKUBE_STDIN_VARS); the
    agent moves them to stdin and re-execs, so its commands find no key in /proc/<agent>/environ."""
    key = f"sk-labkube-canary-{secrets.token_hex(16)}"
    task = make_tiny_task(tmp_path, [])
    # a pod's container is the agent's room (no local sandbox in it), so its commands do see the agent process
    run_dir = make_run_dir(tmp_path, task, model="openai:gpt-5", sandbox="pod")
    with FakeLLM() as server:
        server.script(
            Reply.tool_call("bash", {"command": PARENT.replace("echo 4", "echo 5")}),
            Reply.tool_call("end_task", {"summary": "done"}),
        )
        env = {
            **os.environ,
            "OPENAI_API_KEY": key,
            "OPENAI_BASE_URL": server.base_url + "/v1",
            "LABKUBE_STDIN_VARS": "OPENAI_API_KEY",
        }
        ran = subprocess.run(
            [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(run_dir)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        auth = {r.headers.get("authorization") for r in server.requests}
    assert ran.returncode == 0, ran.stderr
    assert auth == {f"Bearer {key}"}  # the key still reached the model API
    transcript = (run_dir / "transcript.jsonl").read_text()
    assert "OPENAI_BASE_URL=" in transcript  # the command did read the agent's environ
    assert key not in transcript and "OPENAI_API_KEY=" not in transcript
    assert files_holding(run_dir, key) == []


# -- file tools and the world outside the workspace ----------------------------------------------

SECRET = f"outside-secret-{secrets.token_hex(8)}"


@dataclass
class Sandbox:
    base: Path
    ws: Path
    tools: dict[str, Any]
    jobs: JobManager

    def outside(self) -> dict[str, tuple]:
        """Everything outside the workspace (and the job logs), with content and mode."""
        out = {}
        for p in sorted(self.base.rglob("*")):
            rel = p.relative_to(self.base).as_posix()
            if rel == "ws" or rel.startswith(("ws/", "jobs")):
                continue
            st = os.lstat(p)
            content = p.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(p) if p.is_symlink() else None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), content)
        return out


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    base = tmp_path.resolve()
    ws = base / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "notes.txt").write_text("inside\n")
    (base / "secret.txt").write_text(f"{SECRET}\n")
    (base / "outside").mkdir()
    (base / "outside" / "inner.txt").write_text(f"{SECRET} inner\n")
    os.symlink(base / "secret.txt", ws / "link_file")
    os.symlink(base / "outside", ws / "link_dir")
    os.symlink(base / "created.txt", ws / "dangling")
    os.symlink("../../secret.txt", ws / "sub" / "relative_link")
    jobs = JobManager(base / "jobs")
    ctx = ToolContext(workspace=Workspace(ws), jobs=jobs)
    return Sandbox(base, ws, {t.name: t for t in research_tools(ctx)}, jobs)


def call(sb: Sandbox, name: str, args: dict[str, Any]) -> str:
    args = {k: v.replace("BASE", str(sb.base)) if isinstance(v, str) else v for k, v in args.items()}
    try:
        return asyncio.run(sb.tools[name](args))
    except ToolError as exc:
        return f"ToolError: {exc}"


def patch(*lines: str) -> dict[str, str]:
    return {"patch": "\n".join(["*** Begin Patch", *lines, "*** End Patch"])}


ESCAPES = [
    ("read_file", {"path": "../secret.txt"}),
    ("read_file", {"path": "BASE/secret.txt"}),
    ("read_file", {"path": "link_file"}),
    ("read_file", {"path": "link_dir/inner.txt"}),
    ("read_file", {"path": "sub/relative_link"}),
    ("read_file", {"path": "sub/../../secret.txt"}),
    ("read_file", {"path": "link_dir/../secret.txt"}),
    ("search", {"pattern": "outside", "path": ".."}),
    ("search", {"pattern": "outside", "path": "link_dir"}),
    ("search", {"pattern": "outside", "path": "link_file"}),
    ("search", {"pattern": "outside", "path": "BASE"}),
    pytest.param(
        "search",
        {"pattern": "outside"},
        id="search-workspace-with-symlinks",
    ),
    ("write_file", {"path": "link_file", "content": "overwritten"}),
    ("write_file", {"path": "dangling", "content": "created"}),
    ("write_file", {"path": "../created.txt", "content": "created"}),
    ("write_file", {"path": "link_dir/new.txt", "content": "created"}),
    ("write_file", {"path": "BASE/outside/inner.txt", "content": "overwritten"}),
    ("apply_patch", patch("*** Update File: link_file", "@@", "-x", "+y")),
    ("apply_patch", patch("*** Add File: dangling", "+created")),
    ("apply_patch", patch("*** Add File: link_dir/new.txt", "+created")),
    ("apply_patch", patch("*** Delete File: ../secret.txt")),
    ("apply_patch", patch("*** Delete File: link_file")),
    ("apply_patch", patch("*** Update File: notes.txt", "*** Move to: ../moved.txt")),
    ("apply_patch", patch("*** Update File: sub/relative_link", "*** Move to: stolen.txt")),
]


def escape_id(value: Any) -> str:
    if isinstance(value, dict):
        text = value.get("path") or value.get("patch", "").split("\n", 1)[-1].split("\n")[0] or "."
        return text.replace("BASE", "<abs>")
    return str(value)


@pytest.mark.parametrize(("name", "args"), ESCAPES, ids=escape_id)
def test_file_tools_cannot_reach_outside_the_workspace(sandbox: Sandbox, name: str, args: dict[str, Any]) -> None:
    before = sandbox.outside()
    out = call(sandbox, name, args)
    assert SECRET not in out, out
    assert sandbox.outside() == before, "a file outside the workspace changed or appeared"
    assert not (sandbox.ws / "stolen.txt").exists()


def test_bash_commands_see_no_api_key_variables(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"sk-labkube-canary-{secrets.token_hex(16)}"
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_COMPATIBLE_API_KEY"):
        monkeypatch.setenv(var, key)
    for name, args in [
        ("bash", {"command": "env; cat /proc/self/environ"}),
        ("python", {"code": "import os; print(os.environ)"}),
    ]:
        out = call(sandbox, name, args)
        assert "PATH=" in out or "'PATH'" in out
        assert key not in out
