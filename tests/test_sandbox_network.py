"""A task's network is the task's to choose (`network: none | proxy` in labkube.yaml), never the host's.

With `network: none` (the default) a sandboxed command reaches nothing. With `network: proxy` its HTTP and HTTPS go
through the run's proxy (agent/sandbox_proxy.py), which refuses the task's blocked URLs and every loopback,
link-local and private address, and records each request in the transcript.

The test server listens on the host's loopback (nothing here can listen on a public address), which the proxy
refuses: the runs below allow its one address:port through `LABKUBE_PROXY_ALLOW_LOOPBACK_FOR_TESTS`, the proxy's
test-only allow-list (loopback pairs only), and a second listener, not on the list, stands for the host's other
loopback services. The last tests build the proxy directly, with a resolver of their own for names.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.sandbox_proxy import (
    LOOPBACK_FOR_TESTS_VARIABLE,
    IPAddress,
    NetworkRecord,
    SandboxProxy,
    loopback_allowed_for_tests,
)
from labkube.sandbox import SandboxMode, sandbox_problem
from labkube.task_card import NetworkAccess
from labkube.tasks import TaskError, resolve_tasks

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no local sandbox: {sandbox_problem()}")

GREETING = "hello from the test server"
BLOCKED = ["blocked.example", "papers.example/the-paper"]


class Greeter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        body = f"{GREETING} at {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Servers:
    """The test's HTTP server (allowed) and a bare listener on another loopback port (not allowed)."""

    http: ThreadingHTTPServer
    other: socket.socket
    other_connections: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.http.server_address[1]

    @property
    def other_port(self) -> int:
        return self.other.getsockname()[1]

    @property
    def paths(self) -> list[str]:
        return self.http.paths  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    http = ThreadingHTTPServer(("127.0.0.1", 0), Greeter)
    http.paths = []  # type: ignore[attr-defined]
    threading.Thread(target=http.serve_forever, daemon=True).start()
    other = socket.create_server(("127.0.0.1", 0))
    found = Servers(http, other)

    def accept() -> None:
        while True:
            try:
                conn, addr = other.accept()
            except OSError:
                return
            found.other_connections.append(str(addr))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield found
    http.shutdown()
    http.server_close()
    other.close()


def bash(command: str) -> dict:
    return {"tool": "bash", "args": {"command": command, "timeout": 60}}


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy")


def run_task(
    root: Path, steps: list[dict], servers: Servers, sandbox: SandboxMode = SandboxMode.bwrap, **labkube_yaml: object
) -> Path:
    """One oracle run of the tiny task with `steps`, the test server's address on the proxy's test allow-list and
    no proxy of the machine's own in the harness's environment (an unsandboxed command would use it)."""
    task = make_tiny_task(root, steps, **labkube_yaml)
    (task / "blocked_urls.yaml").write_text(json.dumps(BLOCKED))
    run_dir = make_run_dir(root, task, sandbox=sandbox)
    saved = {
        name: os.environ.pop(name) for name in (*PROXY_VARIABLES, LOOPBACK_FOR_TESTS_VARIABLE) if name in os.environ
    }
    os.environ[LOOPBACK_FOR_TESTS_VARIABLE] = f"127.0.0.1:{servers.port}"
    try:
        asyncio.run(run_agent(run_dir))
    finally:
        os.environ.pop(LOOPBACK_FOR_TESTS_VARIABLE, None)
        os.environ.update(saved)
    return run_dir


@dataclass
class Run:
    run_dir: Path

    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "transcript.jsonl").read_text().splitlines()]

    def outputs(self) -> list[str]:
        return [r["output"] for r in self.records() if r["type"] == "tool_call"]

    def network(self) -> list[dict]:
        return [r for r in self.records() if r["type"] == "network"]


# The URLs the commands below name are spelt so that the bash tool's own check of a command's text does not refuse
# them first ("ht""tp://..."): the proxy is what must stop them, as it must a command that builds its URL at run time.
def proxy_plan(servers: Servers) -> list[dict]:
    here = f"127.0.0.1:{servers.port}"
    fetch = "import urllib.request as u; print(u.urlopen('http://{url}', timeout=20).read().decode())"
    return [
        bash(f"curl -sS http://{here}/curl; echo; echo proxy=$HTTPS_PROXY"),
        {"tool": "python", "args": {"code": fetch.format(url=f"{here}/urllib"), "timeout": 60}},
        bash(f"curl -sS --proxytunnel http://{here}/tunnel"),
        bash('curl -sS "ht""tp://blocked.example/anything"; echo'),
        bash('curl -sS "ht""tp://papers.example/the-paper/v2"; echo'),
        bash('curl -sS "ht""tps://blocked.example/"; echo "rc=$?"'),
        bash("curl -sS http://169.254.169.254/latest/meta-data/; echo"),
        bash(f"curl -sS http://127.0.0.1:{servers.other_port}/; echo"),
        {"tool": "start_async", "args": {"command": f"curl -sS http://{here}/job"}},
        {"tool": "check_async", "args": {"job_id": "job1", "wait_minutes": 0.5}},
    ]


