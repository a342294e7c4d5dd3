"""The Helm chart, rendered offline with helm-python-sdk (no cluster, no helm binary)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from labkube.operator.crds import campaign_crd, crd_files, spec_from_resource, validate_resource
from labkube.operator.k8s_models import OperatorConfig, RunResourceSpec
from labkube.operator.pod_manifest import build_pod_manifest, run_labels
from labkube.task_card import Resources, TaskFamily

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "labkube"
RELEASE = "labkube"
NAMESPACE = "labkube-system"
KUBE_VERSION = "1.33"
# Kinds from other projects' CRDs: kubernetes-validate has no schema for them.
FOREIGN_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "CiliumNetworkPolicy"}

DASHBOARD = {"title": "labkube campaigns", "uid": "labkube-campaigns", "panels": []}
RULES = {
    "groups": [
        {
            "name": "labkube",
            "rules": [{"alert": "LabkubeRunStuck", "expr": "labkube_run_step_age_seconds > 1800", "for": "10m"}],
        }
    ]
}
ALL_FLAGS: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboards": {"enabled": True, "namespace": "monitoring"},
    "networkPolicy": {
        "enabled": True,
        "cilium": True,
        "allowedCIDRs": ["10.20.0.0/16", "2001:db8::/32"],
        "allowedHosts": ["api.openai.com", "*.anthropic.com"],
        "extraEgress": [
            {"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}], "ports": [{"port": 53, "protocol": "UDP"}]}
        ],
    },
    "operator": {"watchNamespaces": ["research", "evals"], "rayAddress": "ray://raycluster-head-svc.ray:10001"},
    "imagePullSecrets": [{"name": "registry"}],
    "runs": {
        "image": {"repository": "ghcr.io/labkube/runner", "tag": "0.1.0-cuda"},
        "queueName": "gpu-queue",
        "priorityClassName": "research",
        "serviceAccountName": "labkube-runs",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "env": {"LABKUBE_WEB_SEARCH": "off"},
        "workspace": {"mode": "pvc", "storageClassName": "fast", "size": "200Gi", "keepFinished": False},
        "world": {"image": "ghcr.io/labkube/world:0.1.0", "command": ["labkube-world"], "port": 8765},
        "cpuLimits": True,
        "imagePullTimeoutSeconds": 2700,
        "gradingDeadlineSeconds": 5400,
        "podLabels": {"team": "research"},
        "podAnnotations": {"example.com/owner": "evals", "sidecar.istio.io/inject": "true"},
    },
    "tenancy": {"podLabels": ["team", "cost.example.com/"], "podAnnotations": ["example.com/*"]},
}


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def watched_roles(docs: list[dict[str, Any]], kind: str = "Role") -> list[dict[str, Any]]:
    """The operator's Roles (or RoleBindings) in watched namespaces, not the leader election's."""
    return [d for d in by_kind(docs, kind) if not d["metadata"]["name"].endswith("-leader-election")]


def operator_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's own ClusterRole (the aggregated tenant roles and the run steerers' are ClusterRoles too)."""
    (role,) = [
        d
        for d in by_kind(docs, "ClusterRole")
        if "aggregate-to-view" not in str(d["metadata"])
        and "aggregate-to-edit" not in str(d["metadata"])
        and not d["metadata"]["name"].endswith("-run-steerer")
    ]
    return role


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart whose dashboards/ holds a dashboard, a rule file and a promtool test
    (the repository's dashboards/ is written separately and may still be empty)."""
    root = tmp_path_factory.mktemp("chart") / "labkube"
    shutil.copytree(CHART, root, ignore=shutil.ignore_patterns("dashboards"))
    dashboards = root / "dashboards"
    dashboards.mkdir()
    (dashboards / "campaigns.json").write_text(json.dumps(DASHBOARD), encoding="utf-8")
    (dashboards / "labkube.rules.yaml").write_text(yaml.safe_dump(RULES), encoding="utf-8")
    (dashboards / "labkube.rules_test.yaml").write_text("rule_files: [labkube.rules.yaml]\ntests: []\n")
    return root


@pytest.fixture(scope="module")
def chart(chart_dir: Path) -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(chart_dir) as loaded:
        yield loaded


def render(chart: helm_python.Chart, values: dict[str, Any] | None = None, name: str = RELEASE) -> list[dict[str, Any]]:
    return objects(chart.render(values or {}, name=name, namespace=NAMESPACE))


def operator_config(docs: list[dict[str, Any]]) -> OperatorConfig:
    config_map = next(d for d in by_kind(docs, "ConfigMap") if "operator.yaml" in d["data"])
    return OperatorConfig.model_validate(yaml.safe_load(config_map["data"]["operator.yaml"]))


def check_foreign(doc: dict[str, Any]) -> None:
    """The shape of objects whose CRDs we do not have (Prometheus Operator, Cilium)."""
    api = {
        "ServiceMonitor": "monitoring.coreos.com/v1",
        "PodMonitor": "monitoring.coreos.com/v1",
        "PrometheusRule": "monitoring.coreos.com/v1",
        "CiliumNetworkPolicy": "cilium.io/v2",
    }[doc["kind"]]
    assert doc["apiVersion"] == api
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert doc["metadata"]["namespace"]
    spec_keys = {
        "ServiceMonitor": {"selector", "namespaceSelector", "endpoints"},
        "PodMonitor": {"selector", "namespaceSelector", "podMetricsEndpoints"},
        "PrometheusRule": {"groups"},
        "CiliumNetworkPolicy": {"endpointSelector", "egress"},
    }[doc["kind"]]
    assert set(doc["spec"]) == spec_keys


def run_policies(docs: list[dict[str, Any]], namespace: str = "research") -> list[dict[str, Any]]:
    """The run-pod policies the operator puts into `namespace` (from its config), as it sends them."""
    policies = operator_config(docs).run_policies
    return [{**p, "metadata": {**p["metadata"], "namespace": namespace}} for p in policies]


def check_all(docs: list[dict[str, Any]]) -> None:
    """Every rendered object, and every object the operator creates from its config, passes
    `kubernetes-validate --strict` (our own and other projects' kinds: their shape)."""
    if any(d["kind"] == "ConfigMap" and "operator.yaml" in d.get("data", {}) for d in docs):
        docs = [*docs, *run_policies(docs)]
    for doc in docs:
        if doc["kind"] in FOREIGN_KINDS:
            check_foreign(doc)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        assert len(doc["metadata"]["name"]) <= 63
        for value in doc["metadata"].get("labels", {}).values():
            assert isinstance(value, str) and len(value) <= 63


# -- rendering ------------------------------------------------------------------------------------


def test_default_values_render_valid_objects(chart: helm_python.Chart) -> None:
    docs = render(chart)
    check_all(docs)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",  # the operator's
        "ClusterRole",  # aggregated into view/edit/admin: reading Campaigns and Runs
        "ClusterRole",  # aggregated into edit/admin: writing Campaigns
        "ClusterRole",  # steering runs (pause, resume, cancel, extend, message), bound by an admin
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",  # the operator pod's; run pods' come from the operator, in each namespace with runs
        "PodDisruptionBudget",  # two replicas: one leads, one stands by
        "Role",  # the leader Lease
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]


