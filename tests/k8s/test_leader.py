"""Exactly one driver: leader election on a Lease (`labkube.operator.leader`), against the fake API, and a
partitioned leader fenced while a standby takes over its running campaign without a duplicate pod."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Cluster, eventually, tiny_task
from kopf.testing import KopfRunner

from labkube.operator.k8s_operator import build_registry
from labkube.operator.kube import KubeTarget, api_client
from labkube.operator.leader import LeaderElection, LeaseElector

pytestmark = pytest.mark.slow

LEASES = ("coordination.k8s.io", "v1", "leases")
FAST = LeaderElection(leaseSeconds=3, renewDeadlineSeconds=2, retrySeconds=0.5)
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}


class Partition:
    """A replica's own link to the API server: while `cut`, every call it makes fails as a dead network would."""

    def __init__(self) -> None:
        self.cut = False

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.cut:
            await asyncio.sleep(0.05)
            raise ConnectionError("network partition (test)")
        return await asyncio.to_thread(fn, *args, **kwargs)


def elector(cluster: Cluster, identity: str, link: Partition | None = None) -> LeaseElector:
    client = api_client(KubeTarget(server=cluster.url))
    return LeaseElector(client, "default", identity, FAST, call=link or Partition())


def holder(cluster: Cluster) -> str | None:
    lease = cluster.api.read_object(LEASES, "default", FAST.lease_name)
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


async def test_two_candidates_at_once_get_one_leader(cluster: Cluster) -> None:
    a, b = elector(cluster, "replica-a"), elector(cluster, "replica-b")
    won = await asyncio.gather(a.try_acquire(), b.try_acquire())
    assert sorted(won) == [False, True]
    leader, standby = (a, b) if won[0] else (b, a)
    assert holder(cluster) == leader.identity
    for _ in range(3):  # the standby cannot take a lease that is being renewed
        assert await leader.try_acquire() and not await standby.try_acquire()
        await asyncio.sleep(0.5)
    lease = cluster.api.read_object(LEASES, "default", FAST.lease_name)
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 3 and lease["spec"]["leaseTransitions"] == 0


async def test_a_partitioned_leader_stops_before_the_standby_takes_over(cluster: Cluster) -> None:
    link = Partition()
    leader, standby = elector(cluster, "replica-a", link), elector(cluster, "replica-b")
    await leader.acquire()
    lost_at: list[float] = []
    holding = asyncio.create_task(leader.hold(lambda: lost_at.append(time.monotonic())))
    await asyncio.sleep(1.5)
    assert not await standby.try_acquire()
    link.cut = True
    cut_at = time.monotonic()
    await standby.acquire()
    taken_at = time.monotonic()
    await asyncio.wait_for(holding, 5)
    assert lost_at, "the cut-off leader never noticed"
    # client-go's guarantee: the old leader stops (renew deadline) before the lease runs out for the others.
    assert lost_at[0] < taken_at and lost_at[0] - cut_at <= FAST.renew_deadline_s + FAST.retry_s + 0.5
    assert taken_at - cut_at >= FAST.lease_s - FAST.retry_s
    lease = cluster.api.read_object(LEASES, "default", FAST.lease_name)
    assert (
        lease is not None and lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1
    )


async def test_standby_takes_over_a_running_campaign_without_a_duplicate_pod(cluster: Cluster) -> None:
    """Replica A leads and drives; its network is cut; it fences itself (its campaign daemon stops driving) before
    replica B takes the lease; B then starts kopf, as `labkube operator` does once it leads, and adopts the pods."""
    task = tiny_task(cluster.root, "handover", [WRITE, {"tool": "bash", "args": {"command": "sleep 6"}}, READ])
    link = Partition()
    a, b = elector(cluster, "replica-a", link), elector(cluster, "replica-b")
    fenced_a = threading.Event()
    await a.acquire()
    holding = asyncio.create_task(a.hold(fenced_a.set))
    standby = asyncio.create_task(b.acquire())
    registry = build_registry(cluster.runtime(), cluster.ray, None, fenced_a)
    runner_a = KopfRunner(["run", "-A", "--standalone"], registry=registry, timeout=60)
    await asyncio.to_thread(runner_a.__enter__)
    try:
        cluster.campaign("handover", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
        await eventually(lambda: len(cluster.kubelet.running()) == 2, 60, what="two running pods")
        created_by_a = list(cluster.pods_created("handover"))
        link.cut = True
        await eventually(fenced_a.is_set, 10, what="replica A to fence itself")
        await asyncio.wait_for(standby, 10)
        assert holder(cluster) == "replica-b"
        async with cluster.operator():  # replica B, now leading
            await eventually(
                lambda: ((cluster.get_campaign("handover") or {}).get("status") or {}).get("phase") == "Finished",
                90,
                what="the campaign to finish under replica B",
            )
    finally:
        await asyncio.to_thread(runner_a.__exit__, None, None, None)
        holding.cancel()
    assert sorted(cluster.pods_created("handover")) == sorted(created_by_a), "a pod was created twice"
    for run in cluster.runs("handover"):
        assert run["status"]["phase"] == "Finished" and run["status"]["attempts"] == 1
