"""`labkube agent` and the agent zygote's forked children are one function, the agent room's `agent_process`
(agent/harness/sandbox_process.py; #27 item 2): for the same run directory and options both end with the same exit code
and the same `error: ...` line, the last line of the run's agent.stderr that the supervisor reports.

Real parts: the `labkube agent` process and a real zygote process forking the child; no model is called (each case
ends before the agent's loop)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkube.agent.harness.sandbox_process import BAD_INPUT_EXIT
from labkube.operator.agent_zygote import AgentZygote, ZygoteError, agent_options


def command_ends(run_dir: Path, args: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=run_dir,
    )
    return proc.returncode, proc.stderr.strip().splitlines()[-1]


async def forked_ends(run_dir: Path, args: list[str]) -> tuple[int, str]:
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    zygote = AgentZygote()
    try:
        child = await zygote.spawn(run_dir, args, dict(os.environ), {}, logs)
        code = await asyncio.wait_for(child.wait(), timeout=120)
    finally:
        await zygote.close()
    return code, (logs / "agent.stderr").read_text().strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--finalize", "bogus"], "error: --finalize: unknown reason 'bogus'"),
        ([], "error: {run_dir}/run.json: missing or invalid run spec"),
    ],
)
async def test_a_forked_agent_refuses_what_the_command_refuses_in_the_same_words(
    tmp_path: Path, args: list[str], line: str
) -> None:
    by_command, by_fork = tmp_path / "command", tmp_path / "fork"
    by_command.mkdir()
    by_fork.mkdir()
    assert command_ends(by_command, args) == (BAD_INPUT_EXIT, line.format(run_dir=by_command))
    assert await forked_ends(by_fork, args) == (BAD_INPUT_EXIT, line.format(run_dir=by_fork))


def test_the_zygote_forks_only_the_options_the_sandbox_gives() -> None:
    assert agent_options([]) == (False, None)
    assert agent_options(["--resume"]) == (True, None)
    assert agent_options(["--finalize", "time"]) == (False, "time")
    for unknown in (["--finalize"], ["--verbose"]):  # the sandbox then starts `labkube agent`, whose parser says why
        with pytest.raises(ZygoteError):
            agent_options(unknown)
