"""`labkube run --backend k8s`, the command line's side of the operator: submit a campaign as a Campaign
resource (`submit_campaign`: created, or found the same), read it and its Runs back (`read_campaign`), and one row
per Run for the status table (`run_rows`). The operator does the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from labkube.campaign import CampaignSpec
from labkube.operator.crds import (
    API_VERSION,
    GROUP,
    LABEL_CAMPAIGN,
    VERSION,
    campaign_crd,
    campaign_resource_spec,
    validate_resource,
)
from labkube.operator.k8s_models import ConditionStatus, RunStatus
from labkube.operator.kube import KubeError, list_pages
from labkube.run_spec import RunPhase

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["CampaignExists", "campaign_resource", "read_campaign", "run_rows", "submit_campaign"]


class CampaignExists(ValueError):
    """`labkube run --backend k8s`: a different Campaign of that name exists."""


def campaign_resource(spec: CampaignSpec, namespace: str) -> dict[str, Any]:
    """The Campaign object for a CLI campaign (checked against the CRD's schema)."""
    body = spec.model_dump(mode="json", exclude={"name", "backend"}, exclude_defaults=True)
    body["tasks"] = list(spec.tasks)
    body["backend"] = "k8s"
    obj = {
        "apiVersion": API_VERSION,
        "kind": "Campaign",
        "metadata": {"name": spec.name, "namespace": namespace},
        "spec": body,
    }
    validate_resource(obj, campaign_crd())
    return obj


def submit_campaign(client: ApiClient, spec: CampaignSpec, namespace: str) -> tuple[dict[str, Any], bool]:
    """Create the Campaign (or find the same one); returns (object, created). Raises `KubeError`
    when the CRD is missing and `CampaignExists` when a different campaign has the name."""
    from kubernetes.client import ApiException, CustomObjectsApi

    custom = CustomObjectsApi(client)
    obj = campaign_resource(spec, namespace)
    try:
        made = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", obj)
        return cast(dict[str, Any], made), True
    except ApiException as exc:
        if exc.status == 404:
            raise KubeError(
                f"the Campaign resource is not installed in the cluster (CRD campaigns.{GROUP}): "
                "helm install labkube helm/labkube"
            ) from None
        if exc.status != 409:
            raise KubeError(f"creating Campaign {spec.name} in {namespace}: {exc.status} {exc.reason}") from None
    existing = cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", spec.name)
    )
    theirs = campaign_resource_spec(existing).to_campaign_spec().model_dump(exclude={"concurrency", "backend"})
    if theirs != spec.model_dump(exclude={"concurrency", "backend"}):
        raise CampaignExists(
            f"Campaign {spec.name} already exists in namespace {namespace} with a different spec: "
            f"choose another --name, or `kubectl delete lkc {spec.name} -n {namespace}` (its results are kept)"
        )
    return existing, False


def read_campaign(client: ApiClient, namespace: str, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The Campaign object (None once deleted) and its Runs."""
    from kubernetes.client import ApiException, CustomObjectsApi

    custom = CustomObjectsApi(client)
    try:
        campaign = cast(
            dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", name)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None, []
        raise
    runs = list_pages(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        "runs",
        label_selector=f"{LABEL_CAMPAIGN}={name}",
    )
    return campaign, list(runs["items"])


def run_rows(runs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per Run for a status table: run id, phase, score, tokens, dollars, attempts, message."""
    rows = []
    for run in runs:
        status = RunStatus.model_validate(run.get("status") or {})
        problem = next((c for c in status.conditions if c.status == ConditionStatus.false), None)
        if status.phase is RunPhase.paused:  # who paused it and why (`k8s_control.paused_condition`)
            problem = next((c for c in status.conditions if c.type == "Paused"), problem)
        rows.append(
            {
                "run_id": (run.get("spec") or {}).get("run_id", run["metadata"]["name"]),
                "phase": status.phase.value,
                "score": status.score,
                "tokens": status.tokens,
                "cost_usd": status.cost_usd,
                "spend_at_least": status.spend_at_least,
                "attempts": status.attempts,
                "pod": status.pod_name or "",
                "message": f"{problem.reason}: {problem.message}" if problem else "",
            }
        )
    return sorted(rows, key=lambda r: r["run_id"])
