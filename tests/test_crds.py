"""The Campaign and Run CRDs: generated from the pydantic specs, structural, valid, committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kube_schema import prune
from pydantic import ValidationError

from labkube.budgets import Budgets
from labkube.campaign import CampaignSpec, expand_runs
from labkube.operator.crds import (
    API_VERSION,
    SchemaError,
    build_run_resource,
    campaign_crd,
    campaign_resource_spec,
    check_structural,
    crd_files,
    main,
    openapi_to_jsonschema,
    run_crd,
    run_name,
    run_spec_from_resource,
    spec_from_resource,
    structural_schema,
    validate_resource,
)
from labkube.operator.k8s_models import (
    CampaignPhase,
    CampaignStatus,
    Condition,
    ConditionStatus,
    RunCounts,
    RunResourceSpec,
    RunStatus,
    set_condition,
)
from labkube.run_spec import RunPhase
from labkube.task_card import Resources, TaskCard, TaskFamily

CRDS_DIR = Path(__file__).resolve().parents[1] / "helm" / "labkube" / "crds"
KUBE_VERSIONS = ["1.29", "1.33", "1.37"]


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "<root>", schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def openapi(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def campaign_obj(**spec: Any) -> dict[str, Any]:
    body = {"tasks": ["researchgym/continual-learning-lite"], "models": ["openai:gpt-5"], "seeds": 2, **spec}
    return {
        "apiVersion": API_VERSION,
        "kind": "Campaign",
        "metadata": {"name": "cl-sweep", "namespace": "research", "uid": "c-uid-1", "generation": 1},
        "spec": body,
    }


def card(**resources: Any) -> TaskCard:
    return TaskCard(
        ref="researchgym/continual-learning-lite",
        name="continual-learning-lite",
        path="/opt/tasks/continual-learning-lite",
        resources=Resources(**resources),
        budgets=Budgets(wall_hours=12),
    )


def run_objects(campaign: dict[str, Any], task: TaskCard) -> list[dict[str, Any]]:
    spec = spec_from_resource(campaign)
    runs = expand_runs(spec, {ref: [task] for ref in spec.tasks})
    return [build_run_resource(r, task, campaign) for r in runs]


# -- committed == generated ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(crd_files()))
def test_committed_crds_equal_generated(name: str) -> None:
    committed = CRDS_DIR / name
    assert committed.exists(), f"{committed} missing: run `python -P -m labkube.operator.crds helm/labkube/crds`"
    assert committed.read_text(encoding="utf-8") == crd_files()[name], (
        f"{committed} is stale: run `python -P -m labkube.operator.crds helm/labkube/crds`"
    )


def test_no_other_files_in_crds_dir() -> None:
    assert sorted(p.name for p in CRDS_DIR.iterdir()) == sorted(crd_files())


def test_check_mode_reports_up_to_date_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(CRDS_DIR), "--check"]) == 0


def test_check_mode_reports_stale_files(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--check"]) == 1
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path), "--check"]) == 0


# -- structural ------------------------------------------------------------------------------------


@pytest.mark.parametrize("crd", [campaign_crd(), run_crd()], ids=["campaign", "run"])
def test_crd_schema_is_structural(crd: dict[str, Any]) -> None:
    schema = openapi(crd)
    assert check_structural(schema) == []
    text = json.dumps(crd)
    for banned in ('"$ref"', '"$defs"', '"anyOf"', '"oneOf"', '"allOf"', '"default"', '"title"'):
        assert banned not in text
    for path, node in nodes(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields") is True, path
        if node.get("type") == "object":
            assert not ("properties" in node and "additionalProperties" in node), path
        for key in ("exclusiveMinimum", "exclusiveMaximum", "nullable"):
            assert isinstance(node.get(key, True), bool), f"{path}: {key}"


@pytest.mark.parametrize("crd", [campaign_crd(), run_crd()], ids=["campaign", "run"])
def test_preserve_unknown_fields_only_where_needed(crd: dict[str, Any]) -> None:
    preserved = sorted(p for p, n in nodes(openapi(crd)) if n.get("x-kubernetes-preserve-unknown-fields"))
    expected = {
        "Campaign": [
            ".spec.seeds",
            ".spec.task_overlays{}",
            ".status.kopf",
        ],  # overlays: labkube.yaml, checked when planned
        "Run": [".spec.task_overlay", ".status.kopf"],
    }
    assert preserved == expected[crd["spec"]["names"]["kind"]]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("crd", [campaign_crd(), run_crd()], ids=["campaign", "run"])
def test_crd_passes_kubernetes_validate_strict(crd: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(crd, version, strict=True)


def test_committed_crd_files_load_as_the_generated_objects() -> None:
    for name, crd in zip(sorted(crd_files()), [campaign_crd(), run_crd()], strict=True):
        assert yaml.safe_load((CRDS_DIR / name).read_text(encoding="utf-8")) == crd


def test_crd_names_columns_and_status_subresource() -> None:
    for crd, short, columns in [
        (campaign_crd(), "lkc", ["Tasks", "Models", "Seeds", "Phase", "Progress", "GPU-h", "Age"]),
        (
            run_crd(),
            "lkr",
            ["Task", "Model", "Seed", "Phase", "Score", "Outcome", "Cost", "Attempts", "Pod", "Stop", "Age"],
        ),
    ]:
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["names"]["shortNames"] == [short]
        assert crd["spec"]["names"]["categories"] == ["labkube"]
        version = crd["spec"]["versions"][0]
        assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
        assert [c["name"] for c in version["additionalPrinterColumns"]] == columns


def test_every_printer_column_path_exists_in_the_schema() -> None:
    for crd in (campaign_crd(), run_crd()):
        schema = openapi(crd)
        for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
            if column["jsonPath"].startswith(".metadata."):
                continue  # metadata is the API server's
            node = schema
            for part in column["jsonPath"].strip(".").split("."):
                node = node["properties"][part]


def test_campaign_spec_schema_has_every_cli_field_but_name() -> None:
    """The resource's spec is generated from CampaignSpec: a new CLI field appears by itself."""
    props = openapi(campaign_crd())["properties"]["spec"]["properties"]
    cli_fields = {f.alias or n for n, f in CampaignSpec.model_fields.items()} - {"name"}
    assert cli_fields <= set(props)
    assert "name" not in props and "pod" in props


