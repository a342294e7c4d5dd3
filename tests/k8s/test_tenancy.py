"""Several tenants on one cluster: namespaces, storage, admission of Campaign fields, GPU time.

What the fake cluster enforces and what it does not (checked object by object instead):

- kmock has no admission webhooks, RBAC or NetworkPolicy enforcement: the run pods' policies the
  operator puts into each namespace are checked here object by object against the pods, the API
  server, the cloud metadata address and the operator pod (`kube_policy.allowed`, the documented
  NetworkPolicy semantics), and the pods against the Pod Security Standards' `restricted` profile
  field by field (`kube_policy.pss_restricted_violations`).
- The fake kubelet maps a pod's volume mounts onto local directories per namespace (claims are
  namespaced, as in Kubernetes): which folder of which claim a pod can see is decided by its mounts.
  In the hostile-run test it runs the pods isolated (`FakeKubelet(isolate=True)`: each container in a
  scratch root of its own with only its mounts, as uid 1000, in a network namespace of its own), so
  what a run cannot reach there it really cannot reach; its network is closed entirely, stricter than
  the run policy (no DNS), which is why the policy itself is checked object by object.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kmock
import pytest
from conftest import CAMPAIGNS, CLAIM, PODS, RUNS, Cluster, eventually, tiny_task
from fakekube import FakeKube
from kube_policy import Endpoint, allowed, pss_restricted_violations
from kubelet import FakeKubelet

from labkube.operator.crds import API_VERSION
from labkube.operator.driver import RayContext
from labkube.operator.k8s_ledger import PodLedger, ledger_path
from labkube.operator.k8s_models import Tenancy
from labkube.run_spec import make_run_id
from labkube.store import CampaignDir, read_model

pytestmark = pytest.mark.slow

WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}
OPERATOR_NAMESPACE = "labkube-system"
NETWORK_POLICIES = ("networking.k8s.io", "v1", "networkpolicies")
RUN_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "labkube-runs", "labels": {"app.kubernetes.io/component": "run"}},
    "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "labkube", "app.kubernetes.io/component": "run"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        ],
    },
}


def create_campaign(cluster: Cluster, namespace: str, name: str, **spec: Any) -> None:
    body = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}
    cluster.api.create_object(CAMPAIGNS, namespace, body)


def campaign(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.api.read_object(CAMPAIGNS, namespace, name) or {}


def phase(cluster: Cluster, namespace: str, name: str) -> str | None:
    return (campaign(cluster, namespace, name).get("status") or {}).get("phase")


@pytest.fixture
def two_tenants(cluster: Cluster, tmp_path: Path) -> dict[str, Path]:
    """Namespaces team-a and team-b, each with its own claim named like the chart's (a claim is namespaced)."""
    claims = {ns: tmp_path / f"claim-{ns}" for ns in ("team-a", "team-b")}
    for ns, path in claims.items():
        path.mkdir()
        cluster.kubelet.claims[(ns, CLAIM)] = path  # type: ignore[index]
    return claims


def pod_endpoint(pod: dict[str, Any], ip: str) -> Endpoint:
    meta = pod["metadata"]
    return Endpoint(ip, namespace=meta["namespace"], labels=meta["labels"], named_ports={"metrics": 9400})


