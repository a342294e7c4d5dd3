"""One `labkube run` writes a campaign directory at a time (issue #23, item 8): a second one into the same `--out`
refuses with one line naming the holder, and the lock goes with the process that held it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import labkube, tree_digest
from tinytask import make_tiny_task

from labkube.store import LOCK_FILE, CampaignDir, CampaignLocked

HOLD = """
import sys, time
from labkube.store import CampaignDir
with CampaignDir(sys.argv[1]).lock():
    print("locked", flush=True)
    time.sleep(600)  # the scenario: a process holding the lock until the test kills it
"""


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_second_run_into_a_locked_campaign_refuses_naming_the_holder_and_writes_nothing(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 7 > result.txt"}}])
    out = tmp_path / "c"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = tree_digest(out)
        proc = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"pid {holder.pid} on {socket.gethostname()}" in proc.stderr
        assert "choose another --out" in proc.stderr
        assert tree_digest(out) == before
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # the holder dies without letting go: the kernel releases an flock
        holder.wait()
    with CampaignDir(out).lock():
        assert f"pid {os.getpid()}" in (out / LOCK_FILE).read_text()


def test_the_lock_is_held_once_per_process_and_refused_to_another(tmp_path: Path) -> None:
    cdir = CampaignDir(tmp_path / "c")
    with cdir.lock(), cdir.lock():  # re-entrant: `labkube run` holds it around `launch`, which takes it too
        other = subprocess.run([sys.executable, "-c", HOLD, str(cdir.root)], capture_output=True, text=True)
        assert other.returncode != 0 and CampaignLocked.__name__ in other.stderr
    assert not (tmp_path / "c" / "campaign.json").exists()


def test_two_labkube_runs_into_one_out_grade_each_run_once(tmp_path: Path) -> None:
    slow = {"tool": "bash", "args": {"command": "sleep 4 && echo 7 > result.txt"}}
    task = make_tiny_task(tmp_path, [slow])
    out = tmp_path / "c"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    first = subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "run", str(task), "--model", "oracle", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (out / "campaign.json").exists())
        second = labkube("run", str(task), "--model", "oracle", "--out", str(out), cwd=tmp_path)
        said, _ = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, said
    assert second.returncode == 2 and f"pid {first.pid} on " in second.stderr, second.stderr
    (run_dir,) = (out / "runs").iterdir()
    records = [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("start") == 1
    assert (run_dir / "logs" / "grader.log").read_text().count("$ ") == 1  # the final grading, once
