"""`labkube agent --run-dir DIR`, the process a sandbox runs for one run, as a function of the agent room: the
command line (labkube/agents_cli.py) parses its options into it, and the agent zygote's forked children
(operator/agent_zygote.py) call it directly, so both are the same process to the supervisor that reads them.

Around the run itself (`agent_main.main`) it takes the API keys off the environment (onto stdin, re-executing the
command in a pod), reads `--finalize`'s reason, leaves the result in a pod's termination message, and turns what a
run directory or a user can get wrong into one `error: ...` line on stderr and an exit code, the last line of
`logs/agent.stderr` that the supervisor reports (operator/run_failure.py `last_error_line`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from labkube.agent.harness.agent_main import DISK_FULL_EXIT, DiskFull
from labkube.agent.harness.agent_main import main as run_agent
from labkube.agent.harness.entrypoint import AgentError
from labkube.budgets import StopReason
from labkube.hardening import not_dumpable
from labkube.result import RunResult, termination_report
from labkube.store import StoreError, read_model
from labkube.tasks import TaskError
from labkube.tasks.gaia2.verdict_message import CONTROL_FILE_VARIABLE
from labkube.tasks.gaia2.world_client import CONTROL_TOKEN_VARIABLE

BAD_INPUT_EXIT = 2  # as every labkube command's one-line refusal (labkube/cli_checks.py UsageFailure)


def agent_process(run_dir: Path, resume: bool = False, finalize_reason: str | None = None) -> int:
    """Run `run_dir`'s agent in this process (or only grade its stopped run, with `finalize_reason`) and return the
    exit code: the run's (`agent_main.main`: 0 finished, 1 failed, 143 terminated), DISK_FULL_EXIT (resumable) or
    BAD_INPUT_EXIT, each of the last two after one `error: ...` line on stderr. Any other exception is a labkube
    bug and is left to the caller (the command line shows its traceback and asks for a report)."""
    not_dumpable()  # the keys arrive next: closed to the agent's commands (labkube/hardening.py)
    try:
        code = _run(run_dir, resume, finalize_reason)
    except DiskFull as exc:
        _error_line(str(exc))
        return DISK_FULL_EXIT
    except (AgentError, StoreError, TaskError) as exc:
        _error_line(str(exc))
        return BAD_INPUT_EXIT
    except OSError as exc:  # a file of the run directory it cannot use: `PATH: what went wrong`
        if exc.filename is None:
            raise
        _error_line(f"{exc.filename}: {exc.strerror or type(exc).__name__}")
        return BAD_INPUT_EXIT
    return code


def prepare_for_runs() -> None:
    """In a process that forks runs (the agent zygote), before it forks: what every run's agent would otherwise
    work out for itself. The price table its first model call reads (a YAML parse, 10-25 ms), the schemas of
    rg-agent's tools (from their type hints and docstrings, about 5 ms) and the pristine repository of an empty
    workspace (four `git` processes); `end_prepared_runs` removes that repository."""
    import tempfile

    from labkube.agent.pricing import default_prices
    from labkube.agent.rg.tools import ToolContext, research_tools
    from labkube.agent.rg.workspace import Workspace
    from labkube.tasks import make_empty_pristine

    default_prices()
    research_tools(ToolContext(workspace=Workspace(tempfile.gettempdir())))
    make_empty_pristine()


def end_prepared_runs() -> None:
    from labkube.tasks import remove_empty_pristine

    remove_empty_pristine()


def _run(run_dir: Path, resume: bool, finalize_reason: str | None) -> int:
    secret_env = [n for n in os.environ.pop("LABKUBE_STDIN_VARS", "").split(",") if n]
    control_file = os.environ.pop(CONTROL_FILE_VARIABLE, "")
    if control_file and os.environ.get("LABKUBE_KEYS_ON_STDIN") != "1":
        os.environ[CONTROL_TOKEN_VARIABLE] = take_world_control_token(Path(control_file))
        secret_env.append(CONTROL_TOKEN_VARIABLE)
    if secret_env and os.environ.get("LABKUBE_KEYS_ON_STDIN") != "1":
        keys_to_stdin_and_reexec(secret_env)
    if os.environ.pop("LABKUBE_KEYS_ON_STDIN", None) == "1":
        from labkube.agent.providers.registry import set_secrets

        line = sys.stdin.readline()
        try:
            set_secrets({str(k): str(v) for k, v in json.loads(line or "{}").items()})
        except (ValueError, AttributeError):
            raise AgentError("the API keys on stdin are not a JSON object") from None
    reason = None
    if finalize_reason is not None:
        try:
            reason = StopReason(finalize_reason)
        except ValueError:
            raise AgentError(f"--finalize: unknown reason {finalize_reason!r}") from None
    code = run_agent(run_dir, resume, reason)
    report_termination(run_dir)
    return code


def _error_line(message: str) -> None:
    """One line on stderr, as the command line's refusals print it (labkube/cli_checks.py UsageFailure.show)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    console.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


def keys_to_stdin_and_reexec(names: list[str]) -> None:
    """A pod gets its API keys as environment variables from Secrets (`LABKUBE_STDIN_VARS` names them), where
    the agent's own commands could read them in `/proc/<pid>/environ`. Hand them over on a pipe as stdin, as
    the local sandbox does, and exec this command again without them: the new environ holds no key."""
    keys = {name: os.environ.pop(name) for name in names if name in os.environ}
    read, write = os.pipe()
    os.write(write, (json.dumps(keys) + "\n").encode())  # a few hundred bytes: far below the pipe's buffer
    os.close(write)
    os.dup2(read, sys.stdin.fileno())
    os.close(read)
    os.environ["LABKUBE_KEYS_ON_STDIN"] = "1"
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", "labkube", *sys.argv[1:]])


def take_world_control_token(path: Path) -> str:
    """A Gaia2 pod's world sidecar wrote its control token to `path` (on a memory volume of the pod, read-only here)
    before it listened, and removes it at the first request that carries it: the harness's loading of the scenario,
    before any of the agent's commands runs. From here on the token is only in this process (then on stdin, as the
    keys), never in a file or an environment the agent's shell can read."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise AgentError(
            f"the world sidecar left no control token at {path} (it writes one before it listens, once per pod): "
            "see the pod's world container log; a world restarted in its pod publishes none"
        ) from None
    if not token:
        raise AgentError(f"the world sidecar's control token at {path} is empty: see the pod's world container log")
    return token


def report_termination(run_dir: Path) -> None:
    """In a pod, leave the run's result in the container's termination message (`LABKUBE_TERMINATION_LOG`,
    the pod's `terminationMessagePath`): the operator reads it from the API when it does not share the volume."""
    path = os.environ.get("LABKUBE_TERMINATION_LOG")
    if not path:
        return
    result = read_model(run_dir / "result.json", RunResult)
    if result is not None and result.final:
        with contextlib.suppress(OSError):  # no termination log is not a failed run
            Path(path).write_text(termination_report(result))
