"""The run pod: one plain function from a Run to a Pod, checked without a cluster."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from labkube.agent.gateway import GatewayError
from labkube.agent.gateway.sidecar import RUN_SPEC_VARIABLE, gateway_run_spec
from labkube.budgets import Budgets
from labkube.operator.k8s_models import (
    ApiKeySecret,
    PodOptions,
    PodSettings,
    RunResourceSpec,
    Toleration,
    WorkspaceOptions,
    WorldOptions,
)
from labkube.operator.pod_manifest import (
    LABEL_QUEUE,
    PodManifestError,
    build_pod_manifest,
    build_pvc_manifest,
    pod_name,
    run_labels,
)
from labkube.run_spec import RunSpec
from labkube.task_card import Resources, TaskFamily
from labkube.tasks.gaia2.verdict_message import CONTROL_FILE_VARIABLE, ONE_SCENARIO_VARIABLE, VERDICT_FILE_VARIABLE

RUN_ID = "continual-learning-lite--openai-gpt-5--s0"
RUN_NAME = "cl-sweep-continual-learning-lite--openai-gpt-5--s0"
OWNER = {
    "apiVersion": "labkube.dev/v1alpha1",
    "kind": "Run",
    "metadata": {"name": RUN_NAME, "namespace": "research", "uid": "r-uid-7"},
}
SENTINEL_KEY = "sk-test-sentinel-never-in-a-manifest"
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def make_run(
    *,
    gpus: int = 0,
    family: TaskFamily = TaskFamily.researchgym,
    wall_hours: float | None = 12,
    image: str | None = None,
    pod: PodSettings | None = None,
    node_selector: dict[str, str] | None = None,
) -> RunResourceSpec:
    return RunResourceSpec(
        run_id=RUN_ID,
        campaign="cl-sweep",
        task="researchgym/continual-learning-lite",
        task_path="/opt/tasks/continual-learning-lite",
        model="openai:gpt-5",
        seed=0,
        gpus=gpus,
        budgets=Budgets(wall_hours=wall_hours, usd=20),
        family=family,
        resources=Resources(gpus=gpus, cpus=4, memory_gb=16, image=image, node_selector=node_selector or {}),
        pod=pod or PodSettings(),
    )


def make_options(**changes: Any) -> PodOptions:
    base: dict[str, Any] = {
        "default_image": "ghcr.io/labkube/labkube:0.1.0",
        "api_keys": [
            ApiKeySecret(env="OPENAI_API_KEY", secret_name="labkube-api-keys", key="OPENAI_API_KEY"),
            ApiKeySecret(env="ANTHROPIC_API_KEY", secret_name="labkube-api-keys", key="anthropic", optional=False),
        ],
        "world": WorldOptions(image="ghcr.io/labkube/world:0.1.0", command=["labkube-world"]),
    }
    return PodOptions(**{**base, **changes})


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def check_pod(pod: dict[str, Any]) -> None:
    """What kubernetes-validate does not check: names, labels, ports."""
    kubernetes_validate.validate(pod, "1.33", strict=True)
    meta = pod["metadata"]
    assert DNS_LABEL.match(meta["name"]), meta["name"]
    for key, value in meta["labels"].items():
        assert LABEL_KEY.match(key) and LABEL_VALUE.match(value) and len(value) <= 63, (key, value)
    names = [c["name"] for c in containers(pod).values()]
    assert len(names) == len(set(names)) == len(pod["spec"].get("initContainers", [])) + 1
    ports = [p["name"] for c in containers(pod).values() for p in c.get("ports", [])]
    assert len(ports) == len(set(ports)) and all(len(p) <= 15 for p in ports)
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    for c in containers(pod).values():
        assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes


WORKSPACES = {
    "emptyDir": WorkspaceOptions(mode="emptyDir"),
    "emptyDir-limited": WorkspaceOptions(mode="emptyDir", size_limit="50Gi"),
    "pvc": WorkspaceOptions(mode="pvc", storage_class_name="fast", size="200Gi"),
    "pvc-shared": WorkspaceOptions(mode="pvc", existing_claim="labkube-runs", access_modes=["ReadWriteMany"]),
}


COMBINATIONS = [
    *itertools.product(
        WORKSPACES, [TaskFamily.researchgym, TaskFamily.gaia2], [0, 8], [None, "gpu-queue"], [False, True], [False]
    ),
    ("pvc", TaskFamily.gaia2, 1, "q", True, True),
    ("emptyDir", TaskFamily.gaia, 0, None, False, True),
]


@pytest.mark.parametrize(("workspace", "family", "gpus", "queue", "resume", "read_only"), COMBINATIONS)
def test_every_combination_passes_kubernetes_validate_strict(
    workspace: str, family: TaskFamily, gpus: int, queue: str | None, resume: bool, read_only: bool
) -> None:
    run = make_run(
        gpus=gpus,
        family=family,
        pod=PodSettings(
            queue_name=queue,
            priority_class_name="research",
            tolerations=[Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        ),
        node_selector={"gpu": "a100"} if gpus else None,
    )
    options = make_options(
        workspace=WORKSPACES[workspace],
        read_only_root_filesystem=read_only,
        image_pull_secrets=["registry"],
        service_account_name="labkube-runs",
        env={"LABKUBE_WEB_SEARCH": "off"},
    )
    pod = build_pod_manifest(run, options, owner=OWNER, attempt=2 if resume else 0, resume=resume)
    check_pod(pod)
    pvc = build_pvc_manifest(run, options, owner=OWNER)
    if pvc is not None:
        kubernetes_validate.validate(pvc, "1.33", strict=True)


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_oldest_and_newest_supported_kubernetes_accept_the_pod(version: str) -> None:
    pod = build_pod_manifest(make_run(gpus=1, family=TaskFamily.gaia2), make_options(), owner=OWNER)
    kubernetes_validate.validate(pod, version, strict=True)


def test_agent_command_is_the_labkube_entrypoint() -> None:
    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    agent = containers(pod)["agent"]
    assert agent["command"] == ["labkube", "agent", "--run-dir", f"/runs/{RUN_ID}"]
    resumed = build_pod_manifest(make_run(), make_options(workspace=WORKSPACES["pvc"]), owner=OWNER, resume=True)
    assert containers(resumed)["agent"]["command"][-1] == "--resume"


def test_prepare_writes_the_run_json_the_agent_reads() -> None:
    run = make_run()
    prepare = containers(build_pod_manifest(run, make_options(), owner=OWNER))["prepare"]
    spec = env_of(prepare)["LABKUBE_RUN_SPEC"]["value"]
    assert RunSpec.model_validate_json(spec) == run.to_run_spec()
    assert prepare["command"][:2] == ["sh", "-c"] and "run.json" in prepare["command"][2]


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_gpu_requests_equal_limits_as_strings(gpus: int) -> None:
    pod = build_pod_manifest(make_run(gpus=gpus), make_options(), owner=OWNER)
    resources = containers(pod)["agent"]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == str(gpus)
    assert resources["requests"]["cpu"] == "4000m" and resources["requests"]["memory"] == "16384Mi"
    assert resources["limits"]["memory"] == "16384Mi"


def test_no_gpus_means_no_gpu_resource() -> None:
    pod = build_pod_manifest(make_run(gpus=0), make_options(), owner=OWNER)
    assert "nvidia.com/gpu" not in json.dumps(containers(pod)["agent"]["resources"])


def test_gpu_resource_name_is_configurable() -> None:
    pod = build_pod_manifest(make_run(gpus=2), make_options(gpu_resource_name="amd.com/gpu"), owner=OWNER)
    assert containers(pod)["agent"]["resources"]["limits"]["amd.com/gpu"] == "2"


def test_deadline_is_the_time_budget_left_plus_grace() -> None:
    run = make_run(wall_hours=12)
    pod = build_pod_manifest(run, make_options(), owner=OWNER)
    assert pod["spec"]["activeDeadlineSeconds"] == 12 * 3600 + 900
    resumed = build_pod_manifest(
        run, make_options(deadline_grace_seconds=60), owner=OWNER, attempt=1, spent_wall_seconds=3600.5
    )
    assert resumed["spec"]["activeDeadlineSeconds"] == 11 * 3600 + 60  # ceil(39599.5 + 60)
    spent = build_pod_manifest(run, make_options(deadline_grace_seconds=0), owner=OWNER, spent_wall_seconds=10**6)
    assert spent["spec"]["activeDeadlineSeconds"] == 1


def test_no_time_budget_means_no_deadline() -> None:
    pod = build_pod_manifest(make_run(wall_hours=None), make_options(), owner=OWNER)
    assert "activeDeadlineSeconds" not in pod["spec"]


def test_api_keys_come_from_secrets_by_reference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL_KEY)
    for family in (TaskFamily.researchgym, TaskFamily.gaia2):
        pod = build_pod_manifest(make_run(family=family), make_options(), owner=OWNER)
        assert SENTINEL_KEY not in json.dumps(pod)
        # An API model's calls go through the gateway sidecar: the keys are its alone (issue 41), rg-agent's too.
        agent = env_of(containers(pod)["agent"])
        assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "LABKUBE_STDIN_VARS"} & set(agent)
        assert agent["LABKUBE_GATEWAY_URL"]["value"].startswith("http://127.0.0.1:")
        env = env_of(containers(pod)["gateway"])
        assert env["OPENAI_API_KEY"] == {
            "name": "OPENAI_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "labkube-api-keys", "key": "OPENAI_API_KEY", "optional": True}},
        }
        assert env["ANTHROPIC_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is False
    # A scripted model calls no API and has no gateway: the keys reach its agent by reference, and the agent moves
    # them to stdin and re-execs without them (tests/test_secrets.py).
    scripted = make_run().model_copy(update={"model": "replay:/plans/p.jsonl"})
    pod = build_pod_manifest(scripted, make_options(), owner=OWNER)
    assert "gateway" not in containers(pod)
    env = env_of(containers(pod)["agent"])
    assert env["LABKUBE_STDIN_VARS"]["value"] == "ANTHROPIC_API_KEY,OPENAI_API_KEY"
    for family in (TaskFamily.researchgym, TaskFamily.gaia2):
        pod = build_pod_manifest(make_run(family=family), make_options(), owner=OWNER)
        for c in containers(pod).values():
            for e in c.get("env", []):
                # a *_FILE variable names where a token is, as LABKUBE_GATEWAY_TOKEN_FILE does: a path, no secret
                if re.search("KEY|TOKEN|SECRET", e["name"]) and not e["name"].endswith("_FILE"):
                    assert "value" not in e, (c["name"], e["name"])


def test_only_the_agent_gets_api_keys() -> None:
    pod = build_pod_manifest(make_run(family=TaskFamily.gaia2), make_options(), owner=OWNER)
    for name in ("prepare", "world"):
        assert "OPENAI_API_KEY" not in env_of(containers(pod)[name])


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "HF_TOKEN", "DB_PASSWORD", "my_secret"])
def test_secret_looking_plain_env_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="apiKeys"):
        make_options(env={name: "x"})


def test_reserved_and_duplicate_env_are_refused() -> None:
    with pytest.raises(ValidationError, match="set by labkube"):
        make_options(env={"LABKUBE_RUN_DIR": "/elsewhere"})
    key = ApiKeySecret(env="OPENAI_API_KEY", secret_name="a", key="b")
    with pytest.raises(ValidationError, match="more than once"):
        make_options(api_keys=[key, key])


def test_owner_reference_is_the_run() -> None:
    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "labkube.dev/v1alpha1",
            "kind": "Run",
            "name": RUN_NAME,
            "uid": "r-uid-7",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod["metadata"]["namespace"] == "research"


def test_owner_must_be_a_run_read_from_the_api() -> None:
    with pytest.raises(PodManifestError, match="uid"):
        build_pod_manifest(make_run(), make_options(), owner={**OWNER, "metadata": {"name": RUN_NAME}})
    with pytest.raises(PodManifestError, match="kind Run"):
        build_pod_manifest(make_run(), make_options(), owner={**OWNER, "kind": "Campaign"})


def test_labels_select_the_run_and_its_campaign() -> None:
    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER, attempt=3)
    labels = pod["metadata"]["labels"]
    assert labels.items() >= run_labels("cl-sweep", RUN_NAME).items()
    assert labels["labkube.dev/campaign"] == "cl-sweep" and labels["labkube.dev/run"] == RUN_NAME
    assert labels["app.kubernetes.io/component"] == "run" and labels["labkube.dev/attempt"] == "3"
    annotations = pod["metadata"]["annotations"]
    assert annotations["labkube.dev/model"] == "openai:gpt-5" and annotations["labkube.dev/run-id"] == RUN_ID


def test_run_pods_opt_out_of_service_mesh_injection() -> None:
    """An injected Istio or Linkerd sidecar would keep the pod from completing (and istio-init breaks the restricted
    profile): every run pod, and so its grading pod, carries both meshes' opt-out annotations."""
    from labkube.budgets import StopReason
    from labkube.operator.k8s_grading import grading_manifest

    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    annotations = pod["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false" and annotations["linkerd.io/inject"] == "disabled"
    graded = grading_manifest(pod, StopReason.done, 600)
    assert graded["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"


def test_pod_names_differ_per_attempt_and_fit_a_dns_label() -> None:
    long_run = "r" * 63
    names = {pod_name(long_run, a) for a in range(5)}
    assert len(names) == 5 and all(DNS_LABEL.match(n) for n in names)
    assert pod_name(RUN_NAME, 0) == f"{RUN_NAME}-0"


def test_world_sidecar_only_for_gaia2_runs() -> None:
    plain = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    assert [c["name"] for c in plain["spec"]["initContainers"]] == ["prepare", "gateway"]
    assert "LABKUBE_WORLD_URL" not in env_of(containers(plain)["agent"])

    gaia2 = build_pod_manifest(make_run(family=TaskFamily.gaia2), make_options(), owner=OWNER)
    init = gaia2["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["prepare", "world", "gateway"]
    world = init[1]
    assert world["restartPolicy"] == "Always"  # a native sidecar: the pod completes when the agent exits
    assert world["image"] == "ghcr.io/labkube/world:0.1.0" and world["command"] == ["labkube-world"]
    probe = world["startupProbe"]["exec"]["command"]
    assert probe[:2] == ["python", "-c"] and probe[-1] == "8765" and "127.0.0.1" in probe[2]
    assert "ports" not in world  # it listens on 127.0.0.1: the agent's, nobody else's
    assert env_of(containers(gaia2)["agent"])["LABKUBE_WORLD_URL"]["value"] == "http://127.0.0.1:8765"
    assert {"name": "runs", "mountPath": f"/runs/{RUN_ID}", "readOnly": True} in world["volumeMounts"]


def test_gaia2_run_without_a_world_image_says_what_to_set() -> None:
    with pytest.raises(PodManifestError, match=r"runs\.world\.image"):
        build_pod_manifest(make_run(family=TaskFamily.gaia2), make_options(world=None), owner=OWNER)


def test_empty_dir_workspace() -> None:
    pod = build_pod_manifest(make_run(), make_options(workspace=WORKSPACES["emptyDir-limited"]), owner=OWNER)
    runs = next(v for v in pod["spec"]["volumes"] if v["name"] == "runs")
    assert runs == {"name": "runs", "emptyDir": {"sizeLimit": "50Gi"}}
    assert build_pvc_manifest(make_run(), make_options(workspace=WORKSPACES["emptyDir"]), owner=OWNER) is None


def test_claim_per_run_workspace() -> None:
    options = make_options(workspace=WORKSPACES["pvc"])
    pod = build_pod_manifest(make_run(), options, owner=OWNER)
    pvc = build_pvc_manifest(make_run(), options, owner=OWNER)
    assert pvc is not None
    runs = next(v for v in pod["spec"]["volumes"] if v["name"] == "runs")
    assert runs["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast",
    }
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "r-uid-7"
    assert pvc["metadata"]["labels"]["labkube.dev/run"] == RUN_NAME


def test_shared_claim_workspace_mounts_only_the_runs_own_folder() -> None:
    options = make_options(workspace=WORKSPACES["pvc-shared"])
    pod = build_pod_manifest(make_run(family=TaskFamily.gaia2), options, owner=OWNER)
    runs = next(v for v in pod["spec"]["volumes"] if v["name"] == "runs")
    assert runs["persistentVolumeClaim"]["claimName"] == "labkube-runs"
    for c in containers(pod).values():
        mount = next(m for m in c["volumeMounts"] if m["name"] == "runs")
        # <namespace>/<campaign>/runs/<run-id>: two tenants' campaigns of one name never share a folder,
        # and nothing of a sibling run is in the pod.
        assert mount["subPath"] == f"research/cl-sweep/runs/{RUN_ID}"
        assert mount["mountPath"] == f"/runs/{RUN_ID}"
    assert build_pvc_manifest(make_run(), options, owner=OWNER) is None


@pytest.mark.parametrize("mode", ["emptyDir", "pvc"])
def test_other_workspaces_mount_the_runs_own_volume_at_its_directory(mode: str) -> None:
    pod = build_pod_manifest(make_run(), make_options(workspace=WORKSPACES[mode]), owner=OWNER)
    for c in containers(pod).values():
        mount = next(m for m in c["volumeMounts"] if m["name"] == "runs")
        assert mount == {"name": "runs", "mountPath": f"/runs/{RUN_ID}"}


def test_dev_shm_is_memory_backed_and_sized_from_the_task() -> None:
    def shm(run: RunResourceSpec) -> dict[str, Any]:
        pod = build_pod_manifest(run, make_options(), owner=OWNER)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in containers(pod)["agent"]["volumeMounts"]
        return next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"]

    assert shm(make_run()) == {"medium": "Memory", "sizeLimit": "8192Mi"}  # half of the task's 16 GB
    sized = make_run().model_copy(update={"resources": Resources(cpus=4, memory_gb=16, shm_gb=2)})
    assert shm(sized) == {"medium": "Memory", "sizeLimit": "2048Mi"}


def test_ephemeral_storage_is_requested_and_limited() -> None:
    agent = containers(build_pod_manifest(make_run(), make_options(), owner=OWNER))["agent"]["resources"]
    assert agent["requests"]["ephemeral-storage"] == agent["limits"]["ephemeral-storage"] == "20Gi"
    big = make_run().model_copy(update={"resources": Resources(cpus=4, memory_gb=16, disk_gb=100)})
    shared = make_options(workspace=WORKSPACES["pvc-shared"])
    agent = containers(build_pod_manifest(big, shared, owner=OWNER))["agent"]["resources"]
    assert agent["limits"]["ephemeral-storage"] == "102400Mi"  # no claim of its own: the pod's storage


def test_a_claim_per_run_is_sized_from_the_tasks_disk_gb() -> None:
    """The run's files live on its claim, so the task's disk_gb sizes the claim (and not the node's ephemeral
    storage too, which would reserve the same disk twice); without one, runs.workspace.size."""
    options = make_options(workspace=WORKSPACES["pvc"])
    big = make_run().model_copy(update={"resources": Resources(cpus=4, memory_gb=16, disk_gb=500)})
    odd = make_run().model_copy(update={"resources": Resources(cpus=4, memory_gb=16, disk_gb=1.5)})
    claims = {name: build_pvc_manifest(run, options, owner=OWNER) for name, run in [("big", big), ("odd", odd)]}
    assert {name: c["spec"]["resources"]["requests"]["storage"] for name, c in claims.items() if c} == {
        "big": "500Gi",
        "odd": "1536Mi",
    }
    plain = build_pvc_manifest(make_run(), options, owner=OWNER)
    assert plain is not None and plain["spec"]["resources"]["requests"]["storage"] == "200Gi"
    agent = containers(build_pod_manifest(big, options, owner=OWNER))["agent"]["resources"]
    assert agent["limits"]["ephemeral-storage"] == "20Gi"
    for claim in claims.values():
        kubernetes_validate.validate(claim, "1.33", strict=True)


def millicores(quantity: str) -> float:
    return float(quantity[:-1]) if quantity.endswith("m") else float(quantity) * 1000


def test_cpu_limits_are_off_by_default_and_cover_every_container_when_on() -> None:
    """A ResourceQuota on limits.cpu refuses a pod in which any container, init containers and native sidecars
    included, has no CPU limit: with runs.cpuLimits every container of the run pod and of its grading pod has one
    (the agent's equal to its request, the task's cpus), and none asks for less than it requests."""
    from labkube.budgets import StopReason
    from labkube.operator.k8s_grading import grading_manifest
    from labkube.run_spec import CLI_AGENTS

    run = make_run(family=TaskFamily.gaia2).model_copy(update={"agent": sorted(CLI_AGENTS)[0]})
    plain = build_pod_manifest(run, make_options(), owner=OWNER)
    assert not [c for c in containers(plain).values() if "cpu" in (c.get("resources") or {}).get("limits", {})]

    world = WorldOptions(image="w", resources={"requests": {"cpu": "2", "memory": "1Gi"}})
    for options in (make_options(cpu_limits=True), make_options(cpu_limits=True, world=world)):
        pod = build_pod_manifest(run, options, owner=OWNER)
        grading = grading_manifest(pod, StopReason.done, 600)
        assert {"prepare", "world", "gateway", "agent"} <= set(containers(pod))
        for manifest in (pod, grading):
            check = containers(manifest)
            for name, container in check.items():
                resources = container.get("resources") or {}
                limit, request = resources.get("limits", {}).get("cpu"), resources.get("requests", {}).get("cpu")
                assert limit is not None and request is not None, (name, resources)
                assert millicores(limit) >= millicores(request), (name, resources)  # the API refuses less
            kubernetes_validate.validate(manifest, "1.33", strict=True)
        agent = containers(pod)["agent"]["resources"]
        assert agent["limits"]["cpu"] == agent["requests"]["cpu"] == "4000m"
        assert containers(grading)["grade"]["resources"]["limits"]["cpu"] == "4000m"
    assert containers(pod)["world"]["resources"]["limits"]["cpu"] == "2"  # its own request, as its limit


def test_pod_labels_and_annotations_come_from_the_chart_and_the_campaign_and_never_replace_labkubes() -> None:
    options = make_options(
        labels={"team": "vision", "cost-center": "42"},
        annotations={"example.com/owner": "chart", "sidecar.istio.io/inject": "true"},
    )
    run = make_run(pod=PodSettings(labels={"team": "nlp"}, annotations={"example.com/owner": "campaign"}))
    pod = build_pod_manifest(run, options, owner=OWNER, attempt=1)
    check_pod(pod)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["team"] == "nlp" and labels["cost-center"] == "42"  # the campaign's wins over the chart's
    assert {k: labels[k] for k in run_labels("cl-sweep", RUN_NAME)} == run_labels("cl-sweep", RUN_NAME)
    assert labels["labkube.dev/attempt"] == "1"
    assert annotations["example.com/owner"] == "campaign" and annotations["labkube.dev/run-id"] == RUN_ID
    assert annotations["sidecar.istio.io/inject"] == "true"  # the chart may turn mesh injection back on
    assert annotations["linkerd.io/inject"] == "disabled"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"labels": {"app.kubernetes.io/component": "agent"}}, r"runs\.podLabels: app\.kubernetes\.io/component"),
        ({"annotations": {"labkube.dev/run-id": "x"}}, r"runs\.podAnnotations: labkube\.dev/run-id"),
        ({"labels": {LABEL_QUEUE: "q"}}, r"runs\.queueName"),
        ({"labels": {"team": "a b"}}, r"team='a b' is not a valid label value"),
        ({"annotations": {"-bad": "x"}}, r"'-bad' is not a valid annotation key"),
    ],
)
def test_chart_pod_labels_and_annotations_are_checked(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make_options(**values)


def test_runtime_class_affinity_and_spread_come_from_the_options_and_the_task() -> None:
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    options = make_options(runtime_class_name="gvisor", affinity=affinity, topology_spread_constraints=spread)
    spec = build_pod_manifest(make_run(), options, owner=OWNER)["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["affinity"] == affinity and spec["topologySpreadConstraints"] == spread
    kata = make_run().model_copy(update={"resources": Resources(cpus=4, memory_gb=16, runtime_class="kata")})
    assert build_pod_manifest(kata, options, owner=OWNER)["spec"]["runtimeClassName"] == "kata"
    assert "runtimeClassName" not in build_pod_manifest(make_run(), make_options(), owner=OWNER)["spec"]


def test_the_agents_termination_message_is_its_result() -> None:
    agent = containers(build_pod_manifest(make_run(), make_options(), owner=OWNER))["agent"]
    assert agent["terminationMessagePath"] == "/dev/termination-log"
    assert agent["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert env_of(agent)["LABKUBE_TERMINATION_LOG"]["value"] == "/dev/termination-log"


def test_kueue_queue_label() -> None:
    none = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    assert LABEL_QUEUE not in none["metadata"]["labels"]
    default = build_pod_manifest(make_run(), make_options(queue_name="cluster-queue"), owner=OWNER)
    assert default["metadata"]["labels"][LABEL_QUEUE] == "cluster-queue"
    campaign = build_pod_manifest(
        make_run(pod=PodSettings(queue_name="gpu-queue")), make_options(queue_name="cluster-queue"), owner=OWNER
    )
    assert campaign["metadata"]["labels"][LABEL_QUEUE] == "gpu-queue"
    # Kueue's webhook adds (and removes) its own scheduling gate; we set none.
    assert "schedulingGates" not in campaign["spec"]


def test_non_root_without_service_account_token() -> None:
    pod = build_pod_manifest(make_run(family=TaskFamily.gaia2), make_options(), owner=OWNER)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["restartPolicy"] == "Never"
    for c in containers(pod).values():
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True
    assert containers(pod)["prepare"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert containers(pod)["world"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert containers(pod)["agent"]["securityContext"]["readOnlyRootFilesystem"] is False
    ro = build_pod_manifest(make_run(), make_options(read_only_root_filesystem=True), owner=OWNER)
    assert containers(ro)["agent"]["securityContext"]["readOnlyRootFilesystem"] is True


def test_metrics_port_for_the_pod_monitor() -> None:
    pod = build_pod_manifest(make_run(), make_options(metrics_port=9500), owner=OWNER)
    agent = containers(pod)["agent"]
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert env_of(agent)["LABKUBE_METRICS_PORT"]["value"] == "9500"


def test_image_is_the_tasks_else_the_default() -> None:
    own = build_pod_manifest(make_run(image="ghcr.io/x/task:1"), make_options(), owner=OWNER)
    # the world and the gateway are labkube's own code: the default image, never the task's
    assert {c["image"] for n, c in containers(own).items() if n not in ("world", "gateway")} == {"ghcr.io/x/task:1"}
    default = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    assert containers(default)["agent"]["image"] == "ghcr.io/labkube/labkube:0.1.0"


def test_scheduling_settings_merge_chart_task_and_campaign() -> None:
    options = make_options(
        node_selector={"pool": "research", "zone": "a"},
        tolerations=[Toleration(key="dedicated", operator="Equal", value="labkube", effect="NoSchedule")],
        priority_class_name="default-research",
    )
    run = make_run(
        gpus=1,
        node_selector={"gpu": "a100", "zone": "b"},
        pod=PodSettings(
            node_selector={"zone": "c"},
            priority_class_name="urgent",
            tolerations=[
                Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
                Toleration(key="dedicated", operator="Equal", value="labkube", effect="NoSchedule"),
            ],
        ),
    )
    spec = build_pod_manifest(run, options, owner=OWNER)["spec"]
    assert spec["nodeSelector"] == {"pool": "research", "zone": "c", "gpu": "a100"}
    assert spec["priorityClassName"] == "urgent"
    assert [t["key"] for t in spec["tolerations"]] == ["dedicated", "nvidia.com/gpu"]
    plain = build_pod_manifest(make_run(), make_options(), owner=OWNER)["spec"]
    assert not {"nodeSelector", "tolerations", "priorityClassName", "serviceAccountName"} & set(plain)


def test_negative_attempt_is_refused() -> None:
    with pytest.raises(PodManifestError, match="attempt"):
        build_pod_manifest(make_run(), make_options(), owner=OWNER, attempt=-1)


def test_kubernetes_validate_is_not_vacuous() -> None:
    """A sanity check of the checker: a misspelt field fails strict validation."""
    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    pod["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.33", strict=True)


def test_task_environments_build_in_an_init_container_when_enabled() -> None:
    """`runs.taskEnvironments`: a ResearchGym task with requirements.txt gets a `task-env` init container that runs
    `labkube tasks prepare` into the pod's task-envs volume, which the agent reads (read-only) through
    LABKUBE_ENV_CACHE; off by default, and never for a task with an image of its own."""
    from labkube.tasks import load_task

    bundled = load_task("researchgym/continual-learning-lite")
    run = make_run().model_copy(update={"task_path": str(bundled.path)})
    assert "task-env" not in containers(build_pod_manifest(run, make_options(), owner=OWNER))
    pod = build_pod_manifest(run, make_options(task_environments=True), owner=OWNER)
    check_pod(pod)
    parts = containers(pod)
    init = parts["task-env"]
    assert init["command"] == [
        *("labkube", "tasks", "prepare", str(bundled.path)),
        *("--record", f"/runs/{RUN_ID}/setup.json"),  # the build time, as the result's setup_seconds
    ]
    assert {"name": "runs", "mountPath": f"/runs/{RUN_ID}"} in init["volumeMounts"]
    assert (
        env_of(init)["LABKUBE_ENV_CACHE"]["value"]
        == "/task-envs"
        == env_of(parts["agent"])["LABKUBE_ENV_CACHE"]["value"]
    )
    assert {"name": "task-envs", "mountPath": "/task-envs", "readOnly": True} in parts["agent"]["volumeMounts"]
    assert {"name": "task-envs", "emptyDir": {}} in pod["spec"]["volumes"]
    assert [c["name"] for c in pod["spec"]["initContainers"]][:2] == ["prepare", "task-env"]
    prebuilt = run.model_copy(update={"resources": run.resources.model_copy(update={"image": "registry/task:1"})})
    assert "task-env" not in containers(build_pod_manifest(prebuilt, make_options(task_environments=True), owner=OWNER))
    # runs.env (a package mirror, a Hugging Face endpoint) reaches setup as it reaches the agent; API keys do not
    mirrored = build_pod_manifest(
        run, make_options(task_environments=True, env={"HF_ENDPOINT": "http://hub.mirror:8080"}), owner=OWNER
    )
    setup, agent = containers(mirrored)["task-env"], containers(mirrored)["agent"]
    assert env_of(setup)["HF_ENDPOINT"] == {"name": "HF_ENDPOINT", "value": "http://hub.mirror:8080"}
    assert env_of(agent)["HF_ENDPOINT"] == env_of(setup)["HF_ENDPOINT"]
    assert not [e for e in setup["env"] if "valueFrom" in e]


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_vendor_cli_pod_keeps_the_keys_in_the_gateway_sidecar(monkeypatch: pytest.MonkeyPatch, agent: str) -> None:
    """Object by object (kubernetes-validate --strict checks the schema, not who gets what): the keys are the
    `gateway` sidecar's only; the agent container has the sidecar's loopback address and the token file of a volume
    the two share, read-only for the agent; the sidecar starts (and is probed) before the agent."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", SENTINEL_KEY)
    run = make_run().model_copy(update={"agent": agent})
    pod = build_pod_manifest(run, make_options(env={"ANTHROPIC_BASE_URL": "http://proxy:8080"}), owner=OWNER)
    check_pod(pod)
    assert SENTINEL_KEY not in json.dumps(pod)
    by_name = containers(pod)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["prepare", "gateway"]
    gateway, agent_container = by_name["gateway"], by_name["agent"]
    assert gateway["restartPolicy"] == "Always" and gateway["image"] == "ghcr.io/labkube/labkube:0.1.0"
    assert gateway["command"][:4] == ["labkube", "gateway", "--run-dir", f"/runs/{RUN_ID}"]
    assert gateway["startupProbe"]["exec"]["command"][-1] == "8484" and "ports" not in gateway
    secret_refs = {e["name"] for e in gateway["env"] if "valueFrom" in e}
    assert secret_refs == {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    assert env_of(gateway)["ANTHROPIC_BASE_URL"]["value"] == "http://proxy:8080"  # the provider as users set it
    agent_env = env_of(agent_container)
    assert not any("valueFrom" in e for e in agent_env.values()) and "LABKUBE_STDIN_VARS" not in agent_env
    assert agent_env["LABKUBE_GATEWAY_URL"]["value"] == "http://127.0.0.1:8484"
    assert agent_env["LABKUBE_GATEWAY_TOKEN_FILE"]["value"] == "/gateway/token"
    assert {"name": "gateway", "mountPath": "/gateway", "readOnly": True} in agent_container["volumeMounts"]
    assert {"name": "gateway", "mountPath": "/gateway"} in gateway["volumeMounts"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "gateway")
    assert volume["emptyDir"]["medium"] == "Memory"
    assert not pod["spec"].get("shareProcessNamespace")  # the agent cannot read the sidecar's environment
    plain = build_pod_manifest(make_run().model_copy(update={"model": "noop"}), make_options(), owner=OWNER)
    assert "gateway" not in containers(plain) and "LABKUBE_STDIN_VARS" in env_of(containers(plain)["agent"])


def test_the_gateway_takes_the_runs_spec_from_its_own_environment_not_the_run_folder() -> None:
    """Issue 41: the sidecar read its model, base URL and budgets from run.json, which the agent container writes; a
    rewritten base URL plus a sidecar restart sent the key to the agent's listener. The Run's spec reaches the
    gateway in its own container's environment (which nothing in the pod can change), the same spec `prepare` writes
    to run.json, after the chart's variables; `labkube gateway` reads it from there (`gateway_run_spec`)."""
    run = make_run().model_copy(update={"agent": "claude-code", "model": "anthropic:claude-sonnet-4-6"})
    pod = build_pod_manifest(run, make_options(), owner=OWNER)
    check_pod(pod)
    by_name = containers(pod)
    gateway_env = env_of(by_name["gateway"])
    given = gateway_env[RUN_SPEC_VARIABLE]
    assert set(given) == {"name", "value"}, "a literal value in the pod's spec: no volume, no ConfigMap to rewrite"
    assert gateway_run_spec({RUN_SPEC_VARIABLE: given["value"]}) == run.to_run_spec()
    assert given["value"] == env_of(by_name["prepare"])["LABKUBE_RUN_SPEC"]["value"]
    names = [e["name"] for e in by_name["gateway"]["env"]]
    assert names.count(RUN_SPEC_VARIABLE) == 1
    assert RUN_SPEC_VARIABLE not in env_of(by_name["agent"])
    with pytest.raises(GatewayError, match=r"never from the run folder's run\.json"):
        gateway_run_spec({})


def test_a_vendor_cli_in_a_gaia2_pod_has_the_world_and_a_gateway_that_stops_its_clock() -> None:
    run = make_run(family=TaskFamily.gaia2).model_copy(update={"agent": "claude-code"})
    pod = build_pod_manifest(run, make_options(), owner=OWNER)
    check_pod(pod)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["prepare", "world", "gateway"]
    world_url = "http://127.0.0.1:8765"
    assert env_of(containers(pod)["gateway"])["LABKUBE_WORLD_URL"]["value"] == world_url  # pause/resume its clock
    assert env_of(containers(pod)["agent"])["LABKUBE_WORLD_URL"]["value"] == world_url  # the CLI's MCP bridge


def _writable_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> volume name of what `container` can write (a read-only mount or a read-only source is not)."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    return {
        m["mountPath"]: m["name"]
        for m in container["volumeMounts"]
        if not m.get("readOnly") and "configMap" not in volumes[m["name"]] and "secret" not in volumes[m["name"]]
    }


@pytest.mark.parametrize("family", [TaskFamily.researchgym, TaskFamily.gaia2])
def test_the_gateway_shares_no_writable_volume_with_the_agent_but_the_run_directory(family: TaskFamily) -> None:
    """Object by object: every volume the agent can write, the gateway either does not mount or is the run's
    directory (the gateway appends the transcript there, and imports nothing from it); the gateway's HOME and /tmp
    are a volume only it mounts; its Python has no user site-packages and no script or working directory on its
    path. Before this, the two shared /tmp (the gateway's HOME), where the agent could plant a user site."""
    run = make_run(family=family).model_copy(update={"agent": "claude-code"})
    pod = build_pod_manifest(run, make_options(world=WorldOptions(image="world:1")), owner=OWNER)
    check_pod(pod)
    by_name = containers(pod)
    gateway, agent = by_name["gateway"], by_name["agent"]
    agent_writes = set(_writable_mounts(pod, agent).values())
    shared = set(_writable_mounts(pod, gateway).values()) & agent_writes
    assert shared == {"runs"}, shared
    gateway_mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
    home = env_of(gateway)["HOME"]["value"]
    home_volume = next(name for path, name in gateway_mounts.items() if home == path or home.startswith(path + "/"))
    users = [c["name"] for c in by_name.values() if home_volume in {m["name"] for m in c["volumeMounts"]}]
    assert users == ["gateway"], f"the gateway's HOME ({home}, volume {home_volume}) is mounted by {users}"
    assert gateway_mounts["/tmp"] == home_volume
    assert env_of(gateway)["PYTHONNOUSERSITE"]["value"] == "1" and env_of(gateway)["PYTHONSAFEPATH"]["value"] == "1"
    assert gateway["startupProbe"]["exec"]["command"][:2] == ["python", "-s"]


def test_the_world_shares_no_writable_volume_with_the_agent_and_reports_its_verdict_itself() -> None:
    """The Gaia2 world judges the run: the agent must not be able to plant code it imports (its HOME and /tmp are a
    volume only it mounts, no user site-packages) nor write its verdict (its own termination message, never its
    log), and it serves only the scenario loaded first (the agent's shell reaches its port)."""
    pod = build_pod_manifest(
        make_run(family=TaskFamily.gaia2), make_options(world=WorldOptions(image="w:1")), owner=OWNER
    )
    check_pod(pod)
    by_name = containers(pod)
    world, agent = by_name["world"], by_name["agent"]
    assert not set(_writable_mounts(pod, world).values()) & set(_writable_mounts(pod, agent).values())
    mounts = {m["mountPath"]: m for m in world["volumeMounts"]}
    assert mounts["/tmp"]["name"] == "world-tmp" and env_of(world)["HOME"]["value"] == "/tmp"
    users = [c["name"] for c in by_name.values() if "world-tmp" in {m["name"] for m in c["volumeMounts"]}]
    assert users == ["world"]
    assert all(m.get("readOnly") for m in world["volumeMounts"] if m["name"] == "runs")
    env = {name: e["value"] for name, e in env_of(world).items()}
    assert env["PYTHONNOUSERSITE"] == "1" and env[ONE_SCENARIO_VARIABLE] == "1"
    assert env[VERDICT_FILE_VARIABLE] == world["terminationMessagePath"] == "/dev/termination-log"
    assert world["terminationMessagePolicy"] == "File"


@pytest.mark.parametrize("cli", [False, True])
def test_the_worlds_control_token_goes_from_the_world_to_the_gateway_and_the_harness_only(cli: bool) -> None:
    """A pod's world sidecar makes a control token and writes it to a memory volume that only it writes; the gateway
    (which stops the world's clock during model calls) and the agent container (whose harness loads the scenario)
    mount it read-only and are told where it is. The grading pod, which talks to no world, gets neither."""
    from labkube.budgets import StopReason
    from labkube.operator.k8s_grading import grading_manifest
    from labkube.run_spec import CLI_AGENTS

    run = make_run(family=TaskFamily.gaia2)
    if cli:
        run = run.model_copy(update={"agent": sorted(CLI_AGENTS)[0]})
    pod = build_pod_manifest(run, make_options(world=WorldOptions(image="w:1")), owner=OWNER)
    check_pod(pod)
    by_name = containers(pod)
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "world-control"]
    assert volume["emptyDir"]["medium"] == "Memory"
    world_env = {name: e.get("value") for name, e in env_of(by_name["world"]).items()}
    assert world_env["LABKUBE_WORLD_CONTROL"] == "1"
    token_file = world_env[CONTROL_FILE_VARIABLE]
    readers = {"agent", "gateway"} if cli else {"agent"}
    for name, container in by_name.items():
        mounts = [m for m in container["volumeMounts"] if m["name"] == "world-control"]
        if name == "world":
            assert _writable_mounts(pod, container)[mounts[0]["mountPath"]] == "world-control"
        elif name in readers:
            (mount,) = mounts
            assert mount.get("readOnly") is True and token_file.startswith(mount["mountPath"] + "/")
            assert env_of(container)[CONTROL_FILE_VARIABLE]["value"] == token_file
        else:
            assert mounts == [] and CONTROL_FILE_VARIABLE not in env_of(container), name
    grading = grading_manifest(pod, StopReason.done, 600)
    kubernetes_validate.validate(grading, "1.33", strict=True)
    assert "world-control" not in {v["name"] for v in grading["spec"]["volumes"]}
    (grade,) = grading["spec"]["containers"]
    assert CONTROL_FILE_VARIABLE not in env_of(grade)
    assert "world-control" not in {m["name"] for m in grade["volumeMounts"]}
    for reserved in ("LABKUBE_WORLD_CONTROL", CONTROL_FILE_VARIABLE):
        with pytest.raises(ValidationError, match=reserved):
            make_options(env={reserved: "x"})


def test_a_planted_user_site_never_runs_in_the_gateway(tmp_path: Path) -> None:
    """A hostile agent plants `usercustomize.py`, `sitecustomize.py` and a `.pth` file, as user site-packages,
    under HOME and at the top of every path it can write; then Python starts with the gateway container's
    environment and mounts (each volume a directory here, shared volumes the same directory). Nothing planted
    runs. The same start with the agent container's environment runs the plant: the planting works, so the test
    can fail. The interpreter is the base one, not the test venv's (a venv turns user site-packages off; an
    image's Python has them on)."""
    import subprocess
    import sys

    run = make_run().model_copy(update={"agent": "claude-code"})
    pod = build_pod_manifest(run, make_options(), owner=OWNER)
    by_name = containers(pod)
    marker = tmp_path / "planted-code-ran"
    volumes = {v["name"]: tmp_path / "volumes" / v["name"] for v in pod["spec"]["volumes"]}
    user_site = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    plant = f"open({str(marker)!r}, 'a').write('ran\\n')\n"
    for path in _writable_mounts(pod, by_name["agent"]).values():
        for where in (volumes[path], volumes[path] / user_site):
            where.mkdir(parents=True, exist_ok=True)
            (where / "usercustomize.py").write_text(plant)
            (where / "sitecustomize.py").write_text(plant)
            (where / "planted.pth").write_text(f"import os; {plant.strip()}\n")

    def start_python(container: dict[str, Any]) -> None:
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        for name, value in env.items():
            for path, local in mounts.items():
                if value == path or value.startswith(path + "/"):
                    env[name] = str(local) + value[len(path) :]
        cwd = mounts.get(container.get("workingDir", ""), tmp_path)
        python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        clean = {"PATH": "/usr/bin:/bin", **env}
        subprocess.run([str(python), "-c", "pass"], env=clean, cwd=cwd, check=True, timeout=60)

    start_python(by_name["gateway"])
    assert not marker.exists(), "planted code ran in the gateway"
    start_python(by_name["agent"])
    assert marker.exists(), "the plant never ran, even with the agent's own environment: the test proves nothing"


def test_a_gaia2_world_that_calls_models_gets_their_key_through_the_harness() -> None:
    """The soft judge and ARE's app agents are called by the world sidecar, with the key the harness puts in its
    request to it: a Gaia2 run with a judge hands the keys to its harness on stdin as well as to the gateway."""
    judged = make_run(family=TaskFamily.gaia2).model_copy(update={"judge_model": "openai:gpt-5-mini"})
    pod = build_pod_manifest(judged, make_options(), owner=OWNER)
    agent, gateway = env_of(containers(pod)["agent"]), env_of(containers(pod)["gateway"])
    assert agent["LABKUBE_STDIN_VARS"]["value"] == "ANTHROPIC_API_KEY,OPENAI_API_KEY"
    assert (
        "secretKeyRef" in agent["OPENAI_API_KEY"]["valueFrom"]
        and "secretKeyRef" in gateway["OPENAI_API_KEY"]["valueFrom"]
    )
    plain = build_pod_manifest(make_run(family=TaskFamily.gaia2), make_options(), owner=OWNER)
    assert "OPENAI_API_KEY" not in env_of(containers(plain)["agent"])


def test_the_gateways_call_record_is_mounted_by_the_gateway_and_the_grader_only() -> None:
    """On the shared claim the gateway's record of the model's tool calls is a sibling of the run's folder, mounted
    read-write by the `gateway` sidecar and read-only by the grading pod's `grade` container, never by the agent's
    container; a claim per run (whose agent mounts the whole claim) has no record."""
    from labkube.agent.gateway.record import RECORD_POD_VARIABLE, RECORDS_VARIABLE
    from labkube.budgets import StopReason
    from labkube.operator.k8s_grading import grading_manifest
    from labkube.operator.pod_manifest import (
        GATEWAY_RECORDS_MOUNT,
        RECORDS_VOLUME,
        build_records_pvc_manifest,
        records_pvc_name,
        records_subpath,
    )

    owner = {**OWNER, "metadata": {**OWNER["metadata"], "namespace": "team-a"}}
    pod = build_pod_manifest(make_run(), make_options(workspace=WORKSPACES["pvc-shared"]), owner=owner, attempt=2)
    check_pod(pod)
    mount = {
        "name": "runs",
        "mountPath": GATEWAY_RECORDS_MOUNT,
        "subPath": records_subpath("team-a", "cl-sweep", RUN_ID),
    }
    assert mount["subPath"] == f"team-a/cl-sweep/gateway-records/{RUN_ID}"
    by_name = containers(pod)
    assert mount in by_name["gateway"]["volumeMounts"]
    assert env_of(by_name["gateway"])[RECORDS_VARIABLE]["value"] == GATEWAY_RECORDS_MOUNT
    assert env_of(by_name["gateway"])[RECORD_POD_VARIABLE]["value"] == pod["metadata"]["name"]
    for name, container in by_name.items():
        if name != "gateway":
            assert all(m["mountPath"] != GATEWAY_RECORDS_MOUNT for m in container.get("volumeMounts", [])), name
            assert "gateway-records" not in json.dumps(container), name
    grading = grading_manifest(pod, StopReason.done, 600)
    check_pod(grading)
    (grade,) = grading["spec"]["containers"]
    assert {**mount, "readOnly": True} in grade["volumeMounts"]
    assert env_of(grade)[RECORDS_VARIABLE]["value"] == GATEWAY_RECORDS_MOUNT

    # A claim per run: the agent's container mounts the whole run claim, so the record is a claim of its own, made
    # and deleted with the run's (`build_records_pvc_manifest`), mounted by the gateway and the grading pod only.
    options = make_options(workspace=WORKSPACES["pvc"])
    per_run = build_pod_manifest(make_run(), options, owner=OWNER)
    check_pod(per_run)
    by_name = containers(per_run)
    own = {"name": RECORDS_VOLUME, "mountPath": GATEWAY_RECORDS_MOUNT}
    assert own in by_name["gateway"]["volumeMounts"]
    claim = records_pvc_name(OWNER["metadata"]["name"])
    assert {"name": RECORDS_VOLUME, "persistentVolumeClaim": {"claimName": claim}} in per_run["spec"]["volumes"]
    for name, container in by_name.items():
        if name != "gateway":
            assert all(m["name"] != RECORDS_VOLUME for m in container.get("volumeMounts", [])), name
            assert RECORDS_VARIABLE not in json.dumps(container), name
    (grade,) = grading_manifest(per_run, StopReason.done, 600)["spec"]["containers"]
    assert {**own, "readOnly": True} in grade["volumeMounts"]
    pvc = build_records_pvc_manifest(make_run(), options, owner=OWNER)
    assert pvc is not None and pvc["metadata"]["name"] == claim
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert (
        pvc["metadata"]["ownerReferences"]
        == build_pvc_manifest(make_run(), options, owner=OWNER)["metadata"]["ownerReferences"]
    )
    assert build_records_pvc_manifest(make_run(), make_options(workspace=WORKSPACES["pvc-shared"]), owner=OWNER) is None


def test_ares_own_agent_has_no_gateway_and_its_harness_gets_the_keys() -> None:
    """ARE's default agent is called by the Gaia2 world, with the key the harness puts in its request: no gateway (it
    would see none of those calls), and the keys reach the harness on stdin."""
    run = make_run(family=TaskFamily.gaia2).model_copy(update={"agent": "are-default"})
    pod = build_pod_manifest(run, make_options(), owner=OWNER)
    assert "gateway" not in containers(pod)
    assert env_of(containers(pod)["agent"])["LABKUBE_STDIN_VARS"]["value"] == "ANTHROPIC_API_KEY,OPENAI_API_KEY"


def test_the_agent_reads_its_runs_interventions_from_a_configmap_the_grading_pod_lacks() -> None:
    """Live control (docs/live-control.md): the Run's interventions reach the agent container as a read-only,
    whole-directory ConfigMap mount (a `subPath` mount would never see an update), optional so that a ConfigMap the
    operator could not write keeps no pod from starting; the grading pod gets them in its account instead."""
    from labkube.budgets import StopReason
    from labkube.control import CONTROL_FILE_VARIABLE
    from labkube.operator.k8s_control import CONTROL_FILE, CONTROL_MOUNT, config_map_name
    from labkube.operator.k8s_grading import grading_manifest

    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER)
    agent = containers(pod)["agent"]
    assert env_of(agent)[CONTROL_FILE_VARIABLE]["value"] == CONTROL_FILE
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == CONTROL_MOUNT]
    assert mount["readOnly"] is True and "subPath" not in mount
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"] == {"name": config_map_name(RUN_NAME), "optional": True}
    for name, container in containers(pod).items():
        if name != "agent":  # the sidecars and init containers have no word in it
            assert all(m["mountPath"] != CONTROL_MOUNT for m in container.get("volumeMounts", [])), name
    graded = grading_manifest(pod, StopReason.cancelled, 600)
    grade = containers(graded)["grade"]
    assert CONTROL_FILE_VARIABLE not in env_of(grade)
    assert all(m["mountPath"] != CONTROL_MOUNT for m in grade["volumeMounts"])
    assert all(v["name"] != mount["name"] for v in graded["spec"]["volumes"])