def test_run_spec_schema_has_every_run_json_field() -> None:
    props = openapi(run_crd())["properties"]["spec"]["properties"]
    from labkube.run_spec import RunSpec

    assert set(RunSpec.model_fields) <= set(props)
    assert {"family", "resources", "pod"} <= set(props)


def test_status_fields_are_camel_case_and_spec_fields_are_the_cli_names() -> None:
    run = openapi(run_crd())["properties"]
    assert {"podName", "costUsd", "stopReason", "observedGeneration", "conditions"} <= set(run["status"]["properties"])
    assert {"run_id", "task_path", "api_key_env"} <= set(run["spec"]["properties"])
    campaign = openapi(campaign_crd())["properties"]
    assert {"gpuHoursUsed", "observedGeneration", "runs", "progress"} <= set(campaign["status"]["properties"])
    assert {"gpu_hours_cap", "api_key_env"} <= set(campaign["spec"]["properties"])
    pod = campaign["spec"]["properties"]["pod"]["properties"]
    assert {
        "nodeSelector",
        "tolerations",
        "priorityClassName",
        "queueName",
        "runtimeClassName",
        "labels",
        "annotations",
    } == set(pod)


def test_conditions_are_a_map_list_keyed_by_type() -> None:
    conditions = openapi(run_crd())["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert set(item["required"]) == {"type", "status"}
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_names_are_limited_to_label_length_by_a_cel_rule() -> None:
    for crd in (campaign_crd(), run_crd()):
        rules = openapi(crd)["x-kubernetes-validations"]
        assert rules == [{"rule": "size(self.metadata.name) <= 63", "message": rules[0]["message"]}]


def test_exclusive_minimum_uses_the_openapi_3_0_boolean_form() -> None:
    wall = openapi(campaign_crd())["properties"]["spec"]["properties"]["budgets"]["properties"]["wall_hours"]
    assert wall == {"type": "number", "nullable": True, "minimum": 0, "exclusiveMinimum": True}


def test_recursive_models_are_refused() -> None:
    from pydantic import BaseModel

    class Node(BaseModel):
        children: list[Node] = []

    with pytest.raises(SchemaError, match="refers to itself"):
        structural_schema(Node)


def test_fixed_length_tuples_are_refused() -> None:
    from pydantic import BaseModel

    class Pair(BaseModel):
        pair: tuple[int, str]

    with pytest.raises(SchemaError, match="fixed-length tuple"):
        structural_schema(Pair)


# -- example objects against the schema ----------------------------------------------------------


def test_example_campaign_validates_and_reads_as_the_cli_spec() -> None:
    obj = campaign_obj(
        budgets={"wall_hours": 12, "usd": 50, "tokens": None},
        concurrency=8,
        gpu_hours_cap=200,
        prices={"openai:gpt-5": [1.25, 10.0]},
        api_key_env={"openai:gpt-5": "OPENAI_API_KEY"},
        pod={
            "priorityClassName": "research",
            "queueName": "gpu-queue",
            "nodeSelector": {"gpu": "a100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    )
    validate_resource(obj, campaign_crd())
    spec = spec_from_resource(obj)
    assert isinstance(spec, CampaignSpec) and type(spec) is CampaignSpec
    assert spec.name == "cl-sweep" and spec.backend == "k8s" and spec.seed_list == [0, 1]
    assert spec.budgets == Budgets(wall_hours=12, usd=50)
    full = campaign_resource_spec(obj)
    assert full.pod.queue_name == "gpu-queue" and full.pod.tolerations[0].effect == "NoSchedule"


def test_a_campaign_file_pastes_into_spec_unchanged() -> None:
    text = """
tasks: [researchgym/continual-learning-lite]
models: [oracle, noop]
seeds: [0, 4, 7]
budgets: {wall_hours: 1, usd: 5, tokens: 2000000, steps: 200}
concurrency: 4
"""
    file_spec = yaml.safe_load(text)
    obj = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": "cl"}, "spec": file_spec}
    validate_resource(obj, campaign_crd())
    from_file = CampaignSpec.model_validate({**file_spec, "name": "cl", "backend": "k8s"})
    assert spec_from_resource(obj) == from_file


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"tasks": []}, "tasks"),
        ({"models": "openai:gpt-5"}, "models"),
        ({"concurrency": 0}, "concurrency"),
        ({"budgets": {"wall_hours": 0}}, "wall_hours"),
        ({"budgets": {"hours": 3}}, "hours"),
        ({"gpu_hours_cap": "lots"}, "gpu_hours_cap"),
        ({"backend": "slurm"}, "backend"),
        ({"surprise": True}, "surprise"),
        ({"pod": {"node_selector": {"a": "b"}}}, "node_selector"),
        ({"pod": {"tolerations": [{"effect": "Sometimes"}]}}, "effect"),
        ({"pod": {"queueName": "Not A Queue"}}, "queueName"),
        ({"prices": {"openai:gpt-5": "cheap"}}, "prices"),
    ],
)
def test_bad_campaigns_are_rejected_by_the_schema(change: dict[str, Any], where: str) -> None:
    obj = campaign_obj(**change)
    with pytest.raises(jsonschema.ValidationError) as err:
        validate_resource(obj, campaign_crd())
    assert where in (str(list(err.value.absolute_path)) + err.value.message)


