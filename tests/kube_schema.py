"""What kube-apiserver does with a custom resource's structural schema that tests need outside the fake API too."""

from __future__ import annotations

from typing import Any


def prune(value: Any, schema: dict[str, Any], *, root: bool = False) -> Any:
    """`value` without the fields `schema` (structural, as in a CRD) does not declare: kube-apiserver's
    pruning. At the root (and in embedded resources) apiVersion, kind and metadata are always kept."""
    if schema.get("x-kubernetes-preserve-unknown-fields") is True and "properties" not in schema:
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True
        embedded = root or schema.get("x-kubernetes-embedded-resource") is True
        out = {}
        for key, item in value.items():
            if embedded and key in ("apiVersion", "kind", "metadata"):
                out[key] = item
            elif props is not None and key in props:
                out[key] = prune(item, props[key])
            elif isinstance(extra, dict):
                out[key] = prune(item, extra)
            elif keep_unknown or extra is True:
                out[key] = item
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in value]
    return value
