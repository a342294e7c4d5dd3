"""The end of a local campaign (operator/campaign_run.py, `launch`): `on_end` runs once every run is final, while
the Ray that `launch` started shuts down, and `launch` returns only once Ray has stopped and nothing it started is
left (`labkube run` draws its final table meanwhile)."""

from __future__ import annotations

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


def test_on_end_sees_every_run_final_and_launch_returns_once_ray_has_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not ray.is_initialized()
    task = make_tiny_task(tmp_path, [WRITE, {"tool": "read_file", "args": {"path": "result.txt"}}])
    spec = CampaignSpec(name="end", tasks=[str(task)], models=["oracle"], seeds=2)
    out = tmp_path / "out"
    seen: list[tuple[int, str]] = []

    def on_end() -> None:
        finished = [p for p in (out / "runs").glob("*/result.json") if p.is_file()]
        seen.append((len(finished), ray._private.worker._global_node.get_session_dir_path()))

    results = launch(spec, out, on_end=on_end)
    assert [r.status.value for r in results] == ["Finished", "Finished"]
    assert len(seen) == 1 and seen[0][0] == 2, seen
    assert not ray.is_initialized()
    deadline = time.monotonic() + 5  # Ray signals its processes and does not wait for them to be gone
    while session_processes(seen[0][1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_processes(seen[0][1]) == [], "a Ray process outlived launch"


def test_on_end_is_called_when_every_run_had_already_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    task = make_tiny_task(tmp_path, [WRITE])
    spec = CampaignSpec(name="again", tasks=[str(task)], models=["oracle"], seeds=1)
    calls: list[int] = []
    launch(spec, tmp_path / "out", on_end=lambda: calls.append(1))
    again = launch(spec, tmp_path / "out", on_end=lambda: calls.append(2))  # every run already finished: no Ray
    assert calls == [1, 2] and [r.status.value for r in again] == ["Finished"]