def test_missing_spec_is_rejected() -> None:
    obj = campaign_obj()
    del obj["spec"]
    with pytest.raises(jsonschema.ValidationError, match="spec"):
        validate_resource(obj, campaign_crd())


def test_wrong_kind_is_rejected() -> None:
    with pytest.raises(jsonschema.ValidationError, match="kind Run"):
        validate_resource(campaign_obj(), run_crd())


@pytest.mark.parametrize("seeds", ["three", [1, 1], 0, [-1]])
def test_bad_seeds_pass_the_schema_but_not_pydantic(seeds: object) -> None:
    """`seeds: int | list[int]` has no structural form; pydantic checks it when the operator reads it."""
    obj = campaign_obj(seeds=seeds)
    validate_resource(obj, campaign_crd())
    with pytest.raises(ValidationError):
        spec_from_resource(obj)


def test_unknown_model_fails_when_read() -> None:
    with pytest.raises(ValidationError, match="unknown model"):
        spec_from_resource(campaign_obj(models=["bogus:gpt"]))


def test_spec_name_is_refused_with_a_pointer_to_metadata_name() -> None:
    obj = campaign_obj(name="other")
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(obj, campaign_crd())
    with pytest.raises(SchemaError, match=r"metadata\.name"):
        spec_from_resource(obj)


