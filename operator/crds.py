"""The `Campaign` and `Run` custom resources, generated from the pydantic models.

`Campaign.spec` is `CampaignResourceSpec` (a campaign file plus `pod`), `Run.spec` is
`RunResourceSpec` (a `run.json` plus what its pod needs); both statuses come from
`labkube.operator.k8s_models`. Pydantic writes JSON Schema (2020-12); Kubernetes wants a
*structural* OpenAPI v3 schema, so `structural_schema` rewrites it: `$ref`s inlined,
`anyOf [X, null]` becomes `nullable: true`, numeric `exclusiveMinimum` becomes the OpenAPI 3.0
boolean form, `additionalProperties: false` is dropped (the API server prunes unknown fields,
or rejects them under kubectl's default `--validate=strict`), and defaults are left to pydantic
(a field's default is stated in its description instead). A union of two types (`seeds: int |
list[int]`) has no structural form; it keeps `x-kubernetes-preserve-unknown-fields` and is
checked by pydantic when the operator reads the spec.

The chart's `crds/` holds the output of `write_crds`; a test compares them, so regenerate with

    python -P -m labkube.operator.crds helm/labkube/crds
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml
from pydantic import BaseModel

from labkube.campaign import CampaignSpec
from labkube.operator.k8s_models import CampaignResourceSpec, CampaignStatus, RunResourceSpec, RunStatus
from labkube.run_spec import RunSpec
from labkube.task_card import TaskCard

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = [
    "API_VERSION",
    "FIELD_MANAGER",
    "GROUP",
    "LABEL_CAMPAIGN",
    "LABEL_RUN",
    "VERSION",
    "SchemaError",
    "apply_crds",
    "build_run_resource",
    "campaign_crd",
    "campaign_resource_spec",
    "check_structural",
    "crd_files",
    "crd_yaml",
    "crds_problem",
    "dns_label",
    "missing_fields",
    "object_schema",
    "openapi_to_jsonschema",
    "owner_reference",
    "run_crd",
    "run_name",
    "run_resource_spec",
    "run_spec_from_resource",
    "spec_from_resource",
    "structural_schema",
    "validate_resource",
    "write_crds",
]

GROUP = "labkube.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORIES = ["labkube"]

LABEL_CAMPAIGN = f"{GROUP}/campaign"
LABEL_RUN = f"{GROUP}/run"

# Keywords copied as they are.
_KEEP = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "nullable",
    "exclusiveMinimum",
    "exclusiveMaximum",
}
# Keywords dropped: documentation-only, or meaningless to the API server.
_DROP = {"title", "default", "examples", "propertyNames", "$schema", "discriminator", "readOnly", "writeOnly"}
_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")


class SchemaError(ValueError):
    """A pydantic model has no structural OpenAPI form (or a resource does not match its CRD)."""


# -- pydantic JSON Schema -> structural OpenAPI v3 ----------------------------------------------


def structural_schema(model: type[BaseModel], *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model` (its aliases as property names), without
    the top-level properties named in `exclude`."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _convert(raw, defs, model.__name__, ())
    for name in exclude:
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", []):
            schema["required"] = [r for r in schema["required"] if r != name]
    problems = check_structural(schema)
    if problems:
        raise SchemaError(f"{model.__name__}: not structural: " + "; ".join(problems))
    return schema


def _resolve(node: dict[str, Any], defs: dict[str, Any], where: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """Inline a `$ref` (or a one-element `allOf`, pydantic's older spelling), keeping the
    referring node's own keys (its description wins)."""
    rest = {k: v for k, v in node.items() if k not in ("$ref", "allOf")}
    ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
    name = ref.rsplit("/", 1)[-1]
    if name in seen:
        raise SchemaError(f"{where}: {name} refers to itself; a recursive model has no structural schema")
    target = _convert(defs[name], defs, where, (*seen, name))
    return {**target, **_convert(rest, defs, where, seen)} if rest else target


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str, seen: tuple[str, ...]) -> dict[str, Any]:
    if "$ref" in node or ("allOf" in node and len(node["allOf"]) == 1 and "$ref" in node["allOf"][0]):
        return _resolve(node, defs, where, seen)
    out: dict[str, Any] = {}
    for key in ("anyOf", "oneOf"):
        if key in node:
            out.update(_union(node[key], defs, where, seen))
    for key, value in node.items():
        if key in ("anyOf", "oneOf") or key in _DROP:
            continue
        if key == "properties":
            out["properties"] = {n: _convert(s, defs, f"{where}.{n}", seen) for n, s in value.items()}
        elif key == "items":
            if not isinstance(value, dict):
                raise SchemaError(f"{where}: tuple-style `items` has no structural form")
            out["items"] = _convert(value, defs, f"{where}[]", seen)
        elif key == "prefixItems":
            raise SchemaError(f"{where}: a fixed-length tuple has no structural form (use tuple[X, ...])")
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs, f"{where}{{}}", seen)
            # `false` (extra="forbid"): the API server prunes or rejects unknown fields itself.
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            if len(types) != 1:
                raise SchemaError(f"{where}: type {value} has no structural form")
            out["type"] = types[0]
            if "null" in value:
                out["nullable"] = True
        elif key == "enum":
            values = [v for v in value if v is not None]
            out["enum"] = values
            if len(values) != len(value):
                out["nullable"] = True
        elif key in _KEEP:
            out[key] = value
        else:
            raise SchemaError(f"{where}: JSON Schema keyword {key!r} has no translation to a CRD schema")
    default = node.get("default")
    if default not in (None, "") and not isinstance(default, dict | list):
        out["description"] = f"{out.get('description', '').rstrip()} Default: {_show(default)}.".lstrip()
    if "enum" in out and "type" not in out and all(isinstance(v, str) for v in out["enum"]):
        out["type"] = "string"
    first = [k for k in ("type", "nullable", "description") if k in out]
    return {**{k: out[k] for k in first}, **{k: v for k, v in out.items() if k not in first}}


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _union(options: list[dict[str, Any]], defs: dict[str, Any], where: str, seen: tuple[str, ...]) -> dict[str, Any]:
    nullable = any(o.get("type") == "null" for o in options)
    rest = [_convert(o, defs, where, seen) for o in options if o.get("type") != "null"]
    if len(rest) == 1:
        return {**rest[0], "nullable": True} if nullable else rest[0]
    # Several types: keep the value as written; pydantic checks it when the operator reads it.
    return {"x-kubernetes-preserve-unknown-fields": True}