def test_every_flag_on_renders_valid_objects(chart: helm_python.Chart) -> None:
    docs = render(chart, ALL_FLAGS)
    check_all(docs)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        one(docs, kind)
    assert len(by_kind(docs, "NetworkPolicy")) == 1
    assert [p["kind"] for p in run_policies(docs)] == ["NetworkPolicy", "CiliumNetworkPolicy"]
    assert len(watched_roles(docs)) == len(watched_roles(docs, "RoleBinding")) == 2
    assert len(by_kind(docs, "ConfigMap")) == 2


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_objects_are_valid_for_the_oldest_and_newest_kubernetes(chart: helm_python.Chart, version: str) -> None:
    for doc in render(chart, ALL_FLAGS) + render(chart, ADMIN):
        if doc["kind"] not in FOREIGN_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("flag", "kind"),
    [
        ("serviceMonitor", "ServiceMonitor"),
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
    ],
)
def test_optional_objects_are_off_by_default_and_on_by_flag(chart: helm_python.Chart, flag: str, kind: str) -> None:
    assert not by_kind(render(chart), kind)
    docs = render(chart, {flag: {"enabled": True}})
    check_all(docs)
    assert len(by_kind(docs, kind)) == 1


def test_grafana_dashboards_config_map(chart: helm_python.Chart) -> None:
    assert len(by_kind(render(chart), "ConfigMap")) == 1
    docs = render(chart, {"grafanaDashboards": {"enabled": True}})
    dashboards = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboards"))
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["metadata"]["namespace"] == NAMESPACE
    assert json.loads(dashboards["data"]["campaigns.json"]) == DASHBOARD
    assert set(dashboards["data"]) == {"campaigns.json"}


def test_prometheus_rule_holds_the_rule_files_groups_only(chart: helm_python.Chart) -> None:
    rule = one(render(chart, {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}), "PrometheusRule")
    assert rule["spec"]["groups"] == RULES["groups"]  # the promtool test file is skipped
    assert rule["metadata"]["labels"]["release"] == "kps"


def test_monitoring_flags_fail_without_files(tmp_path: Path) -> None:
    bare = tmp_path / "labkube"
    shutil.copytree(CHART, bare, ignore=shutil.ignore_patterns("dashboards"))
    (bare / "dashboards").mkdir()
    with helm_python.Chart.load(bare) as empty:
        with pytest.raises(helm_python.HelmRenderError, match=r"dashboards/ holds no rule file"):
            empty.render({"prometheusRule": {"enabled": True}}, name=RELEASE, namespace=NAMESPACE)
        with pytest.raises(helm_python.HelmRenderError, match=r"no \*\.json dashboard"):
            empty.render({"grafanaDashboards": {"enabled": True}}, name=RELEASE, namespace=NAMESPACE)


