"""Kubernetes policy semantics as plain functions over manifests, for tests that cannot ask a cluster.

The fake cluster the tests use admits any pod and enforces no NetworkPolicy, so a rendered manifest that a real
cluster would reject (Pod Security Admission, namespace label ``pod-security.kubernetes.io/enforce: restricted``) or
a policy that lets a run pod reach the cloud metadata service would pass every test. This module restates the two
rule sets field by field so that tests can check rendered objects one by one:

* Part 1, :func:`pss_restricted_violations`: the Pod Security Standards, ``restricted`` profile (which includes every
  ``baseline`` control), as in https://kubernetes.io/docs/concepts/security/pod-security-standards/ for Kubernetes
  v1.36 and as enforced by the reference implementation, ``k8s.io/pod-security-admission/policy`` (the doc tables
  are that package's comments). Controls that changed between versions follow the ``version`` argument.
* Part 2, :func:`allowed`: ``networking.k8s.io/v1`` NetworkPolicy semantics, as in
  https://kubernetes.io/docs/concepts/services-networking/network-policies/ and the API reference of
  NetworkPolicySpec: which connections a set of policies lets through.

Both parts are pure Python over dicts as loaded from YAML; neither needs the ``kubernetes`` client. Malformed input
that the API server would reject (a port written as the string ``"53"``, a peer that selects nothing) raises
``ValueError`` instead of being read in some way: a test that passes because its object could never be created is
worse than one that fails.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

# ==================================================================================================================
# Part 1: Pod Security Standards
# ==================================================================================================================

#: The Kubernetes release whose Pod Security Standards page the checks follow when no version is given.
PSS_VERSION = "1.36"
#: The oldest policy version modelled. Older versions read seccomp from annotations and lack the Windows exemptions.
PSS_OLDEST_VERSION = "1.25"

Level = Literal["baseline", "restricted"]

#: Baseline, Capabilities: the container runtime's default set, which may be added back explicitly.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
#: Restricted, Capabilities: the only capability a container may add (after dropping ALL).
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})

#: Baseline, Sysctls: the safe (namespaced, pod-isolated) sysctls, by the minor version that allowed them.
SAFE_SYSCTLS_SINCE: Mapping[int, frozenset[str]] = MappingProxyType(
    {
        0: frozenset(
            {
                "kernel.shm_rmid_forced",
                "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range",
            }
        ),
        27: frozenset({"net.ipv4.ip_local_reserved_ports"}),
        29: frozenset(
            {
                "net.ipv4.tcp_keepalive_time",
                "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes",
            }
        ),
        32: frozenset({"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}),
        # In pod-security-admission for v1.37, unreleased when this was written; only used if asked for.
        37: frozenset({"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}),
    }
)

#: Baseline, SELinux: allowed values of seLinuxOptions.type ("" is the same as unset).
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_1_31 = SELINUX_TYPES | {"container_engine_t"}

#: Restricted, Volume Types: inline volume sources allowed. ``image`` (an OCI image as a read-only volume) was
#: added to the reference implementation in 2025, unversioned: whoever may run an image may also mount it.
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)

#: Baseline, Seccomp and AppArmor: the profile types allowed when set (Restricted also requires seccomp to be set).
CONFINED_PROFILES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"

_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")  # the order the admission plugin visits
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_LIFECYCLE_HOOKS = ("postStart", "preStop")


def pss_restricted_violations(pod: Mapping[str, Any], *, version: str = PSS_VERSION) -> list[str]:
    """Every way ``pod`` breaks the Pod Security Standards ``restricted`` profile (baseline included).

    ``pod`` is a PodSpec, a Pod, a pod template (``{metadata, spec}``), a PodTemplate, or a workload holding one
    (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job: ``spec.template``; CronJob: ``spec.jobTemplate``). Only a
    form with metadata can be checked for the AppArmor annotations.

    Returns one line per offending field, ``"<path>: <what is wrong>"``, with paths relative to the pod as the
    standard writes them (``spec.containers[agent].securityContext.capabilities.drop: must include ALL``),
    containers and volumes named rather than numbered. An empty list means the pod would be admitted. A control
    shared by both profiles (a hostPath volume is both a baseline HostPath volume and a restricted volume type) is
    reported once, as the admission plugin does with its overriding checks.

    ``version`` is the policy version, as in the namespace label ``pod-security.kubernetes.io/enforce-version``
    (``"1.33"``, ``"v1.33"`` or ``"latest"`` for :data:`PSS_VERSION`).
    """
    return pss_violations(pod, level="restricted", version=version)


def pss_violations(pod: Mapping[str, Any], *, level: Level = "restricted", version: str = PSS_VERSION) -> list[str]:
    """Like :func:`pss_restricted_violations`, for either profile: ``baseline`` skips the restricted-only controls."""
    if level not in ("baseline", "restricted"):
        raise ValueError(f"unknown Pod Security Standards level {level!r}")
    metadata, spec = _pod_parts(pod)
    ctx = _PodContext(metadata=metadata, spec=spec, minor=_minor_version(version), restricted=level == "restricted")
    return [f"{path}: {message}" for check in _CHECKS for path, message in check(ctx)]


def _minor_version(version: str) -> int:
    """The minor version of ``"1.33"``, ``"v1.33"`` or ``"latest"``: the only part the standard's changes depend on."""
    text = PSS_VERSION if version == "latest" else version.removeprefix("v")
    major, _, minor = text.partition(".")
    if major != "1" or not minor.isdigit():
        raise ValueError(f"policy version {version!r}: expected 'latest' or '1.<minor>'")
    if int(minor) < int(PSS_OLDEST_VERSION.split(".")[1]):
        raise ValueError(f"policy version {version!r} is older than {PSS_OLDEST_VERSION}, which is not modelled")
    return int(minor)


