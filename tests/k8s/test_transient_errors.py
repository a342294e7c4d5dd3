"""Transient is not final (issue 42, item 2): a full ResourceQuota, throttling with Retry-After, a run needing more
GPUs than any one node has, and the chart values for the image-pull give-up and the grading pod's deadline.

The end-to-end test drives a campaign on the fake cluster (`FakeKube` with a `QuotaRefusal` and a `Throttle`
reaction); the others are plain functions and a `PodRun` without a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kmock
import pytest
from conftest import NAMESPACE, Cluster, eventually, tiny_task
from fakekube import QuotaRefusal, Throttle

from labkube.budgets import StopReason
from labkube.operator.k8s_backend import K8sBackend, PodRun
from labkube.operator.k8s_ledger import PodLedger
from labkube.operator.k8s_models import OperatorConfig, PodOptions, RunResourceSpec, RunStatus
from labkube.operator.kube import KubeTarget, largest_node_gpus, quota_refusal
from labkube.store import RunDir

PODS = kmock.resource("v1/pods")
EVENTS = ("", "v1", "events")
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}
SHARED = {"mode": "pvc", "existingClaim": "runs", "accessModes": ["ReadWriteMany"]}
OWNER = {"apiVersion": "labkube.dev/v1alpha1", "kind": "Run", "metadata": {"name": "c-r", "uid": "u"}}


# -- a full quota, then throttling, on the fake cluster ----------------------------------------------------------


@pytest.mark.slow
async def test_a_full_quota_then_429s_keep_the_run_pending_and_it_finishes(cluster: Cluster) -> None:
    """Pod creation answers 403 `exceeded quota` for 8 s, then 429 with Retry-After 2 twice: the run is not Failed
    (today's code failed it on the first 403); it shows Pending with Scheduled=False/QuotaExceeded and the API's
    message meanwhile, one Warning event on the Run says so, the 429s are waited out for as long as they ask, and
    the run finishes with one agent pod and one grading pod."""
    quota = QuotaRefusal(8)
    cluster.api[kmock.action.CREATE, PODS] << quota
    throttle = Throttle(2, retry_after=2)
    cluster.api[kmock.action.CREATE, PODS] << throttle
    task = tiny_task(cluster.root, "quota", [WRITE, READ])
    seen: list[tuple[str | None, str | None, str]] = []

    def watch() -> str | None:
        runs = cluster.runs("quota")
        for run in runs:
            status = run.get("status") or {}
            scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "Scheduled"), {})
            seen.append((status.get("phase"), scheduled.get("reason"), scheduled.get("message") or ""))
        phases = [(r.get("status") or {}).get("phase") for r in runs]
        return "done" if runs and all(p in ("Finished", "Failed") for p in phases) else None

    async with cluster.operator():
        cluster.campaign("quota", tasks=[str(task)], models=["oracle"], seeds=1, concurrency=1)
        await eventually(watch, 120, every=0.1, what="the run to end")

    [run] = cluster.runs("quota")
    assert run["status"]["phase"] == "Finished", run["status"]
    assert run["status"]["stopReason"] == "done" and run["status"]["score"] == pytest.approx(0.6)
    name = run["metadata"]["name"]
    assert quota.hits and set(quota.hits) == {f"{name}-0"}  # only the first pod met the full quota
    pending = [s for s in seen if s[0] == "Pending" and s[1] == "QuotaExceeded"]
    assert pending, f"never Pending/QuotaExceeded: {sorted(set(seen))}"
    assert "exceeded quota: gpu-quota" in pending[0][2] and f"pod {name}-0" in pending[0][2]
    # Throttled: each 429's Retry-After was honoured (its retry came no sooner than it asked).
    assert throttle.left == 0 and throttle.passed_at is not None
    assert throttle.passed_at - throttle.answered_at[-1] >= 2 - 0.05
    assert cluster.pods_created("quota") == [f"{name}-0", f"{name}-1-grade"]
    events = [e for e in cluster.api.objects(EVENTS, NAMESPACE) if e["involvedObject"]["name"] == name]
    quota_events = [e for e in events if e["reason"] == "QuotaExceeded"]
    assert len(quota_events) == 1, [e["reason"] for e in events]  # once per reason, not once per try
    assert quota_events[0]["type"] == "Warning" and quota_events[0]["involvedObject"]["kind"] == "Run"
    assert quota_events[0]["involvedObject"]["uid"] == run["metadata"]["uid"]
    assert "exceeded quota" in quota_events[0]["message"]


# -- the API's answers --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """What the kubernetes client raises (`ApiException`): a status, a reason and the Status body as text."""

    def __init__(self, status: int, message: str, reason: str = "Forbidden") -> None:
        super().__init__(f"({status}) {reason}")
        self.status, self.reason = status, reason
        self.body = json.dumps({"kind": "Status", "code": status, "reason": reason, "message": message})


def test_only_a_quota_refusal_is_a_transient_403() -> None:
    full = 'pods "c-r-0" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, used: ...'
    unknown = 'pods "c-r-0" is forbidden: status unknown for quota: gpu, resource: requests.nvidia.com/gpu'
    rbac = 'pods is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods" in the namespace "z"'
    assert quota_refusal(ApiError(403, full)) == full
    assert quota_refusal(ApiError(403, unknown)) == unknown
    assert quota_refusal(ApiError(403, rbac)) is None  # RBAC stays final
    assert quota_refusal(ApiError(409, full)) is None
    assert quota_refusal(RuntimeError("exceeded quota:")) is None


def test_the_largest_ready_schedulable_node_bounds_a_pod() -> None:
    def node(gpus: str, ready: bool = True, cordoned: bool = False) -> dict[str, Any]:
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        return {
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": [condition]},
        }

    nodes = [node("4"), node("8", ready=False), node("8", cordoned=True), node("2")]
    assert largest_node_gpus(nodes, "nvidia.com/gpu") == 4
    assert largest_node_gpus([], "nvidia.com/gpu") == 0


# -- a PodRun without a cluster -------------------------------------------------------------------------------------


class Session:
    """A `KubeSession` stand-in: `call` answers a node list, and records every call."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.core = self

    def list_node(self, **_: Any) -> None: ...

    def create_namespaced_event(self, *_: Any, **__: Any) -> None: ...

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((fn, args))
        return {"items": self.nodes} if args and args[0] == self.list_node else None


class NoRunWatch:
    """A `RunWatcher` stand-in that has seen no Run: the run's interventions are its owner's (none)."""

    def get(self, _name: str) -> None:
        return None


def pod_run(options: PodOptions, gpus: int = 0, session: Session | None = None, root: Path | None = None) -> PodRun:
    """A `PodRun` with what `manifest`, `condition`, `check_gpu_fit` and `announce` read; no cluster."""
    resource = RunResourceSpec(
        run_id="r", campaign="c", task="t", task_path="/t", model="oracle", seed=0, gpus=gpus, resources={"gpus": gpus}
    )
    backend = K8sBackend(kube=KubeTarget(server="http://x"), namespace="ns", operator_namespace="ns", runs=options)
    run = PodRun.__new__(PodRun)
    run.backend, run.resource, run.spec = backend, resource, resource.to_run_spec()
    run.owner, run.generation, run.status = OWNER, None, RunStatus()
    run.ledger = PodLedger(run_id="r", gpus=gpus)
    run.name, run.namespace = "c-r", "ns"
    run.session = session  # type: ignore[assignment]
    run.run_watch = NoRunWatch()  # type: ignore[assignment]
    run.rd = RunDir(root or Path("/nonexistent"))
    run.store, run.last_message = None, ""
    return run


def test_chart_values_reach_the_grading_pods_deadline_and_the_image_pull_give_up() -> None:
    config = OperatorConfig.model_validate(
        {
            "runs": {
                "defaultImage": "img",
                "workspace": SHARED,
                "imagePullTimeoutSeconds": 2400,
                "gradingDeadlineSeconds": 5400,
            }
        }
    )
    assert config.runs.image_pull_timeout_seconds == 2400 and config.runs.grading_deadline_seconds == 5400
    run = pod_run(config.runs)
    assert run.backend.pull_give_up_s == 2400  # what `follow` gives a stuck pod
    graded = run.manifest(1, StopReason.done)
    assert graded["spec"]["activeDeadlineSeconds"] == 5400
    # the defaults fit a 20 GB image and a task-environment build
    defaults = PodOptions(default_image="img")
    assert defaults.image_pull_timeout_seconds == 1800 and defaults.grading_deadline_seconds == 3600
    assert pod_run(defaults).manifest(1, StopReason.time)["spec"]["activeDeadlineSeconds"] == 3600
    # an explicit backend setting (tests) still wins
    assert run.backend.model_copy(update={"image_pull_timeout_s": 5.0}).pull_give_up_s == 5.0


def unschedulable_pod() -> dict[str, Any]:
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {"metadata": {"name": "c-r-0"}, "status": {"phase": "Pending", "conditions": [scheduled]}}


def gpu_node(gpus: int) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True"}
    return {"spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [ready]}}


async def test_a_run_needing_more_gpus_than_any_node_says_so_and_one_event_tells(tmp_path: Path) -> None:
    session = Session([gpu_node(4), gpu_node(4)])  # 8 in all, 4 at most on one node
    run = pod_run(PodOptions(default_image="img", workspace=SHARED), gpus=8, session=session, root=tmp_path / "r")
    pod = unschedulable_pod()
    await run.check_gpu_fit(pod)
    await run.check_gpu_fit(pod)  # once per pod: the nodes are read once
    assert sum(args[:1] == (session.list_node,) for _, args in session.calls) == 1
    run.refresh(pod)  # what `publish` does with the pod
    [scheduled] = [c for c in run.status.conditions if c.type == "Scheduled"]
    assert scheduled.reason == "Unschedulable"
    assert scheduled.message.startswith("needs 8 GPUs, largest node has 4 (0/2 nodes are available")
    for _ in range(3):  # every poll: one event for the reason, not one per poll
        await run.announce("c-r-0")
    events = [args[1] for fn, args in session.calls if fn == session.create_namespaced_event]
    assert len(events) == 1
    assert events[0]["reason"] == "Unschedulable" and events[0]["type"] == "Warning"
    assert events[0]["involvedObject"] == {
        "apiVersion": "labkube.dev/v1alpha1",
        "kind": "Run",
        "name": "c-r",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": None,
    }
    assert "needs 8 GPUs, largest node has 4" in events[0]["message"]


async def test_a_run_that_fits_a_node_keeps_the_schedulers_message(tmp_path: Path) -> None:
    session = Session([gpu_node(8)])
    run = pod_run(PodOptions(default_image="img", workspace=SHARED), gpus=4, session=session, root=tmp_path / "r")
    pod = unschedulable_pod()
    await run.check_gpu_fit(pod)
    run.refresh(pod)
    [scheduled] = [c for c in run.status.conditions if c.type == "Scheduled"]
    assert scheduled.message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def test_the_operator_gives_its_supervisors_the_charts_image_pull_give_up_time(tmp_path: Path) -> None:
    """`OperatorRuntime.backend()` carries `runs.imagePullTimeoutSeconds` to every run's supervisor, unless a test
    overrides it."""
    from labkube.operator.k8s_operator import OperatorRuntime

    runs = PodOptions(default_image="labkube:test", image_pull_timeout_seconds=2400)
    runtime = OperatorRuntime(kube=KubeTarget(), runs_root=tmp_path, config=OperatorConfig(runs=runs))
    assert runtime.backend("team-a").pull_give_up_s == 2400
    assert runtime.model_copy(update={"image_pull_timeout_s": 5.0}).backend("team-a").pull_give_up_s == 5.0