def test_service_monitor_scrapes_the_operator_service(chart: helm_python.Chart) -> None:
    docs = render(chart, {"serviceMonitor": {"enabled": True, "interval": "15s"}})
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "interval": "15s",
            # the campaign series' `namespace` (the Campaign's) is kept, not renamed `exported_namespace`
            "honorLabels": True,
            "relabelings": [{"targetLabel": "job", "replacement": "labkube-operator"}],  # the alert rules' job name
        }
    ]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_pod_monitor_and_network_policy_select_run_pods(chart: helm_python.Chart) -> None:
    docs = render(chart, ALL_FLAGS)
    config = operator_config(docs)
    labels = run_labels("cl-sweep", "cl-sweep-x")
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["research", "evals"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    for policy in run_policies(docs):
        selector = policy["spec"].get("podSelector") or policy["spec"]["endpointSelector"]
        assert selector["matchLabels"].items() <= labels.items()
    assert config.runs.metrics_port == 9400
    cluster_wide = one(render(chart, {"podMonitor": {"enabled": True}}), "PodMonitor")
    assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}


def test_run_policy_denies_all_but_dns_the_allowlist_and_scraping(chart: helm_python.Chart) -> None:
    docs = render(chart, ALL_FLAGS)
    network, cilium = run_policies(docs)
    policy = network["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (scrape,) = policy["ingress"]
    assert scrape["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert scrape["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    dns, cidrs, extra = policy["egress"]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    assert [t["ipBlock"]["cidr"] for t in cidrs["to"]] == ["10.20.0.0/16", "2001:db8::/32"]
    assert cidrs["ports"] == [{"protocol": "TCP", "port": 443}]
    assert extra == ALL_FLAGS["networkPolicy"]["extraEgress"][0]
    fqdn = cilium["spec"]["egress"][1]
    assert fqdn["toFQDNs"] == [{"matchName": "api.openai.com"}, {"matchPattern": "*.anthropic.com"}]


def test_run_policy_is_on_by_default_with_dns_only(chart: helm_python.Chart) -> None:
    (policy,) = run_policies(render(chart))
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and len(policy["spec"]["egress"]) == 1
    assert not run_policies(render(chart, {"networkPolicy": {"enabled": False}}))
    assert not by_kind(render(chart, {"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_an_open_egress_cidr_excepts_the_cloud_metadata_service(chart: helm_python.Chart) -> None:
    (policy,) = run_policies(render(chart, {"networkPolicy": {"allowedCIDRs": ["0.0.0.0/0", "::/0"]}}))
    blocks = [t["ipBlock"] for t in policy["spec"]["egress"][1]["to"]]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]},
        {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128"]},
    ]
    with pytest.raises(helm_python.HelmRenderError, match=r"169\.254\.0\.0/16, a link-local range"):
        render(chart, {"networkPolicy": {"allowedCIDRs": ["169.254.0.0/16"]}})


# -- the operator ---------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, ALL_FLAGS], ids=["defaults", "all-flags"])
def test_operator_and_run_pods_meet_the_restricted_pod_security_standard(
    chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    """Field by field (kube_policy), since the fake API has no Pod Security admission."""
    from kube_policy import pss_restricted_violations

    from labkube.operator.k8s_models import RunResourceSpec

    docs = render(chart, values)
    assert pss_restricted_violations(one(docs, "Deployment")["spec"]["template"], version=KUBE_VERSION) == []
    config = operator_config(docs)
    owner = {
        "apiVersion": "labkube.dev/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "c-r", "namespace": "research", "uid": "u"},
    }
    for family in (TaskFamily.researchgym, TaskFamily.gaia2):
        if family == TaskFamily.gaia2 and config.runs.world is None:
            continue
        run = RunResourceSpec(
            run_id="r",
            campaign="c",
            task="t",
            task_path="/t",
            model="oracle",
            seed=0,
            gpus=1,
            family=family,
            resources=Resources(gpus=1),
        )
        pod = build_pod_manifest(run, config.runs, owner=owner)
        assert pss_restricted_violations(pod, version=KUBE_VERSION) == []
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_operator_deployment(chart: helm_python.Chart) -> None:
    docs = render(chart)
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    # Two replicas by default: one leads (a Lease), one stands by; a PodDisruptionBudget keeps one of them.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    election = operator_config(docs).leader_election
    assert election.enabled and election.lease_name == "labkube-leader" and election.renew_deadline_s < election.lease_s
    (lease_role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "labkube-leader-election"]
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert rules_of(lease_role) == {("coordination.k8s.io", "leases"): {"create", "get", "update"}}
    single = render(chart, {"operator": {"replicas": 1, "leaderElection": {"enabled": False}}})
    assert one(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not by_kind(single, "PodDisruptionBudget") and not by_kind(single, "Role")
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert container["command"] == ["labkube", "operator", "--config", "/etc/labkube/operator.yaml"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 8080, "health": 8081}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == "ghcr.io/labkube/labkube:0.1.0"
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()


def test_config_change_rolls_the_operator(chart: helm_python.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        return one(render(chart, values), "Deployment")["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"
        ]

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"runs": {"queueName": "q"}})


@pytest.mark.parametrize("values", [{}, ALL_FLAGS], ids=["defaults", "all-flags"])
def test_operator_config_is_what_the_operator_reads(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    config = operator_config(render(chart, values))
    if values:
        assert config.namespaces == ["research", "evals"]
        assert config.ray_address == "ray://raycluster-head-svc.ray:10001"
        assert config.runs.default_image == "ghcr.io/labkube/runner:0.1.0-cuda"
        assert config.runs.workspace.claim_per_run and config.runs.world is not None
        assert config.runs.image_pull_secrets == ["registry"] and config.runs.queue_name == "gpu-queue"
        assert config.runs.image_pull_timeout_seconds == 2700 and config.runs.grading_deadline_seconds == 5400
    else:
        assert config.namespaces == [] and config.ray_address is None
        assert config.runs.default_image == "ghcr.io/labkube/labkube:0.1.0"
        # a claim per run by default: a replaced pod resumes from its checkpoint
        assert config.runs.workspace.mode == "pvc" and config.runs.workspace.claim_per_run
        assert config.runs.world is None
        assert [k.env for k in config.runs.api_keys] == ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
        # a 20 GB image pull may take half an hour; a grading pod pulls it, rebuilds the task environment, grades
        assert config.runs.image_pull_timeout_seconds == 1800 and config.runs.grading_deadline_seconds == 3600
    # ... and the pods it builds from it are valid.
    run = RunResourceSpec(
        run_id="t--openai-gpt-5--s0",
        campaign="c",
        task="researchgym/t",
        task_path="/opt/tasks/t",
        model="openai:gpt-5",
        seed=0,
        gpus=1,
        resources=Resources(gpus=1),
        family=TaskFamily.gaia2 if config.runs.world else TaskFamily.researchgym,
    )
    owner = {"apiVersion": "labkube.dev/v1alpha1", "kind": "Run", "metadata": {"name": "c-t", "uid": "u"}}
    kubernetes_validate.validate(build_pod_manifest(run, config.runs, owner=owner), KUBE_VERSION, strict=True)


def test_image_tag_defaults_to_app_version(chart: helm_python.Chart) -> None:
    docs = render(chart, {"image": {"repository": "registry.local/labkube", "tag": "dev"}})
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/labkube:dev"
    assert operator_config(docs).runs.default_image == "registry.local/labkube:dev"


def test_full_name_is_truncated_to_63_characters(chart: helm_python.Chart) -> None:
    docs = render(chart, name="a-release-name-that-is-quite-long-indeed-yes-53-chars")
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63
    assert one(render(chart, name="labkube-prod"), "Deployment")["metadata"]["name"] == "labkube-prod"
    assert one(render(chart, {"fullnameOverride": "lk"}), "Deployment")["metadata"]["name"] == "lk"


# -- RBAC -----------------------------------------------------------------------------------------


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_wide_rbac_is_least_privilege(chart: helm_python.Chart) -> None:
    docs = render(chart)
    rules = rules_of(operator_role(docs))
    assert rules[("labkube.dev", "campaigns")] >= {"get", "list", "watch", "patch"}
    assert rules[("labkube.dev", "runs")] >= {"create", "delete", "get", "list", "watch", "patch"}
    for sub in ("campaigns/status", "runs/status"):
        assert rules[("labkube.dev", sub)] == {"get", "patch", "update"}
    for sub in ("campaigns/finalizers", "runs/finalizers"):
        assert rules[("labkube.dev", sub)] == {"update"}
    assert rules[("", "pods")] == {"create", "delete", "get", "list", "watch", "patch"}
    assert rules[("", "events")] == {"create"}
    # each run's ConfigMap of interventions, which its agent container mounts (k8s_control)
    assert rules[("", "configmaps")] == {"create", "get", "patch"}
    # the run pods' policies, put into each namespace with runs before the first pod
    assert rules[("networking.k8s.io", "networkpolicies")] == {"create", "get", "patch"}
    assert ("cilium.io", "ciliumnetworkpolicies") not in rules
    assert rules[("apiextensions.k8s.io", "customresourcedefinitions")] == {"list", "watch"}
    assert rules[("", "namespaces")] == {"list", "watch"}
    # allocatable GPUs (list), so runs beyond them wait; a run pod's own node (get), so a dead node's pods are lost
    assert rules[("", "nodes")] == {"get", "list"}
    assert rules[("", "persistentvolumeclaims")] == {"create", "delete", "get", "list", "watch"}  # a claim per run
    assert ("", "secrets") not in rules  # pods reference Secrets by name; the operator never reads them
    assert all("*" not in group + resource and "*" not in verbs for (group, resource), verbs in rules.items())
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == operator_role(docs)["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "labkube", "namespace": NAMESPACE}]
    assert not watched_roles(docs)


def test_claims_are_allowed_only_when_the_operator_creates_them(chart: helm_python.Chart) -> None:
    per_run = rules_of(operator_role(render(chart, {"runs": {"workspace": {"mode": "pvc"}}})))
    assert per_run[("", "persistentvolumeclaims")] == {"create", "delete", "get", "list", "watch"}
    shared = {"runs": {"workspace": {"mode": "pvc", "existingClaim": "labkube-runs"}}}
    assert ("", "persistentvolumeclaims") not in rules_of(operator_role(render(chart, shared)))


def test_namespaced_rbac_uses_a_role_per_watched_namespace(chart: helm_python.Chart) -> None:
    docs = render(chart, {"operator": {"watchNamespaces": ["research", "evals"]}})
    cluster = rules_of(operator_role(docs))
    # discovery, and the nodes' allocatable GPUs (read-only, cluster-scoped) in both modes
    assert set(cluster) == {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"), ("", "nodes")}
    assert cluster[("", "nodes")] == {"get", "list"}
    roles = watched_roles(docs)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["evals", "research"]
    wide = rules_of(operator_role(render(chart)))
    assert rules_of(roles[0]) == {k: v for k, v in wide.items() if k not in cluster}  # one rule block for both
    for binding in watched_roles(docs, "RoleBinding"):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "labkube"}
        assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_tenants_get_campaign_rights_through_the_default_roles(chart: helm_python.Chart) -> None:
    roles = {d["metadata"]["name"]: d for d in by_kind(render(chart), "ClusterRole")}
    viewer, editor = roles["labkube-campaign-viewer"], roles["labkube-campaign-editor"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in viewer["metadata"]["labels"].items() if v == "true"} == {
        f"{aggregate}view",
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    assert {k for k, v in editor["metadata"]["labels"].items() if v == "true"} == {
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    seen = rules_of(viewer)
    assert set(seen) == {("labkube.dev", r) for r in ("campaigns", "campaigns/status", "runs", "runs/status")}
    assert all(verbs == {"get", "list", "watch"} for verbs in seen.values())
    # Tenants write Campaigns only: Runs, their status and pods stay the operator's.
    assert rules_of(editor) == {
        ("labkube.dev", "campaigns"): {"create", "delete", "deletecollection", "patch", "update"}
    }
    assert not {"labkube-campaign-viewer", "labkube-campaign-editor"} & {
        d["metadata"]["name"]
        for d in by_kind(render(chart, {"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")
    }


def test_the_run_steerer_role_grants_exactly_steering(chart: helm_python.Chart) -> None:
    """Steering is appending to a Run's `spec.interventions`: read Campaigns and Runs, patch Runs; no create or
    delete, no status, no pods, no secrets, and no aggregation into the default roles (an admin binds it)."""
    docs = render(chart)
    (steerer,) = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "labkube-run-steerer"]
    assert rules_of(steerer) == {
        ("labkube.dev", "campaigns"): {"get", "list", "watch"},
        ("labkube.dev", "runs"): {"get", "list", "watch", "patch"},
    }
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate") for k in steerer["metadata"]["labels"])
    for version in ("1.29", "1.37"):
        kubernetes_validate.validate(steerer, version, strict=True)
    named = render(chart, {"fullnameOverride": "x" * 63})
    assert any(d["metadata"]["name"] == "x" * 50 + "-run-steerer" for d in by_kind(named, "ClusterRole"))
    assert "labkube-run-steerer" not in {d["metadata"]["name"] for d in render(chart, {"rbac": {"create": False}})}


def test_pause_grace_reaches_the_operator(chart: helm_python.Chart) -> None:
    assert operator_config(render(chart)).runs.pause_grace_seconds == 300
    assert operator_config(render(chart, {"runs": {"pauseGraceSeconds": 30}})).runs.pause_grace_seconds == 30


def test_rbac_and_service_account_can_be_left_out(chart: helm_python.Chart) -> None:
    docs = render(chart, {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}})
    assert not {"ClusterRole", "ClusterRoleBinding", "ServiceAccount"} & {d["kind"] for d in docs}
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


# -- values a cluster admin sets (#24 item 7) ------------------------------------------------------

DIGEST = "sha256:" + "ab" * 32
ADMIN: dict[str, Any] = {
    "commonLabels": {"team": "research", "cost-center": "ml-42"},
    "image": {"digest": DIGEST},
    "operator": {
        "envFrom": [{"secretRef": {"name": "labkube-operator-env"}}, {"configMapRef": {"name": "proxy"}}],
        "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corporate-ca"}}],
        "extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        "startupProbe": {"periodSeconds": 5, "failureThreshold": 48},
        "livenessProbe": {"initialDelaySeconds": 30, "timeoutSeconds": 10},
        "readinessProbe": {"periodSeconds": 15},
        "terminationGracePeriodSeconds": 45,
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "labkube"}},
            },
        ],
        "revisionHistoryLimit": 3,
    },
    "service": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}},
    "serviceMonitor": {
        "enabled": True,
        "namespace": "monitoring",
        "scrapeTimeout": "10s",
        "honorLabels": False,
        "relabelings": [{"targetLabel": "cluster", "replacement": "gpu-east"}],
        "metricRelabelings": [
            {"action": "drop", "sourceLabels": ["__name__"], "regex": "labkube_campaign_run_resumes_total"}
        ],
    },
    "podDisruptionBudget": {"minAvailable": "50%"},
}


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def test_admin_values_render_valid_objects_where_they_belong(chart: helm_python.Chart) -> None:
    docs = render(chart, ADMIN)
    check_all(docs)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert deployment["spec"]["revisionHistoryLimit"] == 3
    assert pod["terminationGracePeriodSeconds"] == 45
    assert container["envFrom"] == ADMIN["operator"]["envFrom"]
    assert pod["volumes"][-1] == ADMIN["operator"]["extraVolumes"][0]
    assert container["volumeMounts"][-1] == ADMIN["operator"]["extraVolumeMounts"][0]
    assert {v["name"] for v in pod["volumes"]} >= {"config", "tmp", "dshm", "runs"}  # the chart's own stay
    # A probe value given replaces that timing only; the others keep their defaults.
    assert container["startupProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 0,
        "periodSeconds": 5,
        "timeoutSeconds": 1,
        "failureThreshold": 48,
    }
    assert (
        container["livenessProbe"]["initialDelaySeconds"] == 30 and container["livenessProbe"]["timeoutSeconds"] == 10
    )
    assert container["livenessProbe"]["periodSeconds"] == 20 and container["readinessProbe"]["periodSeconds"] == 15
    # A spread constraint without a selector spreads the operator's own pods; one with a selector keeps it.
    zone, host = pod["topologySpreadConstraints"]
    assert zone["labelSelector"] == deployment["spec"]["selector"]
    assert host["labelSelector"] == {"matchLabels": {"app.kubernetes.io/instance": "labkube"}}
    # The digest pins the operator, and run pods that name no image of their own.
    assert container["image"] == f"ghcr.io/labkube/labkube@{DIGEST}"
    assert operator_config(docs).runs.default_image == f"ghcr.io/labkube/labkube@{DIGEST}"
    service = one(docs, "Service")
    assert service["metadata"]["annotations"] == ADMIN["service"]["annotations"]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}  # still the operator's Service
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scrapeTimeout"] == "10s" and endpoint["honorLabels"] is False
    assert endpoint["relabelings"] == [
        {"targetLabel": "job", "replacement": "labkube-operator"},  # first: the alert rules read it
        *ADMIN["serviceMonitor"]["relabelings"],
    ]
    assert endpoint["metricRelabelings"] == ADMIN["serviceMonitor"]["metricRelabelings"]
    assert one(docs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": "50%",  # minAvailable, when set, is used instead of maxUnavailable
        "selector": deployment["spec"]["selector"],
    }


