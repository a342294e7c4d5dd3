"""The stand-in a local Ray head's raylet runs for its dashboard and runtime-env agents (operator/ray_agent_standin.py):
it publishes the ports the raylet waits for as Ray's agents do, and lives exactly as long as the raylet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkube.operator.lean_head import STANDIN, standin_agents

NODE = "ab" * 28


def start_under_a_parent(tmp_path: Path, role: str) -> tuple[subprocess.Popen[bytes], int]:
    """The stand-in as a raylet starts it: a child of a process (here a shell that waits on stdin), with Ray's agent
    options; returns the parent and the stand-in's pid."""
    command = [sys.executable, "-I", "-S", str(STANDIN), role, f"--session-dir={tmp_path}", f"--node-id={NODE}"]
    command.append("--node-ip-address=127.0.0.1")
    script = f"{subprocess.list2cmdline(command)} & echo $!; read _"
    parent = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def published(tmp_path: Path, name: str) -> int:
    path = tmp_path / f"{name}_{NODE}"
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was not published"
        time.sleep(0.01)
    return int(path.read_text())


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.01)
    return False


def test_the_dashboard_standin_publishes_no_services_and_ends_with_its_parent(tmp_path: Path) -> None:
    parent, pid = start_under_a_parent(tmp_path, "dashboard")
    try:
        ports = [published(tmp_path, name) for name in ("metrics_agent_port", "metrics_export_port")]
        ports.append(published(tmp_path, "dashboard_agent_listen_port"))
        assert ports == [-1, -1, -1]  # what Ray's own agent publishes for a service it does not run
        assert not list(tmp_path.glob("*.standin")), "a port file was left half-written"
        time.sleep(0.2)
        assert Path(f"/proc/{pid}").exists()  # it stays while its parent lives
    finally:
        parent.kill()
        parent.wait()
    assert gone(pid), "the stand-in outlived its raylet"


def test_the_runtime_env_standin_listens_and_closes_what_connects(tmp_path: Path) -> None:
    parent, pid = start_under_a_parent(tmp_path, "runtime_env")
    try:
        port = published(tmp_path, "runtime_env_agent_port")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"POST /get_or_create_runtime_env HTTP/1.1\r\n\r\n")
            try:
                answer = conn.recv(100)
            except ConnectionResetError:  # closed before it read the request
                answer = b""
            assert answer == b""  # closed without an answer: a runtime environment cannot be made here
    finally:
        os.kill(parent.pid, 9)
        parent.wait()
    assert gone(pid), "the stand-in outlived its raylet"


def test_the_raylets_agent_commands_become_the_standin_with_rays_options() -> None:
    agent = subprocess.list2cmdline([sys.executable, "-u", "/ray/dashboard/agent.py", "--node-id=n", "--log-dir=/l"])
    runtime = subprocess.list2cmdline([sys.executable, "-u", "/ray/runtime_env/agent/main.py", "--node-id=n"])
    raylet = ["raylet", "--head", f"--dashboard_agent_command={agent}", f"--runtime_env_agent_command={runtime}"]
    command = standin_agents(raylet)
    assert command[:2] == ["raylet", "--head"]
    standin = [sys.executable, "-I", "-S", str(STANDIN)]

    dashboard = subprocess.list2cmdline([*standin, "dashboard", "--node-id=n", "--log-dir=/l"])
    assert command[2] == f"--dashboard_agent_command={dashboard}"
    runtime_env = subprocess.list2cmdline([*standin, "runtime_env", "--node-id=n"])
    assert command[3] == f"--runtime_env_agent_command={runtime_env}"


def test_the_lean_head_changes_only_the_ray_it_was_tested_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean head replaces parts of Ray's private start-up (its raylet's agent commands, its node parameters, its
    node poll). Another Ray than the tested one starts its head as it does by itself: slower, never broken by an
    assumption about internals that changed."""
    import ray
    import ray._private.services as services

    from labkube.operator.lean_head import lean_head, lean_ray

    assert lean_ray(ray.__version__), f"the lean head is not tested on this Ray ({ray.__version__}): see LEAN_RAY"
    original = services.start_ray_process
    with lean_head():
        assert services.start_ray_process is not original
    assert services.start_ray_process is original
    monkeypatch.setattr(ray, "__version__", "2.61.0")
    with lean_head():
        assert services.start_ray_process is original
