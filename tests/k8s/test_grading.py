"""Result intake without a cluster: a run's result comes only from the grading pod the operator started, and a
new leader rebuilds what it knows from the Run statuses (the API is the record)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import validate
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.checkpoint import Checkpoint
from labkube.agent.harness.entrypoint import GRADED_BY_OPERATOR_VARIABLE, finalize_stopped, run_agent
from labkube.budgets import StopReason
from labkube.operator.k8s_grading import (
    GRADE_CONTAINER,
    LABEL_FINALIZE,
    agent_ended_reason,
    graded_result,
    grading_manifest,
    result_from_status,
    world_verdict_of,
)
from labkube.operator.k8s_ledger import PodLedger, PodTime, ledger_path
from labkube.operator.k8s_models import (
    ApiKeySecret,
    OperatorConfig,
    PodOptions,
    RunResourceSpec,
    RunStatus,
    WorldOptions,
)
from labkube.operator.k8s_record import restore_from_statuses
from labkube.operator.pod_manifest import build_pod_manifest
from labkube.result import RunResult, termination_report
from labkube.run_spec import RunPhase, RunSpec
from labkube.store import CampaignDir, read_model
from labkube.task_card import TaskFamily
from labkube.tasks.gaia2.verdict_message import WORLD_VERDICT_SOURCE, WORLD_VERDICT_VARIABLE, verdict_report

OWNER = {
    "apiVersion": "labkube.dev/v1alpha1",
    "kind": "Run",
    "metadata": {"name": "c-r", "namespace": "ns", "uid": "u"},
}
KEYS = [ApiKeySecret(env="OPENAI_API_KEY", secret_name="keys", key="openai")]


def run_spec(**fields: Any) -> RunResourceSpec:
    return RunResourceSpec(run_id="r", campaign="c", task="t", task_path="/t", model="oracle", seed=0, **fields)


def result(score: float = 1.0, run_id: str = "r") -> RunResult:
    return RunResult(
        run_id=run_id,
        task="t",
        model="oracle",
        seed=0,
        status=RunPhase.finished,
        stop_reason=StopReason.done,
        score=score,
        finished_at=datetime(2025, 1, 1, tzinfo=UTC),
    )


def ended(manifest: dict[str, Any], container: str, message: str, code: int = 0) -> dict[str, Any]:
    """`manifest` as the API shows it after its container ended with `message`."""
    terminated = {"exitCode": code, "message": message, "finishedAt": "2025-01-01T00:10:00Z"}
    status = {
        "phase": "Succeeded" if code == 0 else "Failed",
        "startTime": "2025-01-01T00:00:00Z",
        "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
    }
    return {**manifest, "status": status}


@pytest.mark.parametrize("agent", ["rg-agent", "claude-code"])
@pytest.mark.parametrize("family", [TaskFamily.researchgym, TaskFamily.gaia2])
def test_a_grading_pod_grades_without_keys_gateway_or_world(agent: str, family: TaskFamily) -> None:
    options = PodOptions(default_image="img", api_keys=KEYS, world=WorldOptions(image="world:1"))
    pod = build_pod_manifest(run_spec(agent=agent, family=family), options, owner=OWNER, attempt=2, resume=True)
    grading = grading_manifest(pod, StopReason.time, 900)
    validate(grading, "1.33", strict=True)
    spec = grading["spec"]
    (grade,) = spec["containers"]
    assert grade["name"] == GRADE_CONTAINER and grade["image"] == "img"
    assert grade["command"] == ["labkube", "agent", "--run-dir", "/runs/r", "--finalize", "time"]
    # no key by any route: no Secret reference, no hand-over on stdin, no gateway, no world to ask for one
    assert not [e for e in grade["env"] if "valueFrom" in e]
    names = {e["name"] for e in grade["env"]}
    assert not names & {"LABKUBE_STDIN_VARS", "LABKUBE_GATEWAY_URL", "LABKUBE_WORLD_URL", "OPENAI_API_KEY"}
    assert [c["name"] for c in spec["initContainers"]] == ["prepare"]  # run.json re-written from the admitted spec
    assert "gateway" not in {v["name"] for v in spec["volumes"]}
    assert "ports" not in grade
    assert spec["activeDeadlineSeconds"] == 900
    assert grading["metadata"]["name"] == "c-r-2-grade"
    assert grading["metadata"]["labels"][LABEL_FINALIZE] == "time"
    assert grading["metadata"]["labels"]["labkube.dev/attempt"] == "2"
    assert pod["spec"]["containers"][0]["name"] == "agent"  # the agent's manifest is left as it was


def test_only_the_grading_pods_report_is_a_result() -> None:
    pod = build_pod_manifest(run_spec(), PodOptions(default_image="img"), owner=OWNER)
    grading = grading_manifest(pod, StopReason.done, 900)
    forged = termination_report(result(1.0))
    # The agent's own pod: whatever it wrote is its word, not a result (finished or not, whatever its exit code).
    assert graded_result(ended(pod, "agent", forged), "r") is None
    assert graded_result(ended(pod, "agent", forged, code=137), "r") is None
    # The grading pod the operator started: its `grade` container's report, for this run only.
    assert graded_result(ended(grading, GRADE_CONTAINER, termination_report(result(0.6))), "r") == result(0.6)
    assert graded_result(ended(grading, GRADE_CONTAINER, termination_report(result(run_id="other"))), "r") is None
    assert graded_result(ended(grading, "agent", forged), "r") is None
    assert graded_result(ended(grading, GRADE_CONTAINER, "Traceback (most recent call last): ...", 1), "r") is None


def test_only_an_ended_agent_loop_is_graded() -> None:
    assert agent_ended_reason(0) is StopReason.done
    assert agent_ended_reason(1) is StopReason.error
    for crash in (137, 143, 2, 75, None):
        assert agent_ended_reason(crash) is None


def test_an_emptydir_workspace_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"runs\.workspace\.mode emptyDir: .* set runs\.workspace\.mode to pvc"):
        OperatorConfig(runs=PodOptions(default_image="img", workspace={"mode": "emptyDir"}))


def test_a_new_leader_rebuilds_results_and_ledgers_from_run_statuses(tmp_path: Path) -> None:
    cdir = CampaignDir(tmp_path / "ns" / "c")
    start = datetime(2025, 1, 1, tzinfo=UTC)
    done_ledger = PodLedger(
        run_id="done",
        gpus=2,
        pods={
            "c-done-0": PodTime(start=start, end=start + timedelta(minutes=30)),
            "c-done-1-grade": PodTime(start=start + timedelta(hours=1), end=start + timedelta(hours=1, minutes=30)),
        },
    )
    live_ledger = PodLedger(run_id="live", gpus=1, pods={"c-live-0": PodTime(start=start)})
    final = RunStatus(
        phase=RunPhase.finished,
        score=0.6,
        gpu_hours=2.0,
        pod_times=done_ledger.to_status(),
        report=termination_report(result(0.6, run_id="done")),
    )
    objs = [
        {"metadata": {"name": "c-done"}, "status": final.to_status()},
        {
            "metadata": {"name": "c-live"},
            "status": RunStatus(phase=RunPhase.running, pod_times=live_ledger.to_status()).to_status(),
        },
        {"metadata": {"name": "c-new"}, "status": RunStatus().to_status()},
    ]
    runs = [
        RunSpec(run_id=i, campaign="c", task="t", task_path="/t", model="oracle", seed=0, gpus=g)
        for i, g in (("done", 2), ("live", 1), ("new", 0))
    ]
    finished = restore_from_statuses(cdir, runs, objs, shared=False)
    assert finished == {"done"}
    restored = read_model(ledger_path(cdir.root, "done"), PodLedger)
    assert restored == done_ledger and restored.gpu_hours() == pytest.approx(2.0)
    assert read_model(ledger_path(cdir.root, "live"), PodLedger) == live_ledger
    assert cdir.result("done") == result(0.6, run_id="done")
    assert cdir.result("live") is None
    # A status without a report (an earlier version's) is still final, and nothing is made up for it.
    bare = final.model_copy(update={"report": None})
    assert result_from_status(bare, "done") is None
    fresh = CampaignDir(tmp_path / "other" / "c")
    assert restore_from_statuses(
        fresh, runs[:1], [{"metadata": {"name": "c-done"}, "status": bare.to_status()}], shared=False
    ) == {"done"}
    assert fresh.result("done") is None


def test_a_pod_that_ran_within_one_second_counts_that_second_not_zero() -> None:
    """The API's pod times are whole seconds: a quick agent pod and its grading pod, each started and ended within
    one second, ran; they count a second each (#42: a finished one-GPU run showed two pod times and gpuHours 0.0).
    A pod still running counts from its start to now, and a lost pod's closed interval as recorded."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    quick = PodLedger(
        run_id="quick",
        gpus=1,
        pods={"c-quick-0": PodTime(start=start, end=start), "c-quick-1-grade": PodTime(start=start, end=start)},
    )
    assert quick.seconds() == 2.0 and quick.gpu_hours() == pytest.approx(2 / 3600)
    running = PodLedger(run_id="r", gpus=1, pods={"c-r-0": PodTime(start=start)})
    assert running.seconds(now=start) == 0.0 and running.seconds(now=start + timedelta(seconds=5)) == 5.0
    # the Run status's figure moves in whole minutes while the pod runs (a patch per change); ended pods stay exact
    assert running.seconds(start + timedelta(seconds=119), live_step_s=60) == 60.0
    assert quick.seconds(start + timedelta(seconds=119), live_step_s=60) == 2.0
    lost = PodLedger(
        run_id="l", gpus=8, pods={"c-l-0": PodTime(start=start, end=start + timedelta(hours=1), lost="its node died")}
    )
    assert lost.gpu_hours(now=start + timedelta(days=7)) == pytest.approx(8.0) and lost.lost_pods() == 1


