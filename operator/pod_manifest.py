"""The Pod (and, in per-run PVC mode, the PersistentVolumeClaim) of one run: plain functions
from a `Run` to manifests, tested without a cluster.

Anatomy of a run pod (docs/kubernetes.md, "The run pod"):

- init container `prepare`: writes the run's `run.json` into `/runs/<run-id>/` (from an
  environment variable; a RunSpec holds no secrets);
- init container `world` (gaia2 runs only): the Gaia2 world as a native sidecar
  (`restartPolicy: Always`, Kubernetes >= 1.29), started before the agent and stopped after it;
- container `agent`: `labkube agent --run-dir /runs/<run-id> [--resume]`, with the task's CPU,
  memory, ephemeral storage and GPUs (requests equal limits for GPUs, memory and storage; for CPU too with
  `runs.cpuLimits`, which gives every other container a CPU limit as well), API keys
  from Secrets by reference, `/dev/shm` sized from the task, and the Prometheus port `metrics`. Its
  termination message is the run's result (`labkube.result.termination_report`): how the operator
  learns the outcome without sharing the pod's volume.

Labels and annotations: the chart's (`runs.podLabels`, `runs.podAnnotations`), then the Campaign's `pod.labels` and
`pod.annotations` (admitted within `tenancy`), then labkube's own (`app.kubernetes.io/*`, `labkube.dev/*`), which
neither can replace. The service-mesh opt-out annotations come first, so the chart may turn injection back on.

Only the run's own directory is mounted, at `/runs/<run-id>`: an emptyDir, the run's own claim, or
the folder `<namespace>/<campaign>/runs/<run-id>` of the namespace's shared claim (a `subPath`), so
a run never sees a sibling's workspace, status or result. `/tmp` is an emptyDir, so every container
but the agent has a read-only root file system. Every container runs as the chart's non-root user
with no capabilities, no privilege escalation and the runtime's default seccomp profile (the Pod
Security Standards' `restricted` profile), and the pod has no service-account token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labkube.agent.gateway.ledger import CLUSTER_SPEND_VARIABLE, PRIVATE_STATE_VARIABLE
from labkube.agent.gateway.record import RECORD_POD_VARIABLE, RECORDS_VARIABLE
from labkube.agent.harness.entrypoint import GRADED_BY_OPERATOR_VARIABLE
from labkube.budgets import Spend
from labkube.control import CONTROL_FILE_VARIABLE as RUN_CONTROL_VARIABLE
from labkube.model_ref import API_PROVIDERS, parse_model
from labkube.operator.crds import LABEL_CAMPAIGN, LABEL_RUN, SchemaError, dns_label, owner_reference
from labkube.operator.k8s_control import CONTROL_FILE, CONTROL_MOUNT, config_map_name
from labkube.operator.k8s_models import PodOptions, RunResourceSpec, Toleration
from labkube.run_spec import CLI_AGENTS, RUN_SPEC_VARIABLE
from labkube.task_card import TaskFamily
from labkube.tasks.gaia2.verdict_message import (
    CONTROL_ENV,
    CONTROL_FILE_VARIABLE,
    ONE_SCENARIO_VARIABLE,
    VERDICT_FILE_VARIABLE,
)

__all__ = [
    "LABEL_ATTEMPT",
    "LABEL_CAMPAIGN",
    "LABEL_COMPONENT",
    "LABEL_QUEUE",
    "LABEL_RUN",
    "RUNS_MOUNT",
    "TERMINATION_LOG",
    "PodManifestError",
    "build_pod_manifest",
    "build_pvc_manifest",
    "build_records_pvc_manifest",
    "pod_name",
    "pvc_name",
    "records_pvc_name",
    "records_subpath",
    "run_labels",
    "shared_subpath",
]

RUNS_MOUNT = "/runs"
TERMINATION_LOG = "/dev/termination-log"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_ATTEMPT = "labkube.dev/attempt"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
ANNOTATION_PREFIX = "labkube.dev/"
# A service mesh's injected sidecar is not a native sidecar: it keeps running after the agent exits, so the pod
# never completes (and Istio's istio-init container needs NET_ADMIN, which the restricted profile forbids). Run
# pods reach only the model gateway and the world, through their own NetworkPolicy, so they opt out.
MESH_OPT_OUT = {"sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}


class PodManifestError(ValueError):
    """The run cannot be turned into a pod with these options (the message says which to set)."""


def run_labels(campaign: str, run: str) -> dict[str, str]:
    """Labels of every object of one run; select a run's pods with all of them."""
    return {
        "app.kubernetes.io/name": "labkube",
        LABEL_COMPONENT: "run",
        "app.kubernetes.io/part-of": "labkube",
        "app.kubernetes.io/managed-by": "labkube-operator",
        LABEL_CAMPAIGN: campaign,
        LABEL_RUN: run,
    }