def test_admin_values_keep_todays_defaults(chart: helm_python.Chart) -> None:
    """The defaults of the new values render what the chart rendered before them."""
    docs = render(chart)
    container, deployment = operator_container(docs), one(docs, "Deployment")
    timings = {
        probe: {k: v for k, v in container[probe].items() if k != "httpGet"}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    # Kubernetes' own defaults (initialDelaySeconds 0, timeoutSeconds 1, failureThreshold 3) now written out.
    assert timings == {
        "startupProbe": {"initialDelaySeconds": 0, "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 60},
        "livenessProbe": {"initialDelaySeconds": 0, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30 and deployment["spec"]["revisionHistoryLimit"] == 10
    assert "envFrom" not in container and "topologySpreadConstraints" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "dshm", "runs"]
    assert "annotations" not in one(docs, "Service")["metadata"]
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    monitor = one(render(chart, {"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE and "metricRelabelings" not in monitor["spec"]["endpoints"][0]


def test_pod_disruption_budget_toggle(chart: helm_python.Chart) -> None:
    assert not by_kind(render(chart, {"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")
    # with one replica a budget could only block drains (minAvailable 1) or allow everything: none is rendered
    single = {"replicas": 1, "leaderElection": {"enabled": False}}
    assert not by_kind(
        render(chart, {"operator": single, "podDisruptionBudget": {"enabled": True}}), "PodDisruptionBudget"
    )
    docs = render(chart, {"operator": {"replicas": 3}, "podDisruptionBudget": {"maxUnavailable": "34%"}})
    check_all(docs)
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "34%"
    docs = render(chart, {"operator": {"replicas": 3}, "podDisruptionBudget": {"minAvailable": 2}})
    spec = one(docs, "PodDisruptionBudget")["spec"]
    assert spec["minAvailable"] == 2 and "maxUnavailable" not in spec


def test_common_labels_are_on_every_object_the_chart_renders(chart: helm_python.Chart) -> None:
    """Every object of every optional template (and the run pods' policies the operator copies into each namespace
    with runs, and the operator pod); not the CRDs, which Helm installs from crds/ untemplated."""
    labels = {"team": "research", "cost-center": "ml-42"}
    values = {**ALL_FLAGS, "commonLabels": labels}
    docs = render(chart, values)
    check_all(docs)
    for doc in [*docs, *run_policies(docs)]:
        assert doc["metadata"]["labels"].items() >= labels.items(), (doc["kind"], doc["metadata"]["name"])
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= labels.items()
    assert not labels.items() & deployment["spec"]["selector"]["matchLabels"].items()  # the selector is immutable
    for crd in chart.crds:
        assert "team" not in crd["data"]


# -- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"surprise": True}, "surprise"),
        ({"operator": {"metricsPort": "http"}}, "metricsPort"),
        ({"operator": {"logLevel": "loud"}}, "logLevel"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"runs": {"workspace": {"mode": "nfs"}}}, "mode"),
        ({"runs": {"workspace": {"size": "lots"}}}, "size"),
        ({"runs": {"apiKeys": [{"env": "OPENAI_API_KEY", "key": "k"}]}}, "secretName"),
        ({"runs": {"apiKeys": [{"env": "A", "secretName": "s", "key": "k", "value": "sk-literal"}]}}, "value"),
        ({"runs": {"env": {"NOT VALID": "x"}}}, "NOT VALID"),
        ({"runs": {"gpuResourceName": "gpu"}}, "gpuResourceName"),
        ({"networkPolicy": {"allowedCIDRs": ["api.openai.com"]}}, "allowedCIDRs"),
        ({"serviceMonitor": {"enabled": "yes"}}, "enabled"),
        ({"serviceMonitor": {"interval": "soon"}}, "interval"),
        # misspelled keys: every object of the schema has additionalProperties false
        ({"operator": {"replicsa": 3}}, "replicsa"),
        ({"serviceMonitor": {"intervall": "15s"}}, "intervall"),
        ({"operator": {"livenessProbe": {"periodSecond": 5}}}, "periodSecond"),
        ({"rayCluster": {"head": {"nodeSelectr": {"pool": "cpu"}}}}, "nodeSelectr"),
        ({"podDisruptionBudget": {"maxUnavailabe": 1}}, "maxUnavailabe"),
        # a run is graded in a pod of its own after its agent's pod ends: its workspace must outlive that pod
        ({"runs": {"workspace": {"mode": "emptyDir"}}}, "mode"),
        ({"runs": {"workspace": {"mode": "emptyDir", "existingClaim": "shared"}}}, "mode"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"podDisruptionBudget": {"minAvailable": "half"}}, "minAvailable"),
        ({"operator": {"startupProbe": {"failureThreshold": 0}}}, "failureThreshold"),
        ({"operator": {"extraVolumeMounts": [{"name": "ca"}]}}, "mountPath"),
        ({"operator": {"envFrom": [{"secretRefs": {"name": "s"}}]}}, "secretRefs"),
        ({"serviceMonitor": {"scrapeTimeout": "10"}}, "scrapeTimeout"),
        ({"commonLabels": {"team": "research and development"}}, "commonLabels"),
        ({"runs": {"podLabels": {"app.kubernetes.io/component": "x"}}}, "app.kubernetes.io/component"),
        ({"runs": {"podLabels": {"labkube.dev/run": "x"}}}, "labkube.dev/run"),
        ({"runs": {"podLabels": {"kueue.x-k8s.io/queue-name": "q"}}}, "kueue.x-k8s.io/queue-name"),
        ({"runs": {"podLabels": {"team": "research and development"}}}, "podLabels"),
        ({"runs": {"podAnnotations": {"labkube.dev/run-id": "x"}}}, "labkube.dev/run-id"),
        ({"runs": {"cpuLimits": "yes"}}, "cpuLimits"),
        ({"runs": {"workspace": {"keepFinished": "no"}}}, "keepFinished"),
        ({"runs": {"imagePullTimeoutSeconds": 30}}, "imagePullTimeoutSeconds"),
        ({"runs": {"gradingDeadlineSeconds": "1h"}}, "gradingDeadlineSeconds"),
        ({"tenancy": {"podLabels": [""]}}, "podLabels"),
        ({"tenancy": {"podAnnotation": ["x"]}}, "podAnnotation"),
    ],
)
def test_values_that_violate_the_schema_are_rejected(
    chart: helm_python.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"networkPolicy": {"enabled": True, "allowedHosts": ["api.openai.com"]}}, r"networkPolicy\.allowedHosts"),
        ({"networkPolicy": {"enabled": False, "cilium": True}}, r"networkPolicy\.cilium"),
        ({"operator": {"metricsPort": 9000, "healthPort": 9000}}, r"operator\.metricsPort .* 9000"),
        (
            {"operator": {"leaderElection": {"enabled": False}}},
            r"operator\.replicas is 2 but operator\.leaderElection\.enabled is false",
        ),
        ({"operator": {"leaderElection": {"renewDeadlineSeconds": 20}}}, r"renewDeadlineSeconds \(20\)"),
        ({"runs": {"world": {"image": "w", "port": 9400}}}, r"runs\.world\.port .* 9400"),
        ({"runs": {"env": {"HF_TOKEN": "hf_x"}}}, r"runs\.env\.HF_TOKEN looks like a secret"),
        ({"serviceAccount": {"create": False}}, r"serviceAccount\.name"),
        ({"commonLabels": {"app.kubernetes.io/name": "x"}}, r"commonLabels\.app\.kubernetes\.io/name is a label"),
        ({"operator": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}}, r'extraVolumes has a volume named "tmp"'),
        (
            {"operator": {"extraVolumeMounts": [{"name": "x", "mountPath": "/runs/"}]}},
            r'extraVolumeMounts mounts "x" at /runs/',
        ),
        (
            {"podDisruptionBudget": {"minAvailable": None, "maxUnavailable": ""}},
            r"podDisruptionBudget\.enabled is true but neither minAvailable nor maxUnavailable",
        ),
    ],
)
def test_validate_config_fails_with_the_key_and_value(
    chart: helm_python.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_values_schema_is_a_valid_schema_that_accepts_the_defaults() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(defaults)
    jsonschema.Draft202012Validator(schema).validate(ALL_FLAGS)


def test_every_value_is_documented() -> None:
    """A `# --` comment on every value, or on the map it belongs to (helm-docs style); a section
    (a key whose value is a block of further keys) needs none."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    key_line = re.compile(r"^(\s*)([A-Za-z_][\w.-]*):(.*)$")
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    missing = []
    for i, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        while documented and documented[-1][0] >= indent:
            documented.pop()
        j = i - 1
        comment = []
        while j >= 0 and lines[j].strip().startswith("#"):
            comment.append(lines[j].strip())
            j -= 1
        own = any(c.startswith("# --") for c in comment)
        following = next((x for x in lines[i + 1 :] if x.strip() and not x.strip().startswith("#")), "")
        section = not match.group(3).strip() and bool(key_line.match(following))
        section = section and len(following) - len(following.lstrip()) > indent
        if not (own or section or any(d for _, d in documented)):
            missing.append(f"line {i + 1}: {match.group(2)}")
        documented.append((indent, own))
    assert not missing, missing


# -- lint, CRDs, README -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL_FLAGS, ADMIN], ids=["defaults", "all-flags", "admin"])
def test_lint_is_clean(chart_dir: Path, values: dict[str, Any] | None) -> None:
    report = helm_python.lint(chart_dir, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report
    assert report["total_charts_linted"] == 1


def test_lint_reports_bad_values(chart_dir: Path) -> None:
    report = helm_python.lint(chart_dir, {"operator": {"logLevel": "loud"}}, namespace=NAMESPACE)
    assert report["errors"]


def test_the_real_chart_lints_clean() -> None:
    report = helm_python.lint(CHART, strict=True)
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"], report


def test_chart_ships_the_generated_crds(chart: helm_python.Chart) -> None:
    shipped = {Path(c["filename"]).name: c["data"] for c in chart.crds}
    assert shipped == crd_files()
    for text in shipped.values():
        assert "{{" not in text  # crds/ is never templated


def readme_campaign() -> dict[str, Any]:
    text = (CHART / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    campaigns = [d for b in blocks for d in yaml.safe_load_all(b) if d and d.get("kind") == "Campaign"]
    assert len(campaigns) == 1
    return campaigns[0]


def test_readme_example_campaign_validates_against_the_crd() -> None:
    example = readme_campaign()
    validate_resource(example, campaign_crd())
    spec = spec_from_resource(example)
    assert spec.name == example["metadata"]["name"] and spec.backend == "k8s"


def test_dashboards_link_points_at_the_top_level_dashboards() -> None:
    link = CHART / "dashboards"
    assert link.is_symlink() and Path(link.readlink()) == Path("../../dashboards")
    assert link.resolve() == (ROOT / "dashboards").resolve()
    assert link.resolve().is_dir(), "dashboards/ must exist (commit it with at least one file) or the chart won't load"


def test_the_real_dashboards_render_when_present() -> None:
    with helm_python.Chart.load(CHART) as real:
        names = [f["name"] for f in real.files if f["name"].startswith("dashboards/")]
        values: dict[str, Any] = {}
        if any(n.endswith(".json") for n in names):
            values["grafanaDashboards"] = {"enabled": True}
        rule_files = [f for f in real.files if re.search(r"^dashboards/[^/]+\.ya?ml$", f["name"])]
        if any("groups" in (yaml.safe_load(f["data"]) or {}) for f in rule_files):
            values["prometheusRule"] = {"enabled": True}
        if not values:
            pytest.skip("dashboards/ holds no dashboard or rule file yet")
        docs = objects(real.render(values, name=RELEASE, namespace=NAMESPACE))
    check_all(docs)
    for doc in by_kind(docs, "ConfigMap"):
        for key, data in doc.get("data", {}).items():
            if key.endswith(".json"):
                json.loads(data)


def test_run_pod_values_reach_the_config_and_every_pod_the_operator_builds(chart: helm_python.Chart) -> None:
    """runs.podLabels/podAnnotations/cpuLimits and workspace.keepFinished, and tenancy.podLabels/podAnnotations,
    as the operator reads them; the pod and claim it builds from them pass kubernetes-validate --strict, with a CPU
    limit on every container and the claim sized from the task's disk_gb."""
    from labkube.operator.pod_manifest import build_pvc_manifest

    config = operator_config(render(chart, ALL_FLAGS))
    assert config.runs.cpu_limits and not config.runs.workspace.keep_finished
    assert config.runs.labels == {"team": "research"}
    assert config.runs.annotations == {"example.com/owner": "evals", "sidecar.istio.io/inject": "true"}
    assert config.tenancy.pod_labels == ["team", "cost.example.com/"]
    assert config.tenancy.pod_annotations == ["example.com/*"]
    defaults = operator_config(render(chart))
    assert not defaults.runs.cpu_limits and defaults.runs.workspace.keep_finished
    assert defaults.runs.labels == {} == defaults.runs.annotations
    assert defaults.tenancy.pod_labels == [] == defaults.tenancy.pod_annotations

    run = RunResourceSpec(
        run_id="t--openai-gpt-5--s0",
        campaign="c",
        task="researchgym/t",
        task_path="/opt/tasks/t",
        model="openai:gpt-5",
        seed=0,
        resources=Resources(cpus=2, disk_gb=300),
        family=TaskFamily.gaia2,
    )
    owner = {"apiVersion": "labkube.dev/v1alpha1", "kind": "Run", "metadata": {"name": "c-t", "uid": "u"}}
    pod = build_pod_manifest(run, config.runs, owner=owner)
    kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    assert pod["metadata"]["labels"]["team"] == "research"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "true"
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        assert "cpu" in container["resources"]["limits"], container["name"]
    claim = build_pvc_manifest(run, config.runs, owner=owner)
    assert claim is not None and claim["spec"]["resources"]["requests"]["storage"] == "300Gi"
    kubernetes_validate.validate(claim, KUBE_VERSION, strict=True)
