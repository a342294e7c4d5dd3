"""The local sandbox backend: the run's agent as a subprocess in its own process group."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkube.agent.containment import (
    TOKEN_VARIABLE,
    close_containment,
    join_cgroup,
    kill_pids,
    mark_processes,
    open_containment,
)
from labkube.operator.agent_keys import secret_names, split_secrets
from labkube.operator.agent_zygote import AgentZygote, ZygoteChild, ZygoteError

AgentProcess = asyncio.subprocess.Process | ZygoteChild


@dataclass
class SandboxExit:
    returncode: int
    timed_out: bool


def agent_command(run_dir: Path, *extra: str) -> list[str]:
    # -P: never put the working directory on sys.path (a checkout's `operator/` folder
    # would shadow the standard library's module).
    return [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(run_dir), *extra]


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run_local(
    run_dir: Path,
    *extra: str,
    deadline_s: float | None,
    grace_s: float = 15.0,
    env: dict[str, str] | None = None,
    memory_gb: float | None = None,
    cpus: float | None = None,
    zygote: AgentZygote | None = None,
    deadline_now: Callable[[], float | None] | None = None,
) -> SandboxExit:
    """Run `labkube agent` for `run_dir`; past `deadline_s`, SIGTERM the group, then SIGKILL it. Every process the
    run started is gone before this returns (`agent/containment.py`: the run's cgroup, with `memory_gb` and
    `cpus` as its limits where the machine allows, else its process tree and token). With `zygote`, the agent is
    forked from that warm process (`operator/agent_zygote.py`) instead of started as a fresh interpreter; if the
    zygote cannot, it is started as usual. With `deadline_now`, the deadline is asked again when it passes (a person
    may have extended the run's time meanwhile: `labkube runs extend`)."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    box = await asyncio.to_thread(open_containment, run_dir, memory_gb, cpus)
    # What carries the run's token starts from here on (open_containment ended what an earlier start left): the
    # search for it at the end skips older processes, whose environments are most of a scan's reads, and, where the
    # pids handed out since can be bounded, does not read them at all.
    since = mark_processes()
    child_env, secrets = split_secrets({**os.environ, **(env or {})}, secret_names(run_dir))
    child_env = {**child_env, TOKEN_VARIABLE: box.token}
    try:
        proc: AgentProcess | None = None
        if zygote is not None:
            with contextlib.suppress(ZygoteError):
                proc = await zygote.spawn(run_dir, list(extra), child_env, secrets, logs)
        if proc is None:
            proc = await _start_agent(run_dir, extra, child_env, secrets, logs)
        box = join_cgroup(box, proc.pid)
        try:
            return await _wait_agent(proc, deadline_s, grace_s, deadline_now)
        finally:
            if zygote is not None and isinstance(proc, ZygoteChild):
                zygote.forget(proc.pid)
    finally:
        await asyncio.to_thread(close_containment, run_dir, box, since)


async def _start_agent(
    run_dir: Path, extra: tuple[str, ...], child_env: dict[str, str], secrets: dict[str, str], logs: Path
) -> asyncio.subprocess.Process:
    with (logs / "agent.stdout").open("ab") as out, (logs / "agent.stderr").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *agent_command(run_dir, *extra),
            cwd=run_dir,
            stdin=asyncio.subprocess.PIPE,
            stdout=out,
            stderr=err,
            start_new_session=True,
            env={**child_env, "LABKUBE_KEYS_ON_STDIN": "1"},
        )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(secrets).encode() + b"\n")
    await proc.stdin.drain()
    proc.stdin.close()
    return proc


async def _wait_agent(
    proc: AgentProcess, deadline_s: float | None, grace_s: float, deadline_now: Callable[[], float | None] | None
) -> SandboxExit:
    timed_out = False
    try:
        while True:
            try:
                await asyncio.wait_for(proc.wait(), timeout=deadline_s)
                break
            except TimeoutError:
                deadline_s = deadline_now() if deadline_now is not None else None
                if deadline_s is None or deadline_s <= 0:
                    raise
    except TimeoutError:
        timed_out = True
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=grace_s)
        except TimeoutError:
            await _kill_agent_tree(proc)
    except asyncio.CancelledError:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=grace_s)
        finally:
            await _kill_agent_tree(proc)
        raise
    # Whatever the agent's commands left running dies with the run.
    _signal_group(proc.pid, signal.SIGKILL)
    return SandboxExit(proc.returncode if proc.returncode is not None else -9, timed_out)


async def _kill_agent_tree(proc: AgentProcess) -> None:
    """The agent and everything below it: as subreaper it holds every orphan of the run, which would go to init
    (and out of reach of a process-tree search) if the agent died first."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)  # no new children while its tree is read
        await asyncio.to_thread(kill_pids, root=proc.pid)
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()
