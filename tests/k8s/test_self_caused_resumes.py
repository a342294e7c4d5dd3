"""A resume the agent caused is charged as a crash, not a free disruption (#41, item 3): an agent that could make
the cluster take its pod away for nothing (an eviction for its own ephemeral storage) would get a resume from a
checkpoint it wrote, without using up a crash attempt, up to `max_disruptions` (20) times. A SIGTERM it sends its own
harness (PID 1 in a pod) is a crash too. The fake kubelet learns what the real one does for both, and to restart a
native sidecar that dies.

What a real kubelet does, and the fake matches (pkg/kubelet/eviction/eviction_manager.go, helpers.go; docs:
https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/ and "Local ephemeral storage" in
https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/):

- a pod past a local-storage limit of its own spec is evicted by `localStorageEviction`: `Failed`, reason
  `Evicted`, a message such as `Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. `, and
  no `DisruptionTarget` condition (`evictPod(pod, 1, message, nil, nil)`);
- a node-pressure eviction carries `DisruptionTarget=True`, reason `TerminationByKubelet`, and names the containers
  that used more than their request ("Container agent was using 12Gi, which exceeds its request of 10Gi. ", newer
  kubelets: "..., request is 10Gi, has larger consumption of ephemeral-storage. ");
- a native sidecar (an init container with `restartPolicy: Always`) that exits is restarted, with back-off, its
  `restartCount` one higher and its previous end in `lastState.terminated`.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import NAMESPACE, PODS, Cluster, eventually, tiny_task
from fakekube import FakeKube
from kubelet import FakeKubelet

from labkube.operator.pod_status import PodEnd, disruption_of, reason_of, self_caused_eviction

# -- the classification, over pods shaped as real kubelets leave them ----------------------------------------------

OWN_POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. "
OWN_CONTAINER_LIMIT = 'Container agent exceeded its local ephemeral storage limit "10Gi". '
OWN_EMPTYDIR = 'Usage of EmptyDir volume "tmp" exceeds the limit "1Gi". '
PRESSURE = "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "
OVER_OLD = "Container agent was using 12Gi, which exceeds its request of 10Gi. "
OVER_NEW = "Container agent was using 12Gi, request is 10Gi, has larger consumption of ephemeral-storage. "
SIDECAR_OVER = "Container gateway was using 2Gi, which exceeds its request of 0. "


def evicted(message: str, condition: str | None = None, main: str = "agent") -> dict[str, Any]:
    """A pod the kubelet evicted: `condition` is the DisruptionTarget reason a node-pressure eviction adds."""
    conditions: list[dict[str, Any]] = [{"type": "PodScheduled", "status": "True"}]
    if condition is not None:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": condition, "message": message})
    labels = {"labkube.dev/attempt": "0"}
    if main == "grade":
        labels["labkube.dev/finalize"] = "time"
    agent = {"name": main, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}
    return {
        "metadata": {"name": "r-0", "labels": labels},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": message,
            "conditions": conditions,
            "containerStatuses": [agent],
        },
    }


@pytest.mark.parametrize(
    ("pod", "own"),
    [
        (evicted(OWN_POD_LIMIT), "exceeds the total limit of containers 10Gi."),
        (evicted(OWN_CONTAINER_LIMIT), 'Container agent exceeded its local ephemeral storage limit "10Gi".'),
        (evicted(OWN_EMPTYDIR), 'Usage of EmptyDir volume "tmp" exceeds the limit "1Gi".'),
        (evicted(PRESSURE + OVER_OLD, "TerminationByKubelet"), "was using 12Gi, more than its request of 10Gi"),
        (evicted(PRESSURE + OVER_NEW, "TerminationByKubelet"), "was using 12Gi, more than its request of 10Gi"),
        (evicted(PRESSURE + SIDECAR_OVER + OVER_NEW, "TerminationByKubelet"), "container agent was using 12Gi"),
        (evicted(PRESSURE + OVER_OLD), "was using 12Gi"),  # a kubelet before DisruptionTarget (< 1.26)
    ],
)
def test_an_eviction_for_the_runs_own_storage_is_its_own_doing(pod: dict[str, Any], own: str) -> None:
    why = self_caused_eviction(pod)
    assert why is not None and own in why, why
    assert reason_of(PodEnd(pod)) == "SelfCausedEviction"
    assert reason_of(PodEnd(None, last=pod)) == "SelfCausedEviction"  # judged by its last state once deleted


@pytest.mark.parametrize(
    "pod",
    [
        evicted(PRESSURE, "TerminationByKubelet"),  # within its requests: the node's need, not the run's doing
        evicted(PRESSURE + SIDECAR_OVER, "TerminationByKubelet"),  # another container than the agent
        evicted(
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. ", "TerminationByKubelet"
        ),
        evicted("The node had condition: [DiskPressure]. ", "TerminationByKubelet"),
        evicted("Container grade was using 12Gi, which exceeds its request of 10Gi. ", "TerminationByKubelet"),
        {
            "metadata": {"name": "r-0"},
            "status": {
                "phase": "Failed",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
            },
        },
        {
            "metadata": {"name": "r-0"},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                ],
            },
        },
        {"metadata": {"name": "r-0"}, "status": {"phase": "Failed", "reason": "Shutdown", "message": "Node shutdown"}},
    ],
)
def test_the_clusters_own_reasons_stay_disruptions(pod: dict[str, Any]) -> None:
    assert self_caused_eviction(pod) is None
    assert disruption_of(pod) is not None and reason_of(PodEnd(pod)) != "SelfCausedEviction"


def test_a_grading_pod_is_judged_by_its_grade_container() -> None:
    pod = evicted(PRESSURE + "Container grade was using 12Gi, which exceeds its request of 10Gi. ", None, "grade")
    assert "container grade was using 12Gi" in (self_caused_eviction(pod) or "")
    assert self_caused_eviction(evicted(PRESSURE + OVER_OLD, "TerminationByKubelet", "grade")) is None


def test_a_signal_or_a_plain_failure_is_no_eviction() -> None:
    crashed = {"metadata": {"name": "r-0"}, "status": {"phase": "Failed", "containerStatuses": []}}
    assert self_caused_eviction(crashed) is None and self_caused_eviction(None) is None
    assert reason_of(PodEnd(crashed)) == "PodFailed"


# -- the fake kubelet ----------------------------------------------------------------------------------------------


def pod_status(api: FakeKube, name: str) -> dict[str, Any]:
    return (api.read_object(PODS, NAMESPACE, name) or {}).get("status") or {}


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
async def test_the_fake_kubelet_evicts_a_pod_past_its_own_storage_limits(tmp_path: Path) -> None:
    """As `localStorageEviction`: an emptyDir past its `sizeLimit`, the pod past its containers' total limit; the
    pod `Failed`/`Evicted` with the kubelet's message and no `DisruptionTarget`; within its limits it runs on."""
    fill = 'head -c 3145728 /dev/zero > "$DIR/fill"; sleep 600'

    def pod(name: str, volume: dict[str, Any], limit: str | None, command: str) -> dict[str, Any]:
        agent: dict[str, Any] = {
            "name": "agent",
            "image": "agent:test",
            "command": ["sh", "-c", command],
            "env": [{"name": "DIR", "value": "/scratch"}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        }
        if limit is not None:
            agent["resources"] = {"requests": {"ephemeral-storage": limit}, "limits": {"ephemeral-storage": limit}}
        spec = {"restartPolicy": "Never", "containers": [agent], "volumes": [{"name": "scratch", **volume}]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    async with FakeKube() as api:
        kubelet = FakeKubelet(api, claims={}, grace_s=5, work=tmp_path / "kubelet", storage_poll_s=0.2)
        async with kubelet:
            api.create_object(PODS, NAMESPACE, pod("sized", {"emptyDir": {"sizeLimit": "2Mi"}}, None, fill))
            api.create_object(PODS, NAMESPACE, pod("limited", {"emptyDir": {}}, "2Mi", fill))
            api.create_object(PODS, NAMESPACE, pod("within", {"emptyDir": {}}, "8Mi", fill))
            for name in ("sized", "limited"):
                await eventually(lambda n=name: pod_status(api, n).get("phase") == "Failed", 10, what=f"{name} evicted")
            messages = {
                "sized": 'Usage of EmptyDir volume "scratch" exceeds the limit "2Mi". ',
                "limited": "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. ",
            }
            for name, message in messages.items():
                status = pod_status(api, name)
                assert status["reason"] == "Evicted" and status["message"] == message, status
                assert not [c for c in status["conditions"] if c["type"] == "DisruptionTarget"], status
                (agent,) = status["containerStatuses"]
                assert agent["state"]["terminated"]["exitCode"] == 143  # SIGTERM, within the 1 s grace
                assert self_caused_eviction(api.read_object(PODS, NAMESPACE, name)) is not None
            assert pod_status(api, "within").get("phase") == "Running"


def sidecar_pod(name: str, stop: Path) -> dict[str, Any]:
    """A pod whose sidecar writes its termination message at once and then sleeps; its agent runs until `stop`."""
    sidecar = {
        "name": "world",
        "image": "sidecar:test",
        "restartPolicy": "Always",
        "command": ["sh", "-c", 'echo "run $$" > "$TERMINATION"; exec sleep 600'],
        "env": [{"name": "TERMINATION", "value": "/dev/termination-log"}],
        "terminationMessagePath": "/dev/termination-log",
        "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
    }
    agent_container = {
        "name": "agent",
        "image": "agent:test",
        "command": ["sh", "-c", 'while [ ! -e "$STOP" ]; do sleep 0.1; done'],
        "env": [{"name": "STOP", "value": str(stop)}],
    }
    spec = {"restartPolicy": "Never", "initContainers": [sidecar], "containers": [agent_container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.mark.slow
async def test_the_fake_kubelet_restarts_a_native_sidecar_that_dies(tmp_path: Path) -> None:
    """A killed sidecar comes back (restartCount 1, the old end in `lastState.terminated`, its termination message
    included), the pod runs on; once the agent ends, the sidecar is stopped for good and keeps its count."""
    async with FakeKube() as api:
        kubelet = FakeKubelet(api, claims={}, grace_s=0.5, work=tmp_path / "kubelet")
        async with kubelet:
            stop = tmp_path / "stop"
            api.create_object(PODS, NAMESPACE, sidecar_pod("kept", stop))
            await eventually(lambda: kubelet.running() == ["kept"], 10, what="the pod to run")
            (first,) = [pgid for pod, name, pgid in kubelet.sidecars_started if (pod, name) == ("kept", "world")]
            message = kubelet.work / f"{NAMESPACE}-kept" / "termination" / "world"
            await eventually(lambda: message.read_text() == f"run {first}\n", 5, what="the termination message")
            os.killpg(first, signal.SIGKILL)

            def world() -> dict[str, Any]:
                return pod_status(api, "kept")["initContainerStatuses"][0]

            await eventually(lambda: world().get("restartCount") == 1 and world().get("started"), 10, what="restart")
            status = world()
            assert "running" in status["state"] and status["ready"] is True
            last = status["lastState"]["terminated"]
            assert last["exitCode"] == 137 and last["message"] == f"run {first}\n", last
            assert last["startedAt"] and last["finishedAt"]
            assert pod_status(api, "kept")["phase"] == "Running"
            assert len(kubelet.sidecars_started) == 2 and gone(first)
            second = kubelet.sidecars_started[1][2]
            assert not gone(second)

            stop.touch()
            await eventually(lambda: pod_status(api, "kept").get("phase") == "Succeeded", 10, what="the pod to end")
            await asyncio.sleep(0.5)  # no restart after the pod's end
            final = world()
            assert "terminated" in final["state"] and final["restartCount"] == 1
            assert final["lastState"] == status["lastState"]
            assert len(kubelet.sidecars_started) == 2 and gone(second)


# -- the operator: self-caused resumes are crashes -----------------------------------------------------------------

# The agent's commands run in the run's workspace; its HOME is the pod's `tmp` emptyDir (`/tmp` in a pod), where
# the fake kubelet keeps it. Each acts once (a marker on the run's volume), so the resumed pod goes on to finish.
FILL_TMP = r"""python3 - <<'PY'
import os, time
run_dir = os.path.dirname(os.getcwd())
if not os.path.exists(f"{run_dir}/.filled"):
    open(f"{run_dir}/.filled", "w").close()
    with open(os.path.join(os.environ["HOME"], "fill"), "wb") as f:
        for _ in range(48):
            f.write(os.urandom(1 << 20))
    time.sleep(60)
PY
"""
TERM_THE_HARNESS = r"""python3 - <<'PY'
import os, signal, time
run_dir = os.path.dirname(os.getcwd())
if not os.path.exists(f"{run_dir}/.termed"):
    open(f"{run_dir}/.termed", "w").close()
    pid = os.getppid()
    while b"agent\0--run-dir" not in open(f"/proc/{pid}/cmdline", "rb").read():
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGTERM)
    time.sleep(60)
PY
"""
FINISH = [
    {"tool": "bash", "args": {"command": "echo 6 > result.txt"}},
    {"tool": "read_file", "args": {"path": "result.txt"}},
]


def phase(cluster: Cluster, name: str) -> str | None:
    return ((cluster.get_campaign(name) or {}).get("status") or {}).get("phase")


async def run_hostile(cluster: Cluster, name: str, command: str, **labkube_yaml: Any) -> dict[str, Any]:
    task = tiny_task(cluster.root, name, [{"tool": "bash", "args": {"command": command}}, *FINISH], **labkube_yaml)
    async with cluster.operator():
        cluster.campaign(name, tasks=[str(task)], models=["oracle"], seeds=1)
        await eventually(lambda: phase(cluster, name) == "Finished", 120, what="the campaign to finish")
    (run,) = cluster.runs(name)
    return run


@pytest.mark.slow
async def test_filling_its_own_tmp_past_its_storage_limit_is_a_crash(cluster: Cluster) -> None:
    """The agent writes 48 MiB to /tmp (its HOME) against a 20Mi ephemeral-storage limit (the task's disk_gb, with
    the shared claim): the kubelet evicts the pod, and the run counts a crash, not a disruption."""
    run = await run_hostile(cluster, "filler", FILL_TMP, resources={"disk_gb": 20 / 1024})
    name = run["metadata"]["name"]
    created = cluster.created_pod(f"{name}-0")
    assert created["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "20Mi"
    first = cluster.last_pod_state(f"{name}-0")["status"]
    assert first["reason"] == "Evicted", first
    assert first["message"] == "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. "
    assert not [c for c in first["conditions"] if c["type"] == "DisruptionTarget"]
    status = run["status"]
    assert status["crashes"] == 1 and status["disruptions"] == 0 and status["attempts"] == 2, status
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "SelfCausedEviction", resumed
    assert "counted as a crash, not a disruption" in resumed["message"] and "20Mi" in resumed["message"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6)
    assert cluster.pods_created("filler") == [f"{name}-0", f"{name}-1", f"{name}-2-grade"]


@pytest.mark.slow
async def test_a_sigterm_to_its_own_harness_is_a_crash(cluster: Cluster) -> None:
    """The agent sends SIGTERM to `labkube agent` (PID 1 of its container on a cluster): the harness saves and
    exits 143 as on a preemption, but the pod was not being deleted and carries no DisruptionTarget: a crash."""
    run = await run_hostile(cluster, "termer", TERM_THE_HARNESS)
    name = run["metadata"]["name"]
    first = cluster.last_pod_state(f"{name}-0")["status"]
    (agent,) = first["containerStatuses"]
    assert agent["state"]["terminated"]["exitCode"] == 143 and not first.get("reason"), first
    assert not [c for c in first["conditions"] if c["type"] == "DisruptionTarget"]
    status = run["status"]
    assert status["crashes"] == 1 and status["disruptions"] == 0 and status["attempts"] == 2, status
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "PodFailed" and "exit code 143" in resumed["message"], resumed
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6)
    assert cluster.pods_created("termer") == [f"{name}-0", f"{name}-1", f"{name}-2-grade"]
