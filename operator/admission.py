"""Admission of a Campaign: what its author may choose for the pods the operator creates.

The operator creates pods with its own service account, so every pod field a tenant can set is a
right the tenant borrows from the operator (a confused deputy). The chart's `tenancy` values list
what a Campaign, and the tasks it names, may choose: priority classes, node pools (node selector
values), toleration keys, images, runtime classes, Kueue queues, and the keys of pod labels and annotations
(labkube's own, `app.kubernetes.io/*` and `labkube.*`, never). Anything else is refused before a
Run or pod exists, with one message per field naming the allowed values. The chart's own `runs.*`
settings are always allowed: the cluster operator chose them.

What was admitted is written to the campaign directory (`admitted/<run-id>.json`, outside every
pod's mount), and pods are built from that file, never from the `Run` resource a tenant can edit.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from labkube.operator.k8s_models import PodOptions, RunResourceSpec, Tenancy, labkube_key
from labkube.operator.pod_manifest import LABEL_QUEUE
from labkube.store import read_model, write_model

__all__ = ["admission_violations", "admitted_path", "key_allowed", "read_admitted", "write_admitted"]


def _allowed(values: Iterable[str]) -> str:
    listed = sorted(set(values))
    return f"allowed: {', '.join(listed)}" if listed else "none allowed (chart value tenancy)"


def image_allowed(image: str, allowed: Iterable[str]) -> bool:
    """An exact reference, or a prefix ending in `/` or `:` (a registry or repository)."""
    return any(image == a or (a.endswith(("/", ":")) and image.startswith(a)) for a in allowed)


OWN_KEYS = f"app.kubernetes.io/*, labkube.*, and {LABEL_QUEUE}, which pod.queueName sets"


def key_allowed(key: str, allowed: Iterable[str]) -> bool:
    """An exact label or annotation key, or a prefix ending in `/` (every key of a DNS prefix) or `*`."""
    return any(key == a or (a.endswith(("/", "*")) and key.startswith(a.rstrip("*"))) for a in allowed)


def admission_violations(runs: list[RunResourceSpec], options: PodOptions, tenancy: Tenancy) -> list[str]:
    """One line per field a Campaign (or a task it names) sets outside `tenancy`; empty when admitted."""
    found: list[str] = []

    def refuse(line: str) -> None:
        if line not in found:
            found.append(line)

    for run in runs:
        pod, res = run.pod, run.resources
        priority = pod.priority_class_name
        if priority and priority != options.priority_class_name and priority not in tenancy.priority_classes:
            refuse(f"spec.pod.priorityClassName: {priority!r} is not allowed ({_allowed(tenancy.priority_classes)})")
        if pod.queue_name and pod.queue_name != options.queue_name and pod.queue_name not in tenancy.queue_names:
            refuse(f"spec.pod.queueName: {pod.queue_name!r} is not allowed ({_allowed(tenancy.queue_names)})")
        for where, selector in (
            ("spec.pod.nodeSelector", pod.node_selector),
            (f"task {run.task}: resources.node_selector", res.node_selector),
        ):
            for key, value in sorted(selector.items()):
                if options.node_selector.get(key) == value:
                    continue
                allowed = tenancy.node_selectors.get(key, [])
                if value not in allowed:
                    shown = _allowed(f"{k}={v}" for k, vs in tenancy.node_selectors.items() for v in vs)
                    refuse(f"{where}: {key}={value} is not allowed ({shown})")
        chart_tolerations = [t.key for t in options.tolerations]
        for toleration in pod.tolerations:
            key = toleration.key or "*"
            if key not in tenancy.toleration_keys and key not in chart_tolerations:
                refuse(f"spec.pod.tolerations: key {key!r} is not allowed ({_allowed(tenancy.toleration_keys)})")
        for where, runtime in (
            ("spec.pod.runtimeClassName", pod.runtime_class_name),
            (f"task {run.task}: resources.runtime_class", res.runtime_class),
        ):
            if runtime and runtime != options.runtime_class_name and runtime not in tenancy.runtime_classes:
                refuse(f"{where}: {runtime!r} is not allowed ({_allowed(tenancy.runtime_classes)})")
        if res.image and res.image != options.default_image and not image_allowed(res.image, tenancy.images):
            refuse(f"task {run.task}: resources.image {res.image!r} is not allowed ({_allowed(tenancy.images)})")
        for field, asked, chart, allowed in (
            ("labels", pod.labels, options.labels, tenancy.pod_labels),
            ("annotations", pod.annotations, options.annotations, tenancy.pod_annotations),
        ):
            for key, value in sorted(asked.items()):
                if labkube_key(key) or (field == "labels" and key == LABEL_QUEUE):
                    refuse(f"spec.pod.{field}: {key} is set by labkube itself ({OWN_KEYS}); remove it")
                elif chart.get(key) != value and not key_allowed(key, allowed):
                    refuse(f"spec.pod.{field}: key {key!r} is not allowed ({_allowed(allowed)})")
    return found


def admitted_path(campaign_root: Path, run_id: str) -> Path:
    return campaign_root / "admitted" / f"{run_id}.json"


def write_admitted(campaign_root: Path, runs: list[RunResourceSpec]) -> None:
    for run in runs:
        write_model(admitted_path(campaign_root, run.run_id), run)


def read_admitted(campaign_root: Path, run_id: str) -> RunResourceSpec | None:
    return read_model(admitted_path(campaign_root, run_id), RunResourceSpec)