def check_structural(schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Violations of the Kubernetes rules for structural schemas (empty when structural)."""
    problems: list[str] = []
    where = path or "<root>"
    for key in ("$ref", "$defs", "definitions", "default"):
        if key in schema:
            problems.append(f"{where}: has {key}")
    typed = "type" in schema
    untyped_ok = schema.get("x-kubernetes-preserve-unknown-fields") is True or schema.get("x-kubernetes-int-or-string")
    if not typed and not untyped_ok:
        problems.append(f"{where}: no type")
    if typed and schema["type"] not in _TYPES:
        problems.append(f"{where}: type {schema['type']!r}")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{where}: both properties and additionalProperties")
    if "additionalProperties" in schema and not isinstance(schema["additionalProperties"], dict):
        problems.append(f"{where}: additionalProperties must be a schema")
    for key in ("nullable", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema and not isinstance(schema[key], bool):
            problems.append(f"{where}: {key} must be a boolean")
    for junctor in _JUNCTORS:
        for sub in schema.get(junctor, []) if junctor != "not" else [schema.get("not", {})]:
            for banned in ("type", "description", "default", "additionalProperties", "nullable"):
                if banned in sub:
                    problems.append(f"{where}: {banned} inside {junctor}")
    for name, sub in schema.get("properties", {}).items():
        problems += check_structural(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        problems += check_structural(schema["items"], f"{path}[]")
    elif "items" in schema:
        problems.append(f"{where}: items must be one schema")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += check_structural(schema["additionalProperties"], f"{path}{{}}")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{where}: array without items")
    return problems


# -- the two CRDs ---------------------------------------------------------------------------------

_NAME_RULE = {
    "rule": "size(self.metadata.name) <= 63",
    "message": "the name is used as a label value: at most 63 characters",
}


def object_schema(spec: dict[str, Any], status: dict[str, Any], description: str) -> dict[str, Any]:
    """The openAPIV3Schema of a resource with this spec and status."""
    status = copy.deepcopy(status)
    # kopf keeps its own bookkeeping under status.kopf; everything else in status is ours.
    status["properties"]["kopf"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "kopf's bookkeeping (handler progress).",
    }
    conditions = status["properties"].get("conditions")
    if conditions is not None:
        conditions["x-kubernetes-list-type"] = "map"
        conditions["x-kubernetes-list-map-keys"] = ["type"]
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [_NAME_RULE],
    }


def _crd(
    kind: str, plural: str, short: list[str], schema: dict[str, Any], columns: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "labkube", "app.kubernetes.io/part-of": "labkube"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": CATEGORIES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _column(name: str, type_: str, path: str, priority: int = 0, description: str = "") -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        column["priority"] = priority
    if description:
        column["description"] = description
    return column


def campaign_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of `Campaign` (short name `lkc`)."""
    spec = structural_schema(CampaignResourceSpec, exclude=["name"])
    spec["description"] = (
        "A campaign file (as for `labkube campaign run`) without `name` (the resource's name is used), "
        "plus `pod`. Field names are the CLI's."
    )
    status = structural_schema(CampaignStatus)
    schema = object_schema(spec, status, "Tasks x models x seeds, run as one Run per combination.")
    columns = [
        _column("Tasks", "string", ".spec.tasks"),
        _column("Models", "string", ".spec.models"),
        _column("Seeds", "string", ".spec.seeds"),
        _column("Phase", "string", ".status.phase"),
        _column("Progress", "string", ".status.progress", description="Runs in a final state / all runs"),
        _column("GPU-h", "number", ".status.gpuHoursUsed", priority=1),
        _column("Age", "date", ".metadata.creationTimestamp"),
    ]
    return _crd("Campaign", "campaigns", ["lkc"], schema, columns)


def run_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of `Run` (short name `lkr`)."""
    spec = structural_schema(RunResourceSpec)
    spec["description"] = "The run's run.json, plus the task's resources and the campaign's pod settings."
    status = structural_schema(RunStatus)
    schema = object_schema(spec, status, "One task x model x seed of a Campaign; its agent runs in one pod at a time.")
    columns = [
        _column("Task", "string", ".spec.task"),
        _column("Model", "string", ".spec.model"),
        _column("Seed", "integer", ".spec.seed"),
        _column("Phase", "string", ".status.phase"),
        _column("Score", "number", ".status.score"),
        _column("Outcome", "string", ".status.outcome"),
        _column("Cost", "number", ".status.costUsd", description="US dollars"),
        _column("Attempts", "integer", ".status.attempts", priority=1),
        _column("Pod", "string", ".status.podName", priority=1),
        _column("Stop", "string", ".status.stopReason", priority=1),
        _column("Age", "date", ".metadata.creationTimestamp"),
    ]
    return _crd("Run", "runs", ["lkr"], schema, columns)


_HEADER = "# Generated by `python -P -m labkube.operator.crds helm/labkube/crds` from labkube's pydantic models.\n"
_HEADER += "# Do not edit: tests/test_crds.py fails when this file and the models disagree.\n"


def crd_yaml(crd: Mapping[str, Any]) -> str:
    """The committed text of a CRD file."""
    return _HEADER + yaml.safe_dump(dict(crd), sort_keys=False, width=100, allow_unicode=True)


def crd_files() -> dict[str, str]:
    """File name -> text, for every CRD."""
    return {f"{GROUP}_{c['spec']['names']['plural']}.yaml": crd_yaml(c) for c in (campaign_crd(), run_crd())}


def write_crds(directory: str | Path) -> list[Path]:
    """Write every CRD into `directory` (the chart's `crds/`); returns the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in crd_files().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# -- checking a resource against its CRD ------------------------------------------------------------


def openapi_to_jsonschema(schema: Mapping[str, Any], *, strict_fields: bool = True) -> dict[str, Any]:
    """A JSON Schema (2020-12) that accepts what the API server accepts for this CRD schema
    (CEL rules and formats aside). `strict_fields` rejects unknown fields, as kubectl's default
    server-side field validation does, instead of pruning them."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "exclusiveMinimum", "exclusiveMaximum"):
            continue
        if key == "properties":
            out[key] = {n: openapi_to_jsonschema(s, strict_fields=strict_fields) for n, s in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = openapi_to_jsonschema(value, strict_fields=strict_fields)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [openapi_to_jsonschema(s, strict_fields=strict_fields) for s in value]
        elif key == "not":
            out[key] = openapi_to_jsonschema(value, strict_fields=strict_fields)
        else:
            out[key] = value
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if schema.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
    if schema.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if strict_fields and out.get("type") == "object" and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def validate_resource(obj: Mapping[str, Any], crd: Mapping[str, Any]) -> None:
    """Check a custom resource against its CRD's schema as the API server would (CEL rules and
    formats aside). Raises `jsonschema.ValidationError`."""
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    names = crd["spec"]["names"]
    expected = f"{crd['spec']['group']}/{version['name']}"
    if obj.get("apiVersion") != expected or obj.get("kind") != names["kind"]:
        raise jsonschema.ValidationError(
            f"expected apiVersion {expected} kind {names['kind']}, got {obj.get('apiVersion')} {obj.get('kind')}"
        )
    schema = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's own validation
    jsonschema.Draft202012Validator(schema).validate(dict(obj))


# -- resource -> spec ------------------------------------------------------------------------------


def _name_of(obj: Mapping[str, Any]) -> str:
    name = obj.get("metadata", {}).get("name")
    if not name:
        raise SchemaError("resource has no metadata.name")
    return str(name)


def campaign_resource_spec(obj: Mapping[str, Any]) -> CampaignResourceSpec:
    """`Campaign.spec` with its name (from `metadata.name`) and pydantic's defaults applied.

    Raises `pydantic.ValidationError` on a bad spec and `SchemaError` on a `spec.name`.
    """
    name = _name_of(obj)
    spec = dict(obj.get("spec") or {})
    if "name" in spec:
        raise SchemaError(
            f"Campaign {name}: spec.name is not a field of a Campaign resource; metadata.name is its name"
        )
    spec.setdefault("backend", "k8s")
    return CampaignResourceSpec.model_validate({**spec, "name": name})


def spec_from_resource(obj: Mapping[str, Any]) -> CampaignSpec:
    """The `CampaignSpec` a Campaign resource describes: the same object a campaign file gives."""
    return campaign_resource_spec(obj).to_campaign_spec()


def run_spec_from_resource(obj: Mapping[str, Any]) -> RunResourceSpec:
    """`Run.spec` as a model; `.to_run_spec()` gives the `run.json` content."""
    return RunResourceSpec.model_validate(obj.get("spec") or {})


# -- spec -> resource -------------------------------------------------------------------------------

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, max_length: int = 63) -> str:
    """`text` as a DNS-1123 label (also a valid label value): lower-case alphanumerics and
    '-', at most `max_length` characters; a shortened name ends in a hash of the whole."""
    clean = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if len(clean) <= max_length:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean[: max_length - 9].rstrip('-')}-{digest}"


def run_name(campaign: str, run_id: str) -> str:
    """The name of a campaign's Run resource (unique per campaign; at most 63 characters)."""
    return dns_label(f"{campaign}-{run_id}")


def owner_reference(obj: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """An ownerReference to `obj` (which must come from the API server: it needs a uid)."""
    meta = obj.get("metadata", {})
    if not meta.get("uid"):
        raise SchemaError(f"{obj.get('kind')} {meta.get('name')}: no metadata.uid; read the object from the API first")
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def run_resource_spec(run: RunSpec, card: TaskCard, campaign: Mapping[str, Any]) -> RunResourceSpec:
    """What a run's pod is built from: the run, its task's resources and the Campaign's `pod` block."""
    settings = campaign_resource_spec(campaign)
    return RunResourceSpec.model_validate(
        {
            **run.model_dump(),
            "family": card.family,
            "resources": card.resources.model_copy(update={"gpus": run.gpus}),
            "pod": settings.pod,
        }
    )


def build_run_resource(
    run: RunSpec, card: TaskCard, campaign: Mapping[str, Any], spec: RunResourceSpec | None = None
) -> dict[str, Any]:
    """The `Run` object for one run of a Campaign resource, owned by the Campaign (deleting the
    campaign deletes its runs, and their pods with them). Its spec is informational: the operator
    builds pods from the spec it admitted (`admission`), which a tenant cannot edit afterwards."""
    spec = spec or run_resource_spec(run, card, campaign)
    campaign_name = _name_of(campaign)
    name = run_name(campaign_name, run.run_id)
    return {
        "apiVersion": API_VERSION,
        "kind": "Run",
        "metadata": {
            "name": name,
            "namespace": campaign.get("metadata", {}).get("namespace"),
            "labels": {
                "app.kubernetes.io/name": "labkube",
                "app.kubernetes.io/part-of": "labkube",
                "app.kubernetes.io/managed-by": "labkube-operator",
                LABEL_CAMPAIGN: campaign_name,
                LABEL_RUN: name,
            },
            "ownerReferences": [owner_reference(campaign)],
        },
        "spec": spec.model_dump(mode="json", exclude_none=True),
    }


# -- upgrading the CRDs in a cluster ----------------------------------------------------------------

FIELD_MANAGER = "labkube"


def apply_crds(client: ApiClient) -> list[tuple[str, str]]:
    """Server-side apply this labkube's CRDs (what `helm upgrade` never does: Helm installs `crds/` once and leaves
    them). Applied with `force`: labkube owns these definitions, and a CRD that `helm install` created has its fields
    owned by the `helm` manager, which would otherwise be a conflict. Returns (CRD name, `created`, `updated` or
    `unchanged`) in order. Any refusal is one `KubeError` line."""
    from kubernetes.client import ApiException, ApiextensionsV1Api

    from labkube.operator.kube import KubeError, answered

    api = ApiextensionsV1Api(client)
    where = client.configuration.host
    outcomes = []
    for crd in (campaign_crd(), run_crd()):
        name = crd["metadata"]["name"]
        try:
            try:
                before = json.loads(
                    answered(
                        api.read_custom_resource_definition, name, _preload_content=False, _request_timeout=30
                    ).data
                )["metadata"]["resourceVersion"]
            except ApiException as exc:
                if exc.status != 404:
                    raise
                before = None
            response = answered(
                api.patch_custom_resource_definition,
                name,
                crd,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type="application/apply-patch+yaml",
                _preload_content=False,
                _request_timeout=30,
            )
        except ApiException as exc:
            hint = (
                ": CRDs are cluster-scoped; apply them with a cluster admin's context (--kube-context)"
                if exc.status in (401, 403)
                else ""
            )
            raise KubeError(
                f"CustomResourceDefinition {name}: the Kubernetes API at {where} answered {exc.status} "
                f"{exc.reason}{_status_message(exc.body)}{hint}"
            ) from None
        except Exception as exc:  # urllib3, DNS, TLS: one line, no traceback
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise KubeError(
                f"CustomResourceDefinition {name}: cannot reach the Kubernetes API at {where}: {first}"
            ) from None
        after = json.loads(response.data)["metadata"]["resourceVersion"]
        outcomes.append((name, "created" if before is None else "unchanged" if after == before else "updated"))
    return outcomes


def missing_fields(expected: Mapping[str, Any], stored: Mapping[str, Any], path: str = "") -> list[str]:
    """The fields (dotted paths) the CRD schema `expected` declares and the installed `stored` one does not: what the
    API server prunes from every write, answering 200. Nothing is missing below a node that keeps unknown fields."""
    missing: list[str] = []
    keeps = stored.get("x-kubernetes-preserve-unknown-fields") is True
    props = stored.get("properties") or {}
    extra = stored.get("additionalProperties")
    for name, sub in (expected.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        have = props.get(name, extra if isinstance(extra, dict) else None)
        if have is not None:
            missing += missing_fields(sub, have, where)
        elif not keeps:
            missing.append(where)
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(expected.get(key), dict) and isinstance(stored.get(key), dict):
            missing += missing_fields(expected[key], stored[key], f"{path}{suffix}")
    return missing


def crds_problem(client: ApiClient) -> str | None:
    """Why the installed Campaign and Run CRDs cannot hold what this operator writes and reads, in one line naming
    the fix; None when they can (newer CRDs can: only fields this labkube declares and they lack count). The API
    server prunes a field its CRD lacks from every write and answers 200, so an operator leading with older CRDs
    would lose `report`, `clusterSpend` and the like without an error. Reads with `list` (what kopf's RBAC has);
    an API error is raised."""
    from kubernetes.client import ApiextensionsV1Api

    from labkube.operator.kube import answered

    api = ApiextensionsV1Api(client)
    problems = []
    for crd in (campaign_crd(), run_crd()):
        name = crd["metadata"]["name"]
        listed = answered(
            api.list_custom_resource_definition,
            field_selector=f"metadata.name={name}",
            _preload_content=False,
            _request_timeout=30,
        )
        items = json.loads(listed.data).get("items") or []
        versions = (items[0].get("spec") or {}).get("versions") or [] if items else []
        version = next((v for v in versions if v.get("name") == VERSION and v.get("served")), None)
        if not items or version is None:
            problems.append(f"{name} {'does not serve ' + VERSION if items else 'is not installed'}")
            continue
        expected = crd["spec"]["versions"][0]
        missing = missing_fields(
            expected["schema"]["openAPIV3Schema"], (version.get("schema") or {}).get("openAPIV3Schema") or {}
        )
        if "status" not in (version.get("subresources") or {}):
            missing.insert(0, "the status subresource")
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            problems.append(f"{name} lacks {', '.join(missing[:5])}{more}")
    if not problems:
        return None
    return (
        f"the installed CRDs are older than this operator ({'; '.join(problems)}): refusing to lead until they are "
        "upgraded with `labkube crds apply` (Helm never upgrades a chart's CRDs)"
    )


def _status_message(body: object) -> str:
    """`: <message>` of a Kubernetes Status body, or nothing."""
    try:
        message = json.loads(body)["message"]  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        return ""
    return f": {' '.join(str(message).split())[:300]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m labkube.operator.crds", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="where to write the CRDs (the chart's crds/)")
    parser.add_argument("--check", action="store_true", help="only report whether the files are up to date")
    args = parser.parse_args(argv)
    if args.check:
        stale = [n for n, text in crd_files().items() if _read(args.directory / n) != text]
        for name in stale:
            print(f"{args.directory / name}: out of date; run without --check to regenerate", file=sys.stderr)
        return 1 if stale else 0
    for path in write_crds(args.directory):
        print(path)
    return 0


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
