"""Live control of runs on a cluster (docs/live-control.md, "On Kubernetes"): the API is the control.

A Run's `spec.interventions` is its record (`labkube.interventions`): `labkube runs VERB` (`steer`) and
`kubectl patch --type=json -p '[{"op": "add", "path": "/spec/interventions/-", "value": {...}}]'` append to it, and
the state (paused, cancelled, budgets, messages) is folded from it (`RunControl`). The operator follows it
(`k8s_backend.PodRun`): a pause ends the run's pod and leaves the Run `Paused`, its supervisor returning a result that
is not final (`PAUSED`), so its slot and GPUs go to other runs; the campaign daemon hands the run back to the driver
once a resume (or a cancel) is appended (`campaign_daemon`). Being in the spec, a pause outlives the operator: a new
leader reads it before it starts any pod. The agent's container reads a copy the operator keeps in a ConfigMap
(`control_config_map`), mounted read-only (`labkube.control.CONTROL_FILE_VARIABLE`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, cast

from pydantic import ValidationError

from labkube.budgets import Spend
from labkube.control import PAUSED_EXIT
from labkube.interventions import (
    ControlError,
    ControlVerb,
    Intervention,
    InterventionKind,
    RunControl,
    RunState,
    SteerRequest,
    check_request,
    usage_checkpoint,
)
from labkube.operator.crds import GROUP, LABEL_CAMPAIGN, VERSION, dns_label
from labkube.operator.k8s_models import RunStatus
from labkube.operator.kube import KubeError, KubeTarget, list_pages, short_error, status_of
from labkube.run_spec import RunSpec

__all__ = [
    "CONTROL_FILE",
    "CONTROL_KEY",
    "CONTROL_MOUNT",
    "PAUSED",
    "config_map_name",
    "control_config_map",
    "control_of",
    "paused_condition",
    "steer",
]

log = logging.getLogger("labkube.operator.k8s")

# A supervisor's result for a run it paused starts with this (not final: the campaign daemon waits for a resume).
PAUSED = "paused: "
CONTROL_MOUNT = "/etc/labkube/control"
CONTROL_KEY = "control.json"
CONTROL_FILE = f"{CONTROL_MOUNT}/{CONTROL_KEY}"


def control_of(run: Mapping[str, Any], run_id: str | None = None) -> RunControl:
    """The control a Run's `spec.interventions` adds up to. An entry pydantic refuses (written past the CRD's schema
    by hand) is skipped and logged: it cannot be followed, and the others still are."""
    spec = run.get("spec") or {}
    rid = run_id or str(spec.get("run_id") or (run.get("metadata") or {}).get("name") or "")
    made: list[Intervention] = []
    for raw in spec.get("interventions") or []:
        try:
            made.append(Intervention.model_validate(raw))
        except ValidationError as exc:
            name = (run.get("metadata") or {}).get("name")
            log.warning("run %s: an intervention is ignored: %s", name, short_error(exc))
    return RunControl(run_id=rid, interventions=made)


def paused_condition(paused: Intervention) -> tuple[str, str]:
    """The reason and message of a paused Run's `Paused` condition: who paused it and why."""
    reason = "UsageCheckpoint" if paused.kind is InterventionKind.usage_checkpoint else "PausedByRequest"
    return reason, f"paused: {paused.describe()}"


def config_map_name(run: str) -> str:
    return dns_label(f"{run}-control", 253)


def control_config_map(control: RunControl, run: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap holding a run's control as JSON (`CONTROL_KEY`), owned by its Run (gone with it), which the
    agent's container mounts read-only at `CONTROL_MOUNT`."""
    from labkube.operator.crds import owner_reference

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(run),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "labkube-operator", "labkube.dev/run": run},
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {CONTROL_KEY: control.model_dump_json()},
    }


# -- `labkube runs VERB` against a cluster ----------------------------------------------------------------------


def run_state(run: Mapping[str, Any]) -> RunState:
    """What a request is checked against for one Run: started once it has had an agent pod, final once its status
    is."""
    spec = run.get("spec") or {}
    status = RunStatus.model_validate(run.get("status") or {})
    return RunState(
        run_id=str(spec.get("run_id")),
        family=str(spec.get("family") or "researchgym"),
        agent=str(spec.get("agent") or "rg-agent"),
        started=status.attempts > 0,
        final=status.phase.final,
        control=control_of(run),
    )


