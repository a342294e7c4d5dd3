"""The chart's RayCluster (`rayCluster.enabled`) and the wiring to an existing Ray cluster (`operator.rayAddress`,
`operator.rayAuthTokenSecret`), object by object: no KubeRay operator runs here, so the RayCluster is checked against
KubeRay's published CRD schema (v1.7.0, `tests/data/kuberay`) as the API server would check it (the OpenAPI schema,
and no field the schema would prune), its pod templates with `kubernetes-validate --strict` and the restricted Pod
Security Standard, and its NetworkPolicy with the policy evaluator. The driver side (Ray Client with the token,
supervisors on the workers, a worker's death) runs for real in `tests/k8s/test_operator_processes.py`."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kube_policy import Endpoint, allowed, pss_restricted_violations
from kube_schema import prune
from test_chart import (
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    chart,
    chart_dir,
    check_all,
    one,
    operator_config,
    render,
)

from labkube.operator.driver import POD_GPU, SLOT, SUPERVISOR

__all__ = ["chart", "chart_dir"]  # fixtures

KUBERAY_CRD = Path(__file__).parent / "data" / "kuberay" / "ray.io_rayclusters-v1.7.0.yaml.gz"
SHARED = {"runs": {"workspace": {"mode": "pvc", "existingClaim": "labkube-runs", "accessModes": ["ReadWriteMany"]}}}
RAY = {"rayCluster": {"enabled": True, "podGpus": 16}, **SHARED}


def raycluster_schema() -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress(KUBERAY_CRD.read_bytes()))
    assert crd["spec"]["group"] == "ray.io" and crd["spec"]["names"]["kind"] == "RayCluster"
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    return v1["schema"]["openAPIV3Schema"]


def check_raycluster(doc: dict[str, Any]) -> None:
    """As kube-apiserver would admit it with KubeRay's CRD installed: valid against the schema, and nothing pruned."""
    schema = raycluster_schema()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
    assert prune(doc, schema, root=True) == doc, "fields KubeRay's CRD does not have would be pruned"
    templates = [doc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in doc["spec"]["workerGroupSpecs"]]
    for template in templates:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        kubernetes_validate.validate(pod_template, KUBE_VERSION, strict=True)
        assert pss_restricted_violations(template, version=KUBE_VERSION) == []


def ray_start_resources(group: dict[str, Any]) -> dict[str, float]:
    """`rayStartParams.resources` as `ray start --resources=...` reads it after KubeRay's shell quoting."""
    text = group["rayStartParams"]["resources"]
    assert text.startswith('"') and text.endswith('"')
    return yaml.safe_load(text[1:-1].replace('\\"', '"'))


def test_the_raycluster_is_valid_against_kuberays_crd_and_the_operator_drives_through_it(
    chart: helm_python.Chart,
) -> None:
    docs = render(chart, RAY)
    check_all([d for d in docs if d["kind"] != "RayCluster"])
    cluster = one(docs, "RayCluster")
    check_raycluster(cluster)
    name = cluster["metadata"]["name"]
    assert name == "labkube-ray" and cluster["metadata"]["namespace"] == NAMESPACE
    assert cluster["spec"]["authOptions"] == {"mode": "token"}  # KubeRay creates Secret `labkube-ray`
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # no supervisor on the head
    assert ray_start_resources(head) == {SLOT: 5000, POD_GPU: 16}
    assert head["template"]["spec"]["automountServiceAccountToken"] is False
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    assert ray_start_resources(workers) == {SUPERVISOR: 64}
    assert workers["replicas"] == workers["minReplicas"] == 2
    worker = workers["template"]["spec"]
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert worker["serviceAccountName"] == deployment["serviceAccountName"]  # they create pods, patch Runs
    (container,) = worker["containers"]
    assert container["image"] == deployment["containers"][0]["image"]  # labkube and the same Ray version
    runs_mount = next(m for m in container["volumeMounts"] if m["name"] == "runs")
    assert runs_mount["mountPath"] == "/runs"
    runs_volume = next(v for v in worker["volumes"] if v["name"] == "runs")
    assert runs_volume["persistentVolumeClaim"]["claimName"] == "labkube-runs"
    # The operator: Ray Client on KubeRay's head Service, the token from KubeRay's Secret.
    config = operator_config(docs)
    assert config.ray_address == f"ray://{name}-head-svc.{NAMESPACE}.svc:10001"
    env = {e["name"]: e for e in deployment["containers"][0]["env"]}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "auth_token"}


def test_without_gpus_the_head_declares_no_pod_gpu_resource(chart: helm_python.Chart) -> None:
    cluster = one(render(chart, {**RAY, "rayCluster": {"enabled": True}}), "RayCluster")
    assert ray_start_resources(cluster["spec"]["headGroupSpec"]) == {SLOT: 5000}


def test_by_default_there_is_no_raycluster_and_no_ray_token(chart: helm_python.Chart) -> None:
    docs = render(chart)
    assert not by_kind(docs, "RayCluster")
    assert operator_config(docs).ray_address is None
    assert "RAY_AUTH_TOKEN" not in str(one(docs, "Deployment"))


def test_an_existing_cluster_gets_its_address_and_token_secret(chart: helm_python.Chart) -> None:
    values = {"operator": {"rayAddress": "ray://raycluster-head-svc.ray:10001", "rayAuthTokenSecret": "raycluster"}}
    docs = render(chart, values)
    assert not by_kind(docs, "RayCluster")
    assert operator_config(docs).ray_address == "ray://raycluster-head-svc.ray:10001"
    env = {e["name"]: e for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "raycluster", "key": "auth_token"}


