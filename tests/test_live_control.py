"""Live control of a run's harness (labkube/interventions.py, agent/harness/steering.py): interventions written to the
run's control file while its agent runs are acted on at the next step (extend, message, pause) or at once (cancel,
pause --now), each written once to the transcript and kept in result.json."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from fakellm import FakeLLM, Reply, Usage
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.harness.steering import RunPaused
from labkube.budgets import Budgets, Spend, StopReason
from labkube.control import PAUSED_EXIT, add_interventions, read_control, run_control
from labkube.interventions import (
    BudgetChange,
    ControlError,
    ControlVerb,
    Intervention,
    InterventionKind,
    RunControl,
    RunState,
    check_request,
)
from labkube.operator.local_sandbox import agent_command
from labkube.result import Outcome, RunResult
from labkube.run_spec import RunPhase, RunStatus
from labkube.store import read_model

WRITE_5 = {"tool": "bash", "args": {"command": "echo 5 > result.txt"}}
SLEEP = {"tool": "bash", "args": {"command": "sleep 0.3"}}


async def agent(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> int:
    """`labkube agent` for the run, as its supervisor starts it; its exit code."""
    proc = await asyncio.create_subprocess_exec(
        *agent_command(run_dir, *extra), cwd=run_dir, env={**os.environ, **(env or {})}
    )
    return await proc.wait()


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "transcript.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def intervene(run_dir: Path, **fields: object) -> Intervention:
    made = Intervention(by="tester@here", **fields)  # type: ignore[arg-type]
    add_interventions(run_dir.parent.parent, {run_dir.name: made})
    return made


async def at_step(run_dir: Path, step: int) -> None:
    """Until the run's status says it has done `step` steps."""
    for _ in range(1500):
        status = read_model(run_dir / "status.json", RunStatus)
        if status is not None and status.step >= step:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the run never reached step {step}")


async def test_an_extend_while_it_runs_lets_a_run_go_past_its_step_budget(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5] + [SLEEP] * 12)
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(steps=3))
    running = asyncio.create_task(run_agent(run_dir))
    await at_step(run_dir, 1)
    made = intervene(run_dir, kind=InterventionKind.extend, budgets=BudgetChange(steps=6), reason="promising")
    result = await running
    assert result.stop_reason is StopReason.steps and result.spend.steps == 6  # not 3: it went on
    assert result.outcome is Outcome.scored and result.score == 0.5
    assert [i.id for i in result.interventions] == [made.id]
    [event] = events(run_dir, "intervention")
    assert event["id"] == made.id and event["kind"] == "extend" and event["budgets"] == {"steps": 6}
    conversation = [json.loads(x) for x in (run_dir / "conversation.jsonl").read_text().splitlines()]
    told = [m["content"] for m in conversation if "your budget was changed" in (m.get("content") or "")]
    assert len(told) == 1 and "(promising)" in told[0] and "steps" in told[0]


async def test_a_cancel_ends_the_run_at_once_and_it_is_graded_as_it_stands(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5, {"tool": "bash", "args": {"command": "sleep 30", "timeout": 600}}])
    run_dir = make_run_dir(tmp_path, task)
    series = tmp_path / "metrics"  # the campaign driver's multiprocess folder
    series.mkdir()
    code = asyncio.create_task(agent(run_dir, env={"LABKUBE_METRICS_DIR": str(series)}))
    await at_step(run_dir, 1)
    made = intervene(run_dir, kind=InterventionKind.cancel, reason="looping")
    assert await asyncio.wait_for(code, timeout=20) == 0  # not the 30 s the command would have taken
    result = read_model(run_dir / "result.json", RunResult)
    assert result is not None and result.outcome is Outcome.cancelled and result.stop_reason is StopReason.cancelled
    assert result.status is RunPhase.finished and not result.is_error and not result.measured
    assert result.score is None  # never counted as a measurement
    assert result.score_curve[-1].score == 0.5  # the grading as it stood is kept in the curve
    assert [i.id for i in result.interventions] == [made.id]
    assert result.message is not None and "cancel by tester@here (looping)" in result.message
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(series))
    counted = {"campaign": "t", "run_id": run_dir.name, "kind": "cancel"}
    found = [x for m in registry.collect() for x in m.samples if x.name == "labkube_run_interventions_total"]
    assert [x.value for x in found if counted.items() <= x.labels.items()] == [1.0], found


