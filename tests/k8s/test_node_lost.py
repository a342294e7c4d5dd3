"""Pods that stop being pods (issue 42 item 1): a run pod's node dies, and its pod stays "Running" in the API (no
kubelet posts its end), or Terminating for ever after a graceful delete (no kubelet confirms it), or vanishes
"Running" when the Node object is deleted (PodGC). The fake kubelet learns to lose its node (`lose_node`: the
processes end, the Node goes `Ready=Unknown` with its last heartbeat, a new node takes new pods) and the fake API to
keep a dead node's pods Terminating (`awaits_kubelet`), as kube-apiserver does; the fakes were more lenient (a
deleted pod went at once, and no node ever died).

Each run resumes in a new pod as after a disruption (no crash attempt used), its lost pod's GPU time ends when the
cluster last saw it run (the node's last heartbeat) rather than growing for ever, the ledger marks it lost, and the
operator's `labkube_campaign_run_pods_lost_total` (behind `LabkubeRunPodLost`) counts it.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from conftest import NAMESPACE, PODS, Cluster, eventually, tiny_task
from prometheus_client import CollectorRegistry, generate_latest

from labkube.operator.k8s_models import OperatorConfig, PodOptions
from labkube.operator.telemetry import OperatorMetrics
from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}
SLEEP = {"tool": "bash", "args": {"command": "sleep 6"}}


def config(cluster: Cluster, lost_after_s: int) -> OperatorConfig:
    runtime = cluster.runtime()
    runs = runtime.config.runs.model_copy(update={"pod_lost_after_seconds": lost_after_s})
    return runtime.config.model_copy(update={"runs": PodOptions.model_validate(runs.model_dump())})


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def phase(cluster: Cluster, name: str) -> str | None:
    return ((cluster.get_campaign(name) or {}).get("status") or {}).get("phase")


async def running_past_first_step(cluster: Cluster, campaign: str) -> str:
    cdir = CampaignDir(cluster.campaign_dir(campaign))

    def pod() -> str | None:
        running = cluster.kubelet.running()
        ids = cdir.run_ids() if cdir.exists() else []
        status = cdir.status(ids[0]) if ids else None
        return running[0] if running and status is not None and status.step >= 1 else None

    return await eventually(pod, 60, what="a running pod past its first step")


def pods_lost_metric(metrics: OperatorMetrics, campaign: str) -> float:
    registry = CollectorRegistry()
    registry.register(metrics)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    for line in text.splitlines():
        if line.startswith("labkube_campaign_run_pods_lost_total{") and f'campaign="{campaign}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no labkube_campaign_run_pods_lost_total for {campaign}:\n{text}")


def assert_resumed_after_loss(cluster: Cluster, campaign: str, lost_pod: str, killed_at: datetime) -> dict[str, Any]:
    (run,) = cluster.runs(campaign)
    status = run["status"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
    assert status["disruptions"] == 1 and status["crashes"] == 0, status
    resumed = condition(run, "Resumed")
    assert resumed is not None and resumed["reason"] == "PodLost" and lost_pod in resumed["message"], resumed
    times = {p["pod"]: p for p in status["podTimes"]}
    assert times[lost_pod]["lost"] and times[lost_pod]["end"], times
    lost_end = stamp(times[lost_pod]["end"])
    # closed when the cluster last saw it run (the node's last heartbeat), not when the operator noticed
    assert lost_end <= killed_at, (lost_end, killed_at)
    assert all(p["end"] for p in times.values()), "a pod's GPU time is still open"
    # whole-second times: a pod that started and ended within one second counts that second (`MIN_POD_SECONDS`)
    seconds = sum(max(1.0, (stamp(p["end"]) - stamp(p["start"])).total_seconds()) for p in times.values())
    assert status["gpuHours"] == pytest.approx(seconds / 3600, abs=1e-4)
    cdir = CampaignDir(cluster.campaign_dir(campaign))
    (run_id,) = cdir.run_ids()
    result = cdir.result(run_id)
    assert result is not None and result.resumes == 1 and result.subtasks[0].raw == 6.0
    return run


async def test_a_run_on_a_node_that_dies_resumes_elsewhere_and_its_gpu_time_stops(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "deadnode", [WRITE, SLEEP, READ], resources={"gpus": 1})
    metrics = OperatorMetrics()
    async with cluster.operator(metrics=metrics, config=config(cluster, lost_after_s=1)):
        cluster.campaign("dead", tasks=[str(task)], models=["oracle"], seeds=1)
        first = await running_past_first_step(cluster, "dead")
        dead = await cluster.kubelet.lose_node()
        killed_at = datetime.now().astimezone()
        # No kubelet posts the pod's end: the API still says Running on the dead node.
        pod = cluster.api.read_object(PODS, NAMESPACE, first)
        assert pod is not None and pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == dead
        await eventually(lambda: phase(cluster, "dead") == "Finished", 120, what="the campaign to finish")
        await eventually(lambda: pods_lost_metric(metrics, "dead") == 1, 30, what="the lost pod counted")

    run = assert_resumed_after_loss(cluster, "dead", first, killed_at)
    assert ("delete", "pods", NAMESPACE, first) in cluster.api.audit  # force-deleted: nothing would confirm it
    assert cluster.api.read_object(PODS, NAMESPACE, first) is None
    second = cluster.pods_created("dead")[1]
    assert cluster.last_pod_state(second)["spec"]["nodeName"] != dead
    assert "its node" in condition(run, "Resumed")["message"]  # type: ignore[index]


async def test_a_pod_terminating_past_its_grace_is_lost_and_the_run_resumes(cluster: Cluster) -> None:
    """A kubelet that never confirms a deletion (its node alive but hung): the pod stays Terminating past the end of
    its grace period plus the margin, and the run goes on in a new pod."""
    task = tiny_task(cluster.root, "stuck", [WRITE, SLEEP, READ])
    async with cluster.operator(config=config(cluster, lost_after_s=1)):
        cluster.campaign("stuck", tasks=[str(task)], models=["oracle"], seeds=1)
        first = await running_past_first_step(cluster, "stuck")
        cluster.api.awaits_kubelet = lambda pod: pod["metadata"]["name"] == first
        # a graceful DELETE, as the node controller's taint-based eviction makes one
        held = cluster.api.delete_gracefully(NAMESPACE, first, grace_s=1)
        grace_ends = stamp(held["metadata"]["deletionTimestamp"])
        await eventually(lambda: phase(cluster, "stuck") == "Finished", 120, what="the campaign to finish")

    (run,) = cluster.runs("stuck")
    resumed = condition(run, "Resumed")
    assert resumed is not None and resumed["reason"] == "PodLost" and "still Terminating" in resumed["message"]
    assert run["status"]["disruptions"] == 1 and run["status"]["crashes"] == 0
    times = {p["pod"]: p for p in run["status"]["podTimes"]}
    # its node is Ready: the last time the cluster saw it run is the end of its grace period
    assert times[first]["lost"] and stamp(times[first]["end"]) == grace_ends


async def test_pods_that_vanish_with_a_deleted_node_are_lost_not_crashed(cluster: Cluster) -> None:
    """The Node object is deleted soon after it died (before the margin): PodGC removes its pods while their last
    phase is Running. The pod is lost with its node (a disruption), and its GPU time ends at the node's last
    heartbeat the operator read."""
    task = tiny_task(cluster.root, "gone", [WRITE, SLEEP, READ], resources={"gpus": 1})
    async with cluster.operator(config=config(cluster, lost_after_s=600)):
        cluster.campaign("gone", tasks=[str(task)], models=["oracle"], seeds=1)
        first = await running_past_first_step(cluster, "gone")
        time.sleep(0.5)  # a node read by the run's supervisor (every follow), as on a cluster
        dead = await cluster.kubelet.lose_node()
        killed_at = datetime.now().astimezone()
        assert cluster.kubelet.remove_node(dead) == [first]
        await eventually(lambda: phase(cluster, "gone") == "Finished", 120, what="the campaign to finish")

    run = assert_resumed_after_loss(cluster, "gone", first, killed_at)
    assert "is gone" in condition(run, "Resumed")["message"]  # type: ignore[index]
