"""The cluster's allocatable GPUs as the operator reads them from node status (`kube.allocatable_gpus`), through the
real `kubernetes` client against the fake API: Ready, schedulable nodes count; cordoned and NotReady ones do not; an
operator that may not list nodes says so and leaves GPUs to the scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
from fakekube import FakeKube, KubeError

from labkube.operator.kube import KubeTarget, allocatable_gpus, api_client

NODES = ("", "v1", "nodes")


def node(api: FakeKube, name: str, gpus: str, *, ready: bool = True, cordoned: bool = False) -> None:
    api.create_object(NODES, "", {"metadata": {"name": name}, "spec": {"unschedulable": cordoned}})
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    allocatable = {"cpu": "8", "nvidia.com/gpu": gpus, "amd.com/gpu": "1"}
    api.set_status(NODES, "", name, {"allocatable": allocatable, "conditions": [condition]})


async def test_ready_schedulable_nodes_count() -> None:
    async with FakeKube() as api, kmock.Server(api) as server:
        node(api, "a", "8")
        node(api, "b", "4")
        node(api, "cordoned", "8", cordoned=True)
        node(api, "down", "8", ready=False)
        client = api_client(KubeTarget(server=str(server.url).rstrip("/")))
        assert await asyncio.to_thread(allocatable_gpus, client, "nvidia.com/gpu") == 12
        assert await asyncio.to_thread(allocatable_gpus, client, "amd.com/gpu") == 2
        api.close_watches()


async def test_an_operator_that_may_not_list_nodes_gets_none() -> None:
    async with FakeKube() as api, kmock.Server(api) as server:
        node(api, "a", "8")

        def forbidden(request: Any) -> None:
            raise KubeError(403, 'nodes is forbidden: User "system:serviceaccount:x:labkube" cannot list nodes')

        api[kmock.resource("v1/nodes")] << forbidden
        client = api_client(KubeTarget(server=str(server.url).rstrip("/")))
        assert await asyncio.to_thread(allocatable_gpus, client, "nvidia.com/gpu") is None
        api.close_watches()
