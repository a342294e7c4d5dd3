"""Who may call what on a world (docs/gaia2-world-protocol.md, "Who may call what").

A run's agent reaches its world's tools; a vendor CLI does through the MCP bridge, which holds no token, and its shell
could reach the same port. The scenario, the clock, the judge, the oracle and ARE's agent answer only the run's
controller (the agent process), which holds the control token the world announced to the process that started it.

Real parts: world processes in ARE's virtualenv, the real HTTP client, the supervisor (`supervise_run`) lending a
warm world to a forked agent, which gets the token on stdin; for a pod, `world_server.py` run with the world
container's environment, `labkube agent` with the agent container's and the gateway sidecar's clock hooks (the
kubelet's side, its startup order and volumes, is tests/k8s/test_gaia2_pods.py's)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_warm_workers import gaia2_run, source

from labkube.agent.gateway import GatewayError, world_clock_hooks
from labkube.agent.gateway.sidecar import world_control_token
from labkube.operator.agent_keys import split_secrets
from labkube.operator.supervisor import supervise_run
from labkube.operator.warm import WarmWorker
from labkube.result import RunResult
from labkube.store import read_model
from labkube.tasks.gaia2 import (
    CONTROL_TOKEN_VARIABLE,
    WorldClient,
    WorldPool,
    WorldRequestError,
    start_world,
)
from labkube.tasks.gaia2.verdict_message import CONTROL_FILE_VARIABLE, ONE_SCENARIO_VARIABLE
from labkube.tasks.gaia2.world_process import SERVER_SCRIPT, AdoptedWorld

pytestmark = pytest.mark.gaia2


async def refused(call: object) -> str:
    with pytest.raises(WorldRequestError) as error:
        await call  # type: ignore[misc]
    assert error.value.status == 403, error.value
    return error.value.message


async def test_a_world_labkube_starts_answers_its_controllers_endpoints_only_to_its_token(are_python: Path) -> None:
    world = start_world(are_python)
    try:
        token = world.control_token
        assert token and len(token) >= 32
        environ = Path(f"/proc/{world.pid}/environ").read_bytes() + Path(f"/proc/{world.pid}/cmdline").read_bytes()
        assert token.encode() not in environ, "announced on its stdout pipe only"
        async with WorldClient(world.base_url) as agent, world.client() as controller:
            assert (await agent.health()).status == "ok"
            message = await refused(agent.load_scenario(source("time_door_code")))
            assert "POST /scenario is the run's controller's" in message
            await controller.load_scenario(source("time_door_code"))
            # The agent's side stays open: its tools, the time, its notifications.
            assert await agent.list_tools()
            assert (await agent.time()).paused is False
            await agent.pull_notifications()
            # The controller's side does not, whatever the agent tries: stop the clock, end the scenario and have it
            # judged, read the apps' state, load another scenario, run the oracle.
            for call in (
                agent.pause_clock(),
                agent.resume_clock("fixed", seconds=0),
                agent.finish(),
                agent.state(),
                agent.run_oracle(),
            ):
                await refused(call)
            async with WorldClient(world.base_url, control_token="not-" + token) as guessing:
                await refused(guessing.pause_clock())
            assert (await agent.time()).paused is False, "the refused pause did not stop the clock"
            async with httpx.AsyncClient(base_url=world.base_url) as raw:  # one kept-alive connection
                assert (await raw.post("/finish", json={"padding": "x" * 1000})).status_code == 403
                assert (await raw.post("/nope", json={"padding": "x" * 1000})).status_code == 404
                assert (await raw.get("/health")).status_code == 200, "a refused request's body was read with it"
            with socket.create_connection(("127.0.0.1", world.port), timeout=10) as sock:
                sock.sendall(b"POST /tools/call HTTP/1.1\r\nHost: w\r\nContent-Length: two\r\n\r\n")
                answer = b"".join(iter(lambda: sock.recv(65536), b""))  # the world closes this connection
            assert answer.startswith(b"HTTP/1.1 400") and b"Content-Length is not a number" in answer, answer
            await controller.pause_clock()
            assert (await agent.time()).paused is True
            await controller.resume_clock("fixed", seconds=1)
            assert (await controller.state())["apps"]
    finally:
        world.stop()


def _upload(port: int, head: bytes, total: int) -> tuple[bytes, int]:
    """A caller that sends `head` (announcing a `total`-byte body), reads the world's answer, then pushes the body
    until the world's closing of the connection stops it: the answer, and how much of the body got into the socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while not answer.endswith(b"}"):
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        sent, chunk = 0, b"a" * (1 << 20)
        try:
            while sent < total:
                sent += sock.send(chunk)
        except OSError:  # the world closed it
            pass
    return answer, sent


