"""The Kubernetes API as the operator process calls it (`ClusterApi`): Campaign and Run resources, their
statuses, the run-pod network policies of a namespace, and a deleted Campaign's Runs, pods and claims.

Its calls run in a small thread pool from kopf's event loop, each retried (`kube.retrying`). The run supervisors in
Ray workers have their own session (`kube_session`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from labkube.operator.crds import GROUP, LABEL_CAMPAIGN, VERSION
from labkube.operator.k8s_models import POLICY_PLURALS
from labkube.operator.kube import (
    KubeTarget,
    answered,
    api_client,
    list_pages,
    raw_json,
    retrying,
    short_error,
    status_of,
)
from labkube.operator.pod_manifest import LABEL_RUN, pvc_name, records_pvc_name

__all__ = ["ClusterApi"]

T = TypeVar("T")
log = logging.getLogger("labkube.operator")


class ClusterApi:
    """The `kubernetes` client, called from the event loop through a small thread pool."""

    def __init__(self, target: KubeTarget) -> None:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.client = api_client(target, pool_size=32)
        self.core = CoreV1Api(self.client)
        self.custom = CustomObjectsApi(self.client)
        self.executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="labkube-operator")
        self.policed: set[str] = set()  # namespaces whose run-pod NetworkPolicies are in place

    async def call(self, fn: Callable[..., T], *args: Any, conflicts: bool = False, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        work = partial(answered, fn, *args, **kwargs)
        return await retrying(lambda: loop.run_in_executor(self.executor, work), conflicts=conflicts)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    async def runs_of(self, namespace: str, campaign: str) -> list[dict[str, Any]]:
        listing = await self.call(
            list_pages,
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "runs",
            label_selector=f"{LABEL_CAMPAIGN}={campaign}",
        )
        return list(listing["items"])

    async def create_run(self, obj: dict[str, Any]) -> bool:
        """Create a Run; False when it exists already (a restarted operator)."""
        try:
            await self.call(
                self.custom.create_namespaced_custom_object, GROUP, VERSION, obj["metadata"]["namespace"], "runs", obj
            )
        except Exception as exc:
            if status_of(exc) == 409:
                return False
            raise
        return True

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self.call(
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"status": status},
                conflicts=True,  # a merge patch of the status: safe to send again
            )
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    async def append_intervention(self, namespace: str, name: str, intervention: dict[str, Any]) -> None:
        """`add /spec/interventions/-` on a Run (a JSON patch, as `labkube runs` and `kubectl patch` append)."""
        patch = [{"op": "add", "path": "/spec/interventions/-", "value": intervention}]
        try:
            await self.call(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "runs",
                name,
                patch,
                _content_type="application/json-patch+json",
            )
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    async def delete_run(self, namespace: str, name: str) -> None:
        try:
            await self.call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, "runs", name)
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    async def ensure_policies(self, namespace: str, policies: Sequence[Mapping[str, Any]]) -> None:
        """Put the chart's run-pod network policies (a NetworkPolicy; a CiliumNetworkPolicy for host names) into
        `namespace` before any run pod exists there, once per operator process and namespace; an existing one is
        brought back to the chart's spec."""
        if namespace in self.policed or not policies:
            return
        for policy in policies:
            body = {**policy, "metadata": {**policy.get("metadata", {}), "namespace": namespace}}
            group, _, version = str(body["apiVersion"]).rpartition("/")
            plural = POLICY_PLURALS[(body["apiVersion"], body["kind"])]  # OperatorConfig checked the kinds
            name = body["metadata"]["name"]
            try:
                await self.call(self.custom.create_namespaced_custom_object, group, version, namespace, plural, body)
            except Exception as exc:
                if status_of(exc) != 409:
                    raise
                patch = {"metadata": {"labels": body["metadata"].get("labels", {})}, "spec": body["spec"]}
                await self.call(
                    self.custom.patch_namespaced_custom_object, group, version, namespace, plural, name, patch
                )
        self.policed.add(namespace)

    async def delete_run_objects(self, namespace: str, run: str, *, uid: str, claim: bool) -> int:
        """Delete a Run's pods, and its claim when the operator made one (`claim`: a claim per run; in emptyDir and
        shared-claim modes there is none, and the chart grants no right to delete claims); returns how many pods
        there were. Only objects owned by this Run (an ownerReference with its `uid`) go, each by a DELETE
        conditional on its own uid, as `release_claim` deletes a claim: a pod or claim that merely carries the
        label, or belongs to a Run of the same name created since (another uid), is kept."""
        listing = await self.call(
            list_pages, self.core.list_namespaced_pod, namespace, label_selector=f"{LABEL_RUN}={run}"
        )
        pods = [p for p in listing["items"] if _owned_by(p, uid)]
        for pod in pods:
            await self._delete_owned(self.core.delete_namespaced_pod, namespace, pod, f"run {run}: deleting pod")
        if not claim:
            return len(pods)
        for name in (pvc_name(run), records_pvc_name(run)):  # the run's claim, its gateway record's
            await self._delete_claim(namespace, run, name, uid)
        return len(pods)

    async def _delete_claim(self, namespace: str, run: str, name: str, uid: str) -> None:
        try:
            resp = await self.call(
                self.core.read_namespaced_persistent_volume_claim, name, namespace, _preload_content=False
            )
        except Exception as exc:
            if status_of(exc) not in (403, 404, 405):
                log.warning("run %s: reading its claim %s: %s", run, name, short_error(exc))
            return
        pvc = raw_json(resp)
        if _owned_by(pvc, uid):
            delete = self.core.delete_namespaced_persistent_volume_claim
            await self._delete_owned(delete, namespace, pvc, f"run {run}: deleting its claim")
        else:
            log.warning("run %s: claim %s is not the one the operator made for this Run; kept", run, name)

    async def _delete_owned(
        self, delete: Callable[..., Any], namespace: str, obj: Mapping[str, Any], what: str
    ) -> None:
        """DELETE `obj` on condition that it is still the object read (its uid); gone already (404) is the aim, and
        a 409 (the name now holds another object) leaves that one alone."""
        meta = obj["metadata"]
        body = {"preconditions": {"uid": meta["uid"]}}
        try:
            await self.call(delete, meta["name"], namespace, body=body, _preload_content=False)
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                log.warning("%s %s: %s", what, meta["name"], short_error(exc))


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` has an ownerReference to the Run whose uid is `uid`."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(o.get("kind") == "Run" and o.get("uid") == uid for o in owners)
