"""The store's atomic JSON writes: where the temporary file goes, what it leaves, what a reader gets."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from labkube.agent.checkpoint import Checkpoint
from labkube.result import RunResult
from labkube.run_spec import RunStatus
from labkube.store import CampaignDir, NotRegularFile, RunDir, read_model, read_regular, write_json_atomic, write_model


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


def _read_within(seconds: float, read: Callable[[], object], fifo: Path) -> object:
    """`read()` in a thread, which must return within `seconds`; a reader stuck on the FIFO is let go (a writer opens
    it) and the test fails rather than hangs."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(read)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            pytest.fail(f"reading {fifo} blocked")


@pytest.mark.parametrize("name", ["status.json", "checkpoint.json", "result.json"])
def test_a_fifo_where_labkube_expects_its_json_is_refused_at_once_with_a_message(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41: an agent's FIFO named status.json (on a shared claim, in its run folder) blocked the supervisor's read
    on its actor's event loop, freezing every run of the actor. Refused without a writer, with one line saying so."""
    cdir = CampaignDir(tmp_path / "campaign")
    run_dir = cdir.run_dir("r1")
    run_dir.mkdir(parents=True)
    fifo = run_dir / name
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="is a FIFO, not a regular file"):
        _read_within(5, lambda: read_regular(fifo), fifo)
    model = {"status.json": RunStatus, "checkpoint.json": Checkpoint, "result.json": RunResult}[name]
    with caplog.at_level(logging.WARNING, logger="labkube.store"):
        assert _read_within(5, lambda: read_model(fifo, model), fifo) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"labkube: {fifo} is a FIFO, not a regular file: labkube reads its own JSON only from one"
    ]
    if name == "status.json":  # as the supervisor and `labkube status` read it
        assert _read_within(5, lambda: cdir.status("r1"), fifo) is None
        assert _read_within(5, lambda: read_model(RunDir(run_dir).status_json, RunStatus), fifo) is None


def test_a_link_where_labkube_expects_its_json_is_not_followed(tmp_path: Path) -> None:
    """A symbolic link an agent puts in place of status.json (to /dev/zero, or to a file out of its volume) is
    refused, not followed; a regular file is read as before."""
    target = tmp_path / "elsewhere.json"
    write_model(target, RunStatus(run_id="r1"))
    link = tmp_path / "status.json"
    link.symlink_to(target)
    with pytest.raises(NotRegularFile, match="is a symbolic link"):
        read_regular(link)
    assert read_model(link, RunStatus) is None
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert read_model(tmp_path / "zero.json", RunStatus) is None
    assert read_model(target, RunStatus) == RunStatus(run_id="r1")
    assert read_model(tmp_path / "missing.json", RunStatus) is None
