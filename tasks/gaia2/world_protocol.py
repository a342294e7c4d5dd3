"""What every part of the Gaia2 world process shares: the protocol's error (`ProtocolError`, which the HTTP
handler turns into `{"error": ...}` with its status), calls with a deadline, and one-line messages.

Standalone like world_server.py (stdlib only), imported by name from the same folder in ARE's virtualenv.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger("labkube.world")


UTC = timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+; ARE also runs on 3.10)
# How long `POST /finish` may spend validating a run (ARE's judge, its soft checks' model calls included) before the
# world answers 504 and the run is a world_error. The judge's own model time-out is shorter (labkube's default
# `--judge-timeout`), so a judge model that never answers is the judge's failure, not the world's.
VALIDATION_DEADLINE_S = 300.0
DEFAULT_JUDGE_TIMEOUT_S = 120.0


class ProtocolError(Exception):
    """A request the world cannot serve; becomes `{"error": message}` with this HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:2000]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def with_deadline(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run `fn` in a helper thread; a call that outlives `seconds` becomes a 504 instead of a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name=f"world-{what}")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise ProtocolError(504, f"{what} did not finish within {seconds:.0f} s; load a scenario again")
    if "error" in box:
        raise box["error"]
    return box.get("value")
