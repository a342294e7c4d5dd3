"""rg-agent in Gaia2 worlds through labkube: oracle on every scenario, a wrong agent judged by ARE,
notifications in simulated time, and a world that dies mid-run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from labkube.agent.harness.entrypoint import run_agent
from labkube.run_spec import RunSpec, make_run_id
from labkube.store import write_model
from labkube.task_card import TaskFamily
from labkube.tasks import resolve_tasks
from labkube.tasks.gaia2 import setup_world_env

pytestmark = pytest.mark.gaia2

# ARE's built-in scenarios that run offline (scenario_hf_demo_mcp pulls from the hub).
ARE_BUILTINS = [
    "scenario_tutorial",
    "scenario_apps_tutorial",
    "scenario_events_tutorial",
    "scenario_find_image_file",
    "scenario_validation_tutorial",
    "scenario_mcp_demo",
]
WHITFIELD, WELLS, MARCO = (
    "dana.whitfield@northwind.example",
    "dana.wells@mailbox.example",
    "marco.bianchi@northwind.example",
)


@pytest.fixture(scope="module", autouse=True)
def world_env() -> None:
    setup_world_env()


def run_dir_for(root: Path, ref: str, model: str, **spec) -> Path:
    (card,) = resolve_tasks(ref)
    run = RunSpec(
        run_id=make_run_id(card.ref, model, 0),
        campaign="g2",
        task=card.ref,
        task_path=card.path,
        model=model,
        seed=0,
        family=TaskFamily.gaia2,
        **spec,
    )
    run_dir = root / run.run_id
    write_model(run_dir / "run.json", run)
    return run_dir


def replay(path: Path, calls: list[tuple[str, dict]]) -> str:
    lines = [
        json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) for n, a in calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return f"replay:{path}"


@pytest.mark.parametrize(
    "ref",
    [f"gaia2/{s}" for s in ARE_BUILTINS]
    + [
        "gaia2/execution_budget_email",
        "gaia2/search_pediatrician_message",
        "gaia2/adaptability_lunch_reschedule",
        "gaia2/time_door_code",
        "gaia2/ambiguity_which_john",
    ],
)
async def test_oracle_passes_through_labkube(tmp_path: Path, ref: str) -> None:
    result = await run_agent(run_dir_for(tmp_path, ref, "oracle"))
    assert result.status.value == "Finished" and result.score == 1.0, result.details
    assert result.details["gaia2"]["success"] is True and result.details["gaia2"]["oracle"] is True


async def test_wrong_recipient_fails_with_ares_rationale(tmp_path: Path) -> None:
    send = {"recipients": [WELLS], "cc": [MARCO], "subject": "Q3 budget final", "content": "The Q3 budget is final."}
    model = replay(
        tmp_path / "wrong.jsonl",
        [
            ("EmailClientV2__send_email", send),
            ("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
        ],
    )
    result = await run_agent(run_dir_for(tmp_path, "gaia2/execution_budget_email", model))
    assert result.status.value == "Finished" and result.score == 0.0 and not result.beat_baseline
    verdict = result.details["gaia2"]
    assert verdict["success"] is False and "EmailClientV2__send_email" in verdict["rationale"]
    assert verdict["judge"] == "hard checks only"
    assert result.capabilities == ["execution"]


async def test_right_write_passes(tmp_path: Path) -> None:
    send = {
        "recipients": [WHITFIELD],
        "cc": [MARCO],
        "subject": "Q3 budget final",
        "content": "The Q3 budget is final.",
    }
    model = replay(
        tmp_path / "right.jsonl",
        [
            ("EmailClientV2__send_email", send),
            ("AgentUserInterface__send_message_to_user", {"content": "Sent to Dana Whitfield."}),
        ],
    )
    result = await run_agent(run_dir_for(tmp_path, "gaia2/execution_budget_email", model))
    assert result.score == 1.0, result.details


async def test_scheduled_event_arrives_in_simulated_time(tmp_path: Path) -> None:
    # time_door_code: Bob's message arrives 120 simulated seconds in; waiting jumps the clock.
    model = replay(tmp_path / "wait.jsonl", [("wait_for_notification", {"timeout": 600}), ("end_task", {})])
    started = time.monotonic()
    run_dir = run_dir_for(tmp_path, "gaia2/time_door_code", model)
    result = await run_agent(run_dir)
    wall = time.monotonic() - started
    calls = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    waited = next(c for c in calls if c["type"] == "tool_call" and c["tool"] == "wait_for_notification")
    advanced = float(waited["output"].split("waited ")[1].split(" simulated")[0])
    assert advanced >= 100 and wall < advanced / 4
    assert "Notification:" in waited["output"] and "2024-10-15" in waited["output"]
    conversation = [json.loads(x) for x in (run_dir / "conversation.jsonl").read_text().splitlines()]
    first = next(m for m in conversation if m["role"] == "user")
    assert first["content"].startswith("[2024-10-15") and "Message from the user" in first["content"]
    assert result.score == 0.0  # it never forwarded the code


# A world that dies mid-run: tests/faults/test_fault_world.py.
