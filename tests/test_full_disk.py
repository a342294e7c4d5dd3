"""A full disk (issue 45 item 2): `ENOSPC`, `EDQUOT` or `EROFS` met anywhere in a campaign is one line naming the
folder and the filesystem that filled, exit 1, and the campaign resumes once there is space; a run whose workspace
was left half-made is prepared again from the start, never graded from a broken workspace.

Through the CLI on a small tmpfs as `--out` where this machine can mount one (the test skips otherwise); where each
failure surfaces (an agent's git, shutil's collected errors, Ray's wrapping of a supervisor's error, the command
boundary) also in-process, without a mount."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from cli_helpers import BUNDLED_TASK, labkube, one_line_error
from click.testing import CliRunner

from labkube.cli_checks import FrontDoor
from labkube.storage_full import StorageFull, storage_error, storage_full_line
from labkube.tasks import load_task, prepare_run_workspace
from labkube.tasks.workspace import PRISTINE_REF, commit_pristine, workspace_prepared, workspace_record


def mount_tmpfs(path: Path, size: str, *options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    flags = ",".join([f"size={size}", *options])
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", flags, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs, unmounted at the end (skips where mounting is not allowed: it needs CAP_SYS_ADMIN)."""
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "2m"):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def grow(disk: Path) -> None:
    """Free space: the same filesystem, with room now."""
    subprocess.run(["mount", "-o", "remount,size=200m", str(disk)], check=True)


def one_line_exit_1(proc: subprocess.CompletedProcess, disk: Path) -> str:
    line = one_line_error(proc, code=1)
    assert "ray::" not in proc.stderr, proc.stderr
    assert "disk full: " in line and f"on the filesystem at {disk} " in line, line
    assert "run the same command again to resume" in line, line
    return line


def run_dirs(out: Path) -> list[Path]:
    return sorted((out / "runs").iterdir())


def half_made(run: Path) -> bool:
    return not workspace_record(run / "workspace").is_dir()


