"""The world as a pod's sidecar (#24 item 2 for Gaia2): the agent's shell reaches its port, and the run's checkpoint is
the agent's to write, so the world (the real `world_server.py` in ARE's environment) serves only the scenario its
harness loaded first, and writes its verdict where only it can: its termination-message file, which the operator
hands to the grading pod (tests/k8s/test_gaia2_pods.py runs the whole path through the fake kubelet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gaia2_helpers import execution_wrong

from labkube.tasks.gaia2 import load_scenario, setup_world_env, start_world
from labkube.tasks.gaia2.verdict_message import (
    MESSAGE_LIMIT,
    ONE_SCENARIO_VARIABLE,
    VERDICT_FILE_VARIABLE,
    verdict_from_report,
    verdict_report,
)
from labkube.tasks.gaia2.world_client import WorldRequestError
from labkube.tasks.gaia2.world_env import world_python

pytestmark = pytest.mark.gaia2


async def test_a_sidecar_world_serves_one_scenario_and_writes_its_verdict_where_only_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_world_env()
    verdict_file = tmp_path / "termination-log"
    monkeypatch.setenv(VERDICT_FILE_VARIABLE, str(verdict_file))
    monkeypatch.setenv(ONE_SCENARIO_VARIABLE, "1")
    world = start_world(world_python())
    try:
        async with world.client() as client:
            source = load_scenario("gaia2/execution_budget_email").source
            await client.load_scenario(source)  # the harness, before the agent starts
            with pytest.raises(WorldRequestError) as refused:  # the agent's shell, as an oracle run
                await client.load_scenario(source, oracle=True)
            assert refused.value.status == 409 and "one run's scenario" in str(refused.value)
            with pytest.raises(WorldRequestError):
                await client.run_oracle()  # the agent's scenario is no oracle run
            assert not verdict_file.exists(), "nothing judged yet"
            await execution_wrong(client)
            verdict = await client.finish()
    finally:
        world.stop()
    reported = verdict_from_report(verdict_file.read_text())
    assert reported is not None, verdict_file.read_text()[:300]
    assert reported["success"] is False is verdict.success
    assert reported["scenario_id"] == verdict.scenario_id and reported["rationale"] == verdict.rationale


def test_a_long_verdict_fits_a_termination_message_and_keeps_its_judgement() -> None:
    verdict = {
        "scenario_id": "s",
        "success": False,
        "rationale": "why " * 5000,
        "exception": None,
        "judge_usd": 0.02,
        "matches": [{"event": "e" * 100}] * 100,
    }
    text = verdict_report(verdict)
    assert len(text.encode()) <= MESSAGE_LIMIT
    back = verdict_from_report(text)
    assert back is not None and back["success"] is False and back["judge_usd"] == 0.02
    assert back["rationale"].startswith("why why") and back["rationale"].endswith(
        "[cut to fit the termination message]"
    )
    short = {"scenario_id": "s", "success": True, "rationale": None, "matches": [1, 2]}
    assert verdict_from_report(verdict_report(short)) == short  # what fits is kept whole


@pytest.mark.parametrize(
    "message",
    ["", "not json", json.dumps({"labkube.world_verdict/v1": {"success": "yes"}}), json.dumps({"success": True})],
)
def test_what_is_not_a_world_verdict_is_none(message: str) -> None:
    assert verdict_from_report(message) is None
