"""Exactly one driver: leader election on a Lease (`labkube.operator.leader`), against the fake API, and a
partitioned leader fenced while a standby takes over its running campaign without a duplicate pod."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
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
        created_by_a = list(cluster.agent_pods_created("handover"))
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
    assert sorted(cluster.agent_pods_created("handover")) == sorted(created_by_a), "a pod was created twice"
    for run in cluster.runs("handover"):
        assert run["status"]["phase"] == "Finished" and run["status"]["attempts"] == 1


class Writes:
    """A replica's link that records every Lease write the API server accepted: (monotonic time, holder written)."""

    def __init__(self, log: list[tuple[float, str, str | None]], identity: str) -> None:
        self.log, self.identity, self.cut = log, identity, False

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.cut:
            raise ConnectionError("replica gone (test)")
        answer = await asyncio.to_thread(fn, *args, **kwargs)
        if fn.__name__ in ("create_namespaced_lease", "replace_namespaced_lease"):
            body = args[-1]
            self.log.append((time.monotonic(), self.identity, (body.get("spec") or {}).get("holderIdentity")))
        return answer


@pytest.mark.parametrize("skewed", ["leader", "standby"])
async def test_replicas_whose_clocks_differ_by_30_s_never_both_lead(cluster: Cluster, skewed: str) -> None:
    """Expiry is measured from when a candidate saw the Lease change, on its own monotonic clock (client-go's rule):
    a standby whose wall clock runs 30 s ahead does not see a renewed lease as expired (with the old rule, comparing
    the holder's renewTime with its own clock, it took the lease at once), and a standby behind a leader's clock
    takes a dead leader's lease after one lease duration, not 30 s later. Every accepted Lease write is checked."""
    writes: list[tuple[float, str, str | None]] = []
    links = {name: Writes(writes, name) for name in ("replica-a", "replica-b")}
    ahead = {"leader": "replica-a", "standby": "replica-b"}[skewed]

    def clock(name: str) -> Callable[[], datetime]:
        offset = timedelta(seconds=30) if name == ahead else timedelta(0)
        return lambda: datetime.now(UTC) + offset

    client = api_client(KubeTarget(server=cluster.url))
    a, b = (LeaseElector(client, "default", n, FAST, call=links[n], clock=clock(n)) for n in ("replica-a", "replica-b"))
    assert await a.acquire()
    lost: list[float] = []
    holding = asyncio.create_task(a.hold(lambda: lost.append(time.monotonic())))
    standby = asyncio.create_task(b.acquire())
    await asyncio.sleep(4 * FAST.lease_s)
    assert not standby.done() and not lost, "the standby took a lease that was being renewed"
    assert {who for _, who, _ in writes} == {"replica-a"} and len(writes) >= 4 * FAST.lease_s / FAST.retry_s - 2
    links["replica-a"].cut = True  # the leader dies
    died_at = time.monotonic()
    await asyncio.wait_for(standby, 3 * FAST.lease_s)
    await asyncio.wait_for(holding, FAST.lease_s)
    taken_at = next(t for t, who, _ in writes if who == "replica-b")
    last_a = max(t for t, who, _ in writes if who == "replica-a")
    assert lost and lost[0] < taken_at, "the old leader had not fenced itself when the standby took over"
    assert taken_at - last_a >= FAST.lease_s, "the standby took the lease before it ran out"
    assert taken_at - died_at <= FAST.lease_s + 2 * FAST.retry_s + 1, "the standby waited out the clock skew"
    assert all(holder == who for _, who, holder in writes), writes


async def test_a_released_lease_is_taken_on_the_standbys_next_try(cluster: Cluster) -> None:
    """client-go's ReleaseOnCancel: the leader stopping on SIGTERM clears the holder, so the standby leads within
    one retry period instead of a lease duration; a replica that no longer holds the Lease releases nothing."""
    leader, standby = elector(cluster, "replica-a"), elector(cluster, "replica-b")
    assert await leader.acquire()
    stop = threading.Event()
    holding = asyncio.create_task(leader.hold(lambda: pytest.fail("stopping is not losing the lease"), stop))
    waiting = asyncio.create_task(standby.acquire())
    await asyncio.sleep(1.5)
    assert not waiting.done()
    stop.set()
    await asyncio.wait_for(holding, 2)
    released_at = time.monotonic()
    assert await leader.release()
    lease = cluster.api.read_object(LEASES, "default", FAST.lease_name)
    assert lease is not None and not lease["spec"].get("holderIdentity") and lease["spec"]["leaseDurationSeconds"] == 1
    await asyncio.wait_for(waiting, 2)
    assert time.monotonic() - released_at < FAST.retry_s + 0.5 and holder(cluster) == "replica-b"
    assert not await leader.release(), "a replica released a lease another replica holds"
    assert holder(cluster) == "replica-b"
