"""The store's atomic JSON writes: where the temporary file goes, what it leaves, what a reader gets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labkube.store import write_json_atomic


def test_a_write_makes_its_missing_directory_and_leaves_only_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r1" / "status.json"
    write_json_atomic(path, {"phase": "Starting"})
    write_json_atomic(path, {"phase": "Finished"})
    assert json.loads(path.read_text()) == {"phase": "Finished"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["status.json"]


def test_a_written_file_is_readable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    before = os.umask(0o077)
    try:
        write_json_atomic(tmp_path / "result.json", {"score": 1.0})
    finally:
        os.umask(before)
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o644


def test_a_temporary_file_an_earlier_process_left_is_stepped_over(tmp_path: Path) -> None:
    """A process killed between its temporary file and the rename leaves `.NAME.PID.N.tmp`; a later process with the
    same pid writes beside it, not into it, and leaves it as it was."""
    path = tmp_path / "checkpoint.json"
    left = [tmp_path / f".checkpoint.json.{os.getpid()}.{n}.tmp" for n in range(200)]
    for stale in left:
        stale.write_text("half")
    write_json_atomic(path, {"step": 3})
    assert json.loads(path.read_text()) == {"step": 3}
    assert all(stale.read_text() == "half" for stale in left)


def test_a_value_that_cannot_be_encoded_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"phase": "Running"})

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    with pytest.raises(ValueError, match="no text"):  # pydantic-core's serialization error is a ValueError
        write_json_atomic(path, {"phase": Unprintable()})
    assert json.loads(path.read_text()) == {"phase": "Running"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
