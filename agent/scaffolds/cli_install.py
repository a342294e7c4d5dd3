"""The third-party agent CLIs, installed from npm at pinned versions into a cache shared by every run on a machine.

Claude Code (`@anthropic-ai/claude-code`) and Codex (`@openai/codex`) are npm packages. Each pinned version is
installed once into `<cache>/<name>-<version>` (`$LABKUBE_CLI_CACHE`, else `~/.cache/labkube/cli-agents`),
atomically (into a temporary directory, renamed when complete) and under a lock, so runs starting together
install it once. The labkube image for pods carries them preinstalled at the same path (`labkube agents install`
in its build), so a pod without registry access never installs.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from labkube.settings import CLI_CACHE

CACHE_VARIABLE = CLI_CACHE.name


class CliAgentSpec(BaseModel):
    """One third-party agent: which npm package at which version, its executable, the API it speaks."""

    model_config = ConfigDict(frozen=True)

    name: Literal["claude-code", "codex"]
    package: str
    version: str
    binary: str
    family: Literal["anthropic", "openai"]

    @property
    def pinned(self) -> str:
        return f"{self.package}@{self.version}"


CLI_AGENTS: dict[str, CliAgentSpec] = {
    "claude-code": CliAgentSpec(
        name="claude-code", package="@anthropic-ai/claude-code", version="2.1.331", binary="claude", family="anthropic"
    ),
    "codex": CliAgentSpec(name="codex", package="@openai/codex", version="0.169.0", binary="codex", family="openai"),
}


class InstallError(RuntimeError):
    pass


def cache_root() -> Path:
    return CLI_CACHE.read() or Path.home() / ".cache" / "labkube" / "cli-agents"


def install_dir(agent: CliAgentSpec) -> Path:
    return cache_root() / f"{agent.name}-{agent.version}"


def executable(agent: CliAgentSpec) -> Path:
    return install_dir(agent) / "node_modules" / ".bin" / agent.binary


def installed(agent: CliAgentSpec) -> Path | None:
    exe = executable(agent)
    return exe if exe.exists() else None


def ensure_installed(agent: CliAgentSpec, timeout_s: float = 900.0) -> Path:
    """The agent's executable, installed from npm first if this machine does not have it yet."""
    if (exe := installed(agent)) is not None:
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError(
            f"npm is not on PATH: install Node.js (20 or later) to run {agent.name}, or set {CACHE_VARIABLE} to a "
            f"directory where `labkube agents install {agent.name}` has put {agent.pinned}"
        )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{agent.name}.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (exe := installed(agent)) is not None:  # another run installed it while we waited
            return exe
        staging = Path(tempfile.mkdtemp(prefix=f".{agent.name}-", dir=root))
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--loglevel=error", agent.pinned],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise InstallError(
                    f"npm install {agent.pinned} failed ({tail}); check that the npm registry is reachable, or "
                    f"install it where it is (`labkube agents install {agent.name}`) and copy {install_dir(agent)}"
                )
            staging.rename(install_dir(agent))
        except subprocess.TimeoutExpired:
            raise InstallError(
                f"npm install {agent.pinned} took over {timeout_s:.0f} s; is the registry reachable?"
            ) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    exe = installed(agent)
    if exe is None:
        raise InstallError(f"{agent.pinned} installed but has no {agent.binary} executable in {install_dir(agent)}")
    return exe


def reported_version(exe: Path, env: dict[str, str] | None = None, command: list[str] | None = None) -> str:
    """What the executable says it is (`--version`; `command`: that, started another way, as in a run's sandbox),
    recorded in the run's result; "" when it fails."""
    argv = command or [str(exe), "--version"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    said = (done.stdout or done.stderr).strip()
    return said.splitlines()[0] if said and done.returncode == 0 else ""