@pytest.fixture(scope="module")
def proxied(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(run_task(tmp_path_factory.mktemp("proxied"), proxy_plan(servers), servers, network="proxy"))


def test_without_a_network_choice_a_command_reaches_nothing(servers: Servers, tmp_path: Path) -> None:
    steps = [bash(f"curl -sS -m 5 http://127.0.0.1:{servers.port}/none; echo rc=$? proxy=[$HTTPS_PROXY]")]
    run = Run(run_task(tmp_path, steps, servers))
    output = run.outputs()[0]
    assert "rc=7" in output and "proxy=[]" in output  # curl: could not connect (the sandbox's own loopback)
    assert "/none" not in servers.paths
    assert run.network() == [] and not (run.run_dir / "sandbox" / "sockets").exists()


def test_the_network_choice_is_read_from_labkube_yaml_and_checked(tmp_path: Path) -> None:
    assert resolve_tasks(str(make_tiny_task(tmp_path / "default", [])))[0].network is NetworkAccess.none
    assert resolve_tasks(str(make_tiny_task(tmp_path / "proxy", [], network="proxy")))[0].network is NetworkAccess.proxy
    with pytest.raises(TaskError, match="network"):
        resolve_tasks(str(make_tiny_task(tmp_path / "open", [], network="open")))


def test_an_unsandboxed_run_keeps_the_host_network_and_gets_no_proxy(servers: Servers, tmp_path: Path) -> None:
    steps = [bash(f"curl -sS -m 5 http://127.0.0.1:{servers.port}/unsandboxed; echo; echo proxy=[$HTTPS_PROXY]")]
    run = Run(run_task(tmp_path, steps, servers, SandboxMode.none, network="proxy"))
    assert f"{GREETING} at /unsandboxed" in run.outputs()[0] and "proxy=[]" in run.outputs()[0]
    assert run.network() == []


def test_curl_reaches_the_allowed_server_through_the_proxy(proxied: Run, servers: Servers) -> None:
    assert f"{GREETING} at /curl" in proxied.outputs()[0]
    assert "proxy=http://127.0.0.1:3128" in proxied.outputs()[0]
    assert "/curl" in servers.paths


def test_python_urllib_reaches_the_allowed_server_through_the_proxy(proxied: Run) -> None:
    assert f"{GREETING} at /urllib" in proxied.outputs()[1]


def test_a_tunnel_to_the_allowed_server_works(proxied: Run) -> None:
    assert f"{GREETING} at /tunnel" in proxied.outputs()[2]


def test_a_background_job_reaches_the_server_through_the_proxy(proxied: Run) -> None:
    assert f"{GREETING} at /job" in proxied.outputs()[9]


def test_every_request_is_a_network_line_of_the_transcript(proxied: Run, servers: Servers) -> None:
    allowed = [r for r in proxied.network() if r["allowed"]]
    urls = {r["url"] for r in allowed if r["method"] == "GET"}
    here = f"127.0.0.1:{servers.port}"
    assert {f"http://{here}/curl", f"http://{here}/urllib", f"http://{here}/job"} <= urls
    tunnel = next(r for r in allowed if r["method"] == "CONNECT")
    assert tunnel["host"] == "127.0.0.1" and tunnel["port"] == servers.port and tunnel["status"] == 200
    assert tunnel["bytes_up"] > 0 and tunnel["bytes_down"] > 0
    for record in proxied.network():
        NetworkRecord.model_validate(record)
        assert record["duration_s"] >= 0


def test_a_blocked_url_is_refused_with_403_and_recorded(proxied: Run) -> None:
    assert "blocked.example/anything is blocked for this task" in proxied.outputs()[3]
    assert "matches 'papers.example/the-paper'" in proxied.outputs()[4]
    refused = {r["url"]: r for r in proxied.network() if r["method"] == "GET" and not r["allowed"]}
    assert refused["http://blocked.example/anything"]["status"] == 403
    assert refused["http://papers.example/the-paper/v2"]["status"] == 403


def test_a_tunnel_to_a_blocked_host_is_refused_with_403_and_recorded(proxied: Run) -> None:
    assert "403" in proxied.outputs()[5] and "rc=56" in proxied.outputs()[5]  # curl: CONNECT tunnel failed, 403
    tunnel = next(r for r in proxied.network() if r["method"] == "CONNECT" and r["host"] == "blocked.example")
    assert tunnel["allowed"] is False and tunnel["status"] == 403 and tunnel["port"] == 443
    assert "blocked for this task" in tunnel["reason"]


def test_cloud_metadata_is_refused(proxied: Run) -> None:
    assert "169.254.169.254 is a link-local address" in proxied.outputs()[6]
    record = next(r for r in proxied.network() if r["host"] == "169.254.169.254")
    assert record["allowed"] is False and record["status"] == 403 and record["address"] is None


def test_a_loopback_port_not_on_the_test_allow_list_is_refused(proxied: Run, servers: Servers) -> None:
    assert "127.0.0.1 is a loopback address" in proxied.outputs()[7]
    assert servers.other_connections == []


def test_the_proxy_stops_with_the_run(proxied: Run) -> None:
    sock_path = proxied.run_dir / "sandbox" / "sockets" / "proxy.sock"
    assert not sock_path.exists()
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(OSError):
        probe.connect(str(sock_path))


# -- the proxy built directly: a resolver of the test's own stands for DNS ----------------------------------------


async def ask(path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def resolver_of(names: dict[str, list[str]]):
    import ipaddress

    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host not in names:
            raise OSError(f"unknown name {host}")
        return [ipaddress.ip_address(a) for a in names[host]]

    return resolve


async def test_a_name_with_any_private_address_is_refused_before_connecting(tmp_path: Path) -> None:
    records: list[NetworkRecord] = []
    names = {"rebinding.example": ["93.184.216.34", "10.0.0.7"], "inside.example": ["192.168.1.1"]}
    proxy = await SandboxProxy(tmp_path / "p.sock", [], records.append, resolver=resolver_of(names)).start()
    try:
        first = await ask(proxy.path, b"GET http://rebinding.example/ HTTP/1.1\r\nHost: x\r\n\r\n")
        second = await ask(proxy.path, b"CONNECT inside.example:443 HTTP/1.1\r\n\r\n")
    finally:
        await proxy.close()
    assert first.startswith(b"HTTP/1.1 403") and b"10.0.0.7) is a private address" in first
    assert second.startswith(b"HTTP/1.1 403") and b"192.168.1.1) is a private address" in second
    assert [(r.allowed, r.address) for r in records] == [(False, None), (False, None)]


async def test_a_tunnel_to_a_port_other_than_443_is_refused(tmp_path: Path) -> None:
    records: list[NetworkRecord] = []
    names = {"public.example": ["93.184.216.34"]}
    proxy = await SandboxProxy(tmp_path / "p.sock", [], records.append, resolver=resolver_of(names)).start()
    try:
        answer = await ask(proxy.path, b"CONNECT public.example:22 HTTP/1.1\r\n\r\n")
    finally:
        await proxy.close()
    assert answer.startswith(b"HTTP/1.1 403") and b"port 443 only" in answer
    assert records[0].method == "CONNECT" and records[0].port == 22 and not records[0].allowed


async def test_a_blocked_host_is_refused_whatever_its_case_or_trailing_dot(tmp_path: Path) -> None:
    records: list[NetworkRecord] = []
    proxy = await SandboxProxy(tmp_path / "p.sock", BLOCKED, records.append, resolver=resolver_of({})).start()
    try:
        answer = await ask(proxy.path, b"CONNECT WWW.Blocked.Example.:443 HTTP/1.1\r\n\r\n")
    finally:
        await proxy.close()
    assert answer.startswith(b"HTTP/1.1 403") and records[0].host == "www.blocked.example"


async def test_an_idle_tunnel_is_closed(tmp_path: Path, servers: Servers) -> None:
    records: list[NetworkRecord] = []
    allowed = loopback_allowed_for_tests(f"127.0.0.1:{servers.port}")
    proxy = SandboxProxy(tmp_path / "p.sock", [], records.append, allow_for_tests=allowed, idle_timeout_s=0.5)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(proxy.path))
        writer.write(f"CONNECT 127.0.0.1:{servers.port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, not by the server
        writer.close()
    finally:
        await proxy.close()
    assert records[0].status == 200 and records[0].duration_s < 5


def test_the_test_allow_list_takes_loopback_addresses_only() -> None:
    assert loopback_allowed_for_tests("127.0.0.1:8080, [::1]:9000") == loopback_allowed_for_tests(
        "[::1]:9000,127.0.0.1:8080"
    )
    for bad in ("169.254.169.254:80", "10.0.0.1:80", "127.0.0.1"):
        with pytest.raises(ValueError):
            loopback_allowed_for_tests(bad)
