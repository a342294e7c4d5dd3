"""Claude Code and Codex whole inside the run's bubblewrap sandbox (agent/scaffolds/cli_sandbox.py): the real CLIs
against the fake provider (tests/fakellm.py) through the run's gateway, which they reach through a unix socket.

Through each CLI's own bash tool the scripted model probes the sandbox as a hostile agent would: the host's files
beside its run, the run's own records, every TCP listener on the host's loopback (the gateway's own port among
them), every process environment it can see, and a process left running after the run."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply
from test_cli_agents import MODELS, REAL_KEY, provider_env, responder, run_dir_of
from test_sandbox_network import Greeter  # the same test server the network tests use
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.run_sandbox import PROXY_VARIABLES
from labkube.agent.sandbox_proxy import LOOPBACK_FOR_TESTS_VARIABLE
from labkube.agent.scaffolds.cli_install import CLI_AGENTS, ensure_installed
from labkube.agent.scaffolds.cli_sandbox import SANDBOX_GATEWAY_PORT
from labkube.agent.transcript import read_jsonl
from labkube.result import RunResult
from labkube.sandbox import sandbox_problem

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no local sandbox here: {sandbox_problem()}"),
]
AGENTS = ["claude-code", "codex"]


@pytest.fixture(scope="session")
def cli_binaries() -> dict[str, Path]:
    return {name: ensure_installed(agent) for name, agent in CLI_AGENTS.items()}


@pytest.fixture
def under_tmp() -> Iterator[Path]:
    """A campaign folder under /tmp, where the sandbox's own /tmp is mounted over the host's."""
    root = Path(tempfile.mkdtemp(prefix="lk-cli-sandbox-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("agent", AGENTS)
def test_each_cli_runs_its_commands_in_the_workspace_from_inside_the_sandbox(
    under_tmp: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """`labkube run` with the campaign under /tmp: the CLI's shell command writes its files in the workspace, from
    inside the sandbox (HOME is the sandbox's, pid 1 is bubblewrap's, the workspace is at /workspace, which the
    task's text names), and the run is graded and done as usual."""
    task = make_tiny_task(under_tmp, [])
    command = "echo $HOME > home.txt; cat /proc/1/comm > init.txt; pwd > pwd.txt; echo 7 > result.txt"
    with FakeLLM(responder=responder(command)) as server:
        ran = labkube(
            "run", str(task), "--model", MODELS[agent], "--agent", agent, "--out", str(under_tmp / "c"),
            cwd=under_tmp, env=provider_env(agent, server), timeout=300,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    rd = run_dir_of(under_tmp / "c")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert (result.status.value, result.stop_reason.value) == ("Finished", "done"), result.error
    assert result.subtasks[0].raw == 7.0
    workspace = rd / "workspace"
    assert (workspace / "home.txt").read_text().strip() == "/home/agent"
    assert (workspace / "init.txt").read_text().strip() == "bwrap"
    assert (workspace / "pwd.txt").read_text().strip() == "/workspace"
    sent = json.dumps([r.body for r in server.requests])
    assert "Your workspace is /workspace " in sent and str(workspace) not in sent
    (tool,) = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] == "tool_call"]
    assert tool["tool"] == "bash" and tool["ok"]


def listening_ports(pid: int | None = None) -> set[int]:
    """TCP ports listening on the host's loopback (or every address), of one process when `pid` is given."""
    inodes = None
    if pid is not None:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].rsplit(":", 1)
            if fields[3] != "0A" or address.strip("0") not in ("", "100007F", "1"):
                continue  # not listening, or not on loopback / every address
            if inodes is None or fields[9] in inodes:
                ports.add(int(port, 16))
    return ports


