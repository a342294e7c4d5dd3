"""A run's local sandbox: what its agent's processes see, built from the run's folder, task environment and GPUs.

The mechanism and the policy document are the spine's (`labkube/sandbox.py`); this module decides, for one run,
what goes in it: the workspace read-write at `/workspace` (`SANDBOX_WORKSPACE`, the same path in every run), the
task environment's interpreter and packages read-only, a private HOME and /tmp kept in the run folder
(`<run>/sandbox/`) so they last from one command to the next, the run's own GPU nodes, and nothing else of the host.
labkube's own package is hidden inside the interpreter's folder it shares (its bundled tasks carry their oracles).

A task with `network: proxy` gets HTTP and HTTPS for its commands through the run's proxy (agent/sandbox_proxy.py), a
server outside the sandbox on a unix socket in `<run>/sandbox/sockets/`: each command starts behind
`sandbox_relay.py forward`, which listens on the sandbox's own 127.0.0.1:3128 and passes every connection on to that
socket, and its environment names that port as its proxy. labkube's package is hidden in the sandbox, so the relay
(and the vendor CLIs' other helpers) run from standalone copies in `<run>/sandbox/bin/`, bound read-only.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from labkube.run_spec import RunSpec
from labkube.sandbox import (
    SANDBOX_HOME,
    SandboxMode,
    SandboxPolicy,
    gpu_device_nodes,
    sandbox_argv,
)

__all__ = [
    "HELPERS_DIR",
    "SANDBOX_DIR",
    "SANDBOX_PROXY_PORT",
    "SOCKETS_DIR",
    "ProxyRoute",
    "RunRoom",
    "install_helpers",
    "run_room",
    "sandbox_python",
]

SANDBOX_DIR = "sandbox"  # <run>/sandbox/{home,tmp}: the agent's HOME and /tmp, outside its workspace
SOCKETS_DIR = "sockets"  # <run>/sandbox/sockets/: unix sockets of servers outside, bound in as a folder
HELPERS_DIR = "bin"  # <run>/sandbox/bin/: standalone helper scripts, bound read-only
SANDBOX_PROXY_PORT = 3128  # the relay's port on a command's own loopback (a network of its own: always free)
RELAY = Path(__file__).resolve().parent / "scaffolds" / "sandbox_relay.py"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def sandbox_python() -> str:
    """An interpreter every sandbox sees (labkube/sandbox.py binds the base installation labkube runs on): the base
    of labkube's virtualenv, whose site-packages (labkube among them) the helpers do not need."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def install_helpers(run_dir: Path, sources: Iterable[Path]) -> Path:
    """Copy standalone helper scripts (the standard library their only import) to `<run>/sandbox/bin/`, a folder
    outside labkube's package that a sandbox can be given read-only; returns the folder."""
    helpers = run_dir / SANDBOX_DIR / HELPERS_DIR
    helpers.mkdir(parents=True, exist_ok=True)
    for source in sources:
        shutil.copyfile(source, helpers / source.name)
    return helpers


@dataclass(frozen=True)
class ProxyRoute:
    """A sandboxed command's way to the run's proxy: the relay it is started behind, and the environment that names
    the relay's port as every client's proxy (`NO_PROXY` empty: the sandbox's own loopback has nothing to reach)."""

    socket: Path  # the proxy's unix socket, in a folder the sandbox binds
    relay: Path  # the standalone copy of sandbox_relay.py

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` behind the relay, started before every command: `-S` as well as `-I`, since the `.pth` files of the
        interpreter's site-packages can cost more than the relay itself (`python -I` took 35 ms to start here,
        `python -I -S` 8 ms)."""
        relay = [sandbox_python(), "-I", "-S", str(self.relay), "forward", str(self.socket), str(SANDBOX_PROXY_PORT)]
        return [*relay, "--", *argv]

    def env(self) -> dict[str, str]:
        return {**dict.fromkeys(PROXY_VARIABLES, self.url), "NO_PROXY": "", "no_proxy": ""}


@dataclass(frozen=True)
class RunRoom:
    """How a run's processes are started: through its sandbox (`policy`), or as they are (`--sandbox none`, a pod)."""

    policy: SandboxPolicy | None = None
    proxy: ProxyRoute | None = None  # a `network: proxy` task's way out, for a sandboxed run

    @property
    def sandboxed(self) -> bool:
        return self.policy is not None

    def command(
        self, argv: list[str], cwd: Path, env: dict[str, str], status_fd: int | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """`argv` as it is started: inside the sandbox with `env` as its whole environment (HOME and TMPDIR the
        sandbox's own), and the environment bubblewrap itself is started with (none of the run's: nothing to read in
        its /proc entry from outside). With a proxy, `argv` starts behind its relay and the proxy is in `env`."""
        if self.policy is None:
            return argv, env
        inner = {**env, "HOME": SANDBOX_HOME, "TMPDIR": "/tmp"}
        if self.proxy is not None:
            argv, inner = self.proxy.wrap(argv), {**inner, **self.proxy.env()}
        policy = self.policy.model_copy(update={"cwd": cwd, "env": inner})
        return sandbox_argv(policy, argv, status_fd=status_fd), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def run_room(
    spec: RunSpec,
    run_dir: Path,
    workspace: Path,
    *,
    gpu_minors: list[int] | None = None,
    read_only: tuple[Path, ...] = (),
    writable: tuple[Path, ...] = (),
    sockets: tuple[Path, ...] = (),
    outbound_proxy: bool = False,
) -> RunRoom:
    """The run's room: a sandbox policy unless the run is unsandboxed (`--sandbox none`) or its pod is the room.
    `outbound_proxy` (a `network: proxy` task): its commands start behind the relay to the proxy's socket, which
    whoever runs the proxy binds at `room.proxy.socket`."""
    if spec.sandbox is not SandboxMode.bwrap:
        return RunRoom()
    proxy = None
    if outbound_proxy:
        socket_dir = run_dir / SANDBOX_DIR / SOCKETS_DIR
        socket_dir.mkdir(parents=True, exist_ok=True)
        helpers = install_helpers(run_dir, [RELAY])
        proxy = ProxyRoute(socket=socket_dir / "proxy.sock", relay=helpers / RELAY.name)
        read_only, sockets = (*read_only, helpers), tuple(dict.fromkeys((*sockets, socket_dir)))
    from labkube.tasks.environment import sandbox_read_only

    seen, masked = sandbox_read_only(Path(spec.task_path))
    base = run_dir / SANDBOX_DIR
    home, tmp = base / "home", base / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    gpus = gpu_device_nodes(gpu_minors) if spec.gpus > 0 and os.environ.get("CUDA_VISIBLE_DEVICES") else ()
    policy = SandboxPolicy(
        workspace=workspace.resolve(),  # at SANDBOX_WORKSPACE: its host path says nothing to the agent
        writable=writable,
        read_only=(*seen, *read_only),
        masked=masked,
        home=home,
        tmp=tmp,
        sockets=sockets,
        gpu_devices=gpus,
        cwd=workspace.resolve(),
    )
    return RunRoom(policy, proxy)
