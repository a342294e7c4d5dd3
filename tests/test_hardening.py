"""The processes that hold API keys are not dumpable (labkube/hardening.py): `labkube agent` (also after it re-executes
itself with the keys on stdin), the agent zygote's forked children, and `labkube gateway`.

The kernel shows the flag only to the process itself (`prctl(PR_GET_DUMPABLE)`), and root, which CI runs as, reads
any process's /proc files whatever the flag. So each real command runs with a `sitecustomize` on PYTHONPATH that
adds an audit hook: at the process's first open of a file in its run folder (the first thing it does with the run)
it writes `DUMPABLE=<flag>` to stderr, and `EXEC` when it re-executes itself. A process that forgot the call says
`DUMPABLE=1`, as the control case shows."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkube.hardening import dumpable
from labkube.operator.agent_zygote import AgentZygote
from labkube.run_spec import RunSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")

WATCH = "LABKUBE_TEST_WATCH_DIR"
OBSERVER = f"""
import ctypes, os, sys

_watch = os.environ.get({WATCH!r})
if _watch:
    _libc = ctypes.CDLL(None)
    _said = []

    def _hook(event, args):
        if event == "os.exec":
            os.write(2, b"\\nEXEC\\n")
        elif event == "open" and not _said and not isinstance(args[0], int):
            path = os.fsdecode(os.fspath(args[0]))
            if path.startswith(_watch):
                _said.append(path)
                os.write(2, f"\\nDUMPABLE={{_libc.prctl(3, 0, 0, 0, 0)}} {{path}}\\n".encode())

    sys.addaudithook(_hook)
"""


@pytest.fixture
def observed(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes report their dumpable flag at their first open under `run/`."""
    site = tmp_path / "observer"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OBSERVER)
    (tmp_path / "run").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**env, "PYTHONPATH": str(site), WATCH: str(tmp_path / "run")}


def reports(stderr: str) -> list[str]:
    """The observer's lines, in order: `EXEC` and `DUMPABLE=N` (the file left out)."""
    return [m.group(0) for m in re.finditer(r"^(EXEC|DUMPABLE=\d)", stderr, re.MULTILINE)]


def labkube(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "labkube", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_helper_clears_the_flag_of_its_own_process() -> None:
    code = (
        "from labkube.hardening import dumpable, not_dumpable\n"
        "before = dumpable(); took = not_dumpable(); print(before, took, dumpable())"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "False"]
    assert dumpable() is True  # the call was the child's: this test process is left as it was


def test_the_observer_sees_a_process_that_did_not_call_it(tmp_path: Path, observed: dict[str, str]) -> None:
    """The control: a plain Python process opening a file of the run folder reports DUMPABLE=1."""
    (tmp_path / "run" / "run.json").write_text("{}")
    code = f"open({str(tmp_path / 'run' / 'run.json')!r}).read()"
    out = subprocess.run([sys.executable, "-P", "-c", code], env=observed, capture_output=True, text=True, timeout=60)
    assert reports(out.stderr) == ["DUMPABLE=1"], out.stderr


def test_labkube_agent_is_not_dumpable(tmp_path: Path, observed: dict[str, str]) -> None:
    ran = labkube(["agent", "--run-dir", str(tmp_path / "run")], observed, tmp_path)
    assert ran.returncode == 2 and "missing or invalid run spec" in ran.stderr  # it read the (empty) run folder
    assert reports(ran.stderr) == ["DUMPABLE=0"], ran.stderr


def test_labkube_agent_is_not_dumpable_after_it_moves_the_keys_to_stdin(
    tmp_path: Path, observed: dict[str, str]
) -> None:
    """In a pod the keys arrive in the environment; the agent re-executes itself without them, and an execve resets
    the flag: the new process clears it again before it reads the run."""
    env = {**observed, "OPENAI_API_KEY": "sk-labkube-canary-not-dumpable", "LABKUBE_STDIN_VARS": "OPENAI_API_KEY"}
    ran = labkube(["agent", "--run-dir", str(tmp_path / "run")], env, tmp_path)
    assert ran.returncode == 2 and "missing or invalid run spec" in ran.stderr
    assert reports(ran.stderr) == ["EXEC", "DUMPABLE=0"], ran.stderr


async def test_the_zygotes_forked_agent_is_not_dumpable(
    tmp_path: Path, observed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in observed.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    logs = tmp_path / "logs"
    logs.mkdir()
    zygote = AgentZygote()
    try:
        child = await zygote.spawn(run_dir, [], dict(os.environ), {"OPENAI_API_KEY": "sk-canary"}, logs)
        code = await asyncio.wait_for(child.wait(), timeout=120)
    finally:
        await zygote.close()
    stderr = (logs / "agent.stderr").read_text()
    assert code == 2 and "missing or invalid run spec" in stderr
    assert reports(stderr) == ["DUMPABLE=0"], stderr


def test_labkube_gateway_is_not_dumpable(tmp_path: Path, observed: dict[str, str]) -> None:
    # The run's spec comes in the sidecar's environment (LABKUBE_RUN_SPEC, as the pod manifest gives it); its model's
    # key is missing here, so the gateway is refused after reading its own state file (in a pod, in its own volume;
    # here under the watched folder), the first file it opens.
    spec = RunSpec(run_id="r", campaign="c", task="t", task_path=str(tmp_path), model="openai:gpt-5", seed=0)
    state = tmp_path / "run" / "gateway-state.json"
    env = {**observed, "LABKUBE_RUN_SPEC": spec.model_dump_json(), "LABKUBE_GATEWAY_STATE": str(state)}
    args = ["gateway", "--run-dir", str(tmp_path / "run"), "--token-file", str(tmp_path / "token")]
    ran = labkube(args, env, tmp_path)
    assert ran.returncode == 2 and "OPENAI_API_KEY is not set" in ran.stderr, ran.stderr
    assert reports(ran.stderr) == ["DUMPABLE=0"], ran.stderr


def test_the_agents_commands_are_left_dumpable(tmp_path: Path) -> None:
    """The flag is reset by execve: what a non-dumpable process runs is an ordinary process again."""
    code = textwrap.dedent("""
        import subprocess, sys
        from labkube.hardening import not_dumpable
        not_dumpable()
        probe = "from labkube.hardening import dumpable; print(dumpable())"
        print(subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True).stdout.strip())
    """)
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "True"
