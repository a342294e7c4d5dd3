"""A run's local sandbox: what its agent's processes see, built from the run's folder, task environment and GPUs.

The mechanism and the policy document are the spine's (`labkube/sandbox.py`); this module decides, for one run,
what goes in it: the workspace read-write, the task environment's interpreter and packages read-only, a private HOME
and /tmp kept in the run folder (`<run>/sandbox/`) so they last from one command to the next, the run's own GPU
nodes, and nothing else of the host. labkube's own package is hidden inside the interpreter's folder it shares (its
bundled tasks carry their oracles).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from labkube.run_spec import RunSpec
from labkube.sandbox import (
    SANDBOX_HOME,
    SandboxMode,
    SandboxPolicy,
    gpu_device_nodes,
    sandbox_argv,
)

__all__ = ["SANDBOX_DIR", "RunRoom", "run_room"]

SANDBOX_DIR = "sandbox"  # <run>/sandbox/{home,tmp}: the agent's HOME and /tmp, outside its workspace


@dataclass(frozen=True)
class RunRoom:
    """How a run's processes are started: through its sandbox (`policy`), or as they are (`--sandbox none`, a pod)."""

    policy: SandboxPolicy | None = None
    extra_read_only: tuple[Path, ...] = field(default=())

    @property
    def sandboxed(self) -> bool:
        return self.policy is not None

    def command(
        self, argv: list[str], cwd: Path, env: dict[str, str], status_fd: int | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """`argv` as it is started: inside the sandbox with `env` as its whole environment (HOME and TMPDIR the
        sandbox's own), and the environment bubblewrap itself is started with (none of the run's: nothing to read in
        its /proc entry from outside)."""
        if self.policy is None:
            return argv, env
        inner = {**env, "HOME": SANDBOX_HOME, "TMPDIR": "/tmp"}
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
) -> RunRoom:
    """The run's room: a sandbox policy unless the run is unsandboxed (`--sandbox none`) or its pod is the room."""
    if spec.sandbox is not SandboxMode.bwrap:
        return RunRoom()
    from labkube.tasks.environment import sandbox_read_only

    seen, masked = sandbox_read_only(Path(spec.task_path))
    base = run_dir / SANDBOX_DIR
    home, tmp = base / "home", base / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    gpus = gpu_device_nodes(gpu_minors) if spec.gpus > 0 and os.environ.get("CUDA_VISIBLE_DEVICES") else ()
    policy = SandboxPolicy(
        writable=(workspace.resolve(), *writable),
        read_only=(*seen, *read_only),
        masked=masked,
        home=home,
        tmp=tmp,
        sockets=sockets,
        gpu_devices=gpus,
        cwd=workspace.resolve(),
    )
    return RunRoom(policy)