def test_explicit_local_backend_is_kept() -> None:
    assert spec_from_resource(campaign_obj(backend="local")).backend == "local"


def test_lenient_mode_prunes_instead_of_rejecting() -> None:
    schema = openapi_to_jsonschema(openapi(campaign_crd()), strict_fields=False)
    jsonschema.validate(campaign_obj(surprise=True), schema)


OVERLAY = {
    "subtasks": [{"id": "final_acc", "sota": 0.91, "baseline": 0.5}],
    "resources": {"gpus": 1, "node_selector": {"pool": "a100"}},
    "budgets": {"wall_hours": 2},
    "future_key": {"nested": [1, {"deep": True}]},  # not labkube.yaml's: pydantic refuses it when planned
}


def test_task_overlays_survive_the_api_servers_pruning() -> None:
    """A labkube.yaml is free-form to the API server (checked when the campaign is planned): pruning keeps it whole,
    in the Campaign and in each Run."""
    obj = campaign_obj(task_overlays={"continual-learning-lite": OVERLAY})
    validate_resource(obj, campaign_crd())
    stored = prune(obj, openapi(campaign_crd()), root=True)
    assert stored["spec"]["task_overlays"] == {"continual-learning-lite": OVERLAY}
    assert spec_from_resource(stored).task_overlays == {"continual-learning-lite": OVERLAY}
    run = run_objects(stored, card())[0]
    validate_resource(run, run_crd())
    stored_run = prune(run, openapi(run_crd()), root=True)
    assert stored_run["spec"]["task_overlay"] == OVERLAY
    assert run_spec_from_resource(stored_run).to_run_spec().task_overlay == OVERLAY


def test_a_task_overlay_that_is_not_a_mapping_is_rejected_by_the_schema() -> None:
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(campaign_obj(task_overlays={"continual-learning-lite": ["sota"]}), campaign_crd())


# -- Run objects ----------------------------------------------------------------------------------


def test_run_objects_built_from_a_campaign_validate() -> None:
    campaign = campaign_obj(pod={"queueName": "gpu-queue"})
    runs = run_objects(campaign, card(gpus=2, cpus=8, memory_gb=64, image="ghcr.io/x/task:1"))
    assert len(runs) == 2
    for obj in runs:
        validate_resource(obj, run_crd())
        meta = obj["metadata"]
        assert meta["namespace"] == "research"
        assert meta["labels"]["labkube.dev/campaign"] == "cl-sweep"
        assert meta["labels"]["labkube.dev/run"] == meta["name"]
        owner = meta["ownerReferences"][0]
        assert owner == {
            "apiVersion": API_VERSION,
            "kind": "Campaign",
            "name": "cl-sweep",
            "uid": "c-uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        spec = run_spec_from_resource(obj)
        assert spec.gpus == spec.resources.gpus == 2 and spec.pod.queue_name == "gpu-queue"
        assert spec.budgets.wall_hours == 12


def test_run_spec_round_trips_to_run_json() -> None:
    obj = run_objects(campaign_obj(), card())[0]
    spec = run_spec_from_resource(obj)
    run_json = spec.to_run_spec()
    assert "resources" not in run_json.model_dump() and run_json.run_id == spec.run_id
    again = RunResourceSpec.model_validate(
        {**run_json.model_dump(), "family": spec.family, "resources": spec.resources, "pod": spec.pod}
    )
    assert again == spec


def test_run_gpu_counts_must_agree() -> None:
    obj = run_objects(campaign_obj(), card(gpus=1))[0]
    obj["spec"]["gpus"] = 3
    validate_resource(obj, run_crd())  # the schema cannot compare two fields
    with pytest.raises(ValidationError, match=r"resources\.gpus"):
        run_spec_from_resource(obj)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("seed",), -1),
        (("family",), "chess"),
        (("resources", "cpus"), 0),
        (("resources", "memory"), 4),
        (("run_id",), None),
    ],
)
def test_bad_runs_are_rejected_by_the_schema(path: tuple[str, ...], value: object) -> None:
    obj = run_objects(campaign_obj(), card())[0]
    target = obj["spec"]
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(obj, run_crd())


