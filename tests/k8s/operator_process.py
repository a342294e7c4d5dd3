"""`labkube operator` as a real process (its own Ray, its own kopf) against the fake API of this process: what a
replica of the chart's Deployment is, for tests that kill it, start two of it, or point it at a Ray cluster, and
for `benchmarks/operator_scale.py`. Each operator is a session and process group of its own, so killing it kills
what it started (embedded Ray and its actors), as a pod's death does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import yaml
from proc_owner import ours

CONTEXT = "fake"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    """A kubeconfig whose context `fake` is the fake API (the operator's actors on other Ray nodes read it too)."""
    context = {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
                "users": [{"name": CONTEXT, "user": {"token": "x"}}],
                "contexts": [{"name": CONTEXT, "context": context}],
                "current-context": CONTEXT,
            }
        )
    )
    return path


def operator_config(work: Path, **config: Any) -> tuple[Path, int]:
    """An operator config file with free metrics and health ports and `config` on top (camelCase keys); its path and
    its health port."""
    health = free_port()
    path = work / f"operator-{health}.yaml"
    path.write_text(yaml.safe_dump({"healthPort": health, "metricsPort": free_port(), **config}))
    return path, health


def health(port: int) -> str | None:
    """What `/healthz` answers (None: nothing listens yet). A standby replica says it is standing by. Something that
    is not HTTP on the port (a Ray process of another operator took it between `free_port` and the bind) is not an
    answer either: the operator that cannot bind it exits, which `wait_healthy` reports."""
    import http.client
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.read().decode(errors="replace") if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None


class OperatorProcess:
    """One `labkube operator --config ... --kube-context fake` (see the module docstring)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    @classmethod
    async def start(
        cls,
        config: Path,
        kubeconfig: Path,
        runs_root: Path,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        max_runs: int = 64,
        gpus: int | None = None,
    ) -> OperatorProcess:
        handle = log.open("ab")
        args = ["--config", str(config), "--kube-context", CONTEXT, "--runs-root", str(runs_root)]
        args += ["--max-runs", str(max_runs)]
        if gpus is not None:
            args += ["--gpus", str(gpus)]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LABKUBE_"))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "labkube", "operator", *args,
            env={**base, "KUBECONFIG": str(kubeconfig), **(env or {})},
            stdout=handle, stderr=handle, start_new_session=True,
        )  # fmt: skip
        handle.close()
        return cls(proc, log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def said(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def pids(self) -> list[int]:
        """Live processes of this operator's process group (itself, embedded Ray, the supervisor actors)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ProcessLookupError):
                    if os.getpgid(int(entry.name)) == self.proc.pid and not _zombie(int(entry.name)):
                        out.append(int(entry.name))
        return out

    async def kill(self) -> None:
        """SIGKILL to the whole group at once: a node failure or an OOM-killed pod, no clean-up of any kind."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()
        # The group's other processes die on their own schedule (one in uninterruptible I/O exits when it returns):
        # give them what a kernel needs, so callers can assert none is left without racing the exit.
        for _ in range(100):
            if not self.pids():
                return
            await asyncio.sleep(0.1)

    async def stop(self, grace_s: float = 30.0) -> tuple[int | None, list[int]]:
        """SIGTERM (as the kubelet sends it) and up to `grace_s` for the operator to exit; then SIGKILL to whatever
        is left of its group. Its exit code (None: it did not exit in time) and the processes that outlived it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace_s)
        code = self.proc.returncode
        leftovers = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()
        return code, leftovers


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def described(pids: list[int]) -> list[str]:
    """What an assertion about leftover processes shows: each one's state and command line."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid} {state} {cmdline[:160]}")
    return out


def supervisor_actor_pids() -> list[int]:
    """Every `ray::SupervisorActor` process this test process started, however far down (tests/proc_owner.py: the
    suite's other processes run campaigns of their own meanwhile)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                pid = int(entry.name)
                if b"ray::SupervisorActor" in cmdline and not _zombie(pid) and ours(pid):
                    out.append(pid)
    return out
