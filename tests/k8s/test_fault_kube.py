"""Faults in the Kubernetes control plane, on the fake cluster: the operator restarting, and the API server
answering 409 Conflict, 410 Gone on a watch, and 500. Errors are kmock reactions on `FakeKube`
(`api[criteria] << Injected(...)`), consulted before its stateful API; the 410 is `FakeKube.expire_watches`.
Every test drives a whole campaign and checks that it still ends right: every Run Finished with its score,
one pod per run (no duplicates), the results on the runs volume."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import kmock
import pytest
from conftest import Cluster, eventually, tiny_task
from fakekube import FakeKube, KubeError, Outage

from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

Fault = Callable[[str, str, str], object]

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}
PODS = kmock.resource("v1/pods")
RUNS = kmock.resource("labkube.dev/v1alpha1/runs")
CAMPAIGNS = kmock.resource("labkube.dev/v1alpha1/campaigns")
STATUS = kmock.subresource("status")
FINISHED = kmock.data({"status": {"phase": "Finished"}})


def sleep(seconds: float) -> dict[str, Any]:
    return {"tool": "bash", "args": {"command": f"sleep {seconds}"}}


class Injected:
    """A kmock reaction: the first `times` requests it sees answer `code` with a Kubernetes Status; later ones
    go through to the fake API. With `commit`, a create is carried out before the error (its answer was lost)."""

    def __init__(self, api: FakeKube, code: int, times: int, *, commit: bool = False, reason: str | None = None):
        self.api, self.code, self.left, self.commit, self.reason = api, code, times, commit, reason
        self.hits: list[str] = []

    def __call__(self, request: kmock.Request) -> Any:
        if self.left == 0:
            return NotImplemented  # kmock retires the reaction: the API answers from now on
        self.left -= 1
        self.hits.append(f"{request.method.value} {request.url.path}")
        if self.commit:
            assert request.resource is not None and isinstance(request.data, dict)
            res = (request.resource.group or "", request.resource.version or "", request.resource.plural or "")
            self.api.create_object(res, request.namespace or "", request.data)
        raise KubeError(self.code, f"injected {self.code} (fault test)", self.reason)


def inject(cluster: Cluster, *criteria: Any, code: int, times: int, **kwargs: Any) -> Injected:
    reaction = Injected(cluster.api, code, times, **kwargs)
    cluster.api[criteria] << reaction
    return reaction


def by_operator(request: kmock.Request) -> bool:
    """The operator lists a campaign's Runs by label; kopf lists them all."""
    return "labelSelector" in request.params


def by_kopf(request: kmock.Request) -> bool:
    return not by_operator(request)


def phase(cluster: Cluster, name: str) -> str | None:
    return ((cluster.get_campaign(name) or {}).get("status") or {}).get("phase")


def running_mid_step(cluster: Cluster, name: str, count: int) -> bool:
    """`count` pods running, each past its agent's first step."""
    cdir = CampaignDir(cluster.campaign_dir(name))
    if len(cluster.kubelet.running()) != count or not cdir.exists():
        return False
    statuses = [cdir.status(i) for i in cdir.run_ids()]
    return sum(1 for s in statuses if s is not None and s.step >= 1) >= count


def assert_completed(cluster: Cluster, name: str, runs: int) -> None:
    """The campaign finished as if nothing had happened: every Run Finished, its agent in one pod, scored by one
    grading pod."""
    campaign = cluster.get_campaign(name)
    assert campaign is not None
    assert campaign["status"]["phase"] == "Finished" and campaign["status"]["progress"] == f"{runs}/{runs}"
    assert campaign["status"]["runs"]["finished"] == runs
    objs = cluster.runs(name)
    assert len(objs) == runs
    for run in objs:
        status = run["status"]
        assert status["phase"] == "Finished" and status["stopReason"] == "done", status
        assert status["score"] == pytest.approx(0.6) and status["tokens"] > 0 and status["attempts"] == 1
        assert run["metadata"]["ownerReferences"][0]["uid"] == campaign["metadata"]["uid"]
    created = cluster.pods_created(name)
    expected = [p for r in objs for p in (f"{r['metadata']['name']}-0", f"{r['metadata']['name']}-1-grade")]
    assert sorted(created) == sorted(expected), f"pods created: {created}"
    assert all(r["status"]["podName"].endswith("-1-grade") for r in objs)
    cdir = CampaignDir(cluster.campaign_dir(name))
    assert sorted(cdir.run_ids()) == sorted(r["spec"]["run_id"] for r in objs)
    for run_id in cdir.run_ids():
        result = cdir.result(run_id)
        assert result is not None and result.final and result.status.value == "Finished"
        assert result.subtasks[0].raw == 6.0 and result.resumes == 0
        assert (cdir.run_dir(run_id) / "transcript.jsonl").exists()


