"""The cluster's allocatable GPUs as the operator reads them from node status (`kube.allocatable_gpus`), through the
real `kubernetes` client against the fake API: Ready, schedulable nodes count; cordoned and NotReady ones do not; an
operator that may not list nodes says so and leaves GPUs to the scheduler. The run pods' GPU gate (`driver.PodGpus`)
follows them: read as leading starts and on a schedule, the largest node bounding what one run may hold."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest
from conftest import eventually
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


async def test_pod_gpus_hold_runs_that_fit_and_never_those_no_node_can_place() -> None:
    """`driver.PodGpus`: runs that fit the largest node wait for free GPUs; a run needing more GPUs than the largest
    node has holds none (its pod waits with the scheduler's reason) and keeps nothing from runs that fit; new figures
    (a node added) let waiting runs go."""
    from labkube.operator.driver import PodGpus

    gate = PodGpus(total=4, largest=2)
    assert await gate.take(3) == 0  # no node has 3: held nothing, at once
    assert await gate.take(2) == 2 and await gate.take(2) == 2
    third = asyncio.create_task(gate.take(1))
    await asyncio.sleep(0.05)
    assert not third.done()  # 4 of 4 held
    await gate.update(total=12, largest=8)  # an 8-GPU node joined
    assert await asyncio.wait_for(third, 1) == 1 and gate.used == 5
    assert await gate.take(3) == 3  # now placeable
    await gate.give(3)
    await gate.give(1)
    assert gate.used == 4
    assert await PodGpus(total=0).take(1) == 0  # unknown or none: the scheduler alone bounds runs


async def test_a_leader_reads_the_nodes_gpus_as_it_starts_and_again_on_a_schedule(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's figures follow the nodes: read when it starts leading (a new leader does not keep an old
    replica's figure), then every `NODE_GPUS_EVERY_S`, so a node added, lost or cordoned counts."""
    from labkube.operator import driver, k8s_operator

    monkeypatch.setattr(k8s_operator, "NODE_GPUS_EVERY_S", 0.2)

    def figures() -> list[tuple[float, float]]:
        return [(g.total, g.largest) for g in list(driver._POD_GPUS.values())]

    async with cluster.operator():
        await eventually(lambda: (2.0, 2.0) in figures(), 20, what="the kubelet's node read as the leader starts")
        node(cluster.api, "big", "8")
        await eventually(lambda: (10.0, 8.0) in figures(), 20, what="the added node counted")
        cluster.api.delete_object(NODES, "", "big")
        await eventually(lambda: figures()[-1] == (2.0, 2.0), 20, what="the deleted node gone from the figures")
