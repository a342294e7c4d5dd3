"""The pod backend's plain functions, without a cluster."""

from __future__ import annotations

from typing import Any

from labkube.operator.k8s_backend import K8sBackend
from labkube.operator.k8s_models import PodOptions, RunResourceSpec
from labkube.operator.kube import KubeTarget
from labkube.operator.pod_manifest import build_pod_manifest
from labkube.operator.pod_status import (
    failed_init_container,
    live_phase,
    pod_conditions,
    pod_exit_code,
    stuck_condition,
)
from labkube.run_spec import RunPhase, RunStatus

OWNER = {
    "apiVersion": "labkube.dev/v1alpha1",
    "kind": "Run",
    "metadata": {"name": "c-r", "namespace": "ns", "uid": "u"},
}
SHARED = {"mode": "pvc", "existingClaim": "runs", "accessModes": ["ReadWriteMany"]}


def pod(**options: Any) -> dict[str, Any]:
    run = RunResourceSpec(run_id="r", campaign="c", task="t", task_path="/t", model="oracle", seed=0)
    return build_pod_manifest(run, PodOptions(default_image="img", **options), owner=OWNER, resume=True)


def test_a_run_pod_mounts_only_its_own_folder_of_the_namespaces_shared_claim() -> None:
    manifest = pod(workspace=SHARED)
    containers = [*manifest["spec"]["initContainers"], *manifest["spec"]["containers"]]
    mounts = [m for c in containers for m in c["volumeMounts"] if m["name"] == "runs"]
    # The results store's layout, one tree per namespace; never the campaign's runs/ folder as a whole.
    assert {m["subPath"] for m in mounts} == {"ns/c/runs/r"}
    assert {m["mountPath"] for m in mounts} == {"/runs/r"}
    agent = manifest["spec"]["containers"][0]
    assert agent["command"][-2:] == ["/runs/r", "--resume"]


def test_the_operator_shares_the_volume_only_in_its_own_namespace() -> None:
    options = PodOptions(default_image="img", workspace=SHARED)
    mine = K8sBackend(kube=KubeTarget(server="http://x"), namespace="lab", operator_namespace="lab", runs=options)
    other = mine.model_copy(update={"namespace": "team-b"})
    per_run = mine.model_copy(update={"runs": PodOptions(default_image="img", workspace={"mode": "pvc"})})
    assert mine.shared and not other.shared and not per_run.shared


def test_a_crash_looping_sidecar_is_stuck_and_a_failed_init_container_is_named() -> None:
    looping = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}
    crash = {"status": {"initContainerStatuses": [{"name": "world", "state": looping}]}}
    assert stuck_condition(crash) == (
        "PodReady",
        False,
        "CrashLoopBackOff",
        "container world: back-off 40s restarting failed container",
    )
    config = {"waiting": {"reason": "CreateContainerConfigError", "message": "secret k not found"}}
    assert stuck_condition({"status": {"containerStatuses": [{"name": "agent", "state": config}]}}) is None
    ended = {"terminated": {"exitCode": 1, "message": "did not start: its startup probe failed 3 times"}}
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    statuses = [{"name": "prepare", "state": done}, {"name": "world", "state": ended}]
    failed = {"status": {"initContainerStatuses": statuses}}
    assert failed_init_container(failed) == "container world: did not start: its startup probe failed 3 times"
    assert failed_init_container({"status": {"initContainerStatuses": statuses[:1]}}) is None


def test_only_a_shared_claim_in_the_operators_namespace_is_shared() -> None:
    target = KubeTarget(server="http://x")
    shared = PodOptions(default_image="i", workspace=SHARED)
    assert K8sBackend(kube=target, namespace="n", operator_namespace="n", runs=shared).shared
    assert not K8sBackend(kube=target, namespace="n", runs=shared).shared
    assert not K8sBackend(kube=target, namespace="n", operator_namespace="n", runs=PodOptions(default_image="i")).shared
    per_run = PodOptions(default_image="i", workspace={"mode": "pvc"})
    assert not K8sBackend(kube=target, namespace="n", operator_namespace="n", runs=per_run).shared