# -- through the CLI ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seeds", ["1", "3"])
def test_a_full_disk_is_one_line_and_the_same_command_resumes(small_disk: Path, tmp_path: Path, seeds: str) -> None:
    out = small_disk / "c"
    args = ("run", BUNDLED_TASK, "--model", "oracle", "--seeds", seeds, "--out", str(out))
    one_line_exit_1(labkube(*args, cwd=tmp_path, timeout=300), small_disk)
    assert not any((run / "result.json").exists() for run in run_dirs(out)), "a full disk ended a run"
    left_half_made = [run.name for run in run_dirs(out) if half_made(run)]
    assert left_half_made, "the disk filled after every workspace was prepared: the test proves nothing"

    grow(small_disk)
    again = labkube(*args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(run_dirs(out)) == int(seeds)
    for run in run_dirs(out):
        result = json.loads((run / "result.json").read_text())
        assert result["status"] == "Finished" and result["stop_reason"] == "done", result
        assert result["integrity_verdict"] == "PASS", (run.name, result.get("message"))
        assert not half_made(run)


@pytest.mark.slow
def test_a_run_left_with_a_half_made_git_is_prepared_again(small_disk: Path, tmp_path: Path) -> None:
    """The issue's run: a preparation killed while it wrote the agent's `.git` (no record yet). Resumed as it was,
    it was graded and audited from a broken workspace (`git read-tree labkube-pristine: fatal: not a git
    repository`); it is prepared again from the start."""
    out = small_disk / "c"
    args = ("run", BUNDLED_TASK, "--model", "oracle", "--out", str(out))
    one_line_exit_1(labkube(*args, cwd=tmp_path, timeout=300), small_disk)
    grow(small_disk)
    (run,) = run_dirs(out)
    workspace = run / "workspace"
    shutil.rmtree(workspace_record(workspace), ignore_errors=True)
    workspace.mkdir(exist_ok=True)
    (workspace / ".git" / "objects").mkdir(parents=True, exist_ok=True)  # git init's start, and nothing more
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (workspace / "train.py").write_text("half copied")

    again = labkube(*args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "Finished" and result["integrity_verdict"] == "PASS", result.get("message")
    assert workspace_record(workspace).is_dir()
    assert (workspace / ".git" / PRISTINE_REF).is_file()


# -- where a full disk surfaces, in-process ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "what"),
    [(errno.ENOSPC, "disk full"), (errno.EDQUOT, "disk quota used up"), (errno.EROFS, "read-only filesystem")],
)
def test_each_storage_errno_is_one_line_naming_the_file_and_its_filesystem(number: int, what: str) -> None:
    line = storage_full_line(OSError(number, os.strerror(number), "/tmp/camp/runs/r/status.json"))
    assert line is not None and line.startswith(f"{what}: ")
    assert "/tmp/camp/runs/r/status.json" in line and "on the filesystem at /" in line
    assert storage_full_line(OSError(errno.EACCES, "Permission denied", "/x")) is None
    assert storage_full_line(ValueError("no")) is None


def test_a_storage_error_a_ray_actor_raised_is_unwrapped() -> None:
    from ray.exceptions import RayTaskError

    inner = OSError(errno.ENOSPC, "No space left on device", "/tmp/c/runs/r/containment.json")
    wrapped = RayTaskError("SupervisorActor.supervise", "Traceback ...long...", inner).as_instanceof_cause()
    line = storage_full_line(wrapped)
    assert line is not None and "/tmp/c/runs/r/containment.json" in line and "Traceback" not in line
    said = StorageFull("run r: disk full: no space left on device on the filesystem at /tmp (writing /tmp/x)")
    wrapped = RayTaskError("SupervisorActor.supervise", "Traceback ...long...", said).as_instanceof_cause()
    assert storage_full_line(wrapped) == str(said)


def test_copytrees_collected_errors_and_an_os_write_without_a_name_are_found() -> None:
    copied = shutil.Error([("/src/a", "/dst/a", "[Errno 28] No space left on device: '/src/a' -> '/dst/a'")])
    found = storage_error(copied)
    assert found is not None and found.errno == errno.ENOSPC and found.filename == "/dst/a"
    nameless = storage_error(OSError(errno.ENOSPC, "No space left on device"), "/tmp/c/runs/r")
    assert nameless is not None and nameless.filename == "/tmp/c/runs/r"


def test_a_read_only_disk_stops_labkubes_git_with_a_storage_error(tmp_path: Path) -> None:
    """git says `Read-only file system` in its own words: labkube's git raises it as an OSError, which the agent
    turns into its disk-full exit (resumable) instead of a failed run."""
    disk = tmp_path / "ro"
    if not mount_tmpfs(disk, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        (disk / "workspace").mkdir()
        (disk / "workspace" / "a.txt").write_text("a\n")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(OSError) as raised:
            commit_pristine(disk / "workspace")
        assert storage_full_line(raised.value) is not None
        assert raised.value.errno == errno.EROFS
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def boundary(error: BaseException) -> click.Group:
    @click.group(cls=FrontDoor)
    def group() -> None:
        pass

    @group.command()
    def fail() -> None:
        raise error

    return group


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_the_command_boundary_says_a_storage_error_in_one_line_exit_1(number: int) -> None:
    from ray.exceptions import RayTaskError

    inner = OSError(number, os.strerror(number), "/tmp/c/runs/r/status.json")
    for error in (inner, RayTaskError("SupervisorActor.supervise", "Traceback ...", inner).as_instanceof_cause()):
        result = CliRunner().invoke(boundary(error), ["fail"])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "/tmp/c/runs/r/status.json" in lines[0]


# -- a half-made workspace ---------------------------------------------------------------------------------------


def test_a_workspace_without_its_record_is_half_made_and_prepared_again(tmp_path: Path) -> None:
    card = load_task(BUNDLED_TASK)
    run = tmp_path / "run"
    workspace = run / "workspace"
    (workspace / ".git").mkdir(parents=True)  # a preparation killed in `git init`
    (workspace / "stray.txt").write_text("left by the killed copy\n")
    assert not workspace_prepared(workspace)
    prepare_run_workspace(card, workspace)
    assert workspace_prepared(workspace) and not (workspace / "stray.txt").exists()
    assert (workspace / ".git" / PRISTINE_REF).is_file()


def test_a_workspace_of_a_labkube_from_before_the_record_is_kept_once_its_agent_started(tmp_path: Path) -> None:
    workspace = tmp_path / "run" / "workspace"
    (workspace / ".git").mkdir(parents=True)
    (workspace / "work.txt").write_text("the agent's\n")
    assert not workspace_prepared(workspace)  # no agent ever ran: nothing to keep
    (tmp_path / "run" / "checkpoint.json").write_text("{}")
    assert workspace_prepared(workspace)


@pytest.mark.parametrize("task", ["gaia/demo"])
def test_a_half_made_gaia_workspace_is_made_again(tmp_path: Path, task: str) -> None:
    from labkube.tasks import resolve_tasks

    card = resolve_tasks(task)[0]
    workspace = tmp_path / "run" / "workspace"
    (workspace / ".git" / "objects").mkdir(parents=True)
    prepare_run_workspace(card, workspace)
    assert workspace_prepared(workspace) and (workspace / ".git" / PRISTINE_REF).is_file()
