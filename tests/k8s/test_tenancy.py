"""Several tenants on one cluster: namespaces, storage, admission of Campaign fields, GPU time.

What the fake cluster enforces and what it does not (checked object by object instead):

- kmock has no admission webhooks, RBAC or NetworkPolicy enforcement: the run pods' policies the
  operator puts into each namespace are checked here object by object against the pods, the API
  server, the cloud metadata address and the operator pod (`kube_policy.allowed`, the documented
  NetworkPolicy semantics), and the pods against the Pod Security Standards' `restricted` profile
  field by field (`kube_policy.pss_restricted_violations`).
- The fake kubelet maps a pod's volume mounts onto local directories per namespace (claims are
  namespaced, as in Kubernetes): which folder of which claim a pod can see is decided by its mounts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import CAMPAIGNS, CLAIM, PODS, RUNS, Cluster, eventually, tiny_task
from kube_policy import Endpoint, allowed, pss_restricted_violations

from labkube.operator.crds import API_VERSION
from labkube.operator.k8s_backend import PodLedger, ledger_path
from labkube.operator.k8s_models import Tenancy
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
    task = tiny_task(cluster.root, "tenant", [WRITE, READ], resources={"gpus": 1})
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
        assert ledger is not None and len(ledger.pods) == 1 and ledger.gpus == 1
        assert status["gpuHours"] == pytest.approx(ledger.gpu_hours(), abs=1e-6) and status["gpuHours"] > 0
        (pod,) = cluster.api.objects(PODS, ns, "labkube.dev/campaign=sweep")
        window = ledger.pods[pod["metadata"]["name"]]
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


async def test_a_run_cannot_reach_its_siblings_or_the_cluster_and_still_finishes(cluster: Cluster) -> None:
    """Each pod of a 2-seed campaign on the shared claim tries to read and overwrite the other's files and
    to inflate the GPU-hour meter through its own status.json; the pods see only their own folder."""
    nosy = {
        "tool": "bash",
        "args": {
            "command": "ls /runs > seen.txt 2>&1; "
            "for d in /runs/*--s0 /runs/*--s1 ../*; do cat $d/status.json >> stolen.txt 2>&1; "
            'echo \'{"phase": "Failed"}\' > $d/status.json.tmp 2>>denied.txt; done; '
            "python3 - <<'PY'\nimport json, os\np = os.environ['LABKUBE_RUN_DIR'] + '/status.json'\n"
            "s = json.load(open(p)); s['spend']['wall_seconds'] = 0.0\njson.dump(s, open(p, 'w'))\nPY\n"
            "sleep 1.5; echo 6 > result.txt"  # pod times have one-second resolution
        },
    }
    task = tiny_task(cluster.root, "nosy", [nosy, READ], resources={"gpus": 1})
    async with cluster.operator():
        cluster.campaign("nosy", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
        await eventually(lambda: phase(cluster, "default", "nosy") == "Finished", 120, what="the campaign to finish")

    cdir = CampaignDir(cluster.campaign_dir("nosy"))
    ids = cdir.run_ids()
    assert len(ids) == 2
    for run_id in ids:
        result = cdir.result(run_id)
        assert result is not None and result.status.value == "Finished" and result.subtasks[0].raw == 6.0
        workspace = cdir.run_dir(run_id) / "workspace"
        stolen = (workspace / "stolen.txt").read_text()
        assert '"run_id"' not in stolen, "a run read a status.json"
        for other in ids:
            assert not (cdir.run_dir(other) / "status.json.tmp").exists()
    for run in cluster.runs("nosy"):
        # Zeroing its own charged wall time did not zero the GPU-hours: the API's pod times did the counting.
        ledger = read_model(ledger_path(cdir.root, run["spec"]["run_id"]), PodLedger)
        assert ledger is not None
        assert run["status"]["gpuHours"] == pytest.approx(ledger.gpu_hours(), abs=1e-6)
        assert run["status"]["gpuHours"] > 0
    for pod in cluster.pods("nosy"):
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
            pod={"priorityClassName": "system-cluster-critical", "nodeSelector": {"pool": "h100"}},
        )
        await eventually(lambda: phase(cluster, "default", "greedy") == "Failed", 60, what="the refusal")
    ready = next(c for c in campaign(cluster, "default", "greedy")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Forbidden"
    message = ready["message"]
    assert "spec.pod.priorityClassName: 'system-cluster-critical' is not allowed (allowed: research)" in message
    assert "spec.pod.nodeSelector: pool=h100 is not allowed (allowed: pool=a100)" in message
    assert "resources.image 'evil.example/miner:1' is not allowed (allowed: ghcr.io/labkube/)" in message
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
    pods = cluster.pods("edited")
    assert len(pods) == 2
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
