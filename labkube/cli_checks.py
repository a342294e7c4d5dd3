"""The CLI's front door: checks of what a user typed, made before anything is started or written, and the one
place where errors the commands meet later become one line on stderr (exit 2) instead of a traceback."""

from __future__ import annotations

import difflib
import errno
import math
import os
import socket
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape

from labkube import interrupts
from labkube.settings import settings_problems
from labkube.storage_full import storage_full_line
from labkube.store import CampaignDir, StoreError
from labkube.tasks import TaskError

err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
# Wide tables when output goes to a file or a pipe, the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 150)

RAY_CONNECT_TIMEOUT_S = 3.0
BUG_LINE = "this is a bug in labkube: please report it with the command you ran and the traceback above"


class UsageFailure(click.ClickException):
    """Bad input: one line on stderr, exit 2."""

    exit_code = 2

    def show(self, file: object = None) -> None:
        message = " ".join(self.message.split())  # one line, whatever the message holds
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


class DiskFailure(UsageFailure):
    """A full, over-quota or read-only disk (labkube/storage_full.py): one line, exit 1, as the machine's failure and
    not bad input; the same command resumes once there is space."""

    exit_code = 1


def os_error_line(exc: OSError) -> str:
    """`PATH: what went wrong` for an error on a file or folder."""
    where = exc.filename if exc.filename is not None else ""
    what = exc.strerror or type(exc).__name__
    return f"{where}: {what}" if where else what


# The commands that start a campaign, as their words on the command line: the settings are checked before them.
COMMANDS_CHECKING_SETTINGS = (("run",), ("demo",), ("campaign", "run"))
HELP_OPTIONS = ("-h", "--help")


def check_settings() -> None:
    """The `LABKUBE_*` settings (labkube/settings.py), refused as a flag is: one line, exit 2."""
    problems = settings_problems()
    if problems:
        raise UsageFailure(f"{problems[0]} (`labkube settings` lists every setting)")


class FrontDoor(click.Group):
    """The `labkube` group: a store, task or file error a command meets is shown as one line (exit 2); any other
    exception is a labkube bug, shown with its traceback and a line asking for a report. The commands that start a
    campaign have the settings checked first, before their options are read (an option's default may come from
    one) and before anything is written."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        resolved = super().resolve_command(ctx, args)
        words = tuple(args[:2])
        starts_a_campaign = any(words[: len(command)] == command for command in COMMANDS_CHECKING_SETTINGS)
        asks_for_help = ctx.resilient_parsing or any(a in HELP_OPTIONS for a in args)  # resilient: shell completion
        if starts_a_campaign and not asks_for_help:
            check_settings()
        else:  # a command that starts nothing meets signals as Python does
            interrupts.hand_back()
        return resolved

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except Exception as exc:
                full = storage_full_line(exc)  # wherever it surfaced: here, or wrapped by Ray from a supervisor
                if full is None:
                    raise
                raise DiskFailure(full) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:  # before anything was started (labkube run handles its own: runs to mark)
            err_console.print("[yellow]interrupted[/]", highlight=False)
            sys.exit(interrupts.exit_code())
        except (StoreError, TaskError) as exc:
            raise UsageFailure(str(exc)) from None
        except OSError as exc:
            if exc.filename is None:
                raise
            raise UsageFailure(os_error_line(exc)) from None
        except Exception:
            traceback.print_exc()
            err_console.print(f"[bold red]{BUG_LINE}[/]", highlight=False, soft_wrap=True)
            sys.exit(1)


def first_validation_error(exc: ValidationError, what: str) -> str:
    """The first thing Pydantic refused, as one line: `WHAT: field.path: message`."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{what}: {where}: {msg}"


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`did you mean X?` for the valid name nearest `word`, or None where none is near."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]}?" if close else None


# What a value must be, by the kind of error Pydantic reports (its `ctx` fills the braces).
ACCEPTS = {
    "greater_than": "a number above {gt}",
    "greater_than_equal": "a number of at least {ge}",
    "less_than": "a number below {lt}",
    "less_than_equal": "a number of at most {le}",
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "literal_error": "one of {expected}",
    "enum": "one of {expected}",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} item(s)",
    "string_pattern_mismatch": "text matching {pattern}",
}


