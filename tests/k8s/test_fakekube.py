"""Where the fake API server is stricter than kmock and matches kube-apiserver (the contract the operator's code
must meet on a real cluster): patch types of custom resources, pruning by the CRD's structural schema, watches
from a resourceVersion with bookmarks, and Leases. Each check goes through the real `kubernetes` client or raw
HTTP, never through FakeKube's in-process helpers alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import kmock
import pytest
from fakekube import FakeKube
from kubernetes import client

from labkube.operator.crds import API_VERSION

CAMPAIGNS = ("labkube.dev", "v1alpha1", "campaigns")
RUNS = ("labkube.dev", "v1alpha1", "runs")


def custom_api(url: str) -> client.CustomObjectsApi:
    config = client.Configuration()
    config.host = url
    return client.CustomObjectsApi(client.ApiClient(config))


def campaign(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
async def served() -> Any:
    async with FakeKube(bookmark_s=0.2) as api, kmock.Server(api) as server:
        yield api, str(server.url).rstrip("/")
        api.close_watches()


async def test_a_strategic_merge_patch_of_a_custom_resource_is_415_as_on_a_real_cluster(served: Any) -> None:
    api, url = served
    api.create_object(CAMPAIGNS, "default", campaign("c", tasks=["t"], models=["oracle"]))
    path = f"{url}/apis/labkube.dev/v1alpha1/namespaces/default/campaigns/c"
    body = json.dumps({"spec": {"seeds": 2}})
    async with aiohttp.ClientSession() as session:
        strategic = {"Content-Type": "application/strategic-merge-patch+json"}
        async with session.patch(path, data=body, headers=strategic) as response:
            assert response.status == 415
            assert (await response.json())["reason"] == "UnsupportedMediaType"
        async with session.patch(path, data=body, headers={"Content-Type": "application/merge-patch+json"}) as ok:
            assert ok.status == 200
    assert api.read_object(CAMPAIGNS, "default", "c")["spec"]["seeds"] == 2
    # built-in kinds keep strategic merge (the kubernetes client's default for pods)
    api.create_object(("", "v1", "pods"), "default", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    async with aiohttp.ClientSession() as session:
        pod = f"{url}/api/v1/namespaces/default/pods/p"
        strategic = {"Content-Type": "application/strategic-merge-patch+json"}
        async with session.patch(pod, data=json.dumps({"metadata": {"labels": {"a": "b"}}}), headers=strategic) as r:
            assert r.status == 200


async def test_unknown_fields_are_pruned_by_the_crd_schema_on_create_patch_and_status(served: Any) -> None:
    _, url = served
    custom = custom_api(url)
    body = campaign("c", tasks=["t"], models=["oracle"], notAField=1)
    body["spec"]["budgets"] = {"wall_hours": 1, "invented": True}
    body["extraTopLevel"] = {"x": 1}
    created = await asyncio.to_thread(
        custom.create_namespaced_custom_object, "labkube.dev", "v1alpha1", "default", "campaigns", body
    )
    assert "notAField" not in created["spec"] and "extraTopLevel" not in created
    assert created["spec"]["budgets"] == {"wall_hours": 1}
    assert created["spec"]["tasks"] == ["t"]
    patched = await asyncio.to_thread(
        custom.patch_namespaced_custom_object,
        "labkube.dev",
        "v1alpha1",
        "default",
        "campaigns",
        "c",
        {"spec": {"seeds": 3, "alsoNot": "x"}},
    )
    assert patched["spec"]["seeds"] == 3 and "alsoNot" not in patched["spec"]
    status = await asyncio.to_thread(
        custom.patch_namespaced_custom_object_status,
        "labkube.dev",
        "v1alpha1",
        "default",
        "campaigns",
        "c",
        {"status": {"phase": "Running", "madeUp": 1}},
    )
    assert status["status"]["phase"] == "Running" and "madeUp" not in status["status"]


async def test_a_watch_from_a_resource_version_replays_what_came_after_and_sends_bookmarks(served: Any) -> None:
    api, url = served
    first = api.create_object(CAMPAIGNS, "default", campaign("a", tasks=["t"], models=["oracle"]))
    api.create_object(CAMPAIGNS, "default", campaign("b", tasks=["t"], models=["oracle"]))
    since = first["metadata"]["resourceVersion"]
    watch = f"{url}/apis/labkube.dev/v1alpha1/namespaces/default/campaigns"
    params = {"watch": "true", "resourceVersion": since, "allowWatchBookmarks": "true", "timeoutSeconds": "2"}
    events: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.get(watch, params=params) as response:
        async for line in response.content:
            events.append(json.loads(line))
            if any(e["type"] == "BOOKMARK" for e in events):
                break
    assert [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"] == ["b"]
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(since) + 1