def test_unschedulable_and_image_pull_problems_become_conditions() -> None:
    pending = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}],
        }
    }
    assert pod_conditions(pending) == [("Scheduled", False, "Unschedulable", "no GPU")]
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    pulling = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "agent", "image": "bad:1", "state": waiting}],
        }
    }
    (scheduled, pull) = pod_conditions(pulling)
    assert scheduled[:2] == ("Scheduled", True)
    assert pull == ("ImagePulled", False, "ImagePullBackOff", "image bad:1 cannot be pulled: Back-off pulling image")
    gated = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}
    assert "queued, not stuck" in pod_conditions(gated)[0][3]
    config = {"waiting": {"reason": "CreateContainerConfigError", "message": "secret k not found"}}
    broken = {"status": {"containerStatuses": [{"name": "agent", "state": config}]}}
    assert pod_conditions(broken) == [
        ("PodReady", False, "CreateContainerConfigError", "container agent: secret k not found")
    ]


def test_phase_and_exit_code_come_from_the_pod_and_the_agent() -> None:
    assert live_phase(None, None) == RunPhase.pending
    assert live_phase({"status": {"phase": "Pending"}}, None) == RunPhase.starting
    grading = RunStatus(run_id="r", phase=RunPhase.grading)
    assert live_phase({"status": {"phase": "Running"}}, grading) == RunPhase.grading
    done = {"status": {"containerStatuses": [{"name": "agent", "state": {"terminated": {"exitCode": 143}}}]}}
    assert pod_exit_code(done) == 143
    assert pod_exit_code({"status": {}}) is None


async def test_a_pod_change_while_its_supervisor_is_busy_wakes_its_next_wait_at_once() -> None:
    """A supervisor publishes its Run's status, then waits for the pod's next change. A change that reached the cache
    while it was publishing must end that wait at once: before `since`, it waited out `poll_seconds`, and the 2 s
    poll was the p95 of pod Running -> Run Running at 1,000 Runs (benchmarks/operator_scale.py)."""
    import asyncio

    import kmock
    from fakekube import FakeKube

    from labkube.operator.crds import LABEL_CAMPAIGN
    from labkube.operator.kube_session import KubeSession
    from labkube.operator.pod_manifest import LABEL_COMPONENT

    pods = ("", "v1", "pods")
    labels = {"app.kubernetes.io/managed-by": "labkube-operator", LABEL_COMPONENT: "run", LABEL_CAMPAIGN: "wake"}
    async with FakeKube() as api, kmock.Server(api) as server:
        loop = asyncio.get_running_loop()
        session = KubeSession(KubeTarget(server=str(server.url).rstrip("/")), loop)
        watcher = session.pods("default", "wake")
        try:
            await asyncio.wait_for(watcher.synced.wait(), 30)
            api.create_object(pods, "default", {"metadata": {"name": "wake-0", "labels": labels}, "spec": {}})
            while watcher.get("wake-0") is None:
                await asyncio.sleep(0.01)
            before = watcher.version("wake-0")
            api.set_status(pods, "default", "wake-0", {"phase": "Running"})  # nobody is waiting yet
            while watcher.version("wake-0") == before:
                await asyncio.sleep(0.01)
            started = loop.time()
            await watcher.wait("wake-0", 10, since=before)
            assert loop.time() - started < 0.5, "a change made while nobody waited was lost"
            assert (watcher.get("wake-0") or {})["status"]["phase"] == "Running"
            now = watcher.version("wake-0")
            started = loop.time()
            await watcher.wait("wake-0", 0.5, since=now)  # no change since: the whole timeout
            assert loop.time() - started >= 0.45
        finally:
            watcher.close()
            session.executor.shutdown(wait=False, cancel_futures=True)