def _pod_parts(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(metadata, spec) of whatever holds a pod; a bare PodSpec has no metadata."""
    if not isinstance(obj, Mapping):
        raise TypeError(f"expected a mapping, not {type(obj).__name__}")
    if "containers" in obj:
        return {}, obj
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        if "containers" in spec:
            return obj.get("metadata") or {}, spec
        for holder in ("template", "jobTemplate"):
            if isinstance(spec.get(holder), Mapping):
                return _pod_parts(spec[holder])
    if isinstance(obj.get("template"), Mapping):  # kind: PodTemplate
        return _pod_parts(obj["template"])
    raise ValueError("not a pod, pod template, pod spec or workload: found no containers")


@dataclass(frozen=True)
class _PodContext:
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    minor: int
    restricted: bool

    @property
    def security_context(self) -> Mapping[str, Any]:
        return _mapping(self.spec.get("securityContext"))

    @property
    def windows(self) -> bool:
        """Since 1.25 a pod with ``spec.os.name: windows`` is exempt from the Linux-only restricted controls."""
        return _mapping(self.spec.get("os")).get("name") == "windows"

    @property
    def user_namespace(self) -> bool:
        """``hostUsers: false``: root in the pod is not root on the node. Relaxes some controls since 1.35."""
        return self.spec.get("hostUsers") is False and self.minor >= 35

    def containers(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(path, container) for every container of every kind; the path names the container."""
        for kind in _CONTAINER_LISTS:
            for i, container in enumerate(self.spec.get(kind) or []):
                yield f"spec.{kind}[{container.get('name', i)}]", container

    def security_contexts(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """The pod's securityContext, then each container's, with their paths."""
        yield "spec.securityContext", self.security_context
        for path, container in self.containers():
            yield f"{path}.securityContext", _mapping(container.get("securityContext"))


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping; ``{}`` for an absent or ``null`` field (``securityContext:`` with no value)."""
    return value if isinstance(value, Mapping) else {}


Found = Iterator[tuple[str, str]]  # (field path, what is wrong with it)


# -- baseline ------------------------------------------------------------------------------------------------------


def _check_host_process(ctx: _PodContext) -> Found:
    """HostProcess: Windows HostProcess containers have privileged access to the node."""
    for path, sc in ctx.security_contexts():
        if _mapping(sc.get("windowsOptions")).get("hostProcess") is True:
            yield f"{path}.windowsOptions.hostProcess", "must be false or unset"


def _check_host_namespaces(ctx: _PodContext) -> Found:
    """Host Namespaces: sharing the node's network, PID or IPC namespace."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if ctx.spec.get(key) is True:
            yield f"spec.{key}", "must be false or unset"


def _check_privileged(ctx: _PodContext) -> Found:
    """Privileged Containers: privileged disables most security mechanisms."""
    for path, container in ctx.containers():
        if _mapping(container.get("securityContext")).get("privileged") is True:
            yield f"{path}.securityContext.privileged", "must be false or unset"


def _check_capabilities(ctx: _PodContext) -> Found:
    """Capabilities. Baseline: add only from the default set. Restricted: drop ALL, add at most NET_BIND_SERVICE.

    One line per field: a capability outside the default set breaks both profiles but is one mistake. The
    restricted rule does not apply to Windows pods (no Linux capabilities there)."""
    linux_restricted = ctx.restricted and not ctx.windows
    allowed = RESTRICTED_CAPABILITIES if linux_restricted else BASELINE_CAPABILITIES
    for path, container in ctx.containers():
        capabilities = _mapping(_mapping(container.get("securityContext")).get("capabilities"))
        added = [c for c in capabilities.get("add") or [] if c not in allowed]
        if added:
            yield (
                f"{path}.securityContext.capabilities.add",
                f"must not add {', '.join(added)} (allowed: {', '.join(sorted(allowed))})",
            )
        if linux_restricted and "ALL" not in (capabilities.get("drop") or []):
            yield f"{path}.securityContext.capabilities.drop", "must include ALL"


def _check_volumes(ctx: _PodContext) -> Found:
    """HostPath Volumes (baseline) and Volume Types (restricted, which overrides the baseline check).

    A volume whose only key is its name gets ``emptyDir: {}`` from API defaulting, so it is allowed."""
    allowed = ", ".join(sorted(RESTRICTED_VOLUME_TYPES))
    for i, volume in enumerate(ctx.spec.get("volumes") or []):
        path = f"spec.volumes[{volume.get('name', i)}]"
        for source in (key for key in volume if key != "name"):
            if ctx.restricted and source not in RESTRICTED_VOLUME_TYPES:
                yield f"{path}.{source}", f"volume type {source} is not allowed (allowed: {allowed})"
            elif not ctx.restricted and source == "hostPath":
                yield f"{path}.hostPath", "hostPath volumes are forbidden"


def _check_host_ports(ctx: _PodContext) -> Found:
    """Host Ports: a hostPort binds the node's address. The built-in admission allows no list of exceptions."""
    for path, container in ctx.containers():
        for i, port in enumerate(container.get("ports") or []):
            if port.get("hostPort") not in (None, 0):
                yield f"{path}.ports[{port.get('name', i)}].hostPort", f"must be 0 or unset, not {port['hostPort']}"


def _check_apparmor(ctx: _PodContext) -> Found:
    """AppArmor: no override to ``unconfined``, neither by the (deprecated) annotations nor by appArmorProfile."""
    for key, value in sorted(_mapping(ctx.metadata.get("annotations")).items()):
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
            value in ("", "runtime/default") or str(value).startswith("localhost/")
        ):
            yield f"metadata.annotations[{key}]", f"must be runtime/default or localhost/*, not {value!r}"
    for path, sc in ctx.security_contexts():
        profile = sc.get("appArmorProfile")
        if profile is not None and (kind := _mapping(profile).get("type")) not in CONFINED_PROFILES:
            yield f"{path}.appArmorProfile.type", f"must be RuntimeDefault or Localhost, not {kind!r}"


def _check_selinux(ctx: _PodContext) -> Found:
    """SELinux: only the container types may be set (container_engine_t since 1.31); never a user or role."""
    types = SELINUX_TYPES_1_31 if ctx.minor >= 31 else SELINUX_TYPES
    for path, sc in ctx.security_contexts():
        options = _mapping(sc.get("seLinuxOptions"))
        if (options.get("type") or "") not in types:
            yield f"{path}.seLinuxOptions.type", f"must be one of {', '.join(sorted(types - {''}))} or unset"
        for key in ("user", "role"):
            if options.get(key):
                yield f"{path}.seLinuxOptions.{key}", "must be unset"


def _check_proc_mount(ctx: _PodContext) -> Found:
    """/proc Mount Type: keep the default /proc masks. Since 1.35 baseline allows any in a user namespace;
    restricted never does."""
    if ctx.user_namespace and not ctx.restricted:
        return
    for path, container in ctx.containers():
        proc_mount = _mapping(container.get("securityContext")).get("procMount")
        if proc_mount not in (None, "Default"):
            yield f"{path}.securityContext.procMount", f"must be Default or unset, not {proc_mount!r}"


def _check_seccomp(ctx: _PodContext) -> Found:
    """Seccomp. Baseline: if set, RuntimeDefault or Localhost (never Unconfined). Restricted: also required, at pod
    level or on every container (a container's own setting overrides the pod's). Windows pods are exempt from the
    restricted rule."""
    pod_profile = ctx.security_context.get("seccompProfile")
    if pod_profile is not None and (kind := _mapping(pod_profile).get("type")) not in CONFINED_PROFILES:
        yield "spec.securityContext.seccompProfile.type", f"must be RuntimeDefault or Localhost, not {kind!r}"
    unset: list[str] = []  # containers that neither set a profile nor inherit one
    for path, container in ctx.containers():
        profile = _mapping(container.get("securityContext")).get("seccompProfile")
        if profile is None:
            unset.append(path)
        elif (kind := _mapping(profile).get("type")) not in CONFINED_PROFILES:
            yield f"{path}.securityContext.seccompProfile.type", f"must be RuntimeDefault or Localhost, not {kind!r}"
    if ctx.restricted and not ctx.windows and pod_profile is None and unset:
        yield (
            "spec.securityContext.seccompProfile",
            f"must be set (RuntimeDefault or Localhost), here or on every container; unset on {', '.join(unset)}",
        )


def _check_sysctls(ctx: _PodContext) -> Found:
    """Sysctls: only those namespaced to the pod and isolated from other pods, a list that grows by version."""
    safe = frozenset().union(*(names for since, names in SAFE_SYSCTLS_SINCE.items() if ctx.minor >= since))
    for sysctl in ctx.security_context.get("sysctls") or []:
        if sysctl.get("name") not in safe:
            yield f"spec.securityContext.sysctls[{sysctl.get('name')}]", "not in the safe set"


def _check_probe_hosts(ctx: _PodContext) -> Found:
    """Host Probes / Lifecycle Hooks (since 1.34): a ``host`` in an httpGet or tcpSocket handler makes the kubelet
    connect to any address, the node's neighbours or the metadata service included."""
    if ctx.minor < 34:
        return
    for path, container in ctx.containers():
        handlers = [(name, container.get(name)) for name in _PROBES]
        handlers += [(f"lifecycle.{hook}", _mapping(container.get("lifecycle")).get(hook)) for hook in _LIFECYCLE_HOOKS]
        for name, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                host = _mapping(_mapping(handler).get(action)).get("host")
                if host:
                    yield f"{path}.{name}.{action}.host", f"must be unset, not {host!r}"


# -- restricted ----------------------------------------------------------------------------------------------------


def _check_privilege_escalation(ctx: _PodContext) -> Found:
    """Privilege Escalation: every container must set allowPrivilegeEscalation: false; unset means allowed
    (setuid binaries work). Not for Windows pods."""
    if not ctx.restricted or ctx.windows:
        return
    for path, container in ctx.containers():
        if _mapping(container.get("securityContext")).get("allowPrivilegeEscalation") is not False:
            yield f"{path}.securityContext.allowPrivilegeEscalation", "must be false"


def _check_run_as_non_root(ctx: _PodContext) -> Found:
    """Running as Non-root: runAsNonRoot true at pod level or on every container, and false nowhere (a container's
    setting overrides the pod's). Any value in a user namespace since 1.35."""
    if not ctx.restricted or ctx.user_namespace:
        return
    pod_value = ctx.security_context.get("runAsNonRoot")
    unset = [
        path
        for path, container in ctx.containers()
        if _mapping(container.get("securityContext")).get("runAsNonRoot") is None
    ]
    if pod_value is not None and pod_value is not True:
        yield "spec.securityContext.runAsNonRoot", "must be true"
    elif pod_value is None and unset:
        yield (
            "spec.securityContext.runAsNonRoot",
            f"must be true, here or on every container; unset on {', '.join(unset)}",
        )
    for path, container in ctx.containers():
        value = _mapping(container.get("securityContext")).get("runAsNonRoot")
        if value is not None and value is not True:
            yield f"{path}.securityContext.runAsNonRoot", "must be true or unset"


def _check_run_as_user(ctx: _PodContext) -> Found:
    """Running as Non-root user: runAsUser must not be 0 anywhere (the kubelet checks runAsNonRoot against the
    image's user only when runAsUser is unset). Any value in a user namespace since 1.35."""
    if not ctx.restricted or ctx.user_namespace:
        return
    for path, sc in ctx.security_contexts():
        value = sc.get("runAsUser")
        if isinstance(value, int) and not isinstance(value, bool) and value == 0:
            yield f"{path}.runAsUser", "must not be 0"


_CHECKS = (
    _check_host_process,
    _check_host_namespaces,
    _check_privileged,
    _check_capabilities,
    _check_volumes,
    _check_host_ports,
    _check_apparmor,
    _check_selinux,
    _check_proc_mount,
    _check_seccomp,
    _check_sysctls,
    _check_probe_hosts,
    _check_privilege_escalation,
    _check_run_as_non_root,
    _check_run_as_user,
)


# ==================================================================================================================
# Part 2: NetworkPolicy
# ==================================================================================================================

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
Direction = Literal["Ingress", "Egress"]
_PROTOCOLS = frozenset({"TCP", "UDP", "SCTP"})


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (``namespace`` set) or anything else (``namespace=None``).

    A non-pod (an address outside the cluster, a node, the API server, the metadata service) has no labels and no
    policy of its own; policies can only match it by ``ipBlock``. ``namespace_labels`` gets the label
    ``kubernetes.io/metadata.name`` that the API server puts on every namespace, so a test need not repeat it.
    ``named_ports`` maps the pod's container port names to numbers, for rules that name a port.
    """

    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ipaddress.ip_address(self.ip)  # fail early on a typo rather than never matching an ipBlock
        namespace_labels = dict(self.namespace_labels)
        if self.namespace is None:
            if self.labels or namespace_labels or self.named_ports:
                raise ValueError(f"{self.ip}: only a pod (an endpoint with a namespace) has labels or named ports")
        else:
            if namespace_labels.setdefault(NAMESPACE_NAME_LABEL, self.namespace) != self.namespace:
                raise ValueError(f"{self.ip}: label {NAMESPACE_NAME_LABEL} is always the namespace's name")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "namespace_labels", MappingProxyType(namespace_labels))
        object.__setattr__(self, "named_ports", MappingProxyType(dict(self.named_ports)))

    def __hash__(self) -> int:
        return hash((self.ip, self.namespace, *sorted(self.labels.items())))

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


def allowed(policies: Sequence[Any], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Whether ``policies`` let ``src`` open a connection to ``dst`` on ``port``/``protocol``.

    ``policies`` is every object rendered (anything but ``networking.k8s.io/v1`` NetworkPolicy is ignored, e.g.
    CiliumNetworkPolicy or Calico's own NetworkPolicy). The connection needs both halves: egress from ``src`` and
    ingress to ``dst``. A pod not selected for a direction by any policy of its namespace is not isolated in that
    direction; an isolated one allows the union of the selecting policies' rules. A non-pod end has no policy.

    Not modelled: traffic from a pod's own node (always allowed to it), hostNetwork pods, and Service addresses
    (policies see the pod behind a Service, so pass the pod).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be 1-65535, not {port!r}")
    protocol = protocol.upper()
    if protocol not in _PROTOCOLS:
        raise ValueError(f"protocol must be one of {sorted(_PROTOCOLS)}, not {protocol!r}")
    network_policies = [p for p in policies if is_network_policy(p)]
    connection = _Connection(src=src, dst=dst, port=port, protocol=protocol)
    egress = not src.is_pod or _direction_allows(network_policies, "Egress", connection)
    ingress = not dst.is_pod or _direction_allows(network_policies, "Ingress", connection)
    return egress and ingress


def is_network_policy(obj: Any) -> bool:
    """A Kubernetes NetworkPolicy: not another kind, nor a CRD of the same kind name (Calico's)."""
    return (
        isinstance(obj, Mapping)
        and obj.get("kind") == "NetworkPolicy"
        and obj.get("apiVersion", "networking.k8s.io/v1") == "networking.k8s.io/v1"
    )


def policy_types(policy: Mapping[str, Any]) -> frozenset[str]:
    """``spec.policyTypes``, or its default: Ingress always, Egress if the policy has egress rules.

    The default comes from API defaulting, which tests ``len(egress) != 0``: ``egress: []`` without policyTypes
    does *not* isolate for egress, a classic way to write a default-deny that denies nothing."""
    spec = _spec(policy)
    types = spec.get("policyTypes")
    if types:
        unknown = set(types) - {"Ingress", "Egress"}
        if unknown:
            raise ValueError(f"{_name(policy)}: unknown policyTypes {sorted(unknown)}")
        return frozenset(types)
    return frozenset({"Ingress", "Egress"} if spec.get("egress") else {"Ingress"})


def selects(policy: Mapping[str, Any], pod: Endpoint) -> bool:
    """Whether ``policy`` applies to ``pod``: a pod of the policy's own namespace matching ``spec.podSelector``
    (an empty selector selects every pod of the namespace). Says nothing about the direction."""
    if not is_network_policy(policy):
        raise ValueError(f"not a networking.k8s.io/v1 NetworkPolicy: {_mapping(policy).get('kind')!r}")
    spec = _spec(policy)
    return pod.is_pod and pod.namespace == _namespace(policy) and matches_selector(spec.get("podSelector"), pod.labels)


def is_isolated(policies: Sequence[Any], pod: Endpoint, direction: Direction) -> bool:
    """Whether any policy selects ``pod`` for ``direction``, so that only what the rules allow gets through."""
    return bool(_selecting([p for p in policies if is_network_policy(p)], pod, direction))


def matches_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions all hold. Empty (or null) matches everything."""
    selector = _mapping(selector)
    for key, value in _mapping(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], list(expression.get("values") or [])
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"matchExpressions {key} {operator}: values must not be empty")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"matchExpressions {key} {operator}: values must be empty")
        if operator == "In":
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            raise ValueError(f"matchExpressions {key}: unknown operator {operator!r}")
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class _Connection:
    src: Endpoint
    dst: Endpoint
    port: int
    protocol: str


def _spec(policy: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(policy.get("spec"))


def _name(policy: Mapping[str, Any]) -> str:
    metadata = _mapping(policy.get("metadata"))
    return f"NetworkPolicy {metadata.get('namespace')}/{metadata.get('name')}"


def _namespace(policy: Mapping[str, Any]) -> str:
    """The policy's namespace. Required: a template that leaves it to ``helm --namespace`` would be evaluated here
    against a guess."""
    namespace = _mapping(policy.get("metadata")).get("namespace")
    if not namespace:
        raise ValueError(f"{_name(policy)} has no metadata.namespace")
    return str(namespace)


def _selecting(policies: list[Mapping[str, Any]], pod: Endpoint, direction: Direction) -> list[Mapping[str, Any]]:
    return [p for p in policies if direction in policy_types(p) and selects(p, pod)]


def _direction_allows(policies: list[Mapping[str, Any]], direction: Direction, connection: _Connection) -> bool:
    """Egress from the source, or ingress to the destination: free unless isolated, else any rule of any selecting
    policy matching the peer (the other end) and the destination port."""
    pod, peer = (connection.src, connection.dst) if direction == "Egress" else (connection.dst, connection.src)
    rules_key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    selecting = _selecting(policies, pod, direction)
    if not selecting:
        return True
    for policy in selecting:
        namespace = _namespace(policy)
        for rule in _spec(policy).get(rules_key) or []:
            peers = _mapping(rule).get(peers_key) or []  # no peers: every peer
            ports = _mapping(rule).get("ports") or []  # no ports: every port
            if (not peers or any(_peer_matches(p, namespace, peer) for p in peers)) and (
                not ports or any(_port_matches(p, connection) for p in ports)
            ):
                return True
    return False


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, endpoint: Endpoint) -> bool:
    """NetworkPolicyPeer. ipBlock matches by address, pod or not. Selectors match pods only: podSelector alone means
    the policy's namespace; namespaceSelector alone, every pod of the matching namespaces; both in one peer, both
    must hold (two peers would be either)."""
    ip_block = peer.get("ipBlock")
    pod_selector = peer.get("podSelector")
    namespace_selector = peer.get("namespaceSelector")
    if ip_block is not None:
        if pod_selector is not None or namespace_selector is not None:
            raise ValueError("a NetworkPolicyPeer with ipBlock may not have selectors")
        return _in_ip_block(ip_block, endpoint.ip)
    if pod_selector is None and namespace_selector is None:
        raise ValueError("an empty NetworkPolicyPeer selects nothing and is rejected by the API server")
    if not endpoint.is_pod:
        return False
    if namespace_selector is None:
        namespace_ok = endpoint.namespace == policy_namespace
    else:
        namespace_ok = matches_selector(namespace_selector, endpoint.namespace_labels)
    return namespace_ok and matches_selector(pod_selector, endpoint.labels)


def _in_ip_block(ip_block: Mapping[str, Any], ip: str) -> bool:
    """Inside ``cidr`` and outside every ``except``. An IPv4 block never matches an IPv6 address or the reverse."""
    address = ipaddress.ip_address(ip)
    cidr = ipaddress.ip_network(ip_block["cidr"], strict=False)
    if address.version != cidr.version or address not in cidr:
        return False
    for excluded in ip_block.get("except") or []:
        network = ipaddress.ip_network(excluded, strict=False)
        inside = network.network_address in cidr and network.broadcast_address in cidr
        if network.version != cidr.version or not inside:
            raise ValueError(f"ipBlock except {excluded} is not inside {ip_block['cidr']}")
        if address in network:
            return False
    return True


def _port_matches(entry: Mapping[str, Any], connection: _Connection) -> bool:
    """NetworkPolicyPort: protocol (default TCP), then a number, a number range up to endPort, a name resolved on
    the destination pod, or no port (every port of the protocol)."""
    if (entry.get("protocol") or "TCP") != connection.protocol:
        return False
    port, end_port = entry.get("port"), entry.get("endPort")
    if port is None:
        if end_port is not None:
            raise ValueError("endPort requires port")
        return True
    if isinstance(port, str):
        if port.isdigit():
            raise ValueError(f"port {port!r} is a string: the API server reads it as a port name, and rejects it")
        if end_port is not None:
            raise ValueError(f"endPort cannot go with the named port {port!r}")
        return connection.dst.is_pod and connection.dst.named_ports.get(port) == connection.port
    if isinstance(port, bool) or not isinstance(port, int):
        raise ValueError(f"port must be a number or a name, not {port!r}")
    if end_port is None:
        return port == connection.port
    if end_port < port:
        raise ValueError(f"endPort {end_port} is below port {port}")
    return port <= connection.port <= end_port