async def test_same_campaign_name_in_two_namespaces_finishes_with_separate_results(
    cluster: Cluster, two_tenants: dict[str, Path], tmp_path: Path
) -> None:
    # a second of pod time at least: pod times have one-second resolution
    task = tiny_task(
        cluster.root, "tenant", [WRITE, {"tool": "bash", "args": {"command": "sleep 1.5"}}, READ], resources={"gpus": 1}
    )
    operator_root = tmp_path / "operator-runs"
    async with cluster.operator(namespace=OPERATOR_NAMESPACE, runs_root=operator_root, run_policies=[RUN_POLICY]):
        for ns in two_tenants:
            create_campaign(cluster, ns, "sweep", tasks=[str(task)], models=["oracle"], seeds=1)
        for ns in two_tenants:
            await eventually(lambda ns=ns: phase(cluster, ns, "sweep") == "Finished", 120, what=f"{ns}'s campaign")

    for ns, claim in two_tenants.items():
        (run,) = cluster.api.objects(RUNS, ns, "labkube.dev/campaign=sweep")
        status = run["status"]
        assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6)
        # The operator shares no volume with these pods: the outcome came from the termination message.
        cdir = CampaignDir(operator_root / ns / "sweep")
        (run_id,) = cdir.run_ids()
        result = cdir.result(run_id)
        assert result is not None and result.final and result.subtasks[0].raw == 6.0
        # The run's own files are on its namespace's claim, in the namespace's tree, and only there.
        assert (claim / ns / "sweep" / "runs" / run_id / "transcript.jsonl").exists()
        assert [p.name for p in claim.iterdir()] == [ns]
        # GPU-hours come from the pod's start and finish as the API reports them.
        ledger = read_model(ledger_path(cdir.root, run_id), PodLedger)
        assert ledger is not None and len(ledger.pods) == 2 and ledger.gpus == 1  # the agent's and the grading pod
        assert status["gpuHours"] == pytest.approx(ledger.gpu_hours(), abs=1e-6) and status["gpuHours"] > 0
        assert cluster.api.objects(PODS, ns, "labkube.dev/campaign=sweep") == []  # deleted once recorded
        (name, _grading) = [
            n for verb, plural, where, n in cluster.api.audit if verb == "create" and plural == "pods" and where == ns
        ]
        assert _grading == f"{name[: -len('-0')]}-1-grade"
        pod = cluster.last_pod_state(name, ns)
        window = ledger.pods[name]
        assert window.start.isoformat().replace("+00:00", "Z") == pod["status"]["startTime"]
        for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
            for mount in container["volumeMounts"]:
                if mount["name"] == "runs":
                    assert mount["subPath"] == f"{ns}/sweep/runs/{run_id}"
        # The run pods' NetworkPolicy was put into the namespace before its first pod.
        policy = cluster.api.read_object(NETWORK_POLICIES, ns, "labkube-runs")
        assert policy is not None and policy["spec"] == RUN_POLICY["spec"]
        created = [i for i, (verb, plural, _, _) in enumerate(cluster.api.audit) if verb == "create"]
        first_pod = next(i for i in created if cluster.api.audit[i][1] == "pods" and cluster.api.audit[i][2] == ns)
        first_policy = next(
            i for i in created if cluster.api.audit[i][1] == "networkpolicies" and cluster.api.audit[i][2] == ns
        )
        assert first_policy < first_pod
    assert not (operator_root / OPERATOR_NAMESPACE).exists()


@pytest.fixture
async def isolated_cluster(tmp_path: Path, ray_local: RayContext) -> AsyncIterator[Cluster]:
    """conftest's `cluster`, but its kubelet runs every container isolated (`FakeKubelet(isolate=True)`): own
    root, user, PID and network namespaces, only its own mounts; tasks made under `root / "tasks"`, the
    stand-in for what the image holds."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (tmp_path / "tasks").mkdir()
    async with FakeKube() as api, kmock.Server(api) as server:
        kubelet = FakeKubelet(
            api,
            claims={CLAIM: volume},
            gpus=2,
            work=tmp_path / "kubelet",
            isolate=True,
            image_dirs=[tmp_path / "tasks"],
        )
        async with kubelet:
            yield Cluster(api, str(server.url).rstrip("/"), kubelet, volume, ray_local, tmp_path)
        api.close_watches()


# A run's attempts to get out, from inside its pod; everything it sees goes into its workspace, the current
# directory (`/runs/<run-id>/workspace`; the agent's commands get no LABKUBE_* variables).
NOSY_FILES = """\
me=$(basename "$(dirname "$PWD")")
for i in $(seq 600); do [ -e ../go ] && echo go > go.txt && break; sleep 0.1; done  # the test: both runs are up
ls /runs > seen.txt 2>&1
cat "/runs/$me/status.json" > own.txt 2>&1
for s in {siblings}; do
  [ "$s" = "$me" ] && continue
  for d in "/runs/$s" "../$s" "../../$s" "{claim_runs}/$s"; do
    echo "== $d" >> stolen.txt; cat "$d/status.json" >> stolen.txt 2>&1
    echo "== $d" >> denied.txt
    {{ echo '{{"phase": "Failed"}}' > "$d/status.json"; echo planted > "$d/planted.txt"; }} 2>> denied.txt
  done
