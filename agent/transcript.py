"""Append-only JSONL logs: the transcript (every model call and tool call) and the conversation.

Neither file is ever rewritten while a run grows. A checkpoint records their
byte offsets after the last completed step; resuming truncates whatever a
crashed step left past that point, so no step is recorded twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class JsonlLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("ab")
        self.written_end: int | None = None  # where this object's last line ended in the file; None before one

    @property
    def offset(self) -> int:
        return self._fh.tell()

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, default=str, ensure_ascii=False).encode() + b"\n")
        self._fh.flush()
        # Another writer may append to the same file (a pod's gateway sidecar) or truncate it (the agent resuming):
        # `offset` is then this object's position as it last moved, and only a write of its own makes it current.
        self.written_end = self._fh.tell()

    def truncate(self, offset: int) -> None:
        """Drop everything after `offset` (a crashed step's partial records)."""
        self._fh.flush()
        if self.path.stat().st_size > offset:
            os.truncate(self.path, offset)
        self._fh.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._fh.close()


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def read_jsonl(path: Path, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    """Records between two byte offsets; a torn last line is skipped."""
    out = []
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(max(0, end - start))
    except FileNotFoundError:
        return []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file, one line at a time (memory bounded by a line); a torn or malformed line, or one
    that is not an object, is skipped; a missing file has none."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record