def _shown(value: Any) -> str:
    """A value as the user wrote it, short: 0 for 0.0, the text of a string, a long value cut."""
    if isinstance(value, float):
        return f"{value:g}"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _accepts(errors: list[dict[str, Any]]) -> str:
    """What the value must be, from the errors Pydantic gave for it (several for a union: `int | list[int]`)."""
    phrases: list[str] = []
    for err in errors:
        template = ACCEPTS.get(err["type"])
        if template is None:
            return err["msg"].removeprefix("Value error, ")
        ctx = {k: _shown(v) for k, v in (err.get("ctx") or {}).items()}
        try:
            phrase = template.format_map(ctx)
        except KeyError:  # a Pydantic that no longer says the bound: its own words
            return err["msg"]
        if phrase not in phrases:
            phrases.append(phrase)
    return "give " + " or ".join(phrases)


def _user_path(loc: tuple[int | str, ...], data: Any) -> tuple[int | str, ...]:
    """The part of Pydantic's `loc` that is keys and indexes of the user's own data: the names of union members
    (`seeds.int`) and validators it adds are not what the user typed."""
    path: list[int | str] = []
    for part in loc:
        in_mapping = isinstance(data, dict) and part in data
        in_list = isinstance(data, (list, tuple)) and isinstance(part, int) and 0 <= part < len(data)
        if in_mapping or in_list:
            data = data[part]
            path.append(part)
    return tuple(path)


def _keys_at(model: type[BaseModel], path: tuple[int | str, ...]) -> list[str]:
    """The keys the model accepts where `path` leads (a nested model's own keys for `budgets.wall_hour`)."""
    for part in path:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return list(model.model_fields)


def data_error_line(exc: ValidationError, data: Any, model: type[BaseModel], where: str) -> str:
    """What Pydantic refused in a mapping the user wrote (a campaign YAML), as one line in the user's words:
    `FILE: KEY is VALUE; give WHAT IT ACCEPTS`, a key not accepted with the nearest that is."""
    # a key not accepted first: `task:` for `tasks:` also leaves `tasks` missing, and the typo is what to fix
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    path = _user_path(errors[0]["loc"], data)
    same = [e for e in errors if _user_path(e["loc"], data) == path]
    key = ".".join(str(p) for p in path)
    first = same[0]
    if first["type"] == "extra_forbidden":
        accepted = _keys_at(model, path[:-1])
        hint = did_you_mean(str(path[-1]), accepted) or f"the keys: {', '.join(accepted)}"
        return f"{where}: {key} is not a key it accepts; {hint}"
    if first["type"] == "missing":  # not in the user's data: the path is Pydantic's, its last part the key
        missing = ".".join(str(p) for p in (*path, first["loc"][-1]))
        return f"{where}: {missing} is missing; add it"
    if not key:  # a check across keys, its own message
        return f"{where}: {_accepts(same).removeprefix('give ')}"
    if first["type"] == "value_error":
        return f"{where}: {key}: {_accepts(same)}"
    return f"{where}: {key} is {_shown(first['input'])}; {_accepts(same)}"