async def test_a_world_refuses_a_big_body_from_its_head_and_a_control_call_without_the_token_unread(
    are_python: Path,
) -> None:
    """Issue 41: the world read every request's body (any Content-Length) before the token check, so the agent's
    shell could make it hold what it liked. A control call without the token announcing 64 MiB is a 403 from its
    head, its connection closed with the body unsent; any request over MAX_BODY_BYTES is a 413 the same way; the
    clock is untouched, and the controller's calls work as before."""
    world = start_world(are_python)
    try:
        async with WorldClient(world.base_url) as agent, world.client() as controller:
            await controller.load_scenario(source("time_door_code"))
            total = 64 * 1024 * 1024
            head = f"POST /clock/pause HTTP/1.1\r\nHost: w\r\nContent-Length: {total}\r\n\r\n".encode()
            answer, sent = await asyncio.to_thread(_upload, world.port, head, total)
            assert answer.startswith(b"HTTP/1.1 403") and b"connection: close" in answer.lower(), answer[:300]
            assert sent < total, "the world read a refused caller's 64 MiB body"
            head = f"POST /tools/call HTTP/1.1\r\nHost: w\r\nContent-Length: {total}\r\n\r\n".encode()
            answer, sent = await asyncio.to_thread(_upload, world.port, head, total)
            assert answer.startswith(b"HTTP/1.1 413") and sent < total, answer[:300]
            assert (await agent.time()).paused is False, "the refused pause changed nothing"
            await controller.pause_clock()
            assert (await agent.time()).paused is True
    finally:
        world.stop()


async def test_each_forked_world_has_a_token_of_its_own(are_python: Path, tmp_path: Path) -> None:
    with WorldPool(are_python, max_idle=2, log_dir=tmp_path) as pool:
        pool.prestart(2)
        first, copy = sorted(pool.idle(), key=lambda w: isinstance(w, AdoptedWorld))
        assert isinstance(copy, AdoptedWorld) and first.control_token and copy.control_token
        assert first.control_token != copy.control_token
        assert copy.handoff().control_token == copy.control_token, "an adopter gets it with the world"
        async with WorldClient(copy.base_url, control_token=first.control_token) as wrong, copy.client() as right:
            await refused(wrong.load_scenario(source("time_door_code")))
            await right.load_scenario(source("time_door_code"))