def test_a_gaia2_grader_is_given_the_verdict_the_world_sidecar_reported_and_no_other() -> None:
    """The world container's termination message is the verdict; the agent container's message, or a grading pod's,
    is never read for one; the grading pod of a Gaia2 run is told to take only the operator's."""
    options = PodOptions(default_image="img", world=WorldOptions(image="world:1"))
    pod = build_pod_manifest(run_spec(family=TaskFamily.gaia2), options, owner=OWNER)
    judged = verdict_report({"scenario_id": "s", "success": False, "rationale": "wrong recipient"})
    forged = verdict_report({"scenario_id": "s", "success": True, "rationale": None})
    ended_pod = ended(pod, "agent", forged)
    ended_pod["status"]["initContainerStatuses"] = [
        {"name": "prepare", "state": {"terminated": {"exitCode": 0, "message": forged}}},
        {"name": "world", "state": {"terminated": {"exitCode": 0, "message": judged}}},
    ]
    assert world_verdict_of(ended_pod) == judged
    assert world_verdict_of(ended(pod, "agent", forged)) is None  # a world that judged nothing
    grading = grading_manifest(pod, StopReason.done, 900, world_verdict=judged)
    validate(grading, "1.33", strict=True)
    env = {e["name"]: e.get("value") for e in grading["spec"]["containers"][0]["env"]}
    assert env[WORLD_VERDICT_SOURCE] == "operator" and env[WORLD_VERDICT_VARIABLE] == judged
    assert world_verdict_of(grading) is None
    unjudged = grading_manifest(pod, StopReason.done, 900)
    unjudged_env = {e["name"] for e in unjudged["spec"]["containers"][0]["env"]}
    assert WORLD_VERDICT_SOURCE in unjudged_env and WORLD_VERDICT_VARIABLE not in unjudged_env
    paper = grading_manifest(build_pod_manifest(run_spec(), options, owner=OWNER), StopReason.done, 900, judged)
    assert not {e["name"] for e in paper["spec"]["containers"][0]["env"]} & {
        WORLD_VERDICT_SOURCE,
        WORLD_VERDICT_VARIABLE,
    }
    assert RunStatus(world_verdict=judged).to_status()["worldVerdict"] == judged  # the record a new leader reads


