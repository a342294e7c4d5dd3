"""Task environments: the virtualenv a ResearchGym task's code runs in, built before the agent's first step.

ResearchGym hides a task's `requirements.txt` and `install.sh` from the agent but builds an environment from them
before it starts (with uv locally). labkube does the same, once per task version:

1. `uv venv --seed` with this interpreter's Python (pip included: tasks' install.sh scripts call it);
2. `uv pip install -r requirements.txt` into it;
3. `bash install.sh` with a copy of the task directory as its working directory, the venv active, and the
   Hugging Face cache (`HF_HOME`) inside the environment, so downloads are cached with it.

An environment is keyed by the hash of requirements.txt, install.sh and the Python version, lives at
`<cache>/<task>-<key>/` (cache: `$LABKUBE_ENV_CACHE`, else `~/.cache/labkube/task-envs`), is built under a lock (runs
of one task wait for one build), and is shared read-only by every run of that task version; a change to either
file is a new key, so a new build. Files install.sh creates in its copy of the task (a marker, downloaded data) are
linked into each run's workspace. The agent's `bash` and `python` tools and the grader run with the venv active
(`activate`). A failed step raises `SetupError` with the step and the last lines of its log; a step that needed the
network while there is none says so and how to pre-populate the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from labkube.settings import ENV_CACHE
from labkube.task_card import TaskCard

REQUIREMENTS = "requirements.txt"
INSTALL_SH = "install.sh"
READY = "labkube-env.json"
TAIL_LINES = 15
NETWORK_SIGNS = re.compile(
    r"(Temporary failure in name resolution|Name or service not known|Could not resolve host|"
    r"Network is unreachable|No route to host|Failed to establish a new connection|Connection refused|"
    r"failed to lookup address|dns error|ConnectTimeout|Max retries exceeded|offline mode is enabled|"
    r"LocalEntryNotFoundError|We couldn't connect to)",
    re.IGNORECASE,
)


class SetupError(RuntimeError):
    """A task environment could not be built: one line, the step, and what to do."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class EnvStep(BaseModel):
    name: str
    seconds: float


class TaskEnvRecord(BaseModel):
    """`<env>/labkube-env.json`: what was built, from what, and how long it took."""

    task: str
    key: str
    python: str
    requirements: bool
    install_sh: bool
    built_at: datetime
    seconds: float
    steps: list[EnvStep] = Field(default_factory=list)


class TaskEnv(BaseModel):
    """An environment ready for a run: where it is, whether this call built it, and how long the call took."""

    path: Path
    key: str
    reused: bool
    seconds: float = Field(description="Time this call spent (building, or waiting for another run's build).")

    @property
    def venv(self) -> Path:
        return self.path / "venv"

    @property
    def task_copy(self) -> Path:
        return self.path / "task"


ENV_VARIABLE = "LABKUBE_TASK_ENV"  # set by the sandbox for `labkube agent`: the run's environment directory


def current_env() -> TaskEnv | None:
    """The environment the sandbox built for this run (`LABKUBE_TASK_ENV`), if any."""
    path = os.environ.get(ENV_VARIABLE)
    if not path:
        return None
    with contextlib.suppress(OSError, ValueError):
        record = TaskEnvRecord.model_validate_json((Path(path) / READY).read_text())
        return TaskEnv(path=Path(path), key=record.key, reused=True, seconds=0.0)
    return None


CACHE_VARIABLE = ENV_CACHE.name


def cache_root() -> Path:
    explicit = ENV_CACHE.read()
    if explicit is not None:
        return explicit
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "labkube" / "task-envs"


def python_version() -> str:
    return ".".join(str(v) for v in sys.version_info[:3])


def env_key(task_dir: Path) -> str | None:
    """The environment's key, or None when the task declares no environment (neither file exists)."""
    parts = [f"python {python_version()}".encode()]
    found = False
    for name in (REQUIREMENTS, INSTALL_SH):
        path = task_dir / name
        if path.is_file():
            found = True
            parts.append(name.encode() + b"\0" + path.read_bytes())
    if not found:
        return None
    return hashlib.sha256(b"\n".join(parts)).hexdigest()[:16]


def env_dir(card: TaskCard, key: str, root: Path | None = None) -> Path:
    """Named by the task's folder, not its `name:`: an overlay may rename a task, and the pod's `task-env` init
    container (which builds the environment) and the agent (which finds it) must agree without it."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", card.folder).strip("-") or "task"
    return (root or cache_root()) / f"{slug}-{key}"


def uv_binary() -> str:
    """uv from this installation (a dependency), else from PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise SetupError("uv is not installed: pip install uv (labkube depends on it)") from None
        return found


