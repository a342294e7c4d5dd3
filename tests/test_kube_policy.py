"""The test-side policy checkers: Pod Security Standards (restricted) and NetworkPolicy evaluation.

Each checker stands in for something the fake cluster does not do (admission, a CNI enforcing policies), so its own
tests pin it to the documented semantics: a compliant object passes, and each rule, broken alone, is caught once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kube_policy import (
    Endpoint,
    allowed,
    is_isolated,
    matches_selector,
    policy_types,
    pss_restricted_violations,
    pss_violations,
    selects,
)

# == Part 1: Pod Security Standards ================================================================================

APPARMOR_AGENT = "container.apparmor.security.beta.kubernetes.io/agent"


def container(name: str, **extra: Any) -> dict[str, Any]:
    """A container that meets `restricted` on its own: no escalation, no capabilities, seccomp confined."""
    return {
        "name": name,
        "image": "ghcr.io/labkube/runner:0.1.0",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "procMount": "Default",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **extra,
    }


def compliant_pod() -> dict[str, Any]:
    """A pod that sets every restricted field to an allowed value, explicitly where it may, so that each breaking
    case changes one thing. It has every kind of container and every allowed volume type."""
    agent = container(
        "agent",
        ports=[{"name": "metrics", "containerPort": 9400}],
        livenessProbe={"httpGet": {"path": "/healthz", "port": "metrics"}},
        readinessProbe={"tcpSocket": {"port": 9400}},
        lifecycle={"preStop": {"httpGet": {"path": "/drain", "port": 9400}}},
    )
    agent["securityContext"]["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "run-0", "annotations": {APPARMOR_AGENT: "runtime/default"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
                "appArmorProfile": {"type": "RuntimeDefault"},
                "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
                "windowsOptions": {"hostProcess": False},
            },
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "initContainers": [container("init")],
            "containers": [agent, container("world", ports=[{"containerPort": 8765, "hostPort": 0}])],
            "ephemeralContainers": [container("debug")],
            "volumes": [
                {"name": "config", "configMap": {"name": "run-0"}},
                {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "keys", "secret": {"secretName": "run-0"}},
                {"name": "info", "downwardAPI": {"items": []}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "defaulted"},
                {"name": "workspace", "persistentVolumeClaim": {"claimName": "run-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "secrets-store", "csi": {"driver": "secrets-store.csi.k8s.io"}},
                {"name": "dataset", "image": {"reference": "ghcr.io/labkube/dataset:1"}},
            ],
        },
    }


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i.get("name") == name)


def agent_sc(pod: dict[str, Any]) -> dict[str, Any]:
    sc: dict[str, Any] = by_name(pod["spec"]["containers"], "agent")["securityContext"]
    return sc


def pod_sc(pod: dict[str, Any]) -> dict[str, Any]:
    sc: dict[str, Any] = pod["spec"]["securityContext"]
    return sc


Mutation = Callable[[dict[str, Any]], Any]

# (control, how to break it, the field path the one violation must name)
BREAKING: list[tuple[str, Mutation, str]] = [
    (
        "hostProcess-pod",
        lambda p: pod_sc(p)["windowsOptions"].update(hostProcess=True),
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    (
        "hostProcess-container",
        lambda p: agent_sc(p).update(windowsOptions={"hostProcess": True}),
        "spec.containers[agent].securityContext.windowsOptions.hostProcess",
    ),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "spec.hostPID"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC"),
    (
        "privileged",
        lambda p: agent_sc(p).update(privileged=True),
        "spec.containers[agent].securityContext.privileged",
    ),
    (
        "privileged-ephemeral",
        lambda p: by_name(p["spec"]["ephemeralContainers"], "debug")["securityContext"].update(privileged=True),
        "spec.ephemeralContainers[debug].securityContext.privileged",
    ),
    (
        "capabilities-baseline-add",
        lambda p: agent_sc(p)["capabilities"].update(add=["SYS_ADMIN"]),
        "spec.containers[agent].securityContext.capabilities.add",
    ),
    (
        "capabilities-restricted-add",
        lambda p: agent_sc(p)["capabilities"].update(add=["CHOWN"]),
        "spec.containers[agent].securityContext.capabilities.add",
    ),
    (
        "capabilities-drop",
        lambda p: agent_sc(p)["capabilities"].update(drop=["NET_RAW"]),
        "spec.containers[agent].securityContext.capabilities.drop",
    ),
    (
        "capabilities-unset",
        lambda p: by_name(p["spec"]["initContainers"], "init")["securityContext"].pop("capabilities"),
        "spec.initContainers[init].securityContext.capabilities.drop",
    ),
    (
        "hostPath-volume",
        lambda p: p["spec"]["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}),
        "spec.volumes[docker].hostPath",
    ),
    (
        "nfs-volume",
        lambda p: p["spec"]["volumes"].append({"name": "share", "nfs": {"server": "nfs", "path": "/"}}),
        "spec.volumes[share].nfs",
    ),
    (
        "gitRepo-volume",
        lambda p: p["spec"]["volumes"].append({"name": "src", "gitRepo": {"repository": "https://x/y.git"}}),
        "spec.volumes[src].gitRepo",
    ),
    (
        "hostPort",
        lambda p: by_name(p["spec"]["containers"], "agent")["ports"][0].update(hostPort=9400),
        "spec.containers[agent].ports[metrics].hostPort",
    ),
    (
        "apparmor-annotation",
        lambda p: p["metadata"]["annotations"].update({APPARMOR_AGENT: "unconfined"}),
        f"metadata.annotations[{APPARMOR_AGENT}]",
    ),
    (
        "apparmor-pod",
        lambda p: pod_sc(p).update(appArmorProfile={"type": "Unconfined"}),
        "spec.securityContext.appArmorProfile.type",
    ),
    (
        "apparmor-container",
        lambda p: agent_sc(p).update(appArmorProfile={"type": "Unconfined"}),
        "spec.containers[agent].securityContext.appArmorProfile.type",
    ),
    (
        "selinux-type",
        lambda p: pod_sc(p)["seLinuxOptions"].update(type="spc_t"),
        "spec.securityContext.seLinuxOptions.type",
    ),
    (
        "selinux-user",
        lambda p: agent_sc(p).update(seLinuxOptions={"user": "system_u"}),
        "spec.containers[agent].securityContext.seLinuxOptions.user",
    ),
    (
        "selinux-role",
        lambda p: agent_sc(p).update(seLinuxOptions={"role": "system_r"}),
        "spec.containers[agent].securityContext.seLinuxOptions.role",
    ),
    (
        "procMount",
        lambda p: agent_sc(p).update(procMount="Unmasked"),
        "spec.containers[agent].securityContext.procMount",
    ),
    (
        "seccomp-pod-unconfined",
        lambda p: pod_sc(p).update(seccompProfile={"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
    ),
    (
        "seccomp-container-unconfined",
        lambda p: agent_sc(p).update(seccompProfile={"type": "Unconfined"}),
        "spec.containers[agent].securityContext.seccompProfile.type",
    ),
    (
        "seccomp-unset",
        lambda p: pod_sc(p).pop("seccompProfile") and agent_sc(p).pop("seccompProfile"),
        "spec.securityContext.seccompProfile",
    ),
    (
        "sysctl",
        lambda p: pod_sc(p)["sysctls"].append({"name": "kernel.msgmax", "value": "65536"}),
        "spec.securityContext.sysctls[kernel.msgmax]",
    ),
    (
        "probe-host",
        lambda p: by_name(p["spec"]["containers"], "agent")["livenessProbe"]["httpGet"].update(host="169.254.169.254"),
        "spec.containers[agent].livenessProbe.httpGet.host",
    ),
    (
        "lifecycle-host",
        lambda p: by_name(p["spec"]["containers"], "agent")["lifecycle"]["preStop"]["httpGet"].update(host="10.0.0.1"),
        "spec.containers[agent].lifecycle.preStop.httpGet.host",
    ),
    (
        "allowPrivilegeEscalation-true",
        lambda p: agent_sc(p).update(allowPrivilegeEscalation=True),
        "spec.containers[agent].securityContext.allowPrivilegeEscalation",
    ),
    (
        "allowPrivilegeEscalation-unset",
        lambda p: by_name(p["spec"]["initContainers"], "init")["securityContext"].pop("allowPrivilegeEscalation"),
        "spec.initContainers[init].securityContext.allowPrivilegeEscalation",
    ),
    (
        "runAsNonRoot-pod-false",
        lambda p: pod_sc(p).update(runAsNonRoot=False),
        "spec.securityContext.runAsNonRoot",
    ),
    ("runAsNonRoot-unset", lambda p: pod_sc(p).pop("runAsNonRoot"), "spec.securityContext.runAsNonRoot"),
    (
        "runAsNonRoot-container-false",
        lambda p: agent_sc(p).update(runAsNonRoot=False),
        "spec.containers[agent].securityContext.runAsNonRoot",
    ),
    ("runAsUser-pod", lambda p: pod_sc(p).update(runAsUser=0), "spec.securityContext.runAsUser"),
    (
        "runAsUser-container",
        lambda p: agent_sc(p).update(runAsUser=0),
        "spec.containers[agent].securityContext.runAsUser",
    ),
]


def broken(mutate: Mutation) -> dict[str, Any]:
    pod = compliant_pod()
    mutate(pod)
    return pod


def test_compliant_pod_has_no_violations() -> None:
    assert pss_restricted_violations(compliant_pod()) == []
    assert pss_violations(compliant_pod(), level="baseline") == []


@pytest.mark.parametrize(("mutate", "path"), [pytest.param(m, p, id=i) for i, m, p in BREAKING])
def test_each_control_broken_alone_is_one_violation(mutate: Mutation, path: str) -> None:
    (violation,) = pss_restricted_violations(broken(mutate))
    assert violation.startswith(f"{path}: ")


def test_violation_line_format() -> None:
    pod = broken(lambda p: agent_sc(p)["capabilities"].update(drop=[]))
    assert pss_restricted_violations(pod) == [
        "spec.containers[agent].securityContext.capabilities.drop: must include ALL"
    ]


BASELINE_ONLY = {"hostProcess-pod", "hostProcess-container", "hostNetwork", "hostPID", "hostIPC", "privileged"}
BASELINE_ONLY |= {"privileged-ephemeral", "capabilities-baseline-add", "hostPath-volume", "hostPort", "sysctl"}
BASELINE_ONLY |= {"apparmor-annotation", "apparmor-pod", "apparmor-container", "selinux-type", "selinux-user"}
BASELINE_ONLY |= {"selinux-role", "procMount", "seccomp-pod-unconfined", "seccomp-container-unconfined"}
BASELINE_ONLY |= {"probe-host", "lifecycle-host"}


@pytest.mark.parametrize(("control", "mutate", "path"), [pytest.param(*case, id=case[0]) for case in BREAKING])
def test_baseline_catches_only_baseline_controls(control: str, mutate: Mutation, path: str) -> None:
    violations = pss_violations(broken(mutate), level="baseline")
    if control in BASELINE_ONLY:
        (violation,) = violations
        assert violation.startswith(f"{path}: ")
    else:
        assert violations == []


def test_several_violations_are_all_reported() -> None:
    pod = compliant_pod()
    pod["spec"]["hostNetwork"] = True
    del pod["spec"]["securityContext"]
    for c in pod["spec"]["containers"]:
        c["securityContext"] = {}
    violations = pss_restricted_violations(pod)
    assert [v.split(":")[0] for v in violations] == [
        "spec.hostNetwork",
        "spec.containers[agent].securityContext.capabilities.drop",
        "spec.containers[world].securityContext.capabilities.drop",
        "spec.securityContext.seccompProfile",
        "spec.containers[agent].securityContext.allowPrivilegeEscalation",
        "spec.containers[world].securityContext.allowPrivilegeEscalation",
        "spec.securityContext.runAsNonRoot",
    ]
    assert "unset on spec.initContainers[init], spec.containers[agent]" in violations[-1]


def test_accepts_pod_spec_pod_template_and_workloads() -> None:
    pod = broken(lambda p: p["spec"].update(hostPID=True))
    template = {"metadata": pod["metadata"], "spec": pod["spec"]}
    deployment = {"kind": "Deployment", "spec": {"replicas": 1, "template": template}}
    cronjob = {"kind": "CronJob", "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}}
    pod_template = {"kind": "PodTemplate", "template": template}
    expected = ["spec.hostPID: must be false or unset"]
    for obj in (pod, pod["spec"], template, deployment, cronjob, pod_template):
        assert pss_restricted_violations(obj) == expected
    with pytest.raises(ValueError, match="found no containers"):
        pss_restricted_violations({"kind": "ConfigMap", "data": {}})


def test_annotations_need_metadata() -> None:
    pod = broken(lambda p: p["metadata"]["annotations"].update({APPARMOR_AGENT: "unconfined"}))
    assert len(pss_restricted_violations(pod)) == 1
    assert pss_restricted_violations(pod["spec"]) == []  # a bare spec cannot carry them


def test_apparmor_annotation_allows_localhost_profiles() -> None:
    pod = broken(lambda p: p["metadata"]["annotations"].update({APPARMOR_AGENT: "localhost/labkube"}))
    assert pss_restricted_violations(pod) == []


def test_container_settings_can_replace_pod_settings() -> None:
    """runAsNonRoot and seccomp may be set on every container instead of the pod (ephemeral ones included); a pod's
    explicit Unconfined still fails even when every container overrides it, as in the admission plugin."""
    pod = compliant_pod()
    del pod_sc(pod)["runAsNonRoot"], pod_sc(pod)["seccompProfile"]
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod["spec"][kind]:
            c["securityContext"]["runAsNonRoot"] = True
    assert pss_restricted_violations(pod) == []
    pod_sc(pod)["seccompProfile"] = {"type": "Unconfined"}
    assert pss_restricted_violations(pod) == [
        "spec.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost, not 'Unconfined'"
    ]
    localhost = broken(lambda p: agent_sc(p).update(seccompProfile={"type": "Localhost", "localhostProfile": "x"}))
    assert pss_restricted_violations(localhost) == []


def test_null_fields_are_unset() -> None:
    pod = compliant_pod()
    pod["spec"]["volumes"] = None
    pod_sc(pod)["sysctls"] = None
    by_name(pod["spec"]["containers"], "world")["ports"] = None
    agent_sc(pod).update(appArmorProfile=None, seLinuxOptions=None, capabilities={"drop": ["ALL"], "add": None})
    assert pss_restricted_violations(pod) == []


def test_windows_pods_are_exempt_from_linux_only_controls() -> None:
    pod = compliant_pod()
    pod["spec"]["os"] = {"name": "windows"}
    del pod_sc(pod)["seccompProfile"]
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod["spec"][kind]:
            c["securityContext"] = {}
    assert pss_restricted_violations(pod) == []
    by_name(pod["spec"]["containers"], "agent")["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    (violation,) = pss_restricted_violations(pod)  # the baseline rule still holds
    assert violation.startswith("spec.containers[agent].securityContext.capabilities.add: must not add SYS_ADMIN")


def test_user_namespaces_relax_root_controls_since_1_35() -> None:
    pod = compliant_pod()
    pod["spec"]["hostUsers"] = False
    pod_sc(pod).update(runAsNonRoot=False, runAsUser=0)
    assert pss_restricted_violations(pod, version="1.35") == []
    assert len(pss_restricted_violations(pod, version="1.34")) == 2
    agent_sc(pod)["procMount"] = "Unmasked"
    assert len(pss_restricted_violations(pod, version="1.35")) == 1  # restricted keeps the /proc masks
    assert pss_violations(pod, level="baseline", version="1.35") == []
    assert len(pss_violations(pod, level="baseline", version="1.34")) == 1


@pytest.mark.parametrize(
    ("mutate", "since"),
    [
        pytest.param(lambda p: pod_sc(p)["sysctls"].append({"name": "net.ipv4.tcp_rmem"}), 32, id="sysctl-tcp_rmem"),
        pytest.param(
            lambda p: pod_sc(p)["sysctls"].append({"name": "net.ipv4.tcp_keepalive_time"}), 29, id="sysctl-keepalive"
        ),
        pytest.param(
            lambda p: pod_sc(p)["sysctls"].append({"name": "net.ipv4.ip_local_reserved_ports"}), 27, id="sysctl-ports"
        ),
        pytest.param(lambda p: pod_sc(p)["seLinuxOptions"].update(type="container_engine_t"), 31, id="selinux"),
    ],
)
def test_allowances_follow_the_policy_version(mutate: Mutation, since: int) -> None:
    pod = broken(mutate)
    assert pss_restricted_violations(pod, version=f"v1.{since}") == []
    assert len(pss_restricted_violations(pod, version=f"1.{since - 1}")) == 1


def test_probe_hosts_are_checked_since_1_34() -> None:
    pod = broken(lambda p: by_name(p["spec"]["containers"], "agent")["readinessProbe"]["tcpSocket"].update(host="x"))
    assert pss_restricted_violations(pod, version="1.33") == []
    assert len(pss_restricted_violations(pod, version="1.34")) == 1
    assert pss_restricted_violations(pod, version="latest") == pss_restricted_violations(pod)


@pytest.mark.parametrize("version", ["1.24", "2.0", "1.x", "v1"])
def test_unmodelled_versions_are_refused(version: str) -> None:
    with pytest.raises(ValueError, match="version"):
        pss_restricted_violations(compliant_pod(), version=version)


# == Part 2: NetworkPolicy =========================================================================================

RUN_LABELS = {"app.kubernetes.io/name": "labkube-run", "labkube.dev/campaign": "sweep"}

run = Endpoint("10.0.1.5", "research", RUN_LABELS, {"team": "ml"}, {"metrics": 9400})
peer_run = Endpoint("10.0.1.6", "research", RUN_LABELS, {"team": "ml"})
notebook = Endpoint("10.0.1.7", "research", {"app": "notebook"}, {"team": "ml"})
kube_dns = Endpoint("10.0.0.10", "kube-system", {"k8s-app": "kube-dns"})
metrics_server = Endpoint("10.0.0.11", "kube-system", {"k8s-app": "metrics-server"})
fake_dns = Endpoint("10.0.2.9", "research", {"k8s-app": "kube-dns"}, {"team": "ml"})
prometheus = Endpoint("10.0.3.3", "monitoring", {"app.kubernetes.io/name": "prometheus"})
internet = Endpoint("93.184.216.34")
metadata_service = Endpoint("169.254.169.254")
internet_v6 = Endpoint("2606:2800:220:1::1")


def network_policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


RUN_SELECTOR = {"matchLabels": {"app.kubernetes.io/name": "labkube-run"}}
DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
DNS_ONLY = network_policy(
    "runs",
    "research",
    {"podSelector": RUN_SELECTOR, "policyTypes": ["Egress"], "egress": [{"to": [DNS_PEER], "ports": DNS_PORTS}]},
)
DEFAULT_DENY = network_policy("deny", "research", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})


def test_no_policies_allow_everything() -> None:
    for src, dst in [(run, kube_dns), (run, internet), (internet, run), (prometheus, run)]:
        assert allowed([], src, dst, 443)


def test_default_deny_isolates_every_pod_of_its_namespace() -> None:
    policies = [DEFAULT_DENY]
    assert not allowed(policies, run, peer_run, 8080)
    assert not allowed(policies, run, kube_dns, 53, "UDP")
    assert not allowed(policies, run, internet, 443)
    assert not allowed(policies, prometheus, run, 9400)
    assert not allowed(policies, internet, notebook, 443)
    assert allowed(policies, prometheus, kube_dns, 53, "UDP")  # other namespaces are untouched
    assert allowed(policies, internet, kube_dns, 53)
    assert is_isolated(policies, notebook, "Ingress") and is_isolated(policies, notebook, "Egress")
    assert not is_isolated(policies, kube_dns, "Egress")


def test_dns_only_egress() -> None:
    policies = [DNS_ONLY]
    assert allowed(policies, run, kube_dns, 53, "UDP")
    assert allowed(policies, run, kube_dns, 53, "TCP")
    assert allowed(policies, run, kube_dns, 53, "udp")
    assert not allowed(policies, run, kube_dns, 53, "SCTP")
    assert not allowed(policies, run, kube_dns, 5353, "UDP")
    assert not allowed(policies, run, metrics_server, 53, "UDP")  # right namespace, wrong pod
    assert not allowed(policies, run, fake_dns, 53, "UDP")  # right labels, wrong namespace
    assert not allowed(policies, run, internet, 53, "UDP")
    assert not allowed(policies, run, metadata_service, 80)
    assert not allowed(policies, run, peer_run, 8080)
    assert allowed(policies, prometheus, run, 9400)  # ingress is not restricted by an Egress-only policy


def test_unselected_pod_is_not_isolated() -> None:
    policies = [DNS_ONLY, network_policy("ingress", "research", {"podSelector": RUN_SELECTOR, "ingress": []})]
    assert not is_isolated(policies, notebook, "Egress") and not is_isolated(policies, notebook, "Ingress")
    assert allowed(policies, notebook, internet, 443)
    assert allowed(policies, notebook, metadata_service, 80)
    assert allowed(policies, internet, notebook, 8888)
    assert not allowed(policies, notebook, run, 9400)  # but the run pod it talks to is isolated for ingress
    same_labels_elsewhere = Endpoint("10.0.9.9", "evals", RUN_LABELS)
    assert not selects(DNS_ONLY, same_labels_elsewhere)  # a policy selects pods of its own namespace only
    assert allowed(policies, same_labels_elsewhere, internet, 443)


def test_ip_block_with_except() -> None:
    policy = network_policy(
        "internet",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32", "10.0.0.0/8"]}}]},
            ],
        },
    )
    assert allowed([policy], run, internet, 443)
    assert not allowed([policy], run, metadata_service, 80)
    assert allowed([policy], run, Endpoint("169.254.169.253"), 80)  # just outside the /32
    assert not allowed([policy], run, kube_dns, 53, "UDP")  # pods are matched by address too: 10/8 is excepted
    assert not allowed([policy], run, internet_v6, 443)  # an IPv4 block does not cover IPv6
    v6 = network_policy(
        "internet6",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "::/0", "except": ["fd00::/8"]}}], "ports": [{"port": 443}]}],
        },
    )
    assert allowed([policy, v6], run, internet_v6, 443)
    assert not allowed([policy, v6], run, Endpoint("fd00::1"), 443)
    assert not allowed([v6], run, internet_v6, 80)


def test_ip_block_matches_pods_by_address() -> None:
    policy = network_policy(
        "cluster",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}],
        },
    )
    assert allowed([policy], run, kube_dns, 53, "UDP") and allowed([policy], run, metrics_server, 443)
    assert not allowed([policy], run, peer_run, 80)


def test_namespace_and_pod_selector_in_one_peer_is_and_in_two_peers_is_or() -> None:
    both = network_policy(
        "and", "research", {"podSelector": RUN_SELECTOR, "policyTypes": ["Egress"], "egress": [{"to": [DNS_PEER]}]}
    )
    either = network_policy(
        "or",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": DNS_PEER["namespaceSelector"]}, {"podSelector": DNS_PEER["podSelector"]}]}
            ],
        },
    )
    assert allowed([both], run, kube_dns, 53) and allowed([either], run, kube_dns, 53)
    assert not allowed([both], run, metrics_server, 443)
    assert allowed([either], run, metrics_server, 443)  # any pod of kube-system
    assert not allowed([both], run, fake_dns, 53)
    assert allowed([either], run, fake_dns, 53)  # podSelector alone: the policy's own namespace
    assert not allowed([either], run, Endpoint("10.0.9.9", "evals", {"k8s-app": "kube-dns"}), 53)
    assert not allowed([either], run, internet, 53)  # selectors never match non-pods


def test_namespace_selector_on_namespace_labels() -> None:
    policy = network_policy(
        "from-monitoring",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": "metrics"}]}],
        },
    )
    assert allowed([policy], prometheus, run, 9400)  # an empty namespaceSelector: every namespace
    assert not allowed([policy], internet, run, 9400)  # but only pods
    team = copy.deepcopy(policy)
    team["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]
    assert allowed([team], notebook, run, 9400) and not allowed([team], prometheus, run, 9400)


def test_match_expressions() -> None:
    labels = {"app": "run", "tier": "gpu"}
    assert matches_selector({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "tpu"]}]}, labels)
    assert not matches_selector({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]}, labels)
    assert not matches_selector({"matchExpressions": [{"key": "x", "operator": "In", "values": ["a"]}]}, labels)
    assert matches_selector({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, labels)
    assert matches_selector({"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["a"]}]}, labels)
    assert not matches_selector({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, labels)
    assert matches_selector({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert not matches_selector({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    assert matches_selector({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    assert not matches_selector({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, labels)
    combined = {"matchLabels": {"app": "run"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert matches_selector(combined, labels) and not matches_selector(combined, {"app": "run"})
    assert matches_selector({}, {}) and matches_selector(None, labels)
    for bad in ({"key": "a", "operator": "In"}, {"key": "a", "operator": "Exists", "values": ["x"]}):
        with pytest.raises(ValueError):
            matches_selector({"matchExpressions": [bad]}, labels)
    with pytest.raises(ValueError, match="unknown operator"):
        matches_selector({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, labels)


def test_match_expressions_in_a_policy_pod_selector() -> None:
    policy = network_policy(
        "not-notebooks",
        "research",
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["notebook"]}]}},
    )
    assert selects(policy, run) and not selects(policy, notebook)
    assert not allowed([policy], notebook, run, 9400) and allowed([policy], run, notebook, 8888)


def test_named_ports_resolve_on_the_destination() -> None:
    policy = network_policy(
        "scrape",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                    "ports": [{"port": "metrics"}],
                }
            ],
        },
    )
    assert allowed([policy], prometheus, run, 9400)
    assert not allowed([policy], prometheus, run, 9401)
    assert not allowed([policy], prometheus, run, 9400, "UDP")
    assert not allowed([policy], prometheus, peer_run, 9400)  # peer_run has no port named metrics


def test_end_port_ranges() -> None:
    policy = network_policy(
        "range",
        "research",
        {
            "podSelector": RUN_SELECTOR,
            "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": 32000, "endPort": 32768}, {"protocol": "UDP"}]}],
        },
    )
    assert allowed([policy], run, internet, 32000) and allowed([policy], run, internet, 32768)
    assert not allowed([policy], run, internet, 31999) and not allowed([policy], run, internet, 32769)
    assert allowed([policy], run, internet, 1234, "UDP")  # a port entry with a protocol only: every port
    assert not allowed([policy], run, internet, 1234, "TCP")


def test_omitted_policy_types_default() -> None:
    ingress_only = network_policy("i", "research", {"podSelector": RUN_SELECTOR, "ingress": [{}]})
    with_egress = network_policy("e", "research", {"podSelector": RUN_SELECTOR, "egress": [{"ports": [{"port": 443}]}]})
    empty_egress = network_policy("x", "research", {"podSelector": RUN_SELECTOR, "egress": []})
    bare = network_policy("b", "research", {"podSelector": RUN_SELECTOR})
    assert policy_types(ingress_only) == {"Ingress"}
    assert policy_types(with_egress) == {"Ingress", "Egress"}
    assert policy_types(empty_egress) == {"Ingress"}  # `egress: []` isolates nothing without policyTypes
    assert policy_types(bare) == {"Ingress"}
    assert allowed([ingress_only], prometheus, run, 9400)  # `ingress: [{}]` allows all
    assert allowed([ingress_only], run, metadata_service, 80)
    assert allowed([with_egress], run, internet, 443) and not allowed([with_egress], run, internet, 80)
    assert not allowed([with_egress], prometheus, run, 9400)  # no ingress rules: ingress denied
    assert allowed([empty_egress], run, metadata_service, 80)
    assert not allowed([bare], prometheus, run, 9400) and allowed([bare], run, internet, 80)


def test_policies_add_up() -> None:
    scrape = network_policy(
        "scrape", "research", {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}
    )
    assert not allowed([DEFAULT_DENY], prometheus, run, 9400)
    assert allowed([DEFAULT_DENY, scrape], prometheus, run, 9400)
    assert not allowed([DEFAULT_DENY, scrape], run, kube_dns, 53, "UDP")
    assert allowed([DEFAULT_DENY, scrape, DNS_ONLY], run, kube_dns, 53, "UDP")
    assert not allowed([DEFAULT_DENY, scrape, DNS_ONLY], notebook, kube_dns, 53, "UDP")


def test_both_directions_must_allow() -> None:
    dns_ingress = network_policy(
        "dns",
        "kube-system",
        {
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}
            ],
        },
    )
    assert allowed([dns_ingress], prometheus, kube_dns, 53, "UDP")
    assert not allowed([DNS_ONLY, dns_ingress], run, kube_dns, 53, "UDP")  # egress allows, ingress does not


def test_other_policy_kinds_are_ignored() -> None:
    cilium = {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "fqdn", "namespace": "research"},
        "spec": {"endpointSelector": RUN_SELECTOR, "egress": [{"toFQDNs": [{"matchName": "api.openai.com"}]}]},
    }
    calico = {**DEFAULT_DENY, "apiVersion": "projectcalico.org/v3"}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "research"}}
    assert allowed([cilium, calico, config_map, None], run, internet, 443)
    assert allowed([DNS_ONLY, cilium], run, kube_dns, 53, "UDP") and not allowed([DNS_ONLY, cilium], run, internet, 443)
    with pytest.raises(ValueError, match="not a networking"):
        selects(cilium, run)


def test_endpoint() -> None:
    assert run.namespace_labels == {"team": "ml", "kubernetes.io/metadata.name": "research"}
    assert run.is_pod and not internet.is_pod
    assert kube_dns == Endpoint("10.0.0.10", "kube-system", {"k8s-app": "kube-dns"})
    assert len({run, peer_run, run}) == 2
    with pytest.raises(ValueError):
        Endpoint("10.0.0.300")
    with pytest.raises(ValueError, match="only a pod"):
        Endpoint("1.2.3.4", labels={"app": "x"})
    with pytest.raises(ValueError, match="always the namespace"):
        Endpoint("10.0.0.1", "a", namespace_labels={"kubernetes.io/metadata.name": "b"})


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        pytest.param({"ports": [{"port": "53"}]}, "is a string", id="port-as-digit-string"),
        pytest.param({"ports": [{"port": "dns", "endPort": 60}]}, "named port", id="endPort-with-name"),
        pytest.param({"ports": [{"port": 60, "endPort": 53}]}, "below port", id="endPort-below-port"),
        pytest.param({"to": [{}]}, "empty NetworkPolicyPeer", id="empty-peer"),
        pytest.param(
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}, "podSelector": {}}]}, "may not have selectors", id="mixed-peer"
        ),
        pytest.param(
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}]}, "not inside", id="bad-except"
        ),
    ],
)
def test_invalid_policies_raise(rule: dict[str, Any], message: str) -> None:
    policy = network_policy("bad", "research", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [rule]})
    with pytest.raises(ValueError, match=message):
        allowed([policy], run, kube_dns, 53)


def test_policy_without_namespace_raises() -> None:
    policy = {**DEFAULT_DENY, "metadata": {"name": "deny"}}
    with pytest.raises(ValueError, match="has no metadata"):
        allowed([policy], run, internet, 443)


@pytest.mark.parametrize(("port", "protocol"), [(0, "TCP"), (65536, "TCP"), (53, "ICMP")])
def test_invalid_connections_raise(port: int, protocol: str) -> None:
    with pytest.raises(ValueError):
        allowed([], run, internet, port, protocol)