done
"""
NOSY_NET = """\
import socket
own = socket.create_server(("127.0.0.1", 0))  # the pod's own loopback works
targets = {targets} + [("127.0.0.1", own.getsockname()[1])]
with open("net.txt", "w") as out:
    for host, port in targets:
        try:
            socket.create_connection((host, port), timeout=3).close()
            outcome = "connected"
        except OSError as exc:
            outcome = exc.strerror or type(exc).__name__
        out.write(f"{{host}}:{{port}} {{outcome}}\\n")
"""
ZERO_WALL = """\
import json
s = json.load(open("../status.json")); s["spend"]["wall_seconds"] = 0.0
json.dump(s, open("../status.json", "w"))
open("zeroed.txt", "w").write("zeroed\\n")
"""


async def test_a_run_cannot_reach_its_siblings_or_the_cluster_and_still_finishes(isolated_cluster: Cluster) -> None:
    """Each pod of a 2-seed campaign on the shared claim, run isolated, tries to list /runs, to read and overwrite
    the other run's files by every path it might take (its mount path, relative paths, the claim's host path), to
    reach the API server, Ray and the cloud metadata address, and to inflate the GPU-hour meter through its own
    status.json; it sees only its own folder and its own loopback, and still finishes and is graded."""
    cluster = isolated_cluster
    import ray

    api = urlsplit(cluster.url)
    gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    targets = [(api.hostname, api.port), ("127.0.0.1", int(gcs_port)), ("169.254.169.254", 80)]
    if gcs_host != "127.0.0.1":
        targets.append((gcs_host, int(gcs_port)))
    for host, port in targets[:2] + targets[3:]:  # from the test's process, they answer
        socket.create_connection((host, port), timeout=3).close()
    task_root = cluster.root / "tasks"
    ids = [make_run_id(str(task_root / "nosy"), "oracle", seed) for seed in (0, 1)]
    claim_runs = cluster.campaign_dir("nosy") / "runs"
    files = NOSY_FILES.format(siblings=" ".join(ids), claim_runs=claim_runs)
    net = f"python3 - <<'PY'\n{NOSY_NET.format(targets=targets)}PY\n"
    zero = f"python3 - <<'PY'\n{ZERO_WALL}PY\n"
    nosy = {
        "tool": "bash",
        # pod times have one-second resolution: the sleep makes the GPU-hours visible
        "args": {"command": f"{files}{net}{zero}sleep 1.5; echo 6 > result.txt"},
    }
    task = tiny_task(task_root, "nosy", [nosy, READ], resources={"gpus": 1})
    async with cluster.operator():
        cluster.campaign("nosy", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
        # both runs' files exist on the claim before either goes looking for the other's
        status_files = [claim_runs / run_id / "status.json" for run_id in ids]
        await eventually(lambda: all(p.exists() for p in status_files), 90, what="both runs' status.json")
        pods = cluster.pods("nosy")  # as they run (the operator deletes finished pods)
        for run_id in ids:
            (claim_runs / run_id / "go").touch()
        await eventually(lambda: phase(cluster, "default", "nosy") == "Finished", 120, what="the campaign to finish")

    cdir = CampaignDir(cluster.campaign_dir("nosy"))
    assert sorted(cdir.run_ids()) == sorted(ids)
    for run_id in ids:
        result = cdir.result(run_id)
        assert result is not None and result.status.value == "Finished" and result.subtasks[0].raw == 6.0
        workspace = cdir.run_dir(run_id) / "workspace"
        assert (workspace / "go.txt").read_text() == "go\n"  # it looked once both runs were there
        assert (workspace / "zeroed.txt").read_text() == "zeroed\n"  # it did zero its own charged time
        assert (workspace / "seen.txt").read_text() == f"{run_id}\n"  # /runs holds its own folder only
        assert '"run_id"' in (workspace / "own.txt").read_text()  # its own status.json it can read
        (sibling,) = set(ids) - {run_id}
        paths = [f"/runs/{sibling}", f"../{sibling}", f"../../{sibling}", f"{claim_runs}/{sibling}"]
        for name, per_path in (("stolen.txt", 1), ("denied.txt", 2)):
            attempts = (workspace / name).read_text().split("== ")[1:]
            assert [a.split("\n", 1)[0] for a in attempts] == paths
            for attempt in attempts:  # every read and every write: the path does not exist in the pod
                assert attempt.count("No such file or directory") == per_path, (name, attempt)
        assert '"run_id"' not in (workspace / "stolen.txt").read_text(), "a run read its sibling's status.json"
        outcomes = dict(line.split(" ", 1) for line in (workspace / "net.txt").read_text().splitlines())
        assert outcomes.pop(f"{api.hostname}:{api.port}") == "Connection refused"  # the API server
        assert outcomes.pop(f"127.0.0.1:{gcs_port}") == "Connection refused"  # Ray's GCS
        assert outcomes.pop("169.254.169.254:80") == "Network is unreachable"  # cloud metadata
        if gcs_host != "127.0.0.1":
            assert outcomes.pop(f"{gcs_host}:{gcs_port}") == "Network is unreachable"
        assert list(outcomes.values()) == ["connected"]  # its own listener on its own loopback
        # Its files on the claim are its own, written as the pod's user; nothing of the sibling's was touched.
        status = json.loads((claim_runs / run_id / "status.json").read_text())
        assert status["run_id"] == run_id and status["phase"] != "Failed"
        assert (claim_runs / run_id / "status.json").stat().st_uid == 1000
    assert list(cluster.volume.rglob("planted.txt")) == []
    for run in cluster.runs("nosy"):
        # Zeroing its own charged wall time did not zero the GPU-hours: the API's pod times did the counting.
        ledger = read_model(ledger_path(cdir.root, run["spec"]["run_id"]), PodLedger)
        assert ledger is not None
        assert run["status"]["gpuHours"] == pytest.approx(ledger.gpu_hours(), abs=1e-6)
        assert run["status"]["gpuHours"] > 0
    assert len(pods) == 2
    for pod in pods:
        assert pss_restricted_violations(pod, version="1.33") == []
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_run_policy_lets_a_run_reach_dns_and_nothing_of_the_cluster() -> None:
    """Object by object: the operator's default run policy against the endpoints a run must not reach."""
    policies = [{**RUN_POLICY, "metadata": {**RUN_POLICY["metadata"], "namespace": ns}} for ns in ("team-a", "team-b")]
    labels = {"app.kubernetes.io/part-of": "labkube", "app.kubernetes.io/component": "run", "labkube.dev/run": "r"}
    run = Endpoint("10.0.1.5", namespace="team-a", labels=labels, named_ports={"metrics": 9400})
    other_tenant = Endpoint("10.0.2.7", namespace="team-b", labels=labels, named_ports={"metrics": 9400})
    dns = Endpoint("10.0.0.10", namespace="kube-system", labels={"k8s-app": "kube-dns"})
    operator = Endpoint("10.0.0.20", namespace=OPERATOR_NAMESPACE, labels={"app.kubernetes.io/component": "operator"})
    api_server = Endpoint("172.18.0.2")  # the kubernetes Service's endpoint, after DNAT
    metadata = Endpoint("169.254.169.254")
    assert allowed(policies, run, dns, 53, "UDP") and allowed(policies, run, dns, 53, "TCP")
    assert not allowed(policies, run, api_server, 6443) and not allowed(policies, run, api_server, 443)
    assert not allowed(policies, run, metadata, 80)
    for port in (6379, 8265, 10001, 8080):  # Ray's GCS, dashboard, client; the operator's metrics
        assert not allowed(policies, run, operator, port)
    assert not allowed(policies, run, other_tenant, 9400) and not allowed(policies, other_tenant, run, 22)


