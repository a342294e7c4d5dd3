"""scripts/test.sh stops only the Prometheus processes its own package install started, by pid (issue #25 item 5).

The real functions from scripts/prometheus_pids.sh run in bash against real processes; they are named after a
made-up program (a copy of `sleep`) rather than `prometheus`, so the test never touches a Prometheus that someone
else's test or the user started.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ROOT / "scripts" / "prometheus_pids.sh"
NAME = "lkfakeprom"  # a process name (comm, at most 15 characters) no real program has


def bash(script: str, *args: str) -> str:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f". {FUNCTIONS}; {script}", "bash", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return proc.stdout


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def test_only_processes_started_after_the_snapshot_are_stopped(tmp_path: Path) -> None:
    program = tmp_path / NAME
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    users = subprocess.Popen([program, "60"])
    started = None
    try:
        before = bash(f"prometheus_pids {NAME}")
        assert before.split() == [str(users.pid)]
        started = subprocess.Popen([program, "60"])
        assert sorted(bash(f"prometheus_pids {NAME}").split()) == sorted([str(users.pid), str(started.pid)])
        bash(f'stop_new_prometheus "$1" {NAME}', before)
        deadline = time.monotonic() + 10
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(started), "the process started after the snapshot is still running"
        assert alive(users), "a process that was running before the install was stopped"
    finally:
        for proc in (users, started):
            if proc is not None and alive(proc):
                proc.kill()
                proc.wait()


def test_the_test_command_stops_nothing_by_name() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    for by_name in ("pkill", "killall"):
        assert by_name not in script, f"scripts/test.sh uses {by_name}"
    assert "stop_new_prometheus" in script and ". scripts/prometheus_pids.sh" in script