async def test_a_cancel_with_no_grade_grades_nothing(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5] + [SLEEP] * 40)
    run_dir = make_run_dir(tmp_path, task)
    code = asyncio.create_task(agent(run_dir))
    await at_step(run_dir, 1)
    intervene(run_dir, kind=InterventionKind.cancel, grade=False)
    assert await asyncio.wait_for(code, timeout=20) == 0
    result = read_model(run_dir / "result.json", RunResult)
    assert result is not None and result.outcome is Outcome.cancelled
    assert result.score_curve[-1].subtasks == [] and "not graded" in (result.score_curve[-1].note or "")
    assert (
        not (run_dir / "logs" / "grader.log").exists() or "final" not in (run_dir / "logs" / "grader.log").read_text()
    )


async def test_a_pause_stops_at_the_step_boundary_charges_nothing_meanwhile_and_resumes(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5] + [SLEEP] * 4)
    run_dir = make_run_dir(tmp_path, task)
    code = asyncio.create_task(agent(run_dir))
    await at_step(run_dir, 2)
    intervene(run_dir, kind=InterventionKind.pause, reason="overnight")
    assert await asyncio.wait_for(code, timeout=20) == PAUSED_EXIT
    status = read_model(run_dir / "status.json", RunStatus)
    assert status is not None and status.phase is RunPhase.paused and "overnight" in status.message
    assert not (run_dir / "result.json").exists()
    paused_at = status.spend.wall_seconds
    paused_step = status.step
    await asyncio.sleep(1.5)  # paused: not charged
    # a paused run that is started again (a race with its supervisor) pauses again at once
    assert await agent(run_dir, "--resume") == PAUSED_EXIT
    intervene(run_dir, kind=InterventionKind.resume)
    assert await agent(run_dir, "--resume") == 0
    result = read_model(run_dir / "result.json", RunResult)
    assert result is not None and result.outcome is Outcome.scored and result.resumes >= 1
    assert result.spend.steps == 6 and paused_step >= 2  # the plan's five steps and its end_task, none run twice
    assert result.spend.wall_seconds < paused_at + 1.5 + 0.3 * 3  # the pause itself was not charged
    kinds = [e["kind"] for e in events(run_dir, "intervention")]
    assert kinds == ["pause", "resume"]


async def test_a_message_reaches_the_agents_next_model_request_marked_as_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        server.script(
            Reply.tool_call("bash", {"command": "sleep 1"}),
            Reply.tool_call("bash", {"command": "echo 5 > result.txt"}),
            Reply.tool_call("end_task", {"summary": "ok"}),
        )
        run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="openai-chat:gpt-5")
        running = asyncio.create_task(run_agent(run_dir))
        while not server.requests:
            await asyncio.sleep(0.02)
        made = intervene(run_dir, kind=InterventionKind.message, message="the dataset moved to /data/v2")
        result = await running
        bodies = [r.body["messages"] for r in server.requests]
    assert result.stop_reason is StopReason.done
    first_with = next(i for i, body in enumerate(bodies) if any("/data/v2" in str(m.get("content")) for m in body))
    assert first_with == 1  # the very next request
    [note] = [m for m in bodies[1] if "/data/v2" in str(m.get("content"))]
    assert note["role"] == "user" and str(note["content"]).startswith("[Message from the operator of this run")
    assert sum("/data/v2" in str(m.get("content")) for m in bodies[2]) == 1  # delivered once, kept in the context
    assert [e["id"] for e in events(run_dir, "intervention")] == [made.id]


async def test_a_usage_checkpoint_pauses_the_run_when_its_time_crosses_the_next_multiple(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE_5] + [SLEEP] * 20)
    run_dir = make_run_dir(tmp_path, task, pause_every_hours=1.0 / 3600)
    with pytest.raises(RunPaused) as paused:
        await run_agent(run_dir)
    assert "usage checkpoint (0.000277778 h spent)" in paused.value.why
    status = read_model(run_dir / "status.json", RunStatus)
    assert status is not None and status.phase is RunPhase.paused and status.spend.wall_seconds >= 1.0