# Variables that move a part of the Hugging Face cache away from HF_HOME (the hub's files, datasets, xet chunks).
HF_CACHE_VARIABLES = (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ASSETS_CACHE",
    "HUGGINGFACE_ASSETS_CACHE",
    "HF_DATASETS_CACHE",
    "HF_MODULES_CACHE",
    "HF_XET_CACHE",
    "TRANSFORMERS_CACHE",
    "PYTORCH_TRANSFORMERS_CACHE",
    "PYTORCH_PRETRAINED_BERT_CACHE",
)


def use_hf_cache(env: dict[str, str], hf: Path) -> dict[str, str]:
    """`env` with `hf` as the whole Hugging Face cache: HF_HOME set, and a shell's own HF_HUB_CACHE and the like
    dropped, which would otherwise send setup's downloads (and the run's reads) to a cache outside the environment."""
    for name in HF_CACHE_VARIABLES:
        env.pop(name, None)
    env["HF_HOME"] = str(hf)
    return env


def activate(venv: Path, base: dict[str, str]) -> dict[str, str]:
    """`base` with the venv active: its bin first on PATH, VIRTUAL_ENV set, PYTHONHOME unset; the Hugging Face cache
    of the environment (`use_hf_cache`), read offline unless `base` says otherwise (downloads happened at setup)."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    hf = venv.parent / "cache" / "huggingface"
    if hf.is_dir():
        use_hf_cache(env, hf)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
    return env


def task_python(venv: Path | None) -> str:
    """The interpreter task code runs with: the environment's, else this one."""
    return str(venv / "bin" / "python") if venv is not None else sys.executable


def _clean_base_env() -> dict[str, str]:
    """The environment for setup steps: no API keys and no labkube internals (install.sh is the task's code)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and not k.startswith(("LABKUBE_", "RAY_")) and k != "VIRTUAL_ENV"
    }


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-TAIL_LINES:])


def last_statement(tail: str) -> str:
    """The installer's last statement in `tail`, whole: uv (and miette's other users) wrap an error to the terminal's
    width as indented lines under its `╰─▶`, so the last line alone may be a few words of it."""
    lines = [line for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    first = len(lines) - 1
    while first > 0 and lines[first][:1].isspace() and lines[first - 1][:1].isspace():
        if lines[first].lstrip().startswith(("╰", "\u00d7", "│", "├")):
            break
        first -= 1
    return " ".join(line.strip() for line in lines[first:]).removeprefix("╰─▶").strip()


def _run_step(name: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path, timeout_s: float) -> float:
    started = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}  # {name}, in {cwd}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise SetupError(f"setup step {name} ran past {timeout_s:g} s; see {log}", _tail(log)) from None
        except OSError as exc:
            raise SetupError(f"setup step {name} could not start: {exc.strerror or exc}", _tail(log)) from None
    if proc.returncode != 0:
        tail = _tail(log)
        last = last_statement(tail)
        if NETWORK_SIGNS.search(tail):
            raise SetupError(
                f"setup step {name} needed the network and could not reach it ({last[:200]}); pre-populate the "
                f"environment where there is network (`labkube tasks prepare TASK` with LABKUBE_ENV_CACHE set) and "
                f"copy or mount it at {log.parent}",
                tail,
            )
        raise SetupError(f"setup step {name} failed (exit {proc.returncode}): {last[:300]}", tail)
    return time.monotonic() - started


def _read_ready(path: Path, key: str) -> TaskEnvRecord | None:
    with contextlib.suppress(OSError, ValueError):
        record = TaskEnvRecord.model_validate_json((path / READY).read_text())
        if record.key == key:
            return record
    return None


def ready_env(card: TaskCard, root: Path | None = None) -> bool:
    """Whether the task's environment is built and ready in the cache (without building it)."""
    key = env_key(Path(card.path))
    return key is not None and _read_ready(env_dir(card, key, root), key) is not None