async def test_calls_whose_answer_nobody_reads_reuse_one_connection() -> None:
    """Status patches and deletes are sent with `_preload_content=False` and their answer is not read. urllib3 keeps
    such a response's connection until its body is read, so without `kube.answered` every call opened a new one (on
    a real cluster, a TLS handshake per status patch). Ten calls one after another use one connection."""
    import asyncio

    import kmock
    from fakekube import FakeKube

    from labkube.operator.kube_session import KubeSession

    async with FakeKube() as api, kmock.Server(api) as server:
        session = KubeSession(KubeTarget(server=str(server.url).rstrip("/")), asyncio.get_running_loop())
        try:
            for i in range(10):
                body = {"metadata": {"name": f"pod-{i}"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
                await session.call(session.core.create_namespaced_pod, "default", body, _preload_content=False)
            pools = session.client.rest_client.pool_manager.pools
            (key,) = pools.keys()
            pool = pools[key]
            assert pool.num_connections == 1, f"{pool.num_connections} connections for 10 calls"
        finally:
            session.executor.shutdown(wait=False, cancel_futures=True)


async def test_pods_deleted_while_the_watch_was_down_are_reconciled_with_their_last_state() -> None:
    """A watch that cannot resume (410 Gone: the API server compacted its history or restarted) lists again, and a
    pod deleted in the gap is simply missing from that list: no DELETED event will ever say how it went. The
    watcher records it as deleted with the state it last saw, so a pod last seen with `DisruptionTarget` (being
    preempted) is a disruption, as a watched deletion is; one last seen running, with no sign of being deleted, is
    counted as the cluster's doing too (`unseen_deletion`); one last seen being deleted by hand stays a crash. The
    fake API server behaves as kube-apiserver here: the watch ends with ERROR 410, a watch from the old
    resourceVersion answers 410, and lists and watches fail (503) while the test holds the gap open."""
    import asyncio

    import kmock
    from fakekube import FakeKube, KubeError

    from labkube.operator.crds import LABEL_CAMPAIGN, LABEL_RUN
    from labkube.operator.kube_session import KubeSession
    from labkube.operator.pod_manifest import LABEL_COMPONENT
    from labkube.operator.pod_status import PodEnd, disruption_of, unseen_deletion

    pods = ("", "v1", "pods")

    class Gap:
        """Every pod list and watch answers 503 until `close()`; then the reaction retires."""

        def __init__(self) -> None:
            self.closed = False
            self.hits = 0

        def close(self) -> None:
            self.closed = True

        def __call__(self, request: kmock.Request) -> object:
            if self.closed:
                return NotImplemented
            self.hits += 1
            raise KubeError(503, "injected: the API server is unavailable", "ServiceUnavailable")

    def labels(run: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/managed-by": "labkube-operator",
            LABEL_COMPONENT: "run",
            LABEL_CAMPAIGN: "gap",
            LABEL_RUN: run,
        }

    async def until(check: Any, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 30
        while not check():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    preempted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    async with FakeKube() as api, kmock.Server(api) as server:
        session = KubeSession(KubeTarget(server=str(server.url).rstrip("/")), asyncio.get_running_loop())
        watcher = session.pods("default", "gap")
        try:
            await asyncio.wait_for(watcher.synced.wait(), 30)
            for name in ("gap-a-0", "gap-b-0", "gap-c-0", "gap-d-0"):
                api.create_object(pods, "default", {"metadata": {"name": name, "labels": labels(name[:-2])}})
                api.set_status(pods, "default", name, {"phase": "Running"})
            # Seen before the gap: a is being preempted (the scheduler's condition comes before its DELETE), c is
            # being deleted by hand (no condition), b and d just run.
            api.set_status(pods, "default", "gap-a-0", {"phase": "Running", "conditions": [preempted]})
            api.update_object(pods, "default", "gap-c-0", lambda p: p["metadata"].update(deletionTimestamp="now"))
            await until(lambda: (watcher.get("gap-a-0") or {}).get("status", {}).get("conditions"), "a's condition")
            await until(lambda: (watcher.get("gap-c-0") or {}).get("metadata", {}).get("deletionTimestamp"), "c")
            await until(lambda: watcher.get("gap-d-0") is not None, "d")

            gap = Gap()
            api[kmock.resource("v1/pods")] << gap
            api.expire_watches()  # the open watch ends with 410; its re-list meets the gap
            await until(lambda: gap.hits >= 1, "the watcher to list again into the gap")
            for name in ("gap-a-0", "gap-b-0", "gap-c-0"):
                api.delete_object(pods, "default", name)
            gap.close()
            await until(lambda: watcher.get("gap-a-0") is None, "the re-list")

            assert set(watcher.deleted) == {"gap-a-0", "gap-b-0", "gap-c-0"}
            assert watcher.get("gap-d-0") is not None  # still there: not deleted
            ends = {
                name: PodEnd(None, last=gone.last, unobserved=not gone.observed)
                for name, gone in watcher.deleted.items()
            }
            assert disruption_of(ends["gap-a-0"].last) == "PreemptionByScheduler"
            assert disruption_of(ends["gap-b-0"].last) is None and unseen_deletion(ends["gap-b-0"])
            assert disruption_of(ends["gap-c-0"].last) is None and not unseen_deletion(ends["gap-c-0"])
        finally:
            watcher.close()
            session.executor.shutdown(wait=False, cancel_futures=True)