async def test_operator_restart_mid_campaign_adopts_pods_and_starts_the_rest(cluster: Cluster, fault: Fault) -> None:
    fault(
        "operator restarts mid-campaign",
        "the operator (kopf and its Ray supervisors) stops while 2 of 3 runs have pods mid-step; a new one starts",
        "the pods keep running; the new operator adopts them (no second pod), starts the third run and "
        "finishes the campaign; no run resumes or counts a second attempt",
    )
    task = tiny_task(cluster.root, "steady", [WRITE, sleep(4), READ])
    async with cluster.operator():
        cluster.campaign("restarted", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=2)
        await eventually(lambda: running_mid_step(cluster, "restarted", 2), 60, what="two pods mid-step")
    in_flight = set(cluster.kubelet.running())
    assert len(in_flight) == 2 and len(cluster.pods_created("restarted")) == 2

    async with cluster.operator():
        await eventually(lambda: phase(cluster, "restarted") == "Finished", 90, what="the campaign to finish")

    assert_completed(cluster, "restarted", 3)
    assert in_flight < set(cluster.pods_created("restarted"))


async def test_api_conflicts_on_pod_create_and_status_patches(cluster: Cluster, fault: Fault) -> None:
    fault(
        "API server answers 409 Conflict",
        "the first 2 pod creates are carried out but answer 409 AlreadyExists; 409 on the first 2 Run status "
        "patches, on 2 that mark a Run Finished, on the first that marks the Campaign Finished, and 6 times on one "
        "Run's final status patch (more than its supervisor tries)",
        "a create that answers 409 adopts the existing pod (no second pod); a status patch that conflicts is sent "
        "again; a Run whose final status never landed gets it from its result.json before the Campaign is "
        "marked Finished",
    )
    # The most specific reactions first: the first one that matches answers.
    lost = inject(cluster, kmock.method.PATCH, RUNS, STATUS, FINISHED, kmock.name("conflicts-*-s0"), code=409, times=6)
    creates = inject(cluster, kmock.action.CREATE, PODS, code=409, times=2, commit=True, reason="AlreadyExists")
    patches = inject(cluster, kmock.method.PATCH, RUNS, STATUS, code=409, times=2)
    finals = inject(cluster, kmock.method.PATCH, RUNS, STATUS, FINISHED, code=409, times=2)
    campaign = inject(cluster, kmock.method.PATCH, CAMPAIGNS, STATUS, FINISHED, code=409, times=1)
    task = tiny_task(cluster.root, "contested", [WRITE, READ])
    async with cluster.operator():
        cluster.campaign("conflicts", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3)
        await eventually(lambda: phase(cluster, "conflicts") == "Finished", 90, what="the campaign to finish")

    assert_completed(cluster, "conflicts", 3)
    for injected in (lost, creates, patches, finals, campaign):
        assert injected.left == 0, injected.hits


async def test_watch_answers_410_gone_and_everyone_lists_again(cluster: Cluster, fault: Fault) -> None:
    fault(
        "API server answers 410 Gone on a watch",
        "while 3 runs are mid-step, every open watch (kopf's Campaign and Run watches, the supervisors' pod "
        "watch) gets ERROR 410 `too old resource version` and ends; a watch from an older version answers 410",
        "kopf and the pod watcher list again and watch from the new version; no daemon or pod is duplicated "
        "and the campaign finishes",
    )
    task = tiny_task(cluster.root, "watched", [WRITE, sleep(2), READ])
    async with cluster.operator():
        cluster.campaign("gone", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3)
        await eventually(lambda: running_mid_step(cluster, "gone", 3), 60, what="three pods mid-step")
        mark = len(list(cluster.api))
        cluster.api.expire_watches()
        await eventually(lambda: phase(cluster, "gone") == "Finished", 90, what="the campaign to finish")

    assert_completed(cluster, "gone", 3)
    after = [r for r in cluster.api if r.id >= mark]
    listed = {r.resource.plural for r in after if r.resource and r.action == kmock.action.LIST and by_kopf(r)}
    assert {"campaigns", "runs"} <= listed, "kopf did not list again after the 410"
    assert any(r.action == kmock.action.LIST and r.resource == PODS for r in after), "the pod watch did not re-list"
    assert sum(r.action == kmock.action.WATCH for r in after) >= 3


