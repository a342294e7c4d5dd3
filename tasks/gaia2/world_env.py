"""The ARE virtualenv that world processes run in.

ARE (PyPI `meta-agents-research-environments`) pins pydantic 2.10, click 8.1, numpy 2.2 and more, which
conflict with the Kubernetes client and kopf, so it lives in a virtualenv of its own, created once and
cached. `setup_world_env()` is idempotent: a marker file is written only after the install and an import
check succeeded, so an interrupted setup is simply redone.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

from labkube.settings import ARE_VENV

ARE_VERSION = "1.2.0"
ARE_REQUIREMENT = f"meta-agents-research-environments=={ARE_VERSION}"
DEFAULT_VENV = Path("~/.cache/labkube") / f"are-{ARE_VERSION}"
VENV_ENV_VAR = ARE_VENV.name
MARKER = ".labkube-are-ready"

# Imported by the check: the modules the world server needs, so a half-installed venv is caught here.
_IMPORT_CHECK = (
    "import are.simulation.environment, are.simulation.validation, "
    "are.simulation.data_handler.importer, are.simulation.scenarios.utils.registry; "
    "from importlib.metadata import version; print(version('meta-agents-research-environments'))"
)


class WorldEnvError(RuntimeError):
    """The ARE virtualenv cannot be created or used; the message is one line and says what to do."""


def world_env_dir() -> Path:
    """Where the ARE virtualenv lives: `$LABKUBE_ARE_VENV`, else `~/.cache/labkube/are-1.2.0`."""
    return ARE_VENV.read() or DEFAULT_VENV.expanduser()


def _python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_world_env_ready(venv: Path | None = None) -> bool:
    """True when the virtualenv passed its import check for this ARE version."""
    venv = venv or world_env_dir()
    marker = venv / MARKER
    if not marker.is_file() or not _python_in(venv).exists():
        return False
    try:
        return json.loads(marker.read_text()).get("are_version") == ARE_VERSION
    except (OSError, ValueError):
        return False


def world_python(venv: Path | None = None) -> Path:
    """The python of a ready ARE virtualenv (run `setup_world_env()` first)."""
    venv = venv or world_env_dir()
    if not is_world_env_ready(venv):
        raise WorldEnvError(
            f"the ARE {ARE_VERSION} environment at {venv} is not set up: call "
            f"labkube.tasks.gaia2.setup_world_env() (or point {VENV_ENV_VAR} at a ready one)"
        )
    return _python_in(venv)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR") or "Error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def _run(cmd: list[str], what: str, venv: Path, timeout: float) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise WorldEnvError(
            f"{what} for the ARE environment at {venv} took over {timeout:.0f} s (is PyPI reachable?)"
        ) from None
    except OSError as exc:
        raise WorldEnvError(f"{what} for the ARE environment at {venv} could not start: {exc}") from None
    if proc.returncode != 0:
        hint = " (is PyPI reachable?)" if "pip" in cmd else ""
        raise WorldEnvError(
            f"{what} for the ARE environment at {venv} failed: {_last_line(proc.stderr + proc.stdout)}{hint}"
        )
    return proc.stdout


def setup_world_env(force: bool = False, venv: Path | None = None, timeout: float = 1800) -> Path:
    """Create (once) the virtualenv with ARE installed and return its directory.

    Safe to call from several processes at once: a file lock serialises the setup. `force` rebuilds it.
    Raises `WorldEnvError` with a one-line reason when it cannot (no network to PyPI, no disk, ...).
    """
    venv = (venv or world_env_dir()).expanduser()
    if not force and is_world_env_ready(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / f".{venv.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_world_env_ready(venv):
            return venv
        if force and venv.exists():
            shutil.rmtree(venv)
        (venv / MARKER).unlink(missing_ok=True)
        if not _python_in(venv).exists():
            _run([sys.executable, "-m", "venv", "--clear", str(venv)], "creating the virtualenv", venv, timeout)
        pip = [str(_python_in(venv)), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run([*pip, ARE_REQUIREMENT], f"pip install {ARE_REQUIREMENT}", venv, timeout)
        installed = _run([str(_python_in(venv)), "-c", _IMPORT_CHECK], "the import check", venv, 300).strip()
        if installed != ARE_VERSION:
            raise WorldEnvError(f"the ARE environment at {venv} has version {installed!r}, expected {ARE_VERSION}")
        (venv / MARKER).write_text(json.dumps({"are_version": ARE_VERSION, "python": sys.version.split()[0]}))
    return venv