def test_only_ray_pods_and_the_operators_client_reach_the_raycluster(chart: helm_python.Chart) -> None:
    docs = render(chart, RAY)
    cluster = one(docs, "RayCluster")
    # the run pods' policy as the operator puts it into a namespace with runs (here: the release's own)
    run_policies = [
        {**p, "metadata": {**p["metadata"], "namespace": NAMESPACE}} for p in operator_config(docs).run_policies
    ]
    policies = [*by_kind(docs, "NetworkPolicy"), *run_policies]
    # KubeRay labels its pods ray.io/cluster and ray.io/node-type, on top of the template's labels
    ray_labels = {
        **cluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"],
        "ray.io/cluster": cluster["metadata"]["name"],
    }
    head = Endpoint("10.0.0.10", NAMESPACE, {**ray_labels, "ray.io/node-type": "head"})
    worker = Endpoint("10.0.0.11", NAMESPACE, {**ray_labels, "ray.io/node-type": "worker"})
    operator = Endpoint("10.0.0.12", NAMESPACE, one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"])
    run_labels = run_policies[0]["spec"]["podSelector"]["matchLabels"]
    run_pod = Endpoint("10.0.0.13", NAMESPACE, {**run_labels, "labkube.dev/run": "r"})
    stranger = Endpoint("10.0.1.1", "default", {"app": "x"})
    assert allowed(policies, worker, head, 6379) and allowed(policies, head, worker, 40000)
    assert allowed(policies, operator, head, 10001)
    assert not allowed(policies, operator, head, 6379)
    assert not allowed(policies, run_pod, head, 10001) and not allowed(policies, run_pod, worker, 40000)
    assert not allowed(policies, stranger, head, 10001)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rayCluster": {"enabled": True}}, r"rayCluster\.enabled needs runs\.workspace\.existingClaim"),
        (
            {**RAY, "operator": {"rayAddress": "ray://elsewhere:10001"}},
            r'rayCluster\.enabled is true and operator\.rayAddress is "ray://elsewhere:10001"',
        ),
        (
            {**SHARED, "rayCluster": {"enabled": True, "workers": {"replicas": 1, "minReplicas": 2}}},
            r"minReplicas \(2\) <= replicas \(1\)",
        ),
        (
            {**RAY, "commonLabels": {"team": "a"}, "rayCluster": {"enabled": True, "labels": {"team": "b"}}},
            r"rayCluster\.labels\.team is set by the chart or by commonLabels",
        ),
    ],
)
def test_raycluster_values_that_cannot_work_fail_with_the_key(
    chart: helm_python.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_raycluster_image_metadata_and_per_group_scheduling(chart: helm_python.Chart) -> None:
    """rayCluster.image/annotations/labels and head/workers scheduling, each where KubeRay reads it; the shared
    nodeSelector and tolerations stay the default of a group that sets none."""
    cpu_pool = {"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    zone = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    digest = "sha256:" + "cd" * 32
    values = {
        **SHARED,
        "commonLabels": {"team": "research"},
        "rayCluster": {
            "enabled": True,
            "image": {"repository": "registry.local/labkube-ray", "digest": digest, "pullPolicy": "Always"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "labels": {"ray-role": "driver"},
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [cpu_pool],
            "affinity": zone,
            "head": {"nodeSelector": {"pool": "system"}, "tolerations": []},
            "workers": {"affinity": {}},
        },
    }
    docs = render(chart, values)
    check_all([d for d in docs if d["kind"] != "RayCluster"])
    cluster = one(docs, "RayCluster")
    check_raycluster(cluster)
    assert cluster["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert cluster["metadata"]["labels"].items() >= {"team": "research", "ray-role": "driver"}.items()
    head = cluster["spec"]["headGroupSpec"]["template"]
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    for template in (head, workers["template"]):
        assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert template["metadata"]["labels"].items() >= {"team": "research", "ray-role": "driver"}.items()
        (container,) = template["spec"]["containers"]
        assert container["image"] == f"registry.local/labkube-ray@{digest}"
        assert container["imagePullPolicy"] == "Always"
    # The head sets its own node selector; its empty tolerations fall back to the shared ones, as does its affinity.
    assert head["spec"]["nodeSelector"] == {"pool": "system"}
    assert head["spec"]["tolerations"] == [cpu_pool] and head["spec"]["affinity"] == zone
    worker = workers["template"]["spec"]
    assert worker["nodeSelector"] == {"pool": "cpu"} and worker["tolerations"] == [cpu_pool]
    assert worker["affinity"] == zone
    only_workers = {**values, "rayCluster": {"enabled": True, "workers": {"nodeSelector": {"pool": "cpu"}}}}
    cluster = one(render(chart, only_workers), "RayCluster")
    assert "nodeSelector" not in cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}


def test_raycluster_image_defaults_to_the_operators(chart: helm_python.Chart) -> None:
    digest = "sha256:" + "ef" * 32
    docs = render(chart, {**RAY, "image": {"digest": digest, "pullPolicy": "Never"}})
    cluster = one(docs, "RayCluster")
    operator = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == f"ghcr.io/labkube/labkube@{digest}"
    for template in (cluster["spec"]["headGroupSpec"]["template"], cluster["spec"]["workerGroupSpecs"][0]["template"]):
        (container,) = template["spec"]["containers"]
        assert (container["image"], container["imagePullPolicy"]) == (operator["image"], "Never")
        assert "annotations" not in template["metadata"]
    tagged = one(
        render(chart, {**RAY, "rayCluster": {"enabled": True, "image": {"repository": "r/ray"}}}), "RayCluster"
    )
    assert tagged["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "r/ray:0.1.0"