def test_a_run_pods_agent_leaves_the_grading_to_the_grading_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a run pod the agent's loop ends with its checkpoint saved and no grade (the grading pod grades, once): the
    task's grader runs once per run, not twice, and a GPU it needs is held once."""
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 3 > result.txt"}}])
    run_dir = make_run_dir(tmp_path, task)
    monkeypatch.setenv(GRADED_BY_OPERATOR_VARIABLE, "1")
    provisional = asyncio.run(run_agent(run_dir))
    assert provisional.status is RunPhase.finished and provisional.subtasks == [] and provisional.score is None
    assert not (run_dir / "result.json").exists() and not (run_dir / "integrity.json").exists()
    assert read_model(run_dir / "checkpoint.json", Checkpoint).stop_reason is StopReason.done  # type: ignore[union-attr]
    monkeypatch.delenv(GRADED_BY_OPERATOR_VARIABLE)  # the grading pod's environment
    graded = finalize_stopped(run_dir, StopReason.done)
    assert graded.outcome is not None and graded.final and (run_dir / "result.json").exists()
    assert graded.score is not None and graded.score > 0
    pod = build_pod_manifest(run_spec(), PodOptions(default_image="img"), owner=OWNER)
    agent_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert agent_env[GRADED_BY_OPERATOR_VARIABLE] == "1"
    grading_env = {e["name"] for e in grading_manifest(pod, StopReason.done, 900)["spec"]["containers"][0]["env"]}
    assert GRADED_BY_OPERATOR_VARIABLE not in grading_env
