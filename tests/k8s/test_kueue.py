"""Runs admitted through Kueue's pod integration (`kueue.FakeKueue`: its webhook's scheduling gate, its controller's
admission by quota, its preemption), against the fake API and kubelet: the gate is respected (a gated pod waits,
reported as queued, never as stuck), at most the quota of pods runs at once, and a run whose pod Kueue preempts keeps
its identity (same Run, same queue, a new attempt's pod that Kueue gates and admits again) and resumes from its
checkpoint without using a crash attempt."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import PODS, Cluster, eventually, tiny_task
from kueue import GATE, QUEUE_LABEL, FakeKueue
from test_fault_kube import phase, running_mid_step

from labkube.operator.k8s_models import Tenancy

pytestmark = pytest.mark.slow
Fault = Callable[[str, str, str], object]

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}
SLEEP = {"tool": "bash", "args": {"command": "sleep 2"}}


def gated_pods(cluster: Cluster, campaign: str) -> list[dict]:
    pods = cluster.api.objects(PODS, "default", f"labkube.dev/campaign={campaign}")
    return [p for p in pods if any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or [])]


async def test_kueue_admits_runs_by_quota_and_a_preempted_run_requeues_as_itself(
    cluster: Cluster, fault: Fault
) -> None:
    fault(
        "run pod preempted by Kueue",
        "Kueue's pod integration (test-side: its webhook's scheduling gate, admission by a quota of 2 pods) runs 3 "
        "runs; one admitted pod is stopped mid-step with TerminationTarget=True (StoppedByKueue) and deleted",
        "gated pods wait reported as queued (Scheduled=False, SchedulingGated), never more than the quota run; the "
        "preempted run's next pod has the same run label and LocalQueue, is gated and admitted again and resumes "
        "from the checkpoint; a disruption, not a crash",
    )
    kueue = FakeKueue(cluster.api, queues={"gpu"}, quota=2)
    task = tiny_task(cluster.root, "queued", [WRITE, SLEEP, SLEEP, READ])
    async with cluster.operator(tenancy=Tenancy(queue_names=["gpu"])):
        cluster.campaign(
            "kueue", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3, pod={"queueName": "gpu"}
        )
        # the third run's pod waits behind Kueue's gate; its Run says it is queued
        await eventually(lambda: len(gated_pods(cluster, "kueue")) == 1, 60, what="one pod held by Kueue's gate")
        (gated,) = gated_pods(cluster, "kueue")

        def run_of(pod: dict) -> dict | None:
            # the Run's status names its pod in a patch that follows the pod's creation
            name = pod["metadata"]["name"]
            return next((r for r in cluster.runs("kueue") if r["status"].get("podName") == name), None)

        await eventually(lambda: run_of(gated) is not None, 30, what="the gated pod's Run to name it")
        run_of_gated = run_of(gated)
        assert run_of_gated is not None

        def queued() -> bool:
            run = next(r for r in cluster.runs("kueue") if r["metadata"]["name"] == run_of_gated["metadata"]["name"])
            scheduled = next((c for c in run["status"].get("conditions") or [] if c["type"] == "Scheduled"), None)
            return scheduled is not None and scheduled["reason"] == "SchedulingGated"

        await eventually(queued, 30, what="the gated run's Scheduled=False/SchedulingGated condition")
        # Kueue preempts a running pod mid-step: the run's next pod is gated and admitted again, and resumes
        await eventually(lambda: running_mid_step(cluster, "kueue", 2), 60, what="two admitted pods mid-step")
        victim = next(name for name in cluster.kubelet.running() if name != gated["metadata"]["name"])
        kueue.preempt(victim)
        await eventually(lambda: phase(cluster, "kueue") == "Finished", 120, what="the campaign to finish")

    assert kueue.most_admitted == 2
    runs = cluster.runs("kueue")
    assert all(r["status"]["phase"] == "Finished" for r in runs)
    preempted = next(r for r in runs if r["metadata"]["name"] == victim.rsplit("-", 1)[0])
    status = preempted["status"]
    assert status["attempts"] == 2 and status["disruptions"] == 1 and status["crashes"] == 0, status
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "StoppedByKueue"
    second = cluster.created_pod(f"{preempted['metadata']['name']}-1")
    assert status["podName"] == f"{preempted['metadata']['name']}-2-grade"
    assert second["metadata"]["labels"][QUEUE_LABEL] == "gpu"  # the same LocalQueue: requeued as itself
    assert (
        second["metadata"]["labels"]["labkube.dev/run"]
        == cluster.created_pod(victim)["metadata"]["labels"]["labkube.dev/run"]
    )
    assert any(g["name"] == GATE for g in second["spec"]["schedulingGates"])  # Kueue gated it again
    assert "--resume" in second["spec"]["containers"][0]["command"]
    for run in runs:  # nobody ran without Kueue's admission: every pod was created gated
        assert all(
            GATE in str(cluster.created_pod(p)["spec"].get("schedulingGates")) for p in [run["status"]["podName"]]
        )
