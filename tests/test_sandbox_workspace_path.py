"""Inside the run's sandbox the workspace is at a fixed path, /workspace (labkube/sandbox.py's SANDBOX_WORKSPACE):
the agent's commands and jobs run there, never see its host path, and the file tools, the grader and the prompt
agree with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinytask import make_tiny_task

from labkube.agent.jobs import JobManager
from labkube.agent.prompts import initial_messages
from labkube.agent.rg.tools import ToolContext, bash, check_async, read_file, start_async
from labkube.agent.rg.workspace import Workspace
from labkube.agent.run_sandbox import run_room
from labkube.run_spec import RunSpec
from labkube.sandbox import SANDBOX_WORKSPACE, SandboxMode, SandboxPolicy, sandbox_argv, sandbox_problem

needs_sandbox = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no local sandbox here: {sandbox_problem()}")


def sandboxed(tmp_path: Path) -> tuple[ToolContext, Path]:
    ws = tmp_path / "campaign" / "runs" / "r" / "workspace"
    ws.mkdir(parents=True)
    (ws / "notes.txt").write_text("the agent's notes\n")
    spec = RunSpec(run_id="r", campaign="c", task="t", task_path=str(tmp_path / "task"), model="noop", seed=0)
    ctx = ToolContext(workspace=Workspace(ws), jobs=JobManager(ws.parent / "jobs"), room=run_room(spec, ws.parent, ws))
    return ctx, ws


@needs_sandbox
async def test_a_command_runs_in_workspace_and_never_sees_the_host_path(tmp_path: Path) -> None:
    ctx, ws = sandboxed(tmp_path)
    said = await bash(ctx)({"command": "pwd; cat /workspace/notes.txt; echo $PWD; realpath ."})
    assert said.splitlines()[:4] == ["/workspace", "the agent's notes", "/workspace", "/workspace"], said
    for host in (ws, ws.parent, tmp_path / "campaign"):
        probe = await bash(ctx)({"command": f"test -e {host} && echo visible || echo hidden"})
        assert probe.startswith("hidden"), (host, probe)


@needs_sandbox
async def test_a_background_job_runs_under_workspace_in_its_workdir(tmp_path: Path) -> None:
    ctx, ws = sandboxed(tmp_path)
    (ws / "sub").mkdir()
    said = await start_async(ctx)({"command": "pwd > where.txt", "workdir": "sub"})
    assert said.startswith("started job1") and " in sub;" in said, said
    report = await check_async(ctx)({"job_id": "job1", "wait_minutes": 0.5})
    assert "exited with code 0" in report, report
    assert (ws / "sub" / "where.txt").read_text().strip() == "/workspace/sub"
    said = await start_async(ctx)({"command": "pwd > where.txt", "workdir": "/workspace/sub"})
    assert " in sub;" in said, said


@needs_sandbox
async def test_the_file_tools_take_workspace_paths(tmp_path: Path) -> None:
    ctx, _ = sandboxed(tmp_path)
    said = await read_file(ctx)({"path": "/workspace/notes.txt"})
    assert "the agent's notes" in said, said
    assert Workspace(tmp_path).rel("/workspace/a/../b.txt") == "b.txt"


@needs_sandbox
async def test_the_grader_follows_the_agents_links_to_workspace(tmp_path: Path) -> None:
    """A link the agent made to /workspace/... leads, in the grader's sandbox, where it led in the agent's."""
    from labkube.tasks import load_task
    from labkube.tasks.grading import grade_workspace

    ctx, ws = sandboxed(tmp_path)
    said = await bash(ctx)({"command": "echo 7 > real.txt; ln -s /workspace/real.txt result.txt; cat result.txt"})
    assert said.startswith("7"), said
    assert (ws / "result.txt").readlink() == Path("/workspace/real.txt")
    card = load_task(str(make_tiny_task(tmp_path, [])))
    log = tmp_path / "grader.log"
    outcome = grade_workspace(card, ws, tmp_path / "scratch", log, sandboxed=True)
    assert outcome.score is not None and outcome.subtasks[0].raw == 7.0, log.read_text()


def test_the_prompt_names_workspace_when_sandboxed(tmp_path: Path) -> None:
    from labkube.tasks import load_task

    card = load_task(str(make_tiny_task(tmp_path, [])))
    host = tmp_path / "campaign" / "runs" / "r" / "workspace"
    spec = RunSpec(run_id="r", campaign="c", task="t", task_path=card.path, model="noop", seed=0)
    assert spec.sandbox is SandboxMode.bwrap
    text = "\n".join(m.content or "" for m in initial_messages(card, spec, host))
    assert f"Your workspace is {SANDBOX_WORKSPACE} " in text and str(host) not in text
    bare = spec.model_copy(update={"sandbox": SandboxMode.none})
    text = "\n".join(m.content or "" for m in initial_messages(card, bare, host))
    assert f"Your workspace is {host} " in text


def test_the_gaia_attachment_is_named_under_workspace_when_sandboxed(tmp_path: Path) -> None:
    from labkube.tasks import resolve_tasks

    card = next(c for c in resolve_tasks("gaia/demo") if c.gaia is not None and c.gaia.file_name)
    host = tmp_path / "runs" / "r" / "workspace"
    spec = RunSpec(run_id="r", campaign="c", task="t", task_path=card.path, model="noop", seed=0)
    text = "\n".join(m.content or "" for m in initial_messages(card, spec, host))
    assert f"/workspace/{card.gaia.file_name}" in text and str(host) not in text


def test_the_policy_binds_the_workspace_at_workspace_and_translates_the_cwd(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    policy = SandboxPolicy(workspace=ws, cwd=ws / "sub")
    argv = sandbox_argv(policy, ["true"], bwrap="bwrap")
    assert argv[argv.index("--chdir") + 1] == "/workspace/sub"
    assert ["--bind", str(ws), "/workspace"] == argv[argv.index(str(ws)) - 1 : argv.index(str(ws)) + 2]
    grader = SandboxPolicy(workspace=ws, workspace_writable=False, cwd=tmp_path)
    argv = sandbox_argv(grader, ["true"], bwrap="bwrap")
    assert ["--ro-bind", str(ws), "/workspace"] == argv[argv.index(str(ws)) - 1 : argv.index(str(ws)) + 2]
    assert argv[argv.index("--chdir") + 1] == str(tmp_path)


def test_transcripts_and_the_audit_read_workspace_paths_as_the_tasks() -> None:
    from labkube.agent.scaffolds.cli_events import relative
    from labkube.integrity.evidence import normpath

    assert normpath("/workspace/grading/grade.sh") == "grading/grade.sh"
    assert normpath("/workspace/./a/../logs/x.log") == "logs/x.log"
    assert normpath("/etc/passwd") == "/etc/passwd"
    host = Path("/srv/campaign/runs/r/workspace")
    assert relative("/workspace/src/train.py", host) == "src/train.py"
    assert relative("/workspace", host) == "."
    assert relative("/elsewhere/x", host) == "/elsewhere/x"