def has_gateway(run: RunResourceSpec) -> bool:
    """Whether the run's pod has the `gateway` sidecar: a run whose agent calls a model API (not a scripted model,
    and not ARE's own agent, which the Gaia2 world calls)."""
    return parse_model(run.model).provider in API_PROVIDERS and run.agent != "are-default"


def pod_name(run: str, attempt: int) -> str:
    """One pod per attempt, so a retry never waits for the old pod's name to be free."""
    return dns_label(f"{run}-{attempt}")


def pvc_name(run: str) -> str:
    return dns_label(f"{run}-runs")


def _cpu(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def _memory(gb: float) -> str:
    return f"{round(gb * 1024)}Mi"


def _gib(gb: float) -> str:
    return f"{int(gb)}Gi" if float(gb).is_integer() else _memory(gb)


# CPU limits of the containers that are not the agent's (`runs.cpuLimits`): a ResourceQuota on limits.cpu counts
# every container, init containers and sidecars included, and refuses a pod where one has none.
PREPARE_CPU = {"requests": "50m", "limits": "250m"}
GATEWAY_CPU = {"requests": "100m", "limits": "500m"}
WORLD_CPU = {"requests": "100m", "limits": "1"}


def _limited(resources: dict[str, Any], cpu: Mapping[str, str], on: bool) -> dict[str, Any]:
    """`resources` with a CPU limit when `on` (and a request, so the limit does not become the request too): the
    container's own if it has one, else `cpu`'s; a request without a limit gets it as its limit."""
    if not on:
        return resources
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    if "cpu" not in limits:
        limits["cpu"] = str(requests["cpu"]) if "cpu" in requests else cpu["limits"]
    requests.setdefault("cpu", cpu["requests"])
    return {**resources, "requests": requests, "limits": limits}


def _run_meta(owner: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = owner.get("metadata", {})
    if owner.get("kind") != "Run" or not meta.get("name"):
        raise PodManifestError("owner: pass the Run object (kind Run, with metadata.name and uid) as the API has it")
    return str(meta["name"]), meta.get("namespace")


def _secure(read_only: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _tolerations(*groups: list[Toleration]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for group in groups:
        for t in group:
            item = t.to_pod()
            if item not in seen:
                seen.append(item)
    return seen


def build_pod_manifest(
    run: RunResourceSpec,
    options: PodOptions,
    *,
    owner: Mapping[str, Any],
    attempt: int = 0,
    resume: bool = False,
    spent_wall_seconds: float = 0.0,
    cluster_spend: Spend | None = None,
) -> dict[str, Any]:
    """The Pod for attempt `attempt` of `run`, owned by the Run object `owner`.

    `resume` adds `--resume` (the workspace must persist: `workspace.mode: pvc`);
    `spent_wall_seconds` is the time already charged, so a resumed pod's
    `activeDeadlineSeconds` covers only what is left of the budget, plus the grace period;
    `cluster_spend` is the spend the Run's status records (`clusterSpend`, from earlier pods' gateways), which the
    pod's gateway counts on from and the agent's harness never starts below (`agent/gateway/ledger.py`).
    """
    if attempt < 0:
        raise PodManifestError(f"run {run.run_id}: attempt must be >= 0, got {attempt}")
    name, namespace = _run_meta(owner)
    run_dir = f"{RUNS_MOUNT}/{run.run_id}"
    image = run.resources.image or options.default_image
    # The chart's, then the campaign's (admitted within tenancy), then labkube's own, which nothing overrides.
    labels = {**options.labels, **run.pod.labels, **run_labels(run.campaign, name), LABEL_ATTEMPT: str(attempt)}
    queue = run.pod.queue_name or options.queue_name
    if queue:
        labels[LABEL_QUEUE] = queue

    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "LABKUBE_RUN_DIR", "value": run_dir},
        {"name": "LABKUBE_METRICS_PORT", "value": str(options.metrics_port)},
        {"name": "LABKUBE_TERMINATION_LOG", "value": TERMINATION_LOG},
        {"name": GRADED_BY_OPERATOR_VARIABLE, "value": "1"},  # the grading pod grades (k8s_grading.py)
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # the Run's interventions, which the operator keeps in a ConfigMap (k8s_control): pause, extend, message
        {"name": RUN_CONTROL_VARIABLE, "value": CONTROL_FILE},
    ]
    init_containers = [_prepare_container(run, image, options, run_dir, namespace)]
    task_env = _task_env_container(run, image, options, run_dir, namespace)
    if task_env is not None:  # the task's environment, built before the agent starts (not in its budget)
        init_containers.append(task_env)
        env.append({"name": "LABKUBE_ENV_CACHE", "value": TASK_ENVS_MOUNT})
    if run.family == TaskFamily.gaia2:
        if options.world is None:
            raise PodManifestError(
                f"run {run.run_id}: task {run.task} is a gaia2 task and needs a world sidecar; "
                "set runs.world.image in the chart values"
            )
        init_containers.append(_world_container(run, options, run_dir, namespace))
        env += [
            {"name": "LABKUBE_WORLD_URL", "value": f"http://127.0.0.1:{options.world.port}"},
            # the world's control token: the harness reads it; the world removes it at the harness's first use
            {"name": CONTROL_FILE_VARIABLE, "value": WORLD_CONTROL_FILE},
        ]
    env += [{"name": k, "value": v} for k, v in sorted(options.env.items())]
    keys = [
        {
            "name": key.env,
            "valueFrom": {"secretKeyRef": {"name": key.secret_name, "key": key.key, "optional": key.optional}},
        }
        for key in options.api_keys
    ]
    if cluster_spend is not None:
        env.append({"name": CLUSTER_SPEND_VARIABLE, "value": cluster_spend.model_dump_json()})
    # Every model API call goes through the gateway sidecar, which alone holds the keys and counts the spend where
    # the agent's container cannot write; a scripted model (replay, oracle) calls no API and has no gateway, and ARE's
    # own agent (`are-default`) is called by the world, which gets its key in the harness's request, as a judge's.
    gateway = has_gateway(run)
    if gateway:  # the keys are the gateway sidecar's; the agent container gets none
        # a vendor CLI's world clock stops during model calls (the harness stops it for rg-agent's own calls)
        world = [
            e for e in env if e["name"] in ("LABKUBE_WORLD_URL", CONTROL_FILE_VARIABLE) and run.agent in CLI_AGENTS
        ]
        seed = [e for e in env if e["name"] == CLUSTER_SPEND_VARIABLE]
        init_containers.append(
            _gateway_container(
                run, options, run_dir, namespace, [*world, *seed, *keys], bool(world), pod_name(name, attempt)
            )
        )
        env += [
            {"name": "LABKUBE_GATEWAY_URL", "value": f"http://127.0.0.1:{GATEWAY_PORT}"},
            {"name": "LABKUBE_GATEWAY_TOKEN_FILE", "value": f"{GATEWAY_MOUNT}/token"},
        ]
    # A Gaia2 world that calls models (ARE's soft judge, app agents) is given their key in the harness's request to it:
    # that harness gets the keys too, on stdin. A scripted model calls no API, and has no gateway to hold them.
    world_models = run.family == TaskFamily.gaia2 and bool(run.judge_model or run.gaia2_a2a)
    if not gateway or world_models:
        env += keys
        if options.api_keys:  # the agent moves these to stdin and re-execs without them (see `labkube agent`)
            env.append({"name": "LABKUBE_STDIN_VARS", "value": ",".join(sorted({k.env for k in options.api_keys}))})

    # A claim of its own holds the run's files and takes the task's disk_gb; else the pod's own storage does.
    sized_claim = options.workspace.claim_per_run and run.resources.disk_gb
    storage = _memory(run.resources.disk_gb) if run.resources.disk_gb and not sized_claim else options.ephemeral_storage
    requests = {
        "cpu": _cpu(run.resources.cpus),
        "memory": _memory(run.resources.memory_gb),
        "ephemeral-storage": storage,
    }
    limits = {"memory": requests["memory"], "ephemeral-storage": storage}
    if options.cpu_limits:
        limits["cpu"] = requests["cpu"]
    if run.gpus:
        requests[options.gpu_resource_name] = limits[options.gpu_resource_name] = str(run.gpus)

    agent = {
        "name": "agent",
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["labkube", "agent", "--run-dir", run_dir, *(["--resume"] if resume else [])],
        "workingDir": run_dir,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": options.metrics_port, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "securityContext": _secure(options.read_only_root_filesystem),
        "terminationMessagePath": TERMINATION_LOG,
        # The report is JSON; when the agent dies before writing it, the log's tail says why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            _runs_mount(run, options, namespace),
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": RUN_CONTROL, "mountPath": CONTROL_MOUNT, "readOnly": True},
            *([{"name": "task-envs", "mountPath": TASK_ENVS_MOUNT, "readOnly": True}] if task_env else []),
            *([{"name": "gateway", "mountPath": GATEWAY_MOUNT, "readOnly": True}] if gateway else []),
            *(
                [{"name": WORLD_CONTROL, "mountPath": WORLD_CONTROL_MOUNT, "readOnly": True}]
                if run.family == TaskFamily.gaia2
                else []
            ),
        ],
    }

    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": options.termination_grace_period_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": options.run_as_user,
            "runAsGroup": options.run_as_group,
            "fsGroup": options.fs_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": init_containers,
        "containers": [agent],
        "volumes": [
            _runs_volume(name, options),
            {"name": "tmp", "emptyDir": {}},
            # Docker's 64 MiB /dev/shm breaks PyTorch data loaders and NCCL; memory-backed, so it counts
            # against the memory limit: half of it unless the task says otherwise.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _memory(_shm_gb(run))}},
            # a whole-directory mount (no subPath), so the kubelet brings the ConfigMap's updates into the pod;
            # optional: the pod starts, and the run goes on, if it could not be written
            {"name": RUN_CONTROL, "configMap": {"name": config_map_name(name), "optional": True}},
            *([{"name": "task-envs", "emptyDir": {}}] if task_env else []),
            *([{"name": "gateway", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}] if gateway else []),
            *([{"name": GATEWAY_TMP, "emptyDir": {"sizeLimit": "1Gi"}}] if gateway else []),
            *(
                [{"name": RECORDS_VOLUME, "persistentVolumeClaim": {"claimName": records_pvc_name(name)}}]
                if gateway and options.workspace.claim_per_run
                else []
            ),
            *([{"name": WORLD_TMP, "emptyDir": {"sizeLimit": "1Gi"}}] if run.family == TaskFamily.gaia2 else []),
            *(
                [{"name": WORLD_CONTROL, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
                if run.family == TaskFamily.gaia2
                else []
            ),
        ],
    }
    wall = run.budgets.wall_seconds
    if wall is not None:
        left = max(0.0, wall - spent_wall_seconds)
        spec["activeDeadlineSeconds"] = max(1, math.ceil(left + options.deadline_grace_seconds))
    if options.service_account_name:
        spec["serviceAccountName"] = options.service_account_name
    node_selector = {**options.node_selector, **run.resources.node_selector, **run.pod.node_selector}
    if node_selector:
        spec["nodeSelector"] = node_selector
    tolerations = _tolerations(options.tolerations, run.pod.tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    priority = run.pod.priority_class_name or options.priority_class_name
    if priority:
        spec["priorityClassName"] = priority
    if options.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    runtime = run.pod.runtime_class_name or run.resources.runtime_class or options.runtime_class_name
    if runtime:
        spec["runtimeClassName"] = runtime
    if options.affinity:
        spec["affinity"] = options.affinity
    if options.topology_spread_constraints:
        spec["topologySpreadConstraints"] = options.topology_spread_constraints

    metadata: dict[str, Any] = {
        "name": pod_name(name, attempt),
        "labels": labels,
        "annotations": {
            **MESH_OPT_OUT,
            **options.annotations,
            **run.pod.annotations,
            f"{ANNOTATION_PREFIX}task": run.task,
            f"{ANNOTATION_PREFIX}model": run.model,
            f"{ANNOTATION_PREFIX}seed": str(run.seed),
            f"{ANNOTATION_PREFIX}run-id": run.run_id,
        },
        "ownerReferences": [_owner(owner)],
    }
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def build_pvc_manifest(run: RunResourceSpec, options: PodOptions, *, owner: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's own PersistentVolumeClaim in per-run PVC mode (`None` otherwise); owned by the
    Run, so it lives across the run's pods and goes with the Run."""
    ws = options.workspace
    if not ws.claim_per_run:
        return None
    name, namespace = _run_meta(owner)
    size = _gib(run.resources.disk_gb) if run.resources.disk_gb else ws.size
    spec: dict[str, Any] = {"accessModes": list(ws.access_modes), "resources": {"requests": {"storage": size}}}
    if ws.storage_class_name:
        spec["storageClassName"] = ws.storage_class_name
    metadata: dict[str, Any] = {
        "name": pvc_name(name),
        "labels": run_labels(run.campaign, name),
        "ownerReferences": [_owner(owner)],
    }
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def _owner(owner: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return owner_reference(owner)
    except SchemaError as exc:
        raise PodManifestError(str(exc)) from None


def _runs_volume(name: str, options: PodOptions) -> dict[str, Any]:
    ws = options.workspace
    if ws.mode == "emptyDir":
        return {"name": "runs", "emptyDir": {"sizeLimit": ws.size_limit} if ws.size_limit else {}}
    claim = ws.existing_claim or pvc_name(name)
    return {"name": "runs", "persistentVolumeClaim": {"claimName": claim}}


def shared_subpath(namespace: str, campaign: str, run_id: str) -> str:
    """A run's folder on its namespace's shared claim: the results store's layout, one tree per namespace."""
    return f"{namespace}/{campaign}/runs/{run_id}"


def records_subpath(namespace: str, campaign: str, run_id: str) -> str:
    """Where a run's gateway keeps its record of the model's tool calls on the shared claim (`agent/gateway/record.py`):
    a sibling of the run's folder, which the agent's container (mounting only `shared_subpath`) cannot reach."""
    return f"{namespace}/{campaign}/gateway-records/{run_id}"


GATEWAY_RECORDS_MOUNT = "/gateway-records"


RECORDS_VOLUME = "gateway-records"
RECORDS_CLAIM_SIZE = "1Gi"  # a line of tool calls per model call: megabytes for a 12-hour run


def records_pvc_name(run: str) -> str:
    """The claim of a run's gateway record in claim-per-run mode (the agent's container mounts the whole run claim,
    so the record needs a claim of its own)."""
    return dns_label(f"{run}-records")


def records_mount(run: RunResourceSpec, options: PodOptions, namespace: str | None) -> dict[str, Any] | None:
    """The gateway's record folder (read-write: the gateway's only; the grading pod mounts it read-only): a sibling
    folder of the run's on the shared claim; in claim-per-run mode, whose agent container mounts the whole run claim,
    a claim of its own (`records_pvc_name`, volume `RECORDS_VOLUME`); None with an emptyDir workspace, which is
    never graded in a pod of its own."""
    ws = options.workspace
    if ws.mode != "pvc":
        return None
    if ws.claim_per_run:
        return {"name": RECORDS_VOLUME, "mountPath": GATEWAY_RECORDS_MOUNT}
    subpath = records_subpath(namespace or "default", run.campaign, run.run_id)
    return {"name": "runs", "mountPath": GATEWAY_RECORDS_MOUNT, "subPath": subpath}


def build_records_pvc_manifest(
    run: RunResourceSpec, options: PodOptions, *, owner: Mapping[str, Any]
) -> dict[str, Any] | None:
    """In claim-per-run mode, the claim of the run's gateway record (`records_mount`): made, owned and deleted with
    the run's own claim; None in the other modes, and for a scripted model (no gateway)."""
    pvc = build_pvc_manifest(run, options, owner=owner)
    if pvc is None or not has_gateway(run):  # no gateway, no record
        return None
    name, _ = _run_meta(owner)
    pvc["metadata"]["name"] = records_pvc_name(name)
    pvc["spec"]["resources"]["requests"]["storage"] = RECORDS_CLAIM_SIZE
    return pvc


def _runs_mount(
    run: RunResourceSpec, options: PodOptions, namespace: str | None, read_only: bool = False
) -> dict[str, Any]:
    """The run's own directory at `/runs/<run-id>`; nothing of its siblings."""
    mount: dict[str, Any] = {"name": "runs", "mountPath": f"{RUNS_MOUNT}/{run.run_id}"}
    if options.workspace.mode == "pvc" and options.workspace.existing_claim:
        mount["subPath"] = shared_subpath(namespace or "default", run.campaign, run.run_id)
    if read_only:
        mount["readOnly"] = True
    return mount


def _shm_gb(run: RunResourceSpec) -> float:
    return run.resources.shm_gb or run.resources.memory_gb / 2


def _prepare_container(
    run: RunResourceSpec, image: str, options: PodOptions, run_dir: str, namespace: str | None
) -> dict[str, Any]:
    # run.json is on the agent's volume: whatever is there (a FIFO would hang the write, a link redirect it) is removed
    # before the spec is written
    script = (
        'set -eu; mkdir -p "$LABKUBE_RUN_DIR"; rm -rf "$LABKUBE_RUN_DIR/run.json"; '
        'printf "%s\\n" "$LABKUBE_RUN_SPEC" > "$LABKUBE_RUN_DIR/run.json"'
    )
    return {
        "name": "prepare",
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["sh", "-c", script],
        "env": [
            {"name": "LABKUBE_RUN_DIR", "value": run_dir},
            {"name": RUN_SPEC_VARIABLE, "value": run.to_run_spec().model_dump_json()},
        ],
        "resources": _limited(
            {"requests": {"cpu": PREPARE_CPU["requests"], "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            PREPARE_CPU,
            options.cpu_limits,
        ),
        "securityContext": _secure(True),
        "volumeMounts": [_runs_mount(run, options, namespace)],
    }


TASK_ENVS_MOUNT = "/task-envs"


def _task_env_container(
    run: RunResourceSpec, image: str, options: PodOptions, run_dir: str, namespace: str | None
) -> dict[str, Any] | None:
    """`labkube tasks prepare` into the pod's task-envs volume (`runs.taskEnvironments`), for a ResearchGym task with
    requirements.txt or install.sh and no image of its own (an image from `labkube tasks dockerfile` has the
    environment baked in). It needs the package index: the run pods' NetworkPolicy must allow it."""
    from labkube.tasks.environment import env_key

    if not options.task_environments or run.family != TaskFamily.researchgym or run.resources.image:
        return None
    try:
        if env_key(Path(run.task_path)) is None:
            return None
    except OSError:
        return None
    return {
        "name": "task-env",
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        # --record: the build's time into the run's setup.json, the result's setup_seconds (not the agent's budget)
        "command": ["labkube", "tasks", "prepare", run.task_path, "--record", f"{run_dir}/setup.json"],
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "LABKUBE_ENV_CACHE", "value": TASK_ENVS_MOUNT},
            # runs.env (a mirror's PIP_INDEX_URL or HF_ENDPOINT, say) reaches setup too, as it does the agent
            *({"name": k, "value": v} for k, v in sorted(options.env.items())),
        ],
        "resources": _limited(
            {"requests": {"cpu": _cpu(run.resources.cpus), "memory": _memory(run.resources.memory_gb)}},
            PREPARE_CPU,
            options.cpu_limits,
        ),
        "securityContext": _secure(options.read_only_root_filesystem),
        "volumeMounts": [
            {"name": "task-envs", "mountPath": TASK_ENVS_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
            _runs_mount(run, options, namespace),
        ],
    }


WORLD_PROBE = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2).close()"


GATEWAY_PORT = 8484
GATEWAY_MOUNT = "/gateway"
GATEWAY_TMP = "gateway-tmp"  # the gateway's own /tmp and HOME: no other container mounts it


def _gateway_container(
    run: RunResourceSpec,
    options: PodOptions,
    run_dir: str,
    namespace: str | None,
    keys: list[dict[str, Any]],
    world: bool = False,
    pod: str = "",
) -> dict[str, Any]:
    """The run's model gateway as a native sidecar (docs/third-party-agents.md): it alone holds the API keys (no
    other container of the pod can read its environment), listens on the pod's loopback, writes the run token to a
    volume the agent container mounts read-only, and appends its model calls to the run's transcript.

    Nothing the agent can write is code to it: its HOME and /tmp are a volume of its own (`gateway-tmp`, which the
    agent never mounts), and Python runs without user site-packages (`PYTHONNOUSERSITE`, as `-s`) and without the
    script's directory or the working directory on its path (`PYTHONSAFEPATH`, as `-P`). The run's directory is
    the one writable volume both mount: the gateway appends the transcript there and imports nothing from it, and
    takes its model, base URL, key variable and budgets from `LABKUBE_RUN_SPEC` in its own environment (the Run's
    spec, as `prepare` writes it to run.json), never from run.json, which the agent may rewrite before making the
    sidecar restart.

    It also mounts its record folder (`records_mount`, which no other container of the pod mounts)
    and appends the tool calls of every answer there (`agent/gateway/record.py`), for the grading pod's audit."""
    records = records_mount(run, options, namespace)
    record_env = (
        [{"name": RECORDS_VARIABLE, "value": GATEWAY_RECORDS_MOUNT}, {"name": RECORD_POD_VARIABLE, "value": pod}]
        if records is not None
        else []
    )
    return {
        "name": "gateway",
        "image": options.default_image,
        "imagePullPolicy": options.image_pull_policy,
        "restartPolicy": "Always",  # a native sidecar: it ends when the agent does
        "command": [
            *("labkube", "gateway", "--run-dir", run_dir),
            *("--port", str(GATEWAY_PORT), "--token-file", f"{GATEWAY_MOUNT}/token"),
        ],
        "env": [
            {"name": "HOME", "value": "/tmp"},  # its own /tmp (gateway-tmp), not the agent's
            {"name": "PYTHONNOUSERSITE", "value": "1"},
            {"name": "PYTHONSAFEPATH", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *({"name": k, "value": v} for k, v in sorted(options.env.items())),
            # after the chart's variables, so that none of them can stand in for the Run's spec or the report's file
            {"name": RUN_SPEC_VARIABLE, "value": run.to_run_spec().model_dump_json()},
            {"name": "LABKUBE_TERMINATION_LOG", "value": TERMINATION_LOG},
            {"name": PRIVATE_STATE_VARIABLE, "value": "/tmp/labkube-gateway-spend.json"},  # its own gateway-tmp
            *record_env,
            *keys,
        ],
        "startupProbe": {
            "exec": {"command": ["python", "-s", "-c", WORLD_PROBE, str(GATEWAY_PORT)]},
            "periodSeconds": 1,
            "failureThreshold": 60,
        },
        "resources": _limited(
            {"requests": {"cpu": GATEWAY_CPU["requests"], "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            GATEWAY_CPU,
            options.cpu_limits,
        ),
        "securityContext": _secure(True),
        # Its totals (`agent/gateway/ledger.py`), read by the operator from the API when the pod ends: a file only
        # this container writes, unlike the run folder's gateway.json and checkpoint.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            _runs_mount(run, options, namespace),
            {"name": GATEWAY_TMP, "mountPath": "/tmp"},
            {"name": "gateway", "mountPath": GATEWAY_MOUNT},
            *([records] if records is not None else []),
            *([{"name": WORLD_CONTROL, "mountPath": WORLD_CONTROL_MOUNT, "readOnly": True}] if world else []),
        ],
    }


WORLD_TMP = "world-tmp"  # the world's own /tmp and HOME: nothing the agent writes there is code the world imports
# The world's control token (its scenario, clock and judge), written by the world before it listens, read by the
# gateway sidecar and then by the agent's harness, and removed by the world at the first request that carries it (the
# harness's loading of the scenario, before the agent's commands run). Only the world writes this volume.
WORLD_CONTROL = "world-control"
RUN_CONTROL = "run-control"  # the volume of the Run's interventions (a ConfigMap)
WORLD_CONTROL_MOUNT = "/world-control"
WORLD_CONTROL_FILE = f"{WORLD_CONTROL_MOUNT}/token"
WORLD_TERMINATION_LOG = "/dev/termination-log"


def _world_container(run: RunResourceSpec, options: PodOptions, run_dir: str, namespace: str | None) -> dict[str, Any]:
    """The Gaia2 world (ARE) as a native sidecar. The agent's shell reaches its port, so it serves only the scenario
    the harness loaded first, and its controller's endpoints (the scenario, the clock, the judge) only to the holder of
    its control token, which it writes to the `world-control` memory volume before it listens, for the gateway and
    the harness, and removes at the first request that carries it (before the agent's commands run). It shares no
    volume the agent writes (the run's directory is read-only to it), and its verdict leaves through its own
    termination message, which only it can write."""
    world = options.world
    assert world is not None
    container: dict[str, Any] = {
        "name": "world",
        "image": world.image,
        "imagePullPolicy": options.image_pull_policy,
        "restartPolicy": "Always",  # a native sidecar: it ends when the agent does
        "env": [
            {"name": "HOME", "value": "/tmp"},  # its own /tmp (world-tmp), not the agent's
            {"name": "PYTHONNOUSERSITE", "value": "1"},
            {"name": "LABKUBE_RUN_DIR", "value": run_dir},
            {"name": "LABKUBE_WORLD_PORT", "value": str(world.port)},
            # Its verdict, as its termination message: the record the grading pod is given (k8s_grading.py).
            {"name": VERDICT_FILE_VARIABLE, "value": WORLD_TERMINATION_LOG},
            {"name": ONE_SCENARIO_VARIABLE, "value": "1"},
            {"name": CONTROL_ENV, "value": "1"},  # the scenario, the clock and the judge: the harness's only
            {"name": CONTROL_FILE_VARIABLE, "value": WORLD_CONTROL_FILE},
        ],
        "terminationMessagePath": WORLD_TERMINATION_LOG,
        "terminationMessagePolicy": "File",  # never its log: what the agent sent it may be in there
        # The world listens on 127.0.0.1 only (the agent is in the same pod; nothing else may drive it), which a
        # tcpSocket probe (to the pod's IP) cannot reach: the probe connects from inside the container.
        "startupProbe": {
            "exec": {"command": ["python", "-c", WORLD_PROBE, str(world.port)]},
            "periodSeconds": 2,
            # probes run at 0 s, then every period: one more than startup_seconds / 2 covers the whole window
            "failureThreshold": math.ceil(world.startup_seconds / 2) + 1,
        },
        "securityContext": _secure(True),
        "volumeMounts": [
            _runs_mount(run, options, namespace, read_only=True),
            {"name": WORLD_TMP, "mountPath": "/tmp"},
            {"name": WORLD_CONTROL, "mountPath": WORLD_CONTROL_MOUNT},
        ],
    }
    if world.command:
        container["command"] = list(world.command)
    if world.args:
        container["args"] = list(world.args)
    resources = _limited({k: dict(v) for k, v in world.resources.items()}, WORLD_CPU, options.cpu_limits)
    if resources:
        container["resources"] = resources
    return container
