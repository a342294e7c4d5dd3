"""Who may call what on a world (docs/gaia2-world-protocol.md, "Who may call what").

A run's agent reaches its world's tools; a vendor CLI does through the MCP bridge, which holds no token, and its shell
could reach the same port. The scenario, the clock, the judge, the oracle and ARE's agent answer only the run's
controller (the agent process), which holds the control token the world announced to the process that started it.

Real parts: world processes in ARE's virtualenv, the real HTTP client, the supervisor (`supervise_run`) lending a
warm world to a forked agent, which gets the token on stdin."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from test_warm_workers import gaia2_run, source

from labkube.operator.agent_keys import split_secrets
from labkube.operator.supervisor import supervise_run
from labkube.operator.warm import WarmWorker
from labkube.tasks.gaia2 import (
    CONTROL_TOKEN_VARIABLE,
    WorldClient,
    WorldPool,
    WorldRequestError,
    start_world,
)
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
    """A pod's world sidecar is started by its kubelet, not by labkube: it makes no token, and every endpoint answers
    (the pod's agent container shares its loopback: docs/kubernetes.md says what that leaves open)."""
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