async def test_api_server_errors_are_retried(cluster: Cluster, fault: Fault) -> None:
    fault(
        "API server answers 500",
        "500 InternalError on the first requests of each kind: kopf's Campaign and Run lists, Campaign watch "
        "and patch; the operator's Run creates and lists; the supervisors' Run reads, pod list, pod creates "
        "(one carried out before its 500, one 503) and Run status patches (also final ones)",
        "every call is retried with back-off (kopf's own, labkube's `retrying`); a create retried after a lost "
        "answer meets 409 and adopts its pod; the campaign finishes with one pod per run",
    )
    injected = [
        inject(cluster, kmock.action.LIST, CAMPAIGNS, code=500, times=2),
        inject(cluster, kmock.action.WATCH, CAMPAIGNS, code=500, times=1),
        inject(cluster, kmock.method.PATCH, CAMPAIGNS, kmock.subresource(None), code=500, times=1),
        inject(cluster, kmock.action.CREATE, RUNS, code=500, times=2),
        inject(cluster, kmock.action.LIST, RUNS, by_kopf, code=500, times=2),
        inject(cluster, kmock.action.LIST, RUNS, by_operator, code=500, times=2),
        inject(cluster, kmock.action.FETCH, RUNS, code=500, times=2),
        inject(cluster, kmock.action.LIST, PODS, code=500, times=2),
        inject(cluster, kmock.action.CREATE, PODS, code=500, times=1, commit=True),
        inject(cluster, kmock.action.CREATE, PODS, code=503, times=1),
        inject(cluster, kmock.method.PATCH, RUNS, STATUS, code=500, times=2),
        inject(cluster, kmock.method.PATCH, RUNS, STATUS, FINISHED, code=500, times=2),
    ]
    task = tiny_task(cluster.root, "flaky", [WRITE, READ])
    async with cluster.operator():
        cluster.campaign("errors", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3)
        await eventually(lambda: phase(cluster, "errors") == "Finished", 90, what="the campaign to finish")

    assert_completed(cluster, "errors", 3)
    for reaction in injected:
        assert reaction.left == 0, f"a fault was never injected: {reaction.hits}"


async def test_a_minute_of_503s_mid_campaign_fails_no_run(cluster: Cluster, fault: Fault) -> None:
    fault(
        "API server down for 60 s mid-campaign",
        "while 3 runs are mid-step, every HTTP request to the API (kopf's, the operator's, the supervisors' pod "
        "watch, creates and status patches) answers 503 for 60 s, longer than any fixed retry budget",
        "every call waits it out per run with capped exponential back-off and jitter, for as long as the run's own "
        "deadline allows; no run, daemon or campaign fails, no pod is duplicated, and the campaign finishes",
    )
    task = tiny_task(cluster.root, "patient", [WRITE, sleep(3), READ])
    async with cluster.operator():
        cluster.campaign("outage", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=2)
        await eventually(lambda: running_mid_step(cluster, "outage", 2), 60, what="two pods mid-step")
        outage = Outage(60)
        cluster.api[lambda _: True] << outage
        await asyncio.sleep(60)
        await eventually(lambda: phase(cluster, "outage") == "Finished", 120, what="the campaign to finish")

    assert outage.hits > 10
    assert_completed(cluster, "outage", 3)


def mid_step_pod(cluster: Cluster, name: str, after: set[str], past_step: int = 0) -> tuple[str, int] | None:
    """A running pod not in `after` whose agent got past step `past_step` (so past a step of its own attempt),
    and the step it is at."""
    cdir = CampaignDir(cluster.campaign_dir(name))
    running = [p for p in cluster.kubelet.running() if p not in after]
    ids = cdir.run_ids() if cdir.exists() else []
    status = cdir.status(ids[0]) if ids else None
    return (running[0], status.step) if running and status is not None and status.step > past_step else None


async def test_a_pod_evicted_five_times_resumes_each_time_and_finishes(cluster: Cluster, fault: Fault) -> None:
    fault(
        "run pod evicted 5 times (DisruptionTarget)",
        "the kubelet evicts the run's pod 5 times in a row, each time mid-step (node pressure: Failed/Evicted with "
        "DisruptionTarget=True, TerminationByKubelet)",
        "evictions are told apart from crashes and use up no crash attempt (3): each replacement pod resumes from "
        "the checkpoint, one pod per attempt, and the run finishes with its score",
    )
    steps = [WRITE, *[sleep(1.5) for _ in range(8)], READ]
    task = tiny_task(cluster.root, "evicted", steps)
    seen: set[str] = set()
    step = 0
    async with cluster.operator():
        cluster.campaign("evictions", tasks=[str(task)], models=["oracle"], seeds=1)
        for _ in range(5):
            pod, step = await eventually(
                lambda step=step: mid_step_pod(cluster, "evictions", seen, step), 60, what="a pod past its own step"
            )
            seen.add(pod)
            cluster.kubelet.evict(pod)
        await eventually(lambda: phase(cluster, "evictions") == "Finished", 120, what="the campaign to finish")

    (run,) = cluster.runs("evictions")
    status = run["status"]
    assert status["phase"] == "Finished" and status["stopReason"] == "done"
    assert status["attempts"] == 6 and status["disruptions"] == 5 and status["crashes"] == 0
    created = cluster.agent_pods_created("evictions")
    assert cluster.grading_pods_created("evictions") == [run["status"]["podName"]]
    assert len(created) == 6 and len(set(created)) == 6 and set(created[:5]) == seen
    for name in created[1:]:
        assert "--resume" in cluster.created_pod(name)["spec"]["containers"][0]["command"]
    cdir = CampaignDir(cluster.campaign_dir("evictions"))
    (run_id,) = cdir.run_ids()
    result = cdir.result(run_id)
    assert result is not None and result.status.value == "Finished" and result.resumes == 5
    assert result.subtasks[0].raw == 6.0