def _flag_name(param: click.Parameter) -> str:
    """How the user names `param`: its long flag, or the argument's metavar."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def option_error_line(exc: ValidationError, command: click.Command, values: dict[str, Any]) -> str:
    """What Pydantic refused in a model built from `command`'s options, as one line naming the flag the user gave
    and what it accepts. A field is the option's own name, or it with its unit: `grade_interval_s` for
    `--grade-interval`."""
    errors = exc.errors()
    field = str(errors[0]["loc"][0]) if errors[0]["loc"] else ""
    same = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]]
    params = {p.name: p for p in command.params}
    param = params.get(field) or params.get(field.removesuffix("_s"))
    if not field:  # a check across options: its own message names them
        return _accepts(errors).removeprefix("give ")
    if param is None or param.name is None:
        return first_validation_error(exc, "campaign")
    value = values.get(param.name)
    if errors[0]["type"] == "value_error" or isinstance(value, (list, tuple)) or isinstance(param, click.Argument):
        return _accepts(same) if isinstance(param, click.Argument) else f"{_flag_name(param)}: {_accepts(same)}"
    return f"{_flag_name(param)} {_shown(value)}: {_accepts(same)}"


def open_campaign(directory: Path) -> CampaignDir:
    """The campaign directory a user named, or one line saying why it is not one."""
    cdir = CampaignDir(directory)
    if not cdir.exists():
        raise UsageFailure(f"{directory}: not a campaign directory (no campaign.json); pass the --out of a run")
    try:
        cdir.load_spec()
    except StoreError as exc:
        raise UsageFailure(f"{exc}: not a campaign labkube wrote (empty or damaged); pass the --out of a run") from None
    return cdir


def check_output_dir(out: Path, flag: str = "--out") -> None:
    """`out` can be a directory this process creates or writes: not a file, and under a folder it may write."""
    path = Path(os.path.abspath(out.expanduser()))
    if path.exists() and not path.is_dir():
        raise UsageFailure(f"{flag} {out}: is a file, not a directory; choose a directory")
    _check_creatable(path, f"{flag} {out}")


def check_output_file(target: Path, flag: str = "--out") -> None:
    """`target` can be written as a file: not a directory, and its folder exists or can be created."""
    path = Path(os.path.abspath(target.expanduser()))
    if path.is_dir():
        raise UsageFailure(f"{flag} {target}: is a directory; give a file name")
    _check_creatable(path.parent, f"{flag} {target}")


def _check_creatable(path: Path, what: str) -> None:
    """The directory `path` exists and is writable, or the nearest folder that exists above it is."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageFailure(f"{what}: {existing} is a file, not a directory; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageFailure(f"{what}: {existing} is not writable by you; choose another path")


def write_output_file(target: Path, text: str, flag: str = "--out") -> None:
    """Write `text` to `target`, creating its folder; a failure is one line."""
    check_output_file(target, flag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageFailure(f"{flag} {target}: {exc.strerror or exc}") from None


def check_port_free(port: int | None, flag: str = "--metrics-port") -> None:
    """Nothing listens on `port` (all interfaces, as the metrics server binds)."""
    if port is None or port == 0:
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as the metrics server binds (http.server reuses the address): a port left in TIME_WAIT by the last run is free
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise UsageFailure(f"{flag} {port}: {why}; choose another port (or stop what holds it)") from None
    finally:
        sock.close()


def ray_host_port(address: str) -> tuple[str, int] | None:
    """The GCS host and port a `--ray-address` names (`IP:PORT` or `ray://HOST:PORT`), None for `auto`/`local`."""
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise UsageFailure(f"--ray-address {address}: write HOST:PORT (the Ray head's GCS) or ray://HOST:PORT")
    return parts.hostname, port


# An HTTP/2 client's connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server, which both a
# Ray head's GCS and its Ray Client server are, answers with a SETTINGS frame of its own.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


def check_ray_address(address: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A gRPC server answers at the Ray address, found with one bounded connect and an HTTP/2 handshake (Ray's own
    client retries for minutes, and a port that answers something else, a web server, would fail only then)."""
    if address is None:
        return
    host_port = ray_host_port(address)
    if host_port is None:
        return
    try:
        with socket.create_connection(host_port, timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(_HTTP2_PREFACE)
            header = _read_exactly(sock, 9)
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise UsageFailure(
            f"--ray-address {address}: no Ray cluster answers there ({why} after at most {timeout_s:g} s); start one "
            "with `ray start --head` and pass the address it prints, or leave --ray-address out to start one here"
        ) from None
    if len(header) < 9 or header[3] != _HTTP2_SETTINGS:
        said = header.split(b"\r\n", 1)[0].decode(errors="replace").strip() or "nothing"
        raise UsageFailure(
            f"--ray-address {address}: something answers there, but not Ray (it does not speak gRPC; it said "
            f"{said[:60]!r}); pass the address `ray start --head` printed (the GCS port, 6379 by default) or "
            "ray://HOST:10001"
        )


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    """Up to `n` bytes; fewer when the peer closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def check_finite_positive(value: float | None, flag: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageFailure(f"{flag} {value}: give a finite number above 0")