def steer(
    request: SteerRequest, kube_context: str | None, namespace: str | None, *, target: KubeTarget | None = None
) -> list[str]:
    """Apply `request` to its campaign's Runs: each run it acts on gets the request's intervention appended to its
    `spec.interventions` (a JSON patch, `add /spec/interventions/-`, as `kubectl patch` does). Checked first, as
    locally (`check_request`): a refusal is one ControlError line and nothing is patched. `drain` pauses every run
    not started yet (the running ones finish); a campaign-wide pause is a pause of each of its unfinished runs.
    Returns the run ids acted on. A cluster that cannot be reached or read is one KubeError line."""
    from kubernetes.client import CustomObjectsApi

    from labkube.operator.kube import api_client, check_reachable, default_namespace

    if request.verb is ControlVerb.drain and request.run_ids:
        raise ControlError("drain acts on the whole campaign (its runs not started yet); name no runs")
    target = target or KubeTarget(context=kube_context)
    ns = namespace or default_namespace(target)
    client = api_client(target)
    try:
        check_reachable(client, target)
        custom = CustomObjectsApi(client)
        runs = _campaign_runs(custom, ns, request.campaign)
        by_id = {str((r.get("spec") or {}).get("run_id")): r for r in runs}
        if request.run_ids:
            unknown = [i for i in request.run_ids if i not in by_id]
            if unknown:
                raise ControlError(f"campaign {request.campaign} has no run {unknown[0]}")
            chosen = [by_id[i] for i in request.run_ids]
        elif request.all_runs or request.verb is ControlVerb.drain:
            chosen = runs
        else:
            raise ControlError(f"name the runs to {request.verb.value}, or --all for every run of the campaign")
        states = [run_state(r) for r in chosen]
        all_runs = request.all_runs or (request.verb is ControlVerb.drain and not request.run_ids)
        picked = check_request(request.verb, states, all_runs, request.intervention.budgets)
        for run_id in picked:
            _append(custom, ns, by_id[run_id], request.for_run())
        return picked
    finally:
        client.close()


def _campaign_runs(custom: Any, namespace: str, campaign: str) -> list[dict[str, Any]]:
    from kubernetes.client import ApiException

    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "campaigns", campaign)
        listing = list_pages(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "runs",
            label_selector=f"{LABEL_CAMPAIGN}={campaign}",
        )
    except ApiException as exc:
        if exc.status == 404:
            raise ControlError(f"no Campaign {campaign} in namespace {namespace}") from None
        raise KubeError(f"reading Campaign {campaign} in {namespace}: {exc.status} {exc.reason}") from None
    except KubeError:
        raise
    except Exception as exc:
        raise KubeError(f"reading Campaign {campaign} in {namespace}: {short_error(exc)}") from None
    runs = cast(list[dict[str, Any]], listing.get("items") or [])
    return sorted(runs, key=lambda r: str((r.get("spec") or {}).get("run_id")))


def _append(custom: Any, namespace: str, run: Mapping[str, Any], intervention: Intervention) -> None:
    """`add /spec/interventions/-`; a Run made before the field existed has no list: it is made, on the condition
    that the Run is as read (a `test` of its resourceVersion), so no concurrent append is overwritten."""
    value = json.loads(intervention.model_dump_json(exclude_none=True))
    name = run["metadata"]["name"]
    if isinstance((run.get("spec") or {}).get("interventions"), list):
        patch = [{"op": "add", "path": "/spec/interventions/-", "value": value}]
    else:
        rv = run["metadata"]["resourceVersion"]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/spec/interventions", "value": [value]},
        ]
    try:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "runs", name, patch, _content_type="application/json-patch+json"
        )
    except Exception as exc:
        code = status_of(exc)
        why = f"{code} {getattr(exc, 'reason', '')}".strip() if code else short_error(exc)
        raise KubeError(f"patching Run {name} in {namespace}: {why}") from None


def appended(intervention: Intervention) -> list[dict[str, Any]]:
    """The JSON patch that appends `intervention` to a Run's record, as `labkube runs` and `kubectl patch` do."""
    return [{"op": "add", "path": "/spec/interventions/-", "value": intervention.model_dump(mode="json")}]


def checkpoint_due(control: RunControl, exit_code: int | None, seen: Spend, spec: RunSpec) -> Intervention | None:
    """The usage checkpoint (`pause_every_usd`, `pause_every_hours`) an agent pod that saved and exited for a pause no
    one made (PAUSED_EXIT) stopped at: the multiple the run's spend crossed as the operator saw it (`seen`: the
    gateways' dollars, the pods' time), never as the pod says. None for any other end, or when nothing was crossed
    (then the pod's word is not taken: the run goes on)."""
    if exit_code != PAUSED_EXIT or control.paused is not None or control.cancelled is not None:
        return None
    due = control.due_checkpoint(seen, spec.pause_every_usd, spec.pause_every_hours)
    return usage_checkpoint(due, spec.pause_every_usd, spec.pause_every_hours) if due else None
