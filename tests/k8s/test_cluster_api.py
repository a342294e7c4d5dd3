"""`ClusterApi` and the list helper against the fake API server over HTTP: a deleted Campaign's Run objects are
deleted only where that Run (by uid) owns them, and every list is read page by page (`limit`, `continue`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from fakekube import FakeKube
from kubernetes import client

from labkube.operator.cluster_api import ClusterApi
from labkube.operator.crds import API_VERSION, LABEL_CAMPAIGN, LABEL_RUN, owner_reference
from labkube.operator.kube import KubeTarget, allocatable_gpus, api_client, list_pages
from labkube.operator.pod_manifest import pvc_name

RUNS = ("labkube.dev", "v1alpha1", "runs")
PODS = ("", "v1", "pods")
CLAIMS = ("", "v1", "persistentvolumeclaims")
NODES = ("", "v1", "nodes")
NS = "lab"


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeKube, str]]:
    async with FakeKube() as api, kmock.Server(api) as server:
        yield api, str(server.url).rstrip("/")
        api.close_watches()


def make_run(api: FakeKube, name: str, campaign: str = "c") -> dict[str, Any]:
    body = {"apiVersion": API_VERSION, "kind": "Run", "metadata": {"name": name, "labels": {LABEL_CAMPAIGN: campaign}}}
    return api.create_object(RUNS, NS, body)


def make_pod(api: FakeKube, name: str, run_label: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_RUN: run_label}}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return api.create_object(PODS, NS, {"metadata": meta, "spec": {"containers": [{"name": "a", "image": "x"}]}})


def names(api: FakeKube, res: tuple[str, str, str]) -> set[str]:
    return {o["metadata"]["name"] for o in api.objects(res, NS)}


async def test_deleting_a_runs_objects_takes_only_what_that_run_owns(served: tuple[FakeKube, str]) -> None:
    """A pod carrying the Run's label but owned by another Run, or by no one, is kept; so are the pod and claim of a
    Run of the same name created since (another uid): the caller holding the old Run deletes nothing of the new
    one's. Today's code deleted by label alone."""
    api, url = served
    old = make_run(api, "r")
    make_pod(api, "r-old", "r", old)
    api.delete_object(RUNS, NS, "r")  # the garbage collector takes r-old soon after
    await asyncio.sleep(0.1)
    new = make_run(api, "r")  # the same name, another uid
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    make_pod(api, "r-0", "r", new)
    claim = {"metadata": {"name": pvc_name("r"), "ownerReferences": [owner_reference(new)]}, "spec": {}}
    api.create_object(CLAIMS, NS, claim)
    other = make_run(api, "other")
    make_pod(api, "stray-owned", "r", other)  # another Run's pod with this Run's label
    make_pod(api, "stray-unowned", "r", None)
    assert names(api, PODS) == {"r-0", "stray-owned", "stray-unowned"}

    cluster = ClusterApi(KubeTarget(server=url))
    try:
        gone = await cluster.delete_run_objects(NS, "r", uid=old["metadata"]["uid"], claim=True)
        assert gone == 0
        assert names(api, PODS) == {"r-0", "stray-owned", "stray-unowned"}
        assert names(api, CLAIMS) == {pvc_name("r")}

        gone = await cluster.delete_run_objects(NS, "r", uid=new["metadata"]["uid"], claim=True)
        assert gone == 1
        assert names(api, PODS) == {"stray-owned", "stray-unowned"}
        assert names(api, CLAIMS) == set()
        deletes = [(verb, plural, name) for verb, plural, _, name in api.audit if verb == "delete"]
        assert ("delete", "pods", "r-0") in deletes and ("delete", "persistentvolumeclaims", pvc_name("r")) in deletes
        assert not any(name.startswith("stray") for _, _, name in deletes)
    finally:
        cluster.close()


async def test_a_claim_of_the_runs_name_that_it_does_not_own_is_kept(served: tuple[FakeKube, str]) -> None:
    api, url = served
    run = make_run(api, "r")
    other = make_run(api, "other")
    api.create_object(CLAIMS, NS, {"metadata": {"name": pvc_name("r"), "ownerReferences": [owner_reference(other)]}})
    cluster = ClusterApi(KubeTarget(server=url))
    try:
        assert await cluster.delete_run_objects(NS, "r", uid=run["metadata"]["uid"], claim=True) == 0
        assert names(api, CLAIMS) == {pvc_name("r")}
    finally:
        cluster.close()


async def test_the_fake_api_pages_a_list_as_kube_apiserver_does(served: tuple[FakeKube, str]) -> None:
    """`limit` gives at most that many items in key order, `metadata.continue` a token for the rest ("" on the last
    page), `remainingItemCount`, and the first page's resourceVersion on every page; without `limit` one answer."""
    api, url = served
    for i in (3, 1, 4, 0, 2):
        make_run(api, f"r{i}")
    custom = client.CustomObjectsApi(api_client(KubeTarget(server=url)))

    def page(**kw: Any) -> dict[str, Any]:
        resp = custom.list_namespaced_custom_object(*RUNS[:2], NS, "runs", _preload_content=False, **kw)
        return dict(json.loads(resp.data))

    first = await asyncio.to_thread(page, limit=2)
    assert [r["metadata"]["name"] for r in first["items"]] == ["r0", "r1"]
    assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == 3
    make_run(api, "r5")  # the resourceVersion moves on; the pages report the list's
    second = await asyncio.to_thread(page, limit=2, _continue=first["metadata"]["continue"])
    assert [r["metadata"]["name"] for r in second["items"]] == ["r2", "r3"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    last = await asyncio.to_thread(page, limit=2, _continue=second["metadata"]["continue"])
    assert [r["metadata"]["name"] for r in last["items"]] == ["r4", "r5"]
    assert last["metadata"]["continue"] == ""
    whole = await asyncio.to_thread(page)
    assert len(whole["items"]) == 6 and whole["metadata"]["continue"] == ""
    with pytest.raises(client.ApiException) as bad:
        await asyncio.to_thread(page, limit=2, _continue="not a token")
    assert bad.value.status == 400


async def test_a_campaign_with_more_runs_than_a_page_is_seen_whole(served: tuple[FakeKube, str]) -> None:
    """The server answers 3 items a page (as it may answer fewer than `limit`): `runs_of`, a Run's pods and the
    nodes are read through every page. Today's code read one list without `limit`."""
    api, url = served
    api.list_page_cap = 3
    for i in range(8):
        run = make_run(api, f"c-{i}")
        if i == 0:
            for attempt in range(7):
                make_pod(api, f"c-0-{attempt}", "c-0", run)
    make_run(api, "d-0", campaign="d")
    cluster = ClusterApi(KubeTarget(server=url))
    try:
        runs = await cluster.runs_of(NS, "c")
        assert sorted(r["metadata"]["name"] for r in runs) == [f"c-{i}" for i in range(8)]
        assert api.request_counts["list-page"] == 3
        first = next(r for r in runs if r["metadata"]["name"] == "c-0")
        assert await cluster.delete_run_objects(NS, "c-0", uid=first["metadata"]["uid"], claim=False) == 7
        assert api.request_counts["list-page"] == 6
    finally:
        cluster.close()
    for i in range(5):
        api.create_object(NODES, "", {"metadata": {"name": f"n{i}"}, "spec": {}})
        ready = {"type": "Ready", "status": "True"}
        api.set_status(NODES, "", f"n{i}", {"allocatable": {"nvidia.com/gpu": "2"}, "conditions": [ready]})
    kube = api_client(KubeTarget(server=url))
    assert await asyncio.to_thread(allocatable_gpus, kube, "nvidia.com/gpu") == 10
    listing = await asyncio.to_thread(list_pages, client.CoreV1Api(kube).list_namespaced_pod, NS)
    assert len(listing["items"]) == 0 and listing["metadata"]["continue"] == ""
