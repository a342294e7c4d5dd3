"""The CLI's front door: checks of what a user typed, made before anything is started or written, and the one
place where errors the commands meet later become one line on stderr (exit 2) instead of a traceback."""

from __future__ import annotations

import errno
import math
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from pydantic import ValidationError
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