def test_build_run_resource_needs_the_campaign_uid() -> None:
    campaign = campaign_obj()
    del campaign["metadata"]["uid"]
    with pytest.raises(SchemaError, match="uid"):
        run_objects(campaign, card())


def test_gaia2_family_is_carried_to_the_run() -> None:
    task = card().model_copy(update={"family": TaskFamily.gaia2})
    obj = run_objects(campaign_obj(), task)[0]
    assert run_spec_from_resource(obj).family == TaskFamily.gaia2


@pytest.mark.parametrize(
    ("campaign", "run_id"),
    [
        ("cl-sweep", "continual-learning-lite--openai-gpt-5--s0"),
        ("a" * 63, "b" * 60 + "--" + "c" * 60 + "--s12"),
        ("x.y", "task_with_underscores--model.v2--s1"),
    ],
)
def test_run_names_are_dns_labels_and_label_values(campaign: str, run_id: str) -> None:
    import re

    name = run_name(campaign, run_id)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert run_name(campaign, run_id) == name  # stable
    assert run_name(campaign, run_id + "x") != name


# -- status ---------------------------------------------------------------------------------------


def test_statuses_validate_against_the_status_schemas() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    conditions = set_condition([], "Ready", True, "PodRunning", "the agent is working", now=now)
    run_status = RunStatus(
        phase=RunPhase.running,
        pod_name="p-0",
        attempts=1,
        score=0.4,
        tokens=1200,
        cost_usd=0.31,
        conditions=conditions,
        observed_generation=1,
    )
    obj = run_objects(campaign_obj(), card())[0]
    obj["status"] = {**run_status.to_status(), "kopf": {"progress": {"create": {"retries": 1}}}}
    validate_resource(obj, run_crd())
    assert obj["status"]["podName"] == "p-0" and obj["status"]["conditions"][0]["lastTransitionTime"].startswith(
        "2025-01-02T03:04:05"
    )

    counts = RunCounts.of([RunPhase.finished, RunPhase.running, RunPhase.failed])
    campaign_status = CampaignStatus(
        phase=CampaignPhase.running, runs=counts, progress=counts.progress, gpu_hours_used=1.5, conditions=conditions
    )
    campaign = campaign_obj()
    campaign["status"] = campaign_status.to_status()
    validate_resource(campaign, campaign_crd())
    assert campaign["status"]["progress"] == "2/3" and campaign["status"]["runs"]["running"] == 1


def test_status_reads_back_with_kopf_bookkeeping() -> None:
    status = RunStatus.model_validate({"phase": "Finished", "costUsd": 2.5, "kopf": {"progress": {}}})
    assert status.cost_usd == 2.5 and status.phase == RunPhase.finished


def test_bad_status_is_rejected() -> None:
    obj = run_objects(campaign_obj(), card())[0]
    obj["status"] = {"phase": "Exploded"}
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(obj, run_crd())
    obj["status"] = {"conditions": [{"type": "Ready", "status": "yes"}]}
    with pytest.raises(jsonschema.ValidationError):
        validate_resource(obj, run_crd())


def test_set_condition_moves_transition_time_only_on_change() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    t1 = datetime(2025, 1, 2, tzinfo=UTC)
    first = set_condition([], "Ready", False, "Pending", now=t0)
    same = set_condition(first, "Ready", ConditionStatus.false, "StillPending", "waiting", now=t1)
    assert same[0].last_transition_time == t0 and same[0].reason == "StillPending"
    flipped = set_condition(same, "Ready", True, "Running", now=t1)
    assert flipped[0].last_transition_time == t1
    both = set_condition(flipped, "Admitted", True, "Kueue", now=t1)
    assert [c.type for c in both] == ["Ready", "Admitted"]
    assert first == [Condition(type="Ready", status=ConditionStatus.false, reason="Pending", last_transition_time=t0)]