async def test_a_campaign_asking_for_more_than_tenancy_allows_is_refused_naming_the_field(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "greedy", [WRITE, READ], resources={"image": "evil.example/miner:1"})
    tenancy = Tenancy(priority_classes=["research"], node_selectors={"pool": ["a100"]}, images=["ghcr.io/labkube/"])
    async with cluster.operator(tenancy=tenancy):
        cluster.campaign(
            "greedy",
            tasks=[str(task)],
            models=["oracle"],
            pod={
                "priorityClassName": "system-cluster-critical",
                "nodeSelector": {"pool": "h100"},
                "labels": {"app.kubernetes.io/component": "operator", "team": "miners"},
                "annotations": {"sidecar.istio.io/inject": "true"},
            },
        )
        await eventually(lambda: phase(cluster, "default", "greedy") == "Failed", 60, what="the refusal")
    ready = next(c for c in campaign(cluster, "default", "greedy")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Forbidden"
    message = ready["message"]
    assert "spec.pod.priorityClassName: 'system-cluster-critical' is not allowed (allowed: research)" in message
    assert "spec.pod.nodeSelector: pool=h100 is not allowed (allowed: pool=a100)" in message
    assert "resources.image 'evil.example/miner:1' is not allowed (allowed: ghcr.io/labkube/)" in message
    assert "spec.pod.labels: app.kubernetes.io/component is set by labkube itself" in message
    assert "spec.pod.labels: key 'team' is not allowed (none allowed (chart value tenancy))" in message
    assert "spec.pod.annotations: key 'sidecar.istio.io/inject' is not allowed" in message
    assert cluster.runs("greedy") == [] and cluster.pods("greedy") == []


async def test_pods_are_built_from_the_admitted_campaign_not_from_an_edited_run(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "edited", [WRITE, {"tool": "bash", "args": {"command": "sleep 3"}}, READ])
    tenancy = Tenancy(priority_classes=["research"])
    async with cluster.operator(tenancy=tenancy):
        cluster.campaign("edited", tasks=[str(task)], models=["oracle"], pod={"priorityClassName": "research"})
        (run,) = await eventually(lambda: cluster.runs("edited"), 60, what="the Run")
        # A tenant who can edit Runs (the chart's roles do not let them; a hand-written Role might) rewrites the
        # pod block and the image, as `kubectl patch` does, then the pod is evicted so a new one is built.
        patch = {
            "spec": {"pod": {"priorityClassName": "system-node-critical"}, "resources": {"image": "evil.example/x:1"}}
        }
        await asyncio.to_thread(tenant_patch, cluster.url, run["metadata"]["name"], patch)
        edited = cluster.api.read_object(RUNS, "default", run["metadata"]["name"])
        assert edited is not None and edited["spec"]["resources"]["image"] == "evil.example/x:1"
        first = await eventually(lambda: cluster.kubelet.running(), 60, what="a running pod")
        cluster.kubelet.evict(first[0])
        await eventually(lambda: phase(cluster, "default", "edited") == "Finished", 90, what="the campaign")
    assert cluster.pods("edited") == []  # deleted once the result was recorded
    pods = [cluster.created_pod(name) for name in cluster.pods_created("edited")]
    assert len(pods) == 3  # two attempts of the agent (one evicted) and the grading pod
    for pod in pods:
        assert pod["spec"]["priorityClassName"] == "research"
        assert {c["image"] for c in pod["spec"]["containers"]} == {"labkube:test"}
    assert json.dumps(pods).count("evil.example") == 0 and "system-node-critical" not in json.dumps(pods)


def tenant_patch(url: str, name: str, patch: dict[str, Any]) -> None:
    from kubernetes.client import ApiClient, Configuration, CustomObjectsApi

    config = Configuration()
    config.host = url
    with ApiClient(config) as client:
        CustomObjectsApi(client).patch_namespaced_custom_object(
            "labkube.dev", "v1alpha1", "default", "runs", name, patch
        )