def ensure_env(
    card: TaskCard,
    *,
    root: Path | None = None,
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 3600.0,
) -> TaskEnv | None:
    """The task's environment, built if it is not in the cache yet (None: the task declares none)."""
    task_dir = Path(card.path)
    key = env_key(task_dir)
    if key is None:
        return None
    path = env_dir(card, key, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if _read_ready(path, key) is not None:
        return TaskEnv(path=path, key=key, reused=True, seconds=time.monotonic() - started)
    say = progress or (lambda _: None)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        say(f"waiting for the environment lock of {card.name}")
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _read_ready(path, key) is not None:  # another run built it while we waited
            return TaskEnv(path=path, key=key, reused=True, seconds=time.monotonic() - started)
        _build(card, task_dir, path, key, say, timeout_s)
    return TaskEnv(path=path, key=key, reused=False, seconds=time.monotonic() - started)


def _build(card: TaskCard, task_dir: Path, path: Path, key: str, say: Callable[[str], None], timeout_s: float) -> None:
    if path.exists():  # a build that died half-way: start over
        _make_writable(path)
        shutil.rmtree(path)
    path.mkdir(parents=True)
    log = path / "setup.log"
    venv = path / "venv"
    base = _clean_base_env()
    steps: list[EnvStep] = []
    uv = uv_binary()
    built_started = time.monotonic()
    try:
        say(f"{card.name}: creating the virtualenv (uv, Python {python_version()})")
        argv = [uv, "venv", "--seed", "--python", sys.executable, str(venv)]
        steps.append(EnvStep(name="uv venv", seconds=_run_step("uv venv", argv, path, base, log, timeout_s)))
        active = use_hf_cache(activate(venv, base), path / "cache" / "huggingface")
        if (task_dir / REQUIREMENTS).is_file():
            say(f"{card.name}: installing requirements.txt")
            argv = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "-r", str(task_dir / REQUIREMENTS)]
            seconds = _run_step("requirements.txt", argv, path, active, log, timeout_s)
            steps.append(EnvStep(name="requirements.txt", seconds=seconds))
        if (task_dir / INSTALL_SH).is_file():
            say(f"{card.name}: running install.sh")
            copy = path / "task"
            shutil.copytree(task_dir, copy, symlinks=True)
            (path / "cache").mkdir(exist_ok=True)
            seconds = _run_step("install.sh", ["bash", INSTALL_SH], copy, active, log, timeout_s)
            steps.append(EnvStep(name="install.sh", seconds=seconds))
    except SetupError:
        (path / READY).unlink(missing_ok=True)
        raise
    record = TaskEnvRecord(
        task=card.name,
        key=key,
        python=python_version(),
        requirements=(task_dir / REQUIREMENTS).is_file(),
        install_sh=(task_dir / INSTALL_SH).is_file(),
        built_at=datetime.now(UTC),
        seconds=round(time.monotonic() - built_started, 3),
        steps=steps,
    )
    _make_read_only(venv)
    (path / READY).write_text(record.model_dump_json(indent=2))
    say(f"{card.name}: environment ready in {record.seconds:.1f} s at {path}")


def _make_read_only(root: Path) -> None:
    """Shared by every run of the task: nobody's code may change it."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.chmod(p.stat().st_mode & ~0o222)
    with contextlib.suppress(OSError):
        root.chmod(root.stat().st_mode & ~0o222)


def _make_writable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        with contextlib.suppress(OSError):
            Path(dirpath).chmod(Path(dirpath).stat().st_mode | 0o200)
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.chmod(p.stat().st_mode | 0o200)
        del dirnames


def setup_outputs(env: TaskEnv, task_dir: Path) -> list[Path]:
    """What install.sh created in its copy of the task (a marker, downloaded data): the paths in the copy that the
    task itself does not have, a new directory whole."""
    copy = env.task_copy
    if not copy.is_dir():
        return []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(copy):
        rel_dir = Path(dirpath).relative_to(copy)
        for name in list(dirnames) + filenames:
            rel = rel_dir / name
            if (task_dir / rel).exists() or (task_dir / rel).is_symlink():
                continue
            if name in dirnames:
                dirnames.remove(name)  # a new directory is linked whole
            found.append(copy / rel)
    return found


def sandbox_read_only(task_dir: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """What a sandboxed process of a run of the task at `task_dir` reads (the run's environment and the interpreter
    it links to, its Hugging Face cache, what install.sh made), and what to hide inside that (labkube's own package,
    where the interpreter's folder holds it): (read_only, masked)."""
    from labkube.sandbox import interpreter_prefixes, labkube_package_paths

    env = current_env()
    seen: list[Path] = list(interpreter_prefixes(env.venv if env is not None else None))
    if env is not None:
        hf = env.path / "cache" / "huggingface"
        if hf.is_dir():
            seen.append(hf)
        seen.extend(setup_outputs(env, task_dir))  # what the workspace's setup links point at
    masked = tuple(p for p in labkube_package_paths() if any(p.is_relative_to(r) for r in seen))
    return tuple(seen), masked


def link_setup_outputs(env: TaskEnv, task_dir: Path, workspace: Path) -> list[str]:
    """Link what install.sh created in its copy of the task (`setup_outputs`) into `workspace`, at the same
    relative paths; returns them. Existing workspace paths are never replaced."""
    linked: list[str] = []
    for made in setup_outputs(env, task_dir):
        rel = made.relative_to(env.task_copy)
        target = workspace / rel
        if target.exists() or target.is_symlink() or not target.parent.is_dir():
            continue
        target.symlink_to(made)
        linked.append(str(rel))
    return sorted(linked)