async def test_a_world_started_without_labkubes_control_is_open_to_every_caller(are_python: Path) -> None:
    """A world started by hand, without LABKUBE_WORLD_CONTROL: it makes no token, and every endpoint answers."""
    env = {k: v for k, v in os.environ.items() if k != "LABKUBE_WORLD_CONTROL"}
    proc = subprocess.Popen(
        [str(are_python), str(SERVER_SCRIPT), "--port", "0"], stdout=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        assert line[0] == "LISTENING" and not any(f.startswith("control=") for f in line), line
        async with WorldClient(f"http://127.0.0.1:{line[1]}") as anyone:
            await anyone.load_scenario(source("time_door_code"))
            await anyone.pause_clock()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_the_supervisor_hands_a_runs_world_token_over_on_stdin_not_in_its_environment() -> None:
    env, secrets = split_secrets({"PATH": "/bin", "LABKUBE_WORLD_URL": "http://x", CONTROL_TOKEN_VARIABLE: "t"}, set())
    assert secrets == {CONTROL_TOKEN_VARIABLE: "t"} and CONTROL_TOKEN_VARIABLE not in env
    assert env["LABKUBE_WORLD_URL"] == "http://x"


async def test_a_run_lent_a_warm_world_controls_it_and_writes_its_token_nowhere(tmp_path: Path) -> None:
    """The forked agent loads the scenario and has it judged with the token it got on stdin (an oracle run passes
    only so); nothing the run leaves behind holds the token."""
    warm = WarmWorker()
    await warm.warm_up(1, tmp_path, worlds=1, fork_agents=True)
    try:
        assert warm.worlds is not None
        (world,) = warm.worlds.idle()
        token = world.control_token
        assert token
        result = await supervise_run(str(gaia2_run(tmp_path, "gaia2/time_door_code")), warm=warm)
        assert result.score == 1.0, result.error
    finally:
        await warm.close()
    leaks = [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == [], leaks


# -- a pod's world sidecar: its kubelet starts it, so its token goes to a file (operator/pod_manifest.py) -------------


class Sidecar:
    """`world_server.py` as a pod's world container runs it (operator/pod_manifest.py `_world_container`): the
    kubelet starts it, so no starter reads its stdout; HOME is its own volume (`world-tmp`), which outlives the
    process when the kubelet restarts it, and the token file is on the `world-control` volume."""

    def __init__(self, are_python: Path, home: Path, control_file: Path) -> None:
        home.mkdir(exist_ok=True)
        control_file.parent.mkdir(exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if k != CONTROL_FILE_VARIABLE},
            "HOME": str(home),
            "LABKUBE_WORLD_CONTROL": "1",
            CONTROL_FILE_VARIABLE: str(control_file),
            ONE_SCENARIO_VARIABLE: "1",
        }
        self.log = home.parent / f"{home.name}.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(are_python), str(SERVER_SCRIPT), "--port", "0"],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().decode()
        self.url = f"http://127.0.0.1:{self.line.split()[1]}"

    def stop(self) -> None:
        os.killpg(self.proc.pid, 9)
        self.proc.wait()


async def test_a_pods_world_sidecar_publishes_its_token_to_a_file_once_and_removes_it_when_used(
    are_python: Path, tmp_path: Path
) -> None:
    """The token is in the file before the world listens (the pod's startup probe, then the gateway and the harness,
    read it), never on stdout (the container's log); the first request that carries it removes it, so the agent's
    commands, which start after the harness has loaded the scenario, find none. A world the kubelet restarts
    publishes nothing again and stays closed: the agent's commands could read a second token."""
    home, control_file = tmp_path / "world-tmp", tmp_path / "world-control" / "token"
    world = Sidecar(are_python, home, control_file)
    try:
        assert re.fullmatch(r"LISTENING \d+\n", world.line), "no token in the container's log"
        token = control_file.read_text()
        assert len(token) >= 32 and stat.S_IMODE(control_file.stat().st_mode) == 0o600
        async with WorldClient(world.url) as agent, WorldClient(world.url, control_token=token) as harness:
            await refused(agent.load_scenario(source("time_door_code")))
            await refused(agent.pause_clock())
            assert control_file.exists(), "a request without the token leaves it for the harness"
            await harness.load_scenario(source("time_door_code"))
            assert not control_file.exists(), "used once: gone before the agent's commands run"
            await harness.pause_clock()
            assert (await agent.time()).paused is True
            await refused(agent.resume_clock("fixed", seconds=0))
    finally:
        world.stop()

    restarted = Sidecar(are_python, home, control_file)
    try:
        assert not control_file.exists(), "a restarted world publishes no second token"
        assert "restarted in its pod" in restarted.log.read_text()
        async with WorldClient(restarted.url) as agent, WorldClient(restarted.url, control_token=token) as old:
            await refused(agent.load_scenario(source("time_door_code")))
            await refused(old.load_scenario(source("time_door_code")))
            await refused(agent.pause_clock())
    finally:
        restarted.stop()


def agent_in_a_pod(run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`labkube agent` as a pod's agent container runs it (its environment from the pod manifest)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(run_dir)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def test_a_pods_harness_takes_the_world_token_from_the_file_and_its_commands_find_it_nowhere(
    are_python: Path, tmp_path: Path
) -> None:
    """The agent container's harness reads the token (an oracle run passes only with it: it loads the scenario and
    has the oracle judged), its world removes the file at that first use, and the token is in no file the run
    leaves; without the file, the harness refuses in one line and the world was never loaded."""
    control_file = tmp_path / "world-control" / "token"
    world = Sidecar(are_python, tmp_path / "world-tmp", control_file)
    try:
        token = control_file.read_text()
        run_dir = gaia2_run(tmp_path, "gaia2/time_door_code")
        ran = agent_in_a_pod(run_dir, {"LABKUBE_WORLD_URL": world.url, CONTROL_FILE_VARIABLE: str(control_file)})
        assert ran.returncode == 0, ran.stderr[-2000:]
        result = read_model(run_dir / "result.json", RunResult)
        assert result is not None and result.score == 1.0, result
        assert not control_file.exists()
        leaks = [p for p in run_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert leaks == [], leaks
    finally:
        world.stop()

    missing = gaia2_run(tmp_path, "gaia2/time_door_code", seed=1)
    ran = agent_in_a_pod(missing, {"LABKUBE_WORLD_URL": world.url, CONTROL_FILE_VARIABLE: str(control_file)})
    assert ran.returncode == 2, ran.stderr[-2000:]
    (line,) = [x for x in ran.stderr.splitlines() if x.strip()]
    assert line.startswith("error: the world sidecar left no control token at ") and str(control_file) in line


async def test_a_pods_gateway_stops_the_worlds_clock_with_the_token_and_keeps_it_for_its_restart(
    are_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway sidecar reads the token before it listens (before the agent container starts), keeps a copy in
    its own HOME (the world removes the file once the harness has used it), and pauses and resumes the clock around
    each model call with it; without either it refuses to start, in one line."""
    control_file = tmp_path / "world-control" / "token"
    world = Sidecar(are_python, tmp_path / "world-tmp", control_file)
    gateway_home = tmp_path / "gateway-tmp"
    gateway_home.mkdir()
    monkeypatch.setenv("HOME", str(gateway_home))
    monkeypatch.setenv(CONTROL_FILE_VARIABLE, str(control_file))
    try:
        token = world_control_token()
        assert token == control_file.read_text()
        async with WorldClient(world.url, control_token=token) as harness, WorldClient(world.url) as agent:
            await harness.load_scenario(source("time_door_code"))  # the file is gone from here on
            assert not control_file.exists() and world_control_token() == token, "the restarted gateway's copy"
            pause, resume = world_clock_hooks(world.url, None, world_control_token())
            assert pause is not None and resume is not None
            await pause()
            assert (await agent.time()).paused is True
            await resume(2.5)
            assert (await agent.time()).paused is False
            unknowing, _ = world_clock_hooks(world.url, None, None)
            assert unknowing is not None
            await refused(unknowing())
    finally:
        world.stop()
    (gateway_home / ".labkube-world-control").unlink()
    with pytest.raises(GatewayError, match="left no control token"):
        world_control_token()
