"""The end of a local campaign (operator/campaign_run.py, `launch`): `on_end` runs once every run is final, while
the Ray that `launch` started shuts down, and `launch` returns only once Ray has stopped and nothing it started is
left (`labkube run` draws its final table meanwhile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec
from labkube.operator import launch

pytestmark = pytest.mark.slow

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}


def session_processes(session: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if session in text:
            found.append(text)
    return found


LAUNCH = """
import json, sys
from pathlib import Path
import ray
from labkube.campaign import CampaignSpec
from labkube.operator import launch

out = Path(sys.argv[2])
seen = []

def on_end():
    finished = [p for p in (out / "runs").glob("*/result.json") if p.is_file()]
    seen.append([len(finished), ray._private.worker._global_node.get_session_dir_path()])

spec = CampaignSpec(name="end", tasks=[sys.argv[1]], models=["oracle"], seeds=2)
results = launch(spec, out, on_end=on_end)
print(json.dumps({"status": [r.status.value for r in results], "seen": seen, "ray": ray.is_initialized()}))
"""


def test_on_end_sees_every_run_final_and_launch_returns_once_ray_has_stopped(tmp_path: Path) -> None:
    """In a process of its own, as `labkube run` calls it: `launch` starts Ray only where none is connected, and
    the test session may hold one."""
    task = make_tiny_task(tmp_path, [WRITE, {"tool": "read_file", "args": {"path": "result.txt"}}])
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    ran = subprocess.run(
        [sys.executable, "-P", "-c", LAUNCH, str(task), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert report["status"] == ["Finished", "Finished"] and not report["ray"], report
    [[finished, session]] = report["seen"]
    assert finished == 2
    deadline = time.monotonic() + 5  # Ray signals its processes and does not wait for them to be gone
    while session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_processes(session) == [], "a Ray process outlived launch"


def test_on_end_is_called_when_every_run_had_already_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    task = make_tiny_task(tmp_path, [WRITE])
    spec = CampaignSpec(name="again", tasks=[str(task)], models=["oracle"], seeds=1)
    calls: list[int] = []
    launch(spec, tmp_path / "out", on_end=lambda: calls.append(1))
    again = launch(spec, tmp_path / "out", on_end=lambda: calls.append(2))  # every run already finished: no Ray
    assert calls == [1, 2] and [r.status.value for r in again] == ["Finished"]
