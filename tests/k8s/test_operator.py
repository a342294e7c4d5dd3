"""`labkube operator` end to end on a fake cluster: kopf + the Ray driver + pods run by a fake kubelet."""

from __future__ import annotations

import json

import kmock
import pytest
from conftest import NAMESPACE, UNPULLABLE, Cluster, eventually, tiny_task
from prometheus_client import CollectorRegistry

from labkube.operator.k8s_models import Tenancy
from labkube.operator.telemetry import OperatorMetrics
from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}


def sleep(seconds: float) -> dict:
    return {"tool": "bash", "args": {"command": f"sleep {seconds}"}}


def phase(cluster: Cluster, name: str) -> str | None:
    obj = cluster.get_campaign(name)
    return ((obj or {}).get("status") or {}).get("phase")


def condition(obj: dict, type_: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


async def test_campaign_of_two_tasks_and_three_seeds_completes(cluster: Cluster) -> None:
    a = tiny_task(cluster.root, "tiny-a", [WRITE, READ])
    b = tiny_task(cluster.root, "tiny-b", [WRITE, READ])
    metrics = OperatorMetrics()
    async with cluster.operator(metrics):
        cluster.campaign("two-by-three", tasks=[str(a), str(b)], models=["oracle"], seeds=3, concurrency=3)
        await eventually(lambda: phase(cluster, "two-by-three") == "Finished", 120, what="the campaign to finish")

    campaign = cluster.get_campaign("two-by-three")
    assert campaign is not None
    assert campaign["status"]["runs"]["finished"] == 6 and campaign["status"]["progress"] == "6/6"
    runs = cluster.runs("two-by-three")
    assert len(runs) == 6
    for run in runs:
        status = run["status"]
        assert status["phase"] == "Finished" and status["stopReason"] == "done"
        assert status["score"] == pytest.approx(0.6) and status["tokens"] > 0 and status["attempts"] == 1
        assert run["metadata"]["ownerReferences"][0]["uid"] == campaign["metadata"]["uid"]
    assert len(cluster.agent_pods_created("two-by-three")) == 6
    # every run graded once, in a pod of its own after its agent's pod ended
    assert sorted(cluster.grading_pods_created("two-by-three")) == sorted(
        f"{r['metadata']['name']}-1-grade" for r in runs
    )
    # Results land in the campaign directory on the runs volume, in the local layout.
    cdir = CampaignDir(cluster.campaign_dir("two-by-three"))
    assert sorted(cdir.run_ids()) == sorted(r["spec"]["run_id"] for r in runs)
    for run_id in cdir.run_ids():
        result = cdir.result(run_id)
        assert result is not None and result.status.value == "Finished" and result.subtasks[0].raw == 6.0
        assert (cdir.run_dir(run_id) / "transcript.jsonl").exists()
    # The operator's /metrics has the campaign's series.
    registry = CollectorRegistry()
    registry.register(metrics)  # type: ignore[arg-type]
    ratio = {"campaign": "two-by-three", "namespace": "default"}
    assert registry.get_sample_value("labkube_campaign_progress_ratio", ratio) == 1.0
    finished = {"campaign": "two-by-three", "namespace": "default", "phase": "Finished"}
    assert registry.get_sample_value("labkube_campaign_runs", finished) == 6


async def test_operator_restart_adopts_running_pods_and_creates_no_duplicate(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "steady", [WRITE, sleep(4), READ])
    async with cluster.operator():
        cluster.campaign("restart", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3)
        await eventually(
            lambda: (
                len(cluster.kubelet.running()) == 3 and all(r["status"].get("podName") for r in cluster.runs("restart"))
            ),
            60,
            what="three running pods, each named by its Run",
        )
    # The operator is gone; its pods are not.
    assert len(cluster.kubelet.running()) == 3
    before = {r["metadata"]["name"]: r["status"]["podName"] for r in cluster.runs("restart")}

    async with cluster.operator():
        await eventually(lambda: phase(cluster, "restart") == "Finished", 90, what="the campaign to finish")

    runs = cluster.runs("restart")
    assert {r["metadata"]["name"]: r["status"]["podName"] for r in runs} == {name: f"{name}-1-grade" for name in before}
    assert sorted(cluster.agent_pods_created("restart")) == sorted(before.values()), "a pod was created twice"
    assert len(cluster.grading_pods_created("restart")) == 3
    for run in runs:
        assert run["status"]["phase"] == "Finished" and run["status"]["attempts"] == 1
    cdir = CampaignDir(cluster.campaign_dir("restart"))
    results = [cdir.result(i) for i in cdir.run_ids()]
    assert all(r is not None and r.final and r.resumes == 0 for r in results)


async def test_evicted_pod_is_replaced_by_one_that_resumes_from_the_checkpoint(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "evictable", [WRITE, sleep(3), READ])
    async with cluster.operator():
        cluster.campaign("evict", tasks=[str(task)], models=["oracle"], seeds=1)
        cdir = CampaignDir(cluster.campaign_dir("evict"))

        def checkpointed_pod() -> str | None:
            running = cluster.kubelet.running()
            ids = cdir.run_ids() if cdir.exists() else []
            status = cdir.status(ids[0]) if ids else None
            return running[0] if running and status is not None and status.step >= 1 else None

        first = await eventually(checkpointed_pod, 60, what="a running pod past its first step")
        cluster.kubelet.evict(first)
        await eventually(lambda: phase(cluster, "evict") == "Finished", 90, what="the campaign to finish")

    (run,) = cluster.runs("evict")
    assert run["status"]["phase"] == "Finished" and run["status"]["attempts"] == 2
    resumed = condition(run, "Resumed")
    # An eviction is the cluster's doing (DisruptionTarget): it uses up no crash attempt.
    assert resumed is not None and resumed["status"] == "True" and resumed["reason"] == "TerminationByKubelet"
    assert "disruption 1 of at most 20; crashes 0 of 3" in resumed["message"]
    assert run["status"]["disruptions"] == 1 and run["status"]["crashes"] == 0
    created = cluster.pods_created("evict")
    assert created == [first, created[1], run["status"]["podName"]]
    assert run["status"]["podName"] == f"{run['metadata']['name']}-2-grade"
    second = cluster.created_pod(created[1])
    assert "--resume" in second["spec"]["containers"][0]["command"]
    # Both pods were deleted once the result was recorded; their GPU time is in the ledger.
    assert cluster.pods("evict") == []
    (run_id,) = cdir.run_ids()
    result = cdir.result(run_id)
    assert result is not None and result.status.value == "Finished" and result.resumes == 1
    assert result.subtasks[0].raw == 6.0
    records = [json.loads(x) for x in (cdir.run_dir(run_id) / "transcript.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["type"] == "model_call"]
    assert steps == list(range(1, len(steps) + 1)), "the resumed run repeated or skipped a step"


async def test_deleting_a_campaign_deletes_its_runs_and_pods_and_keeps_the_results(cluster: Cluster) -> None:
    from conftest import CAMPAIGNS

    task = tiny_task(cluster.root, "long", [WRITE, sleep(60), READ])
    claim_deletes: list[str] = []

    def claim_deleted(request: kmock.Request) -> object:
        claim_deletes.append(str(request.url))
        return NotImplemented  # the fake API answers it as it would

    def deleting_claims(request: kmock.Request) -> bool:
        return request.method.name == "DELETE" and "/persistentvolumeclaims/" in str(request.url)

    cluster.api[deleting_claims] << claim_deleted
    async with cluster.operator():
        cluster.campaign("doomed", tasks=[str(task)], models=["oracle"], seeds=2)
        cdir = CampaignDir(cluster.campaign_dir("doomed"))

        def working() -> bool:
            statuses = [cdir.status(i) for i in cdir.run_ids()] if cdir.exists() else []
            return len(statuses) == 2 and all(s is not None and s.step >= 1 for s in statuses)

        await eventually(working, 60, what="two runs past their first step")
        cluster.api.delete_object(CAMPAIGNS, NAMESPACE, "doomed")
        await eventually(lambda: cluster.get_campaign("doomed") is None, 60, what="the campaign to go")

    assert cluster.runs("doomed") == [] and cluster.pods("doomed") == []
    assert cluster.kubelet.running() == []
    deleted = [name for verb, plural, _, name in cluster.api.audit if verb == "delete" and plural == "runs"]
    assert len(deleted) == 2
    # the shared claim (this cluster's workspace) is not the operator's: it deletes only claims it created
    assert claim_deletes == [], claim_deletes
    assert cdir.exists() and len(cdir.run_ids()) == 2
    for run_id in cdir.run_ids():
        assert (cdir.run_dir(run_id) / "transcript.jsonl").exists()


async def test_runs_carry_no_finalizer_and_a_run_deleted_alone_takes_its_pod_with_it(cluster: Cluster) -> None:
    """A finalizer on every Run cost two API writes per Run while a campaign starts (kopf's finalizer and its
    last-handled annotation). Without one, a Run deleted on its own goes at once and its pod follows through the
    pod's owner reference: the fake API has kube-controller-manager's garbage collector (its deletions are audited as
    `gc-delete`). A Run still holding the finalizer of an earlier version loses it when the operator sees it."""
    from conftest import CAMPAIGNS, RUNS

    def running() -> list[dict]:
        return [p for p in cluster.pods("alone") if (p.get("status") or {}).get("phase") == "Running"]

    task = tiny_task(cluster.root, "alone", [WRITE, sleep(60), READ])
    async with cluster.operator():
        cluster.campaign("alone", tasks=[str(task)], models=["oracle"], seeds=2)
        await eventually(lambda: len(running()) == 2, 60, what="two running pods")
        runs = cluster.runs("alone")
        for run in runs:
            assert not run["metadata"].get("finalizers"), run["metadata"]
            assert not [a for a in run["metadata"].get("annotations") or {} if a.startswith("kopf.zalando.org")]
        doomed, kept = (r["metadata"]["name"] for r in runs)
        cluster.api.delete_object(RUNS, NAMESPACE, doomed)
        assert cluster.api.read_object(RUNS, NAMESPACE, doomed) is None
        await eventually(
            lambda: [p["metadata"]["name"] for p in cluster.pods("alone")] == [f"{kept}-0"], 30, what="its pod to go"
        )
        assert ("gc-delete", "pods", NAMESPACE, f"{doomed}-0") in cluster.api.audit

        cluster.api.update_object(
            RUNS, NAMESPACE, kept, lambda r: r["metadata"].update(finalizers=["labkube.dev/finalizer"])
        )
        await eventually(
            lambda: not (cluster.api.read_object(RUNS, NAMESPACE, kept) or {}).get("metadata", {}).get("finalizers"),
            30,
            what="the old finalizer to be removed",
        )
        cluster.api.delete_object(CAMPAIGNS, NAMESPACE, "alone")
        await eventually(lambda: cluster.get_campaign("alone") is None, 60, what="the campaign to go")
    assert cluster.pods("alone") == [] and cluster.kubelet.running() == []


async def test_a_run_needing_more_gpus_than_the_cluster_has_shows_why_it_waits(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "huge", [WRITE], resources={"gpus": 4})
    async with cluster.operator():
        cluster.campaign("toobig", tasks=[str(task)], models=["oracle"], seeds=1)

        def unscheduled() -> dict | None:
            runs = cluster.runs("toobig")
            found = condition(runs[0], "Scheduled") if runs else None
            return found if found and found["status"] == "False" else None

        found = await eventually(unscheduled, 60, what="a Scheduled=False condition")
        assert found["reason"] == "Unschedulable"
        assert "Insufficient nvidia.com/gpu" in found["message"]
        (run,) = cluster.runs("toobig")
        assert run["status"]["phase"] == "Pending"  # waiting for a node, not starting
        cdir = CampaignDir(cluster.campaign_dir("toobig"))
        status = await eventually(lambda: cdir.status(cdir.run_ids()[0]), 10, what="status.json")
        await eventually(lambda: "Unschedulable" in (cdir.status(cdir.run_ids()[0]) or status).message, 10)
        assert cluster.kubelet.started == []


async def test_an_image_that_cannot_be_pulled_becomes_a_condition(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "imageless", [WRITE], resources={"image": UNPULLABLE})
    async with cluster.operator(tenancy=Tenancy(images=["registry.invalid/labkube/"])):
        cluster.campaign("noimage", tasks=[str(task)], models=["oracle"], seeds=1)

        def pull_problem() -> dict | None:
            runs = cluster.runs("noimage")
            found = condition(runs[0], "ImagePulled") if runs else None
            return found if found and found["reason"] == "ImagePullBackOff" else None

        found = await eventually(pull_problem, 60, what="an ImagePulled=False condition")
        assert found["status"] == "False" and UNPULLABLE in found["message"]
        assert cluster.runs("noimage")[0]["status"]["phase"] == "Pending"  # waiting for its image
        cdir = CampaignDir(cluster.campaign_dir("noimage"))
        await eventually(lambda: "ImagePullBackOff" in (cdir.status(cdir.run_ids()[0]) or _blank()).message, 10)


def _blank():  # a status.json that says nothing yet
    from labkube.run_spec import RunStatus

    return RunStatus(run_id="?")


async def test_gpu_hour_cap_stops_new_runs_and_marks_them(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "gpu", [WRITE, sleep(1), READ], resources={"gpus": 1})
    async with cluster.operator():
        cluster.campaign("capped", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=1, gpu_hours_cap=0.0001)
        await eventually(lambda: phase(cluster, "capped") == "Finished", 90, what="the campaign to finish")

    campaign = cluster.get_campaign("capped")
    assert campaign is not None
    cap = condition(campaign, "GpuHoursCapReached")
    assert cap is not None and cap["status"] == "True" and "2 run(s) not started" in cap["message"]
    runs = sorted(cluster.runs("capped"), key=lambda r: r["spec"]["seed"])
    assert [r["status"]["phase"] for r in runs] == ["Finished", "Pending", "Pending"]
    for run in runs[1:]:
        held = condition(run, "Started")
        assert held is not None and held["reason"] == "GpuHoursCapReached"
    assert len(cluster.agent_pods_created("capped")) == 1
    assert campaign["status"]["gpuHoursUsed"] > 0.0001
    cdir = CampaignDir(cluster.campaign_dir("capped"))
    held_status = cdir.status(runs[1]["spec"]["run_id"])
    assert held_status is not None and "GPU-hour cap" in held_status.message


@pytest.mark.parametrize("keep", [True, False], ids=["keepFinished", "releaseFinished"])
async def test_a_finished_runs_claim_is_released_only_after_its_result_is_recorded(
    cluster: Cluster, keep: bool
) -> None:
    """Claim per run with `runs.workspace.keepFinished: false`: once a run's result is in its Run status (from its
    grading pod, which has ended), the claim the operator made for it is deleted; with the default it stays until
    the Campaign goes. The fake API answers a DELETE whose uid precondition does not match with 409, as the real
    one does."""
    from conftest import RUNS

    claims = ("", "v1", "persistentvolumeclaims")
    status_at_release: dict[str, dict] = {}

    def heard(type_: str, res: tuple[str, str, str], obj: dict) -> None:
        if res == claims and type_ == "DELETED":
            run = obj["metadata"]["ownerReferences"][0]["name"]
            status_at_release[run] = (cluster.api.read_object(RUNS, NAMESPACE, run) or {}).get("status") or {}

    cluster.api.listeners.append(heard)
    task = tiny_task(cluster.root, "released", [WRITE, READ])
    async with cluster.operator(workspace={"mode": "pvc", "keepFinished": keep}):
        cluster.campaign("released", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
        await eventually(lambda: phase(cluster, "released") == "Finished", 90, what="the campaign to finish")
        runs = cluster.runs("released")
        if not keep:
            await eventually(lambda: len(status_at_release) == 2, 30, what="both claims to be released")

    assert all(r["status"]["phase"] == "Finished" and r["status"]["score"] == pytest.approx(0.6) for r in runs)
    left = cluster.api.objects(claims, NAMESPACE)
    if keep:
        assert sorted(c["metadata"]["name"] for c in left) == sorted(f"{r['metadata']['name']}-runs" for r in runs)
        assert status_at_release == {}
    else:
        assert left == []
        for run in runs:  # deleted after the result was recorded and the grading pod ended
            status = status_at_release[run["metadata"]["name"]]
            assert status["phase"] == "Finished" and status["report"] and status["podName"].endswith("-grade")
        assert not [p for p in cluster.pods("released") if p["status"].get("phase") not in ("Succeeded", "Failed")]
