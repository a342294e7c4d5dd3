"""Faults in the agent process and its disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakellm import FakeLLM, Reply, Usage
from tinytask import make_run_dir, make_tiny_task

from labkube.budgets import Budgets

SLOW = [{"tool": "bash", "args": {"command": f"sleep 0.25; echo {i} > result.txt"}} for i in range(1, 10)]


def agent(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "agent", "--run-dir", str(run_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(pred, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def step_of(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "status.json").read_text())["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def wall_seconds_now(run_dir: Path) -> float:
    """The run's wall-clock spend as of now: what status.json recorded, plus the time since it was written."""
    path = run_dir / "status.json"
    written_at, status = path.stat().st_mtime, json.loads(path.read_text())
    return float(status["spend"]["wall_seconds"]) + time.time() - written_at


def model_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "transcript.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["type"] == "model_call"]


def test_kill_9_mid_step_resumes_without_duplicates(tmp_path: Path, fault) -> None:
    fault(
        "agent killed (SIGKILL) mid-step",
        "`kill -9` of the agent's process group during step 4",
        "`--resume` continues from the last completed step; every step recorded once; totals add up",
    )
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, SLOW))
    proc = agent(run_dir)
    wait_for(lambda: step_of(run_dir) >= 4)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = agent(run_dir, "--resume")
    _, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    steps = model_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1)) == list(range(1, 11))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumes"] == 1 and result["spend"]["steps"] == 10


def test_sigterm_at_the_time_budget_grades_with_reason_time(tmp_path: Path, fault) -> None:
    fault(
        "SIGTERM at the time budget",
        "a model call hangs past the 2 s budget; SIGTERM as a pod deadline sends",
        "the run is graded at once and ends with reason `time`",
    )
    with FakeLLM() as server:
        server.script(
            Reply.tool_call("bash", {"command": "echo 8 > result.txt"}, usage=Usage(input=10, output=5)),
            Reply.delay(60),
        )
        run_dir = make_run_dir(
            tmp_path, make_tiny_task(tmp_path, []), model="openai:gpt-5", budgets=Budgets(wall_hours=2 / 3600)
        )
        proc = agent(run_dir, env={"OPENAI_BASE_URL": server.base_url + "/v1", "OPENAI_API_KEY": "sk-x"})
        wait_for(lambda: step_of(run_dir) >= 1)
        wait_for(lambda: wall_seconds_now(run_dir) > 2.2)  # the budget is spent while the model call hangs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "time" and result["status"] == "Finished", err
    assert result["subtasks"][0]["raw"] == 8.0


def test_sigterm_before_the_budget_is_resumable(tmp_path: Path, fault) -> None:
    fault(
        "SIGTERM mid-run (preemption)",
        "SIGTERM at step 3 of 10, budget far from spent",
        "checkpoint kept, exit 143, no result; `--resume` finishes the run",
    )
    run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, SLOW))
    proc = agent(run_dir)
    wait_for(lambda: step_of(run_dir) >= 3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143 and not (run_dir / "result.json").exists()
    assert agent(run_dir, "--resume").wait(timeout=60) == 0
    assert model_steps(run_dir) == list(range(1, 11))


@pytest.mark.parametrize(
    ("name", "reply", "outcome"),
    [
        ("model API answers 429", Reply.error(429), "retried with back-off; back-off time not charged"),
        ("model API answers 500", Reply.error(500), "retried with back-off"),
        ("model API times out", Reply.delay(3.0, then=Reply.text("late")), "the call times out and is retried"),
        ("model API sends malformed JSON", Reply.malformed(), "retried"),
        ("model API stream cut mid-way", Reply.cut_stream(after_events=2), "retried (Anthropic streams)"),
    ],
)
def test_model_server_faults_are_retried(tmp_path: Path, fault, name: str, reply: Reply, outcome: str) -> None:
    fault(name, "the local fake model server's next answer", outcome + "; the run completes")
    anthropic = "stream" in name
    with FakeLLM() as server:
        server.script(
            reply,
            Reply.tool_call("bash", {"command": "echo 5 > result.txt"}, usage=Usage(input=9, output=3)),
            Reply.tool_call("end_task", {"summary": "ok"}, usage=Usage(input=9, output=3)),
        )
        model = "anthropic:claude-fake" if anthropic else "openai:gpt-5"
        env = (
            {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "k"}
            if anthropic
            else {"OPENAI_BASE_URL": server.base_url + "/v1", "OPENAI_API_KEY": "k"}
        )
        run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model=model, model_timeout_s=1.0)
        proc = agent(run_dir, env=env)
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "done" and result["subtasks"][0]["raw"] == 5.0
    first = next(
        r for r in map(json.loads, (run_dir / "transcript.jsonl").read_text().splitlines()) if r["type"] == "model_call"
    )
    assert first["attempts"] >= 2


def _small_disk(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False
        ).returncode
        == 0
    )


def test_disk_full_is_a_clear_error_and_loses_nothing(tmp_path: Path, fault) -> None:
    fault(
        "run directory's disk full",
        "the run directory on a 3 MB tmpfs; a step fills it",
        "one-line `disk full` error, exit 75; the checkpoint and transcript up to the last step are intact",
    )
    disk = tmp_path / "disk"
    if not _small_disk(disk, "3m"):
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        steps = [
            {"tool": "bash", "args": {"command": "echo 1 > result.txt"}},
            {"tool": "bash", "args": {"command": "echo 2 > result.txt"}},
            {
                "tool": "bash",
                "args": {"command": "[ -f .filled ] || { touch .filled; head -c 8M /dev/zero > big.bin; }"},
            },
            {"tool": "bash", "args": {"command": "echo 3 > result.txt"}},
        ]
        task = make_tiny_task(tmp_path, steps)
        run_dir = make_run_dir(disk, task)
        proc = agent(run_dir)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 75, err
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "disk full" in lines[0] and "Traceback" not in err
        checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
        assert checkpoint["step"] == 2
        with (run_dir / "transcript.jsonl").open("rb") as fh:
            kept = fh.read(checkpoint["transcript_offset"]).decode().splitlines()
        assert [json.loads(x)["type"] for x in kept].count("model_call") == 2
        # Free the space and resume: the run completes.
        (run_dir / "workspace" / "big.bin").unlink()
        resumed = agent(run_dir, "--resume")
        _, err = resumed.communicate(timeout=60)
        assert resumed.returncode == 0, err
        assert json.loads((run_dir / "result.json").read_text())["subtasks"][0]["raw"] == 3.0
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
