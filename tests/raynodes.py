"""A multi-node Ray cluster on this machine, as `ray start` builds one: a head (`ray start --head`) and worker
nodes (`ray start --address`), each a process group of its own, so a test can kill one node (SIGKILL to its
group: raylet, agents, actor workers) the way a KubeRay worker pod dies. This stands in for a RayCluster in the
tests: the operator reaches it through Ray Client (`ray://`), as it reaches a KubeRay head service."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Node deaths are noticed in a few seconds instead of Ray's default half minute.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayNode:
    """One `ray start --block` and everything it starts (its own session and process group)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.agent_port = free_port()  # the dashboard agent's HTTP port (KubeRay's probes ask it)
        self.handle = log.open("wb")
        self.proc = subprocess.Popen(
            [
                RAY,
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                # several nodes on one machine: each needs ports of its own where Ray's defaults are fixed
                f"--dashboard-agent-listen-port={self.agent_port}",
                f"--metrics-export-port={free_port()}",
                *args,
            ],
            env=env,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_started(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray start did not start in {timeout:g}s: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        """Every live process of this node: its process group and every descendant (Ray's workers, the actors, run
        in sessions of their own)."""
        return node_processes(self.proc.pid)

    def kill(self) -> None:
        """The node dies at once (a worker pod killed): SIGKILL to every process of the node."""
        doomed = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM to the node (Ray stops its processes), SIGKILL to whatever is left after 10 s (`ray start --block`
        itself may not exit on SIGTERM)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.handle.close()


def node_processes(root: int) -> list[int]:
    """Live processes in `root`'s process group or below it in the process tree."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry.name)], groups[int(entry.name)] = int(fields[1]), int(fields[2])
    found = {pid for pid, group in groups.items() if group == root}
    frontier = [root, *found]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return sorted(pid for pid in found if pid in parents)


class LocalRayCluster:
    """A head (no supervisors: like the chart's RayCluster head, `num-cpus: 0`) and `workers` nodes that declare
    `labkube_supervisor`; token authentication on, the token in `token`; Ray Client at `client_address`."""

    def __init__(
        self,
        work: Path,
        workers: int,
        env: dict[str, str],
        head_resources: dict[str, float],
        *,
        client_port: int | None = None,
        gcs_port: int | None = None,
        token: str | None = None,
    ) -> None:
        from labkube.operator.driver import SUPERVISOR

        self.token = token or os.urandom(32).hex()
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}
        self.gcs_port, self.client_port = gcs_port or free_port(), client_port or free_port()
        work.mkdir(parents=True, exist_ok=True)
        # A session directory of its own: `ray start --head` records its address in <temp-dir>/ray_current_cluster,
        # which a later `ray.init()` on this machine would otherwise join. Short: Ray's socket paths live there.
        self.temp_dir = tempfile.mkdtemp(prefix="lkray-", dir="/tmp")
        self.head = RayNode(
            [
                "--head",
                f"--temp-dir={self.temp_dir}",
                f"--port={self.gcs_port}",
                f"--ray-client-server-port={self.client_port}",
                "--num-cpus=0",
                "--include-dashboard=false",
                f"--resources={json.dumps(head_resources)}",
                f"--system-config={json.dumps(FAST_HEALTH_CHECKS)}",
            ],
            self.env,
            work / "head.log",
        )
        self.workers: list[RayNode] = []
        try:
            self.head.wait_started()
            for i in range(workers):  # one at a time: nodes starting together on one machine race for ports
                worker = RayNode(
                    [
                        f"--address=127.0.0.1:{self.gcs_port}",
                        "--num-cpus=0",
                        f"--resources={json.dumps({SUPERVISOR: 64})}",
                    ],
                    self.env,
                    work / f"worker-{i}.log",
                )
                self.workers.append(worker)
                worker.wait_started()
        except BaseException:
            self.stop()
            raise

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            node.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        return [pid for node in [self.head, *self.workers] for pid in node.pids()]