def host_processes_with(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.parametrize("agent", AGENTS)
def test_through_its_shell_the_agent_reaches_nothing_of_the_host(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str
) -> None:
    """The CLI's bash tool, told to look around: a file planted beside the run folder and the run's own run.json are
    not there; every TCP listener on the host's loopback when it runs (the run's gateway, the provider, one this
    test opens) refuses it; the environments and memory of every process it can see hold no API key (the provider's,
    and one planted in the harness's environment); the pristine grader, the cgroup tree and labkube's record of the
    workspace (a clean filter in the workspace's git, its tag moved) are out of its reach; and the processes it
    leaves running do not outlive the run."""
    task = make_tiny_task(tmp_path, [])
    grader_before = (task / "grading" / "grade.sh").read_bytes()
    git_trap = f"sh -c 'touch {tmp_path}/git-filter-ran; cat'"
    rd = make_run_dir(tmp_path, task, model=MODELS[agent], agent=agent)
    planted = rd.parent / "planted.txt"
    planted.write_text("planted-secret-beside-the-run\n")
    planted_key = f"sk-planted-{secrets.token_hex(12)}"
    marker = f"4242.{secrets.randbelow(10**6):06d}"
    listener = socket.create_server(("127.0.0.1", 0))
    listener_port = listener.getsockname()[1]
    harness: list[subprocess.Popen[bytes]] = []
    probed: dict[str, set[int]] = {}

    def probe() -> str:
        gateway = listening_ports(harness[0].pid)
        ports = (listening_ports() | gateway) - {SANDBOX_GATEWAY_PORT}
        probed.update(gateway=gateway, all=ports)
        knock = 'for p in {}; do (timeout 3 bash -c "echo > /dev/tcp/127.0.0.1/$p") 2>/dev/null && echo "open $p" || echo "closed $p"; done'  # noqa: E501
        return "; ".join(
            [
                f'cat {planted} > probe-planted.txt 2>&1; echo "exit=$?" >> probe-planted.txt',
                f'cat {rd}/run.json > probe-run.txt 2>&1; echo "exit=$?" >> probe-run.txt',
                f"ls -a {rd.parent} > probe-ls.txt 2>&1",
                knock.format(" ".join(str(p) for p in sorted(ports))) + " > probe-tcp.txt",
                "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' > probe-environ.txt",
                "for p in /proc/[0-9]*; do grep -a -o 'sk-[A-Za-z0-9-]*' $p/mem 2>/dev/null; done > probe-mem.txt",
                f"{{ echo 'echo 99 > result.txt' >> {task}/grading/grade.sh; }} 2> probe-grader.txt",
                "{ echo $$ > /sys/fs/cgroup/cgroup.procs; } 2> probe-cgroup.txt",
                f'git config filter.x.clean "{git_trap}"; echo "* filter=x" > .git/info/attributes',
                "echo changed > changed.txt; git add -A >/dev/null 2>&1; git -c user.name=a -c user.email=a@b "
                "commit -qm x --no-verify >/dev/null 2>&1; git tag -f labkube-pristine >/dev/null 2>&1",
                f"(setsid sleep {marker} > /dev/null 2>&1 < /dev/null &)",
                f"nohup sleep {marker} > /dev/null 2>&1 < /dev/null & echo 7 > result.txt",
            ]
        )

    answers: list[Callable[[str, dict[str, Any]], Reply]] = []

    def answer(path: str, body: dict[str, Any]) -> Reply:
        if not answers:
            answers.append(responder(probe()))
        return answers[0](path, body)

    try:
        with FakeLLM(responder=answer) as server:
            env = {
                **os.environ,
                "RAY_AUTH_MODE": "disabled",
                **provider_env(agent, server),
                "OTHER_SERVICE_API_KEY": planted_key,
            }
            command = [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(rd)]
            process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            harness.append(process)
            _, err = harness[0].communicate(timeout=300)
    finally:
        listener.close()
    assert harness[0].returncode == 0, err[-3000:].decode(errors="replace")
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert (result.stop_reason.value, result.subtasks[0].raw) == ("done", 7.0), result.error
    workspace = rd / "workspace"
    seen_planted = (workspace / "probe-planted.txt").read_text()
    assert "No such file" in seen_planted and "planted-secret" not in seen_planted
    seen_run = (workspace / "probe-run.txt").read_text()
    assert "No such file" in seen_run and '"run_id"' not in seen_run
    assert "planted.txt" not in (workspace / "probe-ls.txt").read_text()
    knocked = dict(reversed(line.split()) for line in (workspace / "probe-tcp.txt").read_text().splitlines())
    assert probed["gateway"] and probed["gateway"] <= {int(p) for p in knocked}, (probed, knocked)
    provider_port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    assert listener_port in probed["all"] and provider_port in probed["all"]
    assert set(knocked.values()) == {"closed"}, knocked
    environ = (workspace / "probe-environ.txt").read_text()
    assert "PATH=" in environ  # it did read environments: its own sandbox's processes'
    assert REAL_KEY not in environ and planted_key not in environ
    memory = (workspace / "probe-mem.txt").read_text()
    assert REAL_KEY not in memory and planted_key not in memory
    assert (task / "grading" / "grade.sh").read_bytes() == grader_before
    assert "No such file" in (workspace / "probe-grader.txt").read_text()
    assert "No such file" in (workspace / "probe-cgroup.txt").read_text()
    assert not (tmp_path / "git-filter-ran").exists()
    recorded = json.loads((rd / "workspace-files.json").read_text())["files"]
    assert "changed.txt" in recorded, sorted(recorded)
    deadline = time.monotonic() + 10
    while (left := host_processes_with(f"sleep {marker}")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], left


@pytest.mark.parametrize("agent", AGENTS)
def test_a_network_proxy_tasks_cli_reaches_the_web_through_the_runs_proxy(
    tmp_path: Path, cli_binaries: dict[str, Path], agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `network: proxy` task: the CLI's bash command reaches the test's server (on 127.0.0.2, a loopback address
    outside the CLI's NO_PROXY, allowed by the proxy's test allow-list) through the run's proxy, which writes a
    `network` line; a blocked URL (its host spelled so the CLI's own URL hook cannot see it) is refused with 403 by
    the proxy; and the CLI's own calls still reach the gateway on the sandbox's loopback, not through the proxy."""
    http = ThreadingHTTPServer(("127.0.0.2", 0), Greeter)
    http.paths = []  # type: ignore[attr-defined]
    threading.Thread(target=http.serve_forever, daemon=True).start()
    port = http.server_address[1]
    task = make_tiny_task(tmp_path, [], network="proxy")
    (task / "blocked_urls.yaml").write_text(json.dumps(["blocked.example"]))
    rd = make_run_dir(tmp_path, task, model=MODELS[agent], agent=agent)
    for name in (*PROXY_VARIABLES, "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    command = "; ".join(
        [
            f"curl -sS -o got.txt -w '%{{http_code}}' http://127.0.0.2:{port}/from-the-cli > allowed.txt 2>&1",
            "H=blocked; curl -sS -o /dev/null -w '%{http_code}' http://$H.example/x > refused.txt 2>&1",
            "env | grep -i _proxy | sort > proxy-env.txt",
            "echo 7 > result.txt",
        ]
    )
    try:
        with FakeLLM(responder=responder(command)) as server:
            ran = labkube(
                "agent", "--run-dir", str(rd), cwd=tmp_path, timeout=300,
                env={**provider_env(agent, server), LOOPBACK_FOR_TESTS_VARIABLE: f"127.0.0.2:{port}"},
            )  # fmt: skip
            requests = server.requests
    finally:
        http.shutdown()
        http.server_close()
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert (result.stop_reason.value, result.subtasks[0].raw) == ("done", 7.0), result.error
    assert len(requests) >= 2  # the model's calls went through the gateway's relay, as ever
    workspace = rd / "workspace"
    environ = (workspace / "proxy-env.txt").read_text()
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in environ and "no_proxy=127.0.0.1,localhost" in environ, environ
    assert (workspace / "allowed.txt").read_text().strip() == "200"
    assert (workspace / "got.txt").read_text() == "hello from the test server at /from-the-cli"
    assert http.paths == ["/from-the-cli"]  # type: ignore[attr-defined]
    assert (workspace / "refused.txt").read_text().strip() == "403"
    network = [e for e in read_jsonl(rd / "transcript.jsonl") if e["type"] == "network"]
    allowed = [e for e in network if e["allowed"]]
    assert [(e["host"], e["port"]) for e in allowed] == [("127.0.0.2", port)], network
    refused = [e for e in network if e["host"] == "blocked.example"]
    assert refused and not refused[0]["allowed"], network
    assert not (rd / "sandbox" / "sockets" / "proxy.sock").exists()  # the proxy stopped with the run


def test_a_sandbox_that_cannot_start_the_cli_is_a_harness_error(tmp_path: Path, cli_binaries: dict[str, Path]) -> None:
    """bubblewrap fails (here a stand-in that says so and exits 1): the CLI never runs, and the run ends as the
    harness's error, with bubblewrap's words, not as the agent's `done`."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model=MODELS["codex"], agent="codex")
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: something failed' >&2\nexit 1\n")
    broken.chmod(0o755)
    with FakeLLM(responder=responder("echo 7 > result.txt")) as server:
        ran = labkube(
            "agent", "--run-dir", str(rd), cwd=tmp_path,
            env={**provider_env("codex", server), "LABKUBE_BWRAP": str(broken)}, timeout=300,
        )  # fmt: skip
        requests = server.requests
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.stop_reason.value == "error", (result, ran.stderr[-2000:])
    assert result.is_error
    assert result.error and "bwrap: something failed" in result.error
    assert requests == [] and not (rd / "workspace" / "result.txt").exists()
    events = read_jsonl(rd / "transcript.jsonl")
    (failure,) = [e for e in events if e["type"] == "harness_error"]
    assert "could not start codex" in failure["error"]
    assert json.loads((rd / "run.json").read_text())["sandbox"] == "bwrap"


def test_the_relay_forwards_connections_signals_and_the_clis_exit(tmp_path: Path) -> None:
    """`sandbox_relay.py forward`, run by path with no labkube on its path: a TCP connection to its port reaches the
    unix socket (here a long path, as a run folder's may be), SIGINT to it reaches the command's group, and the
    command's exit status is its own."""
    from labkube.agent.scaffolds import sandbox_relay

    relay = [sys.executable, "-I", sandbox_relay.__file__, "forward"]
    folder = tmp_path / ("deep-" * 20)
    folder.mkdir()
    path = folder / "gateway.sock"
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    upstream = socket.socket(socket.AF_UNIX)
    upstream.bind(f"/proc/self/fd/{fd}/gateway.sock")
    upstream.listen()
    os.close(fd)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One process with no child of its own: a shell's `trap` loop around `sleep` lost the signal when it came between
    # a fork and the child's reset of the trap (the child ran the trap, the loop went on), seen once under load.
    script = (
        "import signal, sys, time\n"
        "def stop(*_):\n    open('seen.txt', 'w').write('interrupted')\n    sys.exit(7)\n"
        "signal.signal(signal.SIGINT, stop)\nopen('up.txt', 'w').write('up')\ntime.sleep(120)\n"
    )
    process = subprocess.Popen([*relay, str(path), str(port), "--", sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "up.txt").exists():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            served, _ = upstream.accept()
            with served:
                client.sendall(b"ping")
                assert served.recv(4) == b"ping"
                served.sendall(b"pong")
                assert client.recv(4) == b"pong"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 7
        assert (tmp_path / "seen.txt").read_text().strip() == "interrupted"
    finally:
        process.kill()
        upstream.close()
    done = subprocess.run([*relay, str(path), str(port), "--", "sh", "-c", "exit 3"], timeout=30, check=False)
    assert done.returncode == 3


def test_the_relay_forwards_several_ports_each_to_its_own_socket(tmp_path: Path) -> None:
    """`forward SOCKET PORT SOCKET PORT -- ARGV` (the gateway's and the proxy's, for a `network: proxy` task): both
    ports listen before the command starts, each reaching its own socket; run with `-I -S`, as the CLI's relay is."""
    from labkube.agent.scaffolds import sandbox_relay

    upstreams, routes = [], []
    for name in ("gateway", "proxy"):
        upstream = socket.socket(socket.AF_UNIX)
        upstream.bind(str(tmp_path / f"{name}.sock"))
        upstream.listen()
        upstreams.append(upstream)

        def serve(listener: socket.socket = upstream, reply: bytes = name.encode()) -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(16)
                conn.sendall(reply)

        threading.Thread(target=serve, daemon=True).start()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            routes += [str(tmp_path / f"{name}.sock"), str(probe.getsockname()[1])]
    client = (
        "import socket, sys\n"
        "for port in sys.argv[1:]:\n"
        "    with socket.create_connection(('127.0.0.1', int(port)), timeout=10) as c:\n"
        "        c.sendall(b'hi'); print(c.recv(16).decode())\n"
    )
    relay = [sys.executable, "-I", "-S", sandbox_relay.__file__, "forward", *routes, "--"]
    try:
        done = subprocess.run(
            [*relay, sys.executable, "-I", "-c", client, routes[1], routes[3]],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    finally:
        for upstream in upstreams:
            upstream.close()
    assert (done.returncode, done.stdout.split()) == (0, ["gateway", "proxy"]), done.stderr
    malformed = subprocess.run([*relay[:5], routes[0], "--", "true"], capture_output=True, timeout=30, check=False)
    assert malformed.returncode == 2
