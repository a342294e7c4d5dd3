"""Ctrl-C, SIGTERM and SIGHUP at any moment of `labkube run` (labkube/interrupts.py): while the imports load, while
Ray starts, during the runs and during the last grading. Each time the command ends within seconds with the one
"interrupted" line and 128 + the signal's number, no traceback, nothing of it left running, and the same command
run again finishes every run. A second signal during the clean-up ends it at once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from tinytask import GRADE_SH, make_tiny_task

from labkube.agent.containment import read_record, tagged_pids

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 10.0
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
RESUMED_LINE = "run the same command again"


@dataclass
class Interrupted:
    returncode: int
    stderr: str
    took_s: float
    left: list[int]


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that stays live for seconds (a step sleeping 6 s), then ends quickly: 5 s of offsets all meet it live."""
    root = tmp_path_factory.mktemp("interrupts")
    steps = [
        {"tool": "bash", "args": {"command": "sleep 6"}},
        {"tool": "bash", "args": {"command": "echo 7 > result.txt"}},
    ]
    return make_tiny_task(root, steps)


@pytest.fixture(scope="module")
def slow_grading_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose agent is done at once and whose final grading takes seconds."""
    root = tmp_path_factory.mktemp("grading")
    task = make_tiny_task(root, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    (task / "grading" / "grade.sh").write_text(GRADE_SH.replace("set -euo pipefail\n", "set -euo pipefail\nsleep 4\n"))
    return task


def command(task: Path, out: Path) -> list[str]:
    return [sys.executable, "-P", "-m", "labkube", "run", str(task), "--out", str(out)]


def start(task: Path, out: Path) -> subprocess.Popen[str]:
    """The CLI as from a terminal: the signals at their defaults (a background test session has SIGINT ignored, and a
    child keeps that), in a session of its own, so what it leaves behind can be found."""

    def defaults() -> None:
        for sig in CODES:
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(
        command(task, out),
        preexec_fn=defaults,
        start_new_session=True,
        cwd=out.parent,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def session_members(sid: int) -> list[int]:
    """The living processes of session `sid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def end(proc: subprocess.Popen[str], sig: signal.Signals) -> Interrupted:
    """Send `sig`, wait for the command's end, then for its session to empty (a few seconds at most)."""
    proc.send_signal(sig)
    sent = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - sent
    deadline = time.monotonic() + 5
    while (left := session_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # the assertion says so; the next tests start clean
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return Interrupted(proc.returncode, stderr, took, left)


def check_interrupted(result: Interrupted, sig: signal.Signals, out: Path) -> None:
    assert result.returncode == CODES[sig], result.stderr
    assert result.took_s < EXIT_WITHIN_S, f"took {result.took_s:.1f} s: {result.stderr}"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert "SIGTERM received" not in result.stderr and "Aborted" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, result.stderr
    if (out / "campaign.json").exists():
        assert f"in {out}" in lines[0] and RESUMED_LINE in lines[0], result.stderr
    assert result.left == [], f"left running: {result.left}"
    for run_dir in (out / "runs").glob("*") if (out / "runs").is_dir() else []:
        record = read_record(run_dir)
        if record is not None:
            assert tagged_pids(record.token) == set(), run_dir
        status = json.loads((run_dir / "status.json").read_text() or "{}") if (run_dir / "status.json").exists() else {}
        assert status.get("phase") in (None, "Pending", "Finished", "Failed"), status


def check_resumes(task: Path, out: Path) -> None:
    again = subprocess.run(
        command(task, out),
        cwd=out.parent,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    runs = list((out / "runs").iterdir())
    assert runs and all((run / "result.json").exists() for run in runs), again.stdout


# Every 0.2 s over the first 5 s: the imports, Ray's start, the runs' start, the runs. Every fifth is run again.
OFFSETS = [round(0.2 * i, 1) for i in range(1, 26)]


@pytest.mark.parametrize("offset", OFFSETS)
def test_sigint_at_any_moment_ends_the_command_and_the_same_command_resumes(
    task: Path, tmp_path: Path, offset: float
) -> None:
    out = tmp_path / "c"
    proc = start(task, out)
    time.sleep(offset)
    assert proc.poll() is None, "the campaign ended before it could be interrupted"
    result = end(proc, signal.SIGINT)
    check_interrupted(result, signal.SIGINT, out)
    if OFFSETS.index(offset) % 5 == 0:
        check_resumes(task, out)


# SIGTERM most densely while Ray starts (about 1 s in): `ray.init` sets SIGTERM handlers of its own.
SIGNAL_OFFSETS = [
    *((signal.SIGTERM, offset) for offset in (0.3, 0.8, 1.0, 1.2, 1.4, 1.6, 2.0, 3.0)),
    *((signal.SIGHUP, offset) for offset in (0.3, 1.3, 3.0)),
]


@pytest.mark.parametrize(("sig", "offset"), SIGNAL_OFFSETS, ids=[f"{s.name}-{o}" for s, o in SIGNAL_OFFSETS])
def test_sigterm_and_sighup_end_it_as_ctrl_c_does(
    task: Path, tmp_path: Path, sig: signal.Signals, offset: float
) -> None:
    out = tmp_path / "c"
    proc = start(task, out)
    time.sleep(offset)
    assert proc.poll() is None, "the campaign ended before it could be interrupted"
    check_interrupted(end(proc, sig), sig, out)


def wait_for_phase(proc: subprocess.Popen[str], out: Path, phase: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        for status in (out / "runs").glob("*/status.json"):
            try:
                if json.loads(status.read_text() or "{}").get("phase") == phase:
                    return
            except (OSError, ValueError):
                pass
        time.sleep(0.05)
    raise AssertionError(f"no run reached {phase}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_during_the_last_grading_ends_it_and_the_same_command_resumes(
    slow_grading_task: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "c"
    proc = start(slow_grading_task, out)
    wait_for_phase(proc, out, "Grading")
    time.sleep(0.5)  # the grader is running
    check_interrupted(end(proc, sig), sig, out)
    check_resumes(slow_grading_task, out)


def test_a_second_sigint_during_the_clean_up_ends_it_at_once(task: Path, tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = start(task, out)
    wait_for_phase(proc, out, "Running")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)  # the clean-up has begun: Ray's shutdown, the supervisors' close
    result = end(proc, signal.SIGINT)
    assert result.returncode == 130, result.stderr
    assert result.took_s < 3.0, f"took {result.took_s:.1f} s"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert "interrupted again: stopped at once" in result.stderr, result.stderr
    assert result.left == [], f"left running: {result.left}"
    for run_dir in (out / "runs").iterdir():
        record = read_record(run_dir)
        assert record is None or tagged_pids(record.token) == set(), run_dir
    check_resumes(task, out)
