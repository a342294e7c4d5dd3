"""A Ray worker dying under the campaign driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from proc_owner import ours
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec
from labkube.operator import launch

pytestmark = pytest.mark.slow

SLOW = [{"tool": "bash", "args": {"command": f"sleep 0.3; echo {i} > result.txt"}} for i in range(1, 13)]


def supervisor_pids() -> list[int]:
    """This test process's supervisor actors (tests/proc_owner.py): never another test process's."""
    out = subprocess.run(["pgrep", "-f", "ray::SupervisorActor"], capture_output=True, text=True, check=False)
    return [pid for pid in map(int, out.stdout.split()) if ours(pid)]


def test_ray_worker_death_resumes_runs_on_a_new_worker(ray_local, tmp_path: Path, fault) -> None:
    fault(
        "Ray worker dies",
        "`kill -9` of the Ray worker process hosting the run supervisors, mid-campaign",
        "its orphaned agents checkpoint and exit; the driver starts a new supervisor actor; the runs resume "
        "and finish with every step recorded once",
    )
    spec = CampaignSpec(name="raydeath", tasks=[str(make_tiny_task(tmp_path, SLOW))], models=["oracle"], seeds=2)
    out = tmp_path / "out"
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.extend(launch(spec, out, ray_ctx=ray_local))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        statuses = [p for p in out.glob("runs/*/status.json")]
        steps = [json.loads(p.read_text()).get("step", 0) for p in statuses if p.stat().st_size]
        if len(steps) == 2 and min(steps) >= 3 and supervisor_pids():
            break
        time.sleep(0.1)
    for pid in supervisor_pids():
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=180)
    assert not thread.is_alive() and not errors, errors
    assert len(results) == 2
    for result in results:
        assert result.status.value == "Finished" and result.subtasks[0].raw == 12.0
        assert result.resumes >= 1
        lines = (out / "runs" / result.run_id / "transcript.jsonl").read_text().splitlines()
        steps = [r["step"] for r in map(json.loads, lines) if r["type"] == "model_call"]
        assert steps == list(range(1, 14))
