"""Every API call is bounded (issue 42, item 3), against an API server that reads a request and never answers
(`FakeKube.hang`):

- a standby whose Lease call hangs keeps trying on schedule, and takes over a dead leader's Lease once the API answers
  again (before, its first `try_acquire` never came back);
- a leader whose API hangs fences itself (stops leading) without exiting, and its `/healthz` fails with the reason;
  when the API answers again it leads again;
- an operator started while the API never answers stays up, says it is waiting in its log and its `/healthz` (503),
  and leads once the API answers (before, it exited after its first 5 s check);
- a leader whose node list fails waits, says so, and goes on once it answers (before, it exited);
- `/healthz` answers 503 with the reason once no API answer came within its window (before, it did not watch the API).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import kmock
import pytest
import yaml
from conftest import eventually
from fakekube import FakeKube, KubeError
from operator_process import OperatorProcess, free_port, operator_config, write_kubeconfig

from labkube.operator.kube import KubeTarget, api_client
from labkube.operator.leader import LeaderElection, LeaseElector
from labkube.operator.replica import ReplicaState, serve_health

pytestmark = pytest.mark.slow

LEASES = ("coordination.k8s.io", "v1", "leases")
FAST = LeaderElection(leaseSeconds=3, renewDeadlineSeconds=2, retrySeconds=0.5)
FAST_LEASE = {"leaseSeconds": 3, "renewDeadlineSeconds": 2, "retrySeconds": 0.5}
OPERATOR_NAMESPACE = "labkube-system"


def lease_paths(path: str) -> bool:
    return "/leases" in path


@dataclass
class Api:
    fake: FakeKube
    url: str
    work: Path

    def holder(self, namespace: str = "default") -> str | None:
        lease = self.fake.read_object(LEASES, namespace, FAST.lease_name)
        return ((lease or {}).get("spec") or {}).get("holderIdentity")

    def elector(self, identity: str) -> LeaseElector:
        """A candidate calling the fake API through the real client (no test link: its time-outs are the code's)."""
        return LeaseElector(api_client(KubeTarget(server=self.url)), "default", identity, FAST)

    async def operator(self, name: str) -> tuple[OperatorProcess, Path, int]:
        """`labkube operator` with a fast lease and the chart's default storage; its process, config and health port."""
        runs = {"defaultImage": "labkube:test", "workspace": {"mode": "pvc"}, "terminationGracePeriodSeconds": 5}
        config, port = operator_config(self.work, runs=runs, leaderElection=FAST_LEASE)
        kubeconfig = write_kubeconfig(self.work / "kubeconfig", self.url)
        root = self.work / f"root-{name}"
        root.mkdir()
        env = {"LABKUBE_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE}
        op = await OperatorProcess.start(config, kubeconfig, root, self.work / f"{name}.log", env=env)
        return op, config, port


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with FakeKube() as fake, kmock.Server(fake) as server:
        yield Api(fake, str(server.url).rstrip("/"), tmp_path)
        fake.close_watches()  # releases every held request too


def healthz(port: int) -> tuple[int, str] | None:
    """What `/healthz` answers, with its status (None: nothing listens yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status, resp.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace").strip()
    except OSError:
        return None


def leader_gauge(config: Path) -> float | None:
    """`labkube_operator_leader` as the replica of `config` serves it (None: no answer)."""
    port = yaml.safe_load(config.read_text())["metricsPort"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    found = re.search(r"^labkube_operator_leader (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def alive(op: OperatorProcess) -> None:
    if op.returncode is not None:
        raise AssertionError(f"the operator exited {op.returncode}: {op.said()}")


async def leads(op: OperatorProcess, port: int, timeout: float) -> None:
    def leading() -> bool:
        alive(op)
        return healthz(port) == (200, "leading")

    try:
        await eventually(leading, timeout, every=0.3, what="the operator to lead")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; /healthz: {healthz(port)}\n{op.said()}") from None


async def test_a_hung_lease_call_does_not_stop_the_standbys_candidate_loop(api: Api) -> None:
    """The leader dies; the standby's Lease calls hang for a while (the API server reads them and never answers).
    Each hung try ends within the renew deadline and the next comes on schedule, so the standby takes the Lease
    within a lease duration and a few tries of the API answering again."""
    leader, standby = api.elector("replica-a"), api.elector("replica-b")
    assert await leader.acquire()  # and then dies: it never renews
    hang = api.fake.hang(lease_paths)
    waiting = asyncio.create_task(standby.acquire())
    await asyncio.sleep(3 * FAST.renew_deadline_s)
    assert not waiting.done() and hang.held >= 2, f"the standby tried {hang.held} time(s) in the hang"
    hang.lift()  # new requests are answered; those held stay held
    lifted_at = time.monotonic()
    try:
        await asyncio.wait_for(waiting, FAST.lease_s + FAST.renew_deadline_s + 4 * FAST.retry_s + 2)
    finally:
        waiting.cancel()
    assert api.holder() == "replica-b"
    assert time.monotonic() - lifted_at >= FAST.lease_s - FAST.retry_s, "took a lease that had not run out"


async def test_a_leader_whose_api_hangs_fences_without_exiting_and_fails_healthz(api: Api) -> None:
    """Every request to the API hangs: the leader stops leading within its renew deadline, stays up, and `/healthz`
    answers 503 saying the API has not answered (a window of two lease durations); when the API answers again, it
    leads again."""
    op, config, port = await api.operator("leader")
    try:
        await leads(op, port, 120)
        hang = api.fake.hang()
        hung_at = time.monotonic()
        await eventually(lambda: leader_gauge(config) == 0.0, 10, every=0.2, what="the leader to fence itself")
        assert time.monotonic() - hung_at <= FAST.renew_deadline_s + 2 * FAST.retry_s + 2

        def unhealthy() -> bool:
            alive(op)
            said = healthz(port)
            return said is not None and said[0] == 503 and "no answer from the Kubernetes API" in said[1]

        await eventually(unhealthy, 2 * FAST.lease_s + 10, every=0.3, what="/healthz to fail")
        await asyncio.sleep(5)
        alive(op)
        assert leader_gauge(config) == 0.0, "leads without the API"
        assert hang.held > 0
        hang.release()  # the API answers again (the held requests get a 504)
        await leads(op, port, 90)
        assert leader_gauge(config) == 1.0
    finally:
        code, leftovers = await op.stop()
    assert code == 0 and leftovers == [], (code, leftovers, op.said())


async def test_an_operator_started_without_the_api_waits_says_so_and_leads_once_it_answers(api: Api) -> None:
    hang = api.fake.hang()  # the API server accepts connections and never answers
    op, config, port = await api.operator("early")
    try:

        def waiting() -> bool:
            alive(op)
            said = healthz(port)
            return said is not None and said[0] == 503 and "waiting for the Kubernetes API" in said[1]

        await eventually(waiting, 60, every=0.3, what="/healthz to say it waits for the API")
        await asyncio.sleep(8)  # more than the first check's 5 s time-out, and a retry
        alive(op)
        assert "waiting for the Kubernetes API" in op.said(20_000)
        assert leader_gauge(config) == 0.0
        hang.release()
        await leads(op, port, 120)
        assert api.holder(OPERATOR_NAMESPACE) is not None
    finally:
        code, leftovers = await op.stop()
    assert code == 0 and leftovers == [], (code, leftovers, op.said())


class Refusing:
    """A kmock reaction: 503 for every request it sees until `over` (then it retires)."""

    def __init__(self) -> None:
        self.over, self.hits = False, 0

    def __call__(self, request: kmock.Request) -> object:
        if self.over:
            return NotImplemented
        self.hits += 1
        raise KubeError(503, "injected: the node list is unavailable (fault test)", "ServiceUnavailable")


async def test_a_leader_that_cannot_list_nodes_waits_says_so_and_goes_on(api: Api) -> None:
    """Listing nodes fails (503) when the operator leads and reads the cluster's GPUs: it waits and retries, says so
    in its log and `/healthz`, and starts driving once the list answers (before, it exited)."""
    refusing = Refusing()
    api.fake[kmock.resource("v1/nodes")] << refusing
    op, _config, port = await api.operator("nodes")
    try:

        def waiting() -> bool:
            alive(op)
            said = healthz(port)
            return said is not None and said[0] == 503 and "waiting for the node list" in said[1]

        await eventually(waiting, 60, every=0.3, what="/healthz to say it waits for the node list")
        await asyncio.sleep(3)
        alive(op)
        assert "waiting for the node list" in op.said(20_000) and refusing.hits >= 2
        refusing.over = True
        await leads(op, port, 90)
    finally:
        code, leftovers = await op.stop()
    assert code == 0 and leftovers == [], (code, leftovers, op.said())


def test_healthz_fails_with_a_reason_once_the_api_has_not_answered_within_the_window() -> None:
    answered = [time.monotonic()]
    state = ReplicaState(api_window_s=0.5, answered_at=lambda: answered[0])
    state.now("standing by for the leader lease", leader=False)
    port = free_port()
    with serve_health(port, state):
        assert healthz(port) == (200, "standing by for the leader lease")
        time.sleep(0.8)
        said = healthz(port)
        assert said is not None and said[0] == 503, said
        assert said[1].startswith("no answer from the Kubernetes API for ") and "standing by" in said[1], said
        answered[0] = time.monotonic()  # an answer came
        assert healthz(port) == (200, "standing by for the leader lease")