async def test_a_preempted_pod_resumes_without_using_a_crash_attempt(cluster: Cluster, fault: Fault) -> None:
    fault(
        "run pod preempted by the scheduler",
        "the pod gets DisruptionTarget=True (PreemptionByScheduler) and is deleted mid-step, as a higher-priority "
        "pod's preemption (or Kueue, or a drain) does",
        "the supervisor reads the deleted pod's last state from its watch, counts a disruption, not a crash, and "
        "a new pod resumes from the checkpoint",
    )
    task = tiny_task(cluster.root, "preempted", [WRITE, sleep(2), sleep(2), READ])
    async with cluster.operator():
        cluster.campaign("preemption", tasks=[str(task)], models=["oracle"], seeds=1)
        pod, _ = await eventually(lambda: mid_step_pod(cluster, "preemption", set()), 60, what="a pod mid-step")
        cluster.kubelet.preempt(pod)
        await eventually(lambda: phase(cluster, "preemption") == "Finished", 90, what="the campaign to finish")

    (run,) = cluster.runs("preemption")
    assert run["status"]["disruptions"] == 1 and run["status"]["crashes"] == 0 and run["status"]["attempts"] == 2
    resumed = next(c for c in run["status"]["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "PreemptionByScheduler" and "resuming from the checkpoint" in resumed["message"]


class PodListGap:
    """A kmock reaction: every pod list and watch answers 503 until `close()` (then it retires). The pod watch that
    meets it after a 410 cannot list again, so whatever happens to pods meanwhile is never seen as an event."""

    def __init__(self) -> None:
        self.closed = False
        self.hits = 0

    def close(self) -> None:
        self.closed = True

    def __call__(self, request: kmock.Request) -> Any:
        if self.closed:
            return NotImplemented
        self.hits += 1
        raise KubeError(503, "injected: pod lists and watches unavailable (fault test)", "ServiceUnavailable")


def pod_list_or_watch(request: kmock.Request) -> bool:
    return request.resource == PODS and request.action in (kmock.action.LIST, kmock.action.WATCH)


async def test_a_pod_preempted_while_the_pod_watch_is_down_is_a_disruption(cluster: Cluster, fault: Fault) -> None:
    fault(
        "run pod preempted while the pod watch re-lists",
        "the pod watch gets 410 Gone and its lists and watches answer 503 for a while; meanwhile the scheduler "
        "preempts the run's pod (DisruptionTarget, then DELETE): no event of it reaches the operator",
        "the watch lists again and finds the pod missing; the supervisor reconciles it with the last state seen "
        "(running, not being deleted): a disruption, not a crash, and a new pod resumes from the checkpoint",
    )
    task = tiny_task(cluster.root, "unwatched", [WRITE, sleep(3), sleep(3), READ])
    async with cluster.operator():
        cluster.campaign("unwatched", tasks=[str(task)], models=["oracle"], seeds=1)
        pod, _ = await eventually(lambda: mid_step_pod(cluster, "unwatched", set()), 60, what="a pod mid-step")
        gap = PodListGap()
        cluster.api[pod_list_or_watch] << gap
        cluster.api.expire_watches()
        await eventually(lambda: gap.hits >= 2, 30, what="the pod watch to list again into the gap")
        assert pod in cluster.kubelet.running()  # preempted mid-run, not after it ended
        cluster.kubelet.preempt(pod)
        gap.close()
        await eventually(lambda: phase(cluster, "unwatched") == "Finished", 90, what="the campaign to finish")

    (run,) = cluster.runs("unwatched")
    assert run["status"]["disruptions"] == 1 and run["status"]["crashes"] == 0 and run["status"]["attempts"] == 2
    resumed = next(c for c in run["status"]["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "DeletedWhileUnwatched" and "resuming from the checkpoint" in resumed["message"]
    assert run["status"]["phase"] == "Finished" and run["status"]["score"] == pytest.approx(0.6)
