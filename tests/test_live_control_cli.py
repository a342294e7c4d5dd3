"""`labkube runs VERB` from another shell while `labkube run` drives the campaign on this machine (real Ray): a paused
run frees its slot and stops being charged, and resumes from its checkpoint; a cancelled run ends at once and is
counted apart while the others finish; a drained campaign starts nothing new, and a paused run stays paused when the
campaign is run again; a usage checkpoint pauses a run until a person resumes it. Bad requests are one line each,
exit 2, with nothing changed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import labkube, one_line_error
from tinytask import make_tiny_task

from labkube.agent.containment import read_record, tagged_pids
from labkube.campaign import CampaignSpec
from labkube.control import control_path, run_control
from labkube.interventions import InterventionKind
from labkube.result import Outcome, RunResult
from labkube.run_spec import RunPhase, RunSpec, RunStatus, make_run_id
from labkube.store import CampaignDir, read_model, write_model

pytestmark = pytest.mark.slow

ENV = {"RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
SLEEPS = [{"tool": "bash", "args": {"command": "echo 5 > result.txt"}}] + [
    {"tool": "bash", "args": {"command": "sleep 0.5"}}
] * 8


def run_id(seed: int) -> str:
    return make_run_id("tiny-task", "oracle", seed)


STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def end_what_was_started() -> Iterator[None]:
    """Whatever a test started ends with it, passed or failed."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def start(task: Path, out: Path, *flags: str) -> subprocess.Popen[str]:
    """`labkube run` in a session of its own, as from a terminal."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "run", str(task), "--out", str(out), *flags],
        start_new_session=True,
        cwd=out.parent,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out + err


def status(out: Path, seed: int) -> RunStatus | None:
    return read_model(out / "runs" / run_id(seed) / "status.json", RunStatus)


def wait_until(what: str, check, proc: subprocess.Popen[str] | None = None, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"labkube run ended before {what}: {finish(proc)[1]}")
        time.sleep(0.05)
    raise AssertionError(f"never {what}")


def in_phase(out: Path, seed: int, phase: RunPhase, step: int = 0) -> bool:
    s = status(out, seed)
    return s is not None and s.phase is phase and s.step >= step


def result(out: Path, seed: int) -> RunResult:
    found = read_model(out / "runs" / run_id(seed) / "result.json", RunResult)
    assert found is not None
    return found


def steer(out: Path, *args: str) -> subprocess.CompletedProcess:
    return labkube("runs", *args, cwd=out.parent, env=ENV, timeout=60)


def nothing_of_the_run_left(out: Path, seed: int) -> bool:
    record = read_record(out / "runs" / run_id(seed))
    return record is None or tagged_pids(record.token) == set()


@pytest.fixture()
def task(tmp_path: Path) -> Path:
    return make_tiny_task(tmp_path, SLEEPS)


def test_a_paused_run_frees_its_slot_stops_being_charged_and_resumes_from_its_checkpoint(
    task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    proc = start(task, out, "--seeds", "2", "--concurrency", "1", "--budget-hours", "1")
    first = next_running = None
    wait_until(
        "a run was under way",
        lambda: in_phase(out, 0, RunPhase.running, 1) or in_phase(out, 1, RunPhase.running, 1),
        proc,
    )
    first, next_running = (0, 1) if in_phase(out, 0, RunPhase.running) else (1, 0)
    said = steer(out, "pause", str(out), run_id(first), "--reason", "give the slot away")
    assert said.returncode == 0, said.stderr
    assert f"paused: {run_id(first)} pauses at its next step" in said.stdout
    wait_until("the run paused", lambda: in_phase(out, first, RunPhase.paused), proc)
    paused = status(out, first)
    assert paused is not None and "paused by" in paused.message and "give the slot away" in paused.message
    wait_until("its processes ended", lambda: nothing_of_the_run_left(out, first), proc, timeout_s=10)
    # concurrency 1: the other run could only start once the paused one gave its slot back
    wait_until("the other run started", lambda: (status(out, next_running) or RunStatus(run_id="x")).step >= 1, proc)
    charged = paused.spend.wall_seconds
    time.sleep(2.0)
    still = status(out, first)
    assert still is not None and still.phase is RunPhase.paused and still.spend.wall_seconds == charged
    assert proc.poll() is None  # the campaign waits for the paused run
    said = steer(out, "resume", str(out), run_id(first))
    assert said.returncode == 0, said.stderr
    code, printed = finish(proc)
    assert code == 0, printed
    resumed = result(out, first)
    assert resumed.outcome is Outcome.scored and resumed.resumes >= 1
    assert [i.kind for i in resumed.interventions] == [InterventionKind.pause, InterventionKind.resume]
    assert resumed.spend.wall_seconds < 8 * 0.5 + 3  # the 2 s paused were not charged
    assert result(out, next_running).interventions == []
    events = [json.loads(x) for x in (out / "runs" / run_id(first) / "transcript.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events if e["type"] == "intervention"] == ["pause", "resume"]


def test_cancelling_one_run_of_three_ends_it_now_and_the_others_finish_and_are_scored(
    task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    proc = start(task, out, "--seeds", "3", "--concurrency", "3")
    wait_until("the run was under way", lambda: in_phase(out, 1, RunPhase.running, 1), proc)
    said = steer(out, "cancel", str(out), run_id(1), "--reason", "it loops")
    assert said.returncode == 0, said.stderr
    code, printed = finish(proc)
    assert code == 0, printed  # a cancelled run is no error
    cancelled = result(out, 1)
    assert cancelled.outcome is Outcome.cancelled and cancelled.score is None
    assert cancelled.spend.steps < len(SLEEPS)  # it ended before its plan did
    assert [i.reason for i in cancelled.interventions] == ["it loops"]
    for seed in (0, 2):
        assert result(out, seed).outcome is Outcome.scored and result(out, seed).score == 0.5
    again = steer(out, "cancel", str(out), run_id(1))
    assert "it has finished" in one_line_error(again)


def test_a_drained_campaign_starts_nothing_new_and_a_paused_run_stays_paused_when_run_again(
    task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    proc = start(task, out, "--seeds", "2", "--concurrency", "1")
    wait_until("a run started", lambda: in_phase(out, 0, RunPhase.running) or in_phase(out, 1, RunPhase.running), proc)
    running, waiting = (0, 1) if in_phase(out, 0, RunPhase.running) else (1, 0)
    said = steer(out, "drain", str(out))
    assert said.returncode == 0, said.stderr
    assert f"drained: {run_id(waiting)}" in said.stdout and run_id(running) not in said.stdout
    wait_until("the running run finished", lambda: (out / "runs" / run_id(running) / "result.json").exists(), proc)
    wait_until("the drained run showed Paused", lambda: in_phase(out, waiting, RunPhase.paused), proc)
    time.sleep(1.0)
    assert proc.poll() is None and not (out / "runs" / run_id(waiting) / "checkpoint.json").exists()
    proc.send_signal(signal.SIGINT)
    code, printed = finish(proc)
    assert code == 130, printed
    assert in_phase(out, waiting, RunPhase.paused)  # not marked stopped: it stays paused
    said = steer(out, "resume", str(out), "--all")
    assert said.returncode == 0, said.stderr
    assert "no labkube run is running this campaign" in said.stdout
    code, printed = finish(start(task, out, "--seeds", "2", "--concurrency", "1"))
    assert code == 0, printed
    assert result(out, waiting).outcome is Outcome.scored
    kinds = [i.kind for i in result(out, waiting).interventions]
    assert kinds == [InterventionKind.pause, InterventionKind.resume]
    assert result(out, waiting).interventions[0].reason == "drained"


def test_a_usage_checkpoint_pauses_a_run_until_a_person_resumes_it(task: Path, tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = start(task, out, "--pause-every-hours", str(1.5 / 3600))
    wait_until("the run paused at its usage checkpoint", lambda: in_phase(out, 0, RunPhase.paused), proc)
    paused = status(out, 0)
    assert paused is not None and "usage checkpoint" in paused.message
    # the run's supervisor records the checkpoint once the run's agent has exited (the agent never writes its control)
    wait_until("the checkpoint was recorded", lambda: run_control(out, run_id(0)).paused is not None, proc, 10)
    control = run_control(out, run_id(0))
    assert control.paused is not None and control.paused.kind is InterventionKind.usage_checkpoint
    assert control.paused.by == "labkube" and control.paused.crossed["hours"] == pytest.approx(1.5 / 3600)
    time.sleep(1.0)
    assert in_phase(out, 0, RunPhase.paused)  # it waits for a person
    resumes = 0
    while proc.poll() is None:  # each crossing pauses it again, until its plan ends
        if in_phase(out, 0, RunPhase.paused):
            said = steer(out, "resume", str(out), run_id(0))
            assert said.returncode == 0 or "not paused" in said.stderr, said.stderr
            resumes += 1
        time.sleep(0.1)
    code, printed = finish(proc)
    assert code == 0, printed
    done = result(out, 0)
    assert done.outcome is Outcome.scored and resumes >= 1
    checkpoints = [i for i in done.interventions if i.kind is InterventionKind.usage_checkpoint]
    assert [c.crossed["hours"] * 3600 for c in checkpoints] == pytest.approx(
        [1.5 * (n + 1) for n in range(len(checkpoints))]
    )


def made_campaign(tmp_path: Path) -> Path:
    """A campaign folder as `labkube run` writes it, with a finished run, a live one and a Gaia2 one: nothing runs."""
    out = tmp_path / "c"
    spec = CampaignSpec(name="c", tasks=["t"])
    runs = [
        RunSpec(run_id=rid, campaign="c", task="t", task_path=str(tmp_path), model="oracle", seed=0, family=family)
        for rid, family in (("done--s0", "researchgym"), ("live--s0", "researchgym"), ("world--s0", "gaia2"))
    ]
    CampaignDir(out).write_campaign(spec, runs)
    done = RunResult(run_id="done--s0", task="t", model="oracle", seed=0, status=RunPhase.finished, score=0.5)
    write_model(out / "runs" / "done--s0" / "result.json", done)
    return out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("cancel", "{out}", "lvie--s0"), "run lvie--s0: not a run of the campaign in {out}; did you mean live--s0?"),
        (("pause", "{out}", "done--s0"), "run done--s0: it has finished; nothing is left to steer"),
        (("resume", "{out}", "live--s0"), "run live--s0: it is not paused (labkube runs pause first)"),
        (("extend", "{out}", "live--s0", "--steps", "-3"), "--steps -3: give a number above 0"),
        (("extend", "{out}", "live--s0"), "extend needs a budget to set: --hours, --usd, --tokens or --steps"),
        (("message", "{out}", "world--s0", "-m", "hi"), "run world--s0: a Gaia2 run's user is the scenario's"),
        (("pause", "{out}", "world--s0"), "run world--s0: a Gaia2 run's world cannot be saved"),
        (("pause", "{out}"), "name the runs to pause (RUN_ID...), or give --all"),
        (("drain", "{out}", "live--s0"), "drain acts on the whole campaign"),
        (("pause", "{out}/nope", "live--s0"), "not a campaign directory"),
        (("message", "{out}", "live--s0", "-m", "  "), "--text is empty"),
    ],
)
def test_a_request_that_cannot_apply_is_one_line_and_changes_nothing(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    out = made_campaign(tmp_path)
    proc = labkube("runs", *(a.format(out=out) for a in args), cwd=tmp_path, env=ENV, timeout=60)
    assert said.format(out=out) in one_line_error(proc)
    assert not any(control_path(out, rid).exists() for rid in ("done--s0", "live--s0", "world--s0"))


@pytest.mark.parametrize(
    ("args", "said", "fields"),
    [
        (("pause", "--now"), "paused: live--s0 stops now", {"kind": "pause", "now": True}),
        (("cancel", "--no-grade"), "cancelled: live--s0 ends now, not graded", {"kind": "cancel", "grade": False}),
        (("pause",), "paused: live--s0 pauses at its next step", {"kind": "pause", "now": False}),
    ],
)
def test_a_request_says_what_it_does_and_is_recorded_as_asked(
    tmp_path: Path, args: tuple[str, ...], said: str, fields: dict[str, object]
) -> None:
    out = made_campaign(tmp_path)
    proc = labkube("runs", args[0], str(out), "live--s0", *args[1:], "--reason", "why", cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stdout and "no labkube run is running this campaign" in proc.stdout
    (made,) = run_control(out, "live--s0").interventions
    assert made.model_dump(mode="json", include=set(fields)) == fields and made.reason == "why"