async def test_a_usage_checkpoint_pauses_the_run_when_its_dollars_cross_the_next_multiple(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        costly = Usage(input=100_000, output=0)  # $0.125 a call at gpt-5's price
        server.script(*[Reply.tool_call("bash", {"command": f"echo {i}"}, usage=costly) for i in range(6)])
        run_dir = make_run_dir(tmp_path, make_tiny_task(tmp_path, []), model="openai-chat:gpt-5", pause_every_usd=0.3)
        with pytest.raises(RunPaused) as paused:
            await run_agent(run_dir)
        calls = len(server.requests)
    assert calls == 3  # $0.375 after the third: past $0.30, and it stopped before a fourth call
    assert "usage checkpoint ($0.3 spent)" in paused.value.why
    status = read_model(run_dir / "status.json", RunStatus)
    assert status is not None and status.phase is RunPhase.paused and status.spend.usd == pytest.approx(0.375)


def test_a_controls_state_is_folded_from_its_interventions() -> None:
    def made(kind: InterventionKind, **fields: object) -> Intervention:
        return Intervention(kind=kind, by="a", **fields)  # type: ignore[arg-type]

    checkpoint = made(InterventionKind.usage_checkpoint, crossed={"usd": 2.0})
    control = RunControl(run_id="r", interventions=[checkpoint])
    assert control.paused is checkpoint
    assert control.due_checkpoint(Spend(usd=2.9), 1.0, None) == {}  # $2 was stopped at already
    assert control.due_checkpoint(Spend(usd=3.0), 1.0, None) == {"usd": 3.0}
    control.interventions.append(made(InterventionKind.extend, budgets=BudgetChange(usd=10)))
    assert control.paused is None  # an extend releases a usage checkpoint
    assert control.budgets(Budgets(usd=5, steps=3)) == Budgets(usd=10, steps=3)
    control.interventions.append(made(InterventionKind.pause))
    control.interventions.append(made(InterventionKind.extend, budgets=BudgetChange(usd=4)))
    assert control.paused is not None  # but not a person's pause
    assert control.budgets(Budgets(usd=5)) == Budgets(usd=4)  # lowered


def test_requests_that_cannot_apply_are_refused_naming_the_run() -> None:
    def state(run_id: str, **kw: object) -> RunState:
        fields: dict = {"family": "researchgym", "agent": "rg-agent", "started": True, "final": False}
        return RunState(run_id=run_id, control=RunControl(run_id=run_id), **{**fields, **kw})

    with pytest.raises(ControlError, match="run a: it has finished"):
        check_request(ControlVerb.cancel, [state("a", final=True)], False, None)
    with pytest.raises(ControlError, match="run a: it is not paused"):
        check_request(ControlVerb.resume, [state("a")], False, None)
    with pytest.raises(ControlError, match="Gaia2 run's user is the scenario's"):
        check_request(ControlVerb.message, [state("g", family="gaia2")], False, None)
    with pytest.raises(ControlError, match="Claude Code runs non-interactively"):
        check_request(ControlVerb.message, [state("c", agent="claude-code")], False, None)
    with pytest.raises(ControlError, match="extend needs a budget"):
        check_request(ControlVerb.extend, [state("a")], False, BudgetChange())
    # --all skips what it cannot apply to, and refuses only when nothing is left
    assert check_request(ControlVerb.pause, [state("a", final=True), state("b")], True, None) == ["b"]
    assert check_request(ControlVerb.drain, [state("a"), state("b", started=False)], True, None) == ["b"]
    with pytest.raises(ControlError, match="no run of the campaign can be resumed"):
        check_request(ControlVerb.resume, [state("a"), state("b")], True, None)


def test_a_run_without_a_control_file_reads_as_untouched(tmp_path: Path) -> None:
    assert run_control(tmp_path, "nope").interventions == []


def test_a_projected_configmap_is_read_through_its_links_and_a_link_out_of_its_folder_is_not(tmp_path: Path) -> None:
    """The kubelet's layout of a ConfigMap volume (each key a link to `..data/KEY`, `..data` a link to the current
    copy) is read; a link that leaves the folder (to a file the agent could write) is refused."""
    mount = tmp_path / "mount"
    (mount / "..2026_12_07").mkdir(parents=True)
    control = RunControl(run_id="r", interventions=[Intervention(kind=InterventionKind.pause, by="alice")])
    (mount / "..2026_12_07" / "control.json").write_text(control.model_dump_json())
    (mount / "..data").symlink_to("..2026_12_07")
    (mount / "control.json").symlink_to("..data/control.json")
    assert read_control(mount / "control.json", "r").paused is not None
    outside = tmp_path / "agent-written.json"
    outside.write_text(control.model_dump_json())
    (mount / "elsewhere.json").symlink_to(outside)
    assert read_control(mount / "elsewhere.json", "r").interventions == []
    assert read_control(mount / "missing.json", "r").interventions == []
