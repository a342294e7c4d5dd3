"""Faults of the control plane with `labkube operator` as real processes (`operator_process.py`), each with its own
Ray, against the fake API and kubelet of this process:

- the operator killed (SIGKILL to its whole process group, Ray included, as a node failure does) and restarted,
  twice, mid-campaign;
- two replicas started at once (leader election on a Lease): one drives, the other stands by; the leader is killed
  and the standby takes the campaign over;
- the chart's default storage (a claim per run, each replica's runs root an empty directory of its own) with the
  leader killed and replaced twice: the Run statuses are the record (no finished run re-runs, the GPU meter holds);
- a Ray worker node of a multi-node Ray cluster (`raynodes.LocalRayCluster`: `ray start --head` and two
  `ray start --address` nodes, reached through Ray Client as a KubeRay head service is) killed mid-campaign.

Each ends with every Run Finished, one agent pod per Run (none created twice) and its grading pod, and no
orphan: no process of a stopped operator outlives it, and no supervisor actor is left on any Ray node.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import pytest
from conftest import CAMPAIGNS, CLAIM, PODS, RUNS, eventually, tiny_task
from fakekube import FakeKube, Outage
from kubelet import FakeKubelet
from operator_process import (
    OperatorProcess,
    described,
    health,
    operator_config,
    supervisor_actor_pids,
    write_kubeconfig,
)
from raynodes import LocalRayCluster

from labkube.operator.crds import API_VERSION
from labkube.operator.k8s_ledger import PodLedger
from labkube.store import read_model

pytestmark = pytest.mark.slow
Fault = Callable[[str, str, str], object]

NAMESPACE = "default"
OPERATOR_NAMESPACE = "labkube-system"
LEASES = ("coordination.k8s.io", "v1", "leases")
FAST_LEASE = {"leaseSeconds": 3, "renewDeadlineSeconds": 2, "retrySeconds": 0.5}
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}


@dataclass
class Fake:
    api: FakeKube
    kubelet: FakeKubelet
    volume: Path
    kubeconfig: Path
    work: Path
    started: list[OperatorProcess] = field(default_factory=list)  # ended by the fixture, the test failed or not

    def config(self, workspace: dict[str, Any] | None = None, **extra: Any) -> tuple[Path, int]:
        """A replica's config: the shared claim by default; `workspace` `{"mode": "pvc"}` is the chart's default
        (a claim per run)."""
        runs = {
            "defaultImage": "labkube:test",
            "workspace": workspace or {"mode": "pvc", "existingClaim": CLAIM, "accessModes": ["ReadWriteMany"]},
            "terminationGracePeriodSeconds": 5,
        }
        return operator_config(self.work, runs=runs, leaderElection=FAST_LEASE, **extra)

    async def operator(self, config: Path, name: str, runs_root: Path | None = None, **kwargs: Any) -> OperatorProcess:
        """A replica; its runs root is the shared claim unless `runs_root` (e.g. an empty one: the chart's emptyDir)."""
        env = {"LABKUBE_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE, **kwargs.pop("env", {})}
        process = await OperatorProcess.start(
            config, self.kubeconfig, runs_root or self.volume, self.work / f"{name}.log", env=env, **kwargs
        )
        self.started.append(process)
        return process

    def campaign(self, name: str, task: Path, seeds: int) -> None:
        spec = {"tasks": [str(task)], "models": ["oracle"], "seeds": seeds, "concurrency": seeds}
        body = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}
        self.api.create_object(CAMPAIGNS, NAMESPACE, body)

    def phase(self, name: str) -> str | None:
        return ((self.api.read_object(CAMPAIGNS, NAMESPACE, name) or {}).get("status") or {}).get("phase")

    def pods_created(self, campaign: str) -> list[str]:
        return [
            n
            for verb, plural, _, n in self.api.audit
            if verb == "create" and plural == "pods" and n.startswith(f"{campaign}-")
        ]

    def running(self, campaign: str) -> int:
        pods = self.api.objects(PODS, NAMESPACE, f"labkube.dev/campaign={campaign}")
        return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")

    async def finished(self, campaign: str, operators: list[OperatorProcess], timeout: float = 180) -> None:
        def done() -> bool:
            for op in operators:
                if op.returncode is not None and op.returncode != 0:
                    raise AssertionError(f"an operator exited {op.returncode}: {op.said()}")
            return self.phase(campaign) == "Finished"

        try:
            await eventually(done, timeout, every=0.5, what=f"campaign {campaign} to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(op.said(2500) for op in operators)) from None

    def assert_one_pod_per_run(self, campaign: str, runs: int) -> None:
        """One agent pod per run, and one grading pod after it (`k8s_grading`)."""
        created = self.pods_created(campaign)
        agents = [n for n in created if not n.endswith("-grade")]
        assert len(agents) == len(set(agents)) == runs, f"pods created: {created}"
        assert len(created) == len(set(created)) == 2 * runs, f"pods created: {created}"
        objs = self.api.objects(RUNS, NAMESPACE, f"labkube.dev/campaign={campaign}")
        assert len(objs) == runs
        for run in objs:
            assert run["status"]["phase"] == "Finished" and run["status"]["attempts"] == 1, run["status"]
            assert run["status"]["score"] is not None


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[Fake]:
    volume = tmp_path / "volume"
    volume.mkdir()
    async with FakeKube() as api, kmock.Server(api) as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url).rstrip("/"))
        # one node with two allocatable GPUs (the kubelet registers it), as `kubectl get nodes` would list it
        kubelet = FakeKubelet(api, claims={CLAIM: volume}, gpus=2, work=tmp_path / "kubelet")
        async with kubelet:
            fake = Fake(api, kubelet, volume, kubeconfig, tmp_path)
            try:
                yield fake
            finally:
                # A test that failed midway leaves its replicas and their embedded Ray running (seen for an hour, with
                # parent 1): each process group goes, whatever the test did.
                for process in fake.started:
                    await process.kill()
        api.close_watches()


async def one_leader(replicas: dict[str, tuple[OperatorProcess, int]], timeout: float = 90) -> dict[str, str]:
    """Until one replica leads and the others stand by; what each one's `/healthz` then says. (Each answers from
    process start, and the winner says "standing by" until its lease write returns.)"""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        said = {n: await wait_healthy(op, port, timeout) for n, (op, port) in replicas.items()}
        if sum("standing by" not in text for text in said.values()) == 1:
            return said
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not exactly one leader: {said}")
        await asyncio.sleep(0.3)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is among `pid`'s parents (Ray's workers leave the operator's process group, not its tree)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


def slow_task(fake: Fake, name: str, seconds: int) -> Path:
    return tiny_task(fake.work, name, [WRITE, {"tool": "bash", "args": {"command": f"sleep {seconds}"}}, READ])


async def wait_healthy(op: OperatorProcess, port: int, timeout: float = 90) -> str:
    """Until the replica leads (kopf started) or stands by for the lease; what its `/healthz` then says. It answers
    from process start ("starting", "leading; connecting to Ray"), which is not yet either."""

    async def answer() -> str | None:
        if op.returncode is not None:
            raise AssertionError(f"the operator exited {op.returncode}: {op.said()}")
        said = await asyncio.to_thread(health, port)
        return said if said is not None and (said.strip() == "leading" or said.startswith("standing by")) else None

    deadline = asyncio.get_running_loop().time() + timeout
    while (said := await answer()) is None:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the operator never answered /healthz: {op.said()}")
        await asyncio.sleep(0.3)
    return said


async def test_the_operator_killed_and_restarted_twice_finishes_every_run(fake: Fake, fault: Fault) -> None:
    fault(
        "operator killed and restarted twice",
        "`labkube operator` as a process (its own embedded Ray) is SIGKILLed with its whole process group while 3 "
        "runs are mid-step, restarted, SIGKILLed again 3 s after it leads, and restarted again",
        "the pods keep running; each new leader adopts them (no second pod, no extra attempt) and the campaign "
        "finishes; the last operator exits 0 on SIGTERM with no process left behind, and no supervisor actor survives",
    )
    task = slow_task(fake, "restarts", 10)
    config, port = fake.config()
    first = await fake.operator(config, "first")
    fake.campaign("restarts", task, seeds=3)
    await eventually(lambda: fake.running("restarts") == 3, 120, what="three running pods")
    await first.kill()
    assert first.pids() == [], described(first.pids())
    second = await fake.operator(config, "second")
    await wait_healthy(second, port)
    await asyncio.sleep(3)  # it leads, adopts the pods and drives for a while
    await second.kill()
    assert fake.running("restarts") == 3, "a pod died with the operator"
    third = await fake.operator(config, "third")
    await fake.finished("restarts", [third])
    code, leftovers = await third.stop()
    assert code == 0 and leftovers == [], (code, leftovers, third.said())
    fake.assert_one_pod_per_run("restarts", 3)
    assert supervisor_actor_pids() == [], described(supervisor_actor_pids())


async def test_ray_holds_back_gpu_runs_beyond_the_clusters_allocatable_gpus(fake: Fake) -> None:
    """The operator reads the nodes' allocatable GPUs (2) into its Ray: of three one-GPU runs, the third waits in Ray
    (no pod) until a GPU is free, instead of sitting in the scheduler's queue as an Unschedulable pod."""
    task = tiny_task(
        fake.work, "gpus", [WRITE, {"tool": "bash", "args": {"command": "sleep 4"}}, READ], resources={"gpus": 1}
    )
    config, _ = fake.config()
    op = await fake.operator(config, "gpus")
    fake.campaign("gpus", task, seeds=3)
    await fake.finished("gpus", [op])
    code, leftovers = await op.stop()
    assert code == 0 and leftovers == [], (code, leftovers, op.said())
    assert "the cluster has 2 allocatable nvidia.com/gpu" in op.said(20_000)
    fake.assert_one_pod_per_run("gpus", 3)
    live, most = set(), 0
    for event in fake.api.log:
        if event.res != PODS:
            continue
        name, status = event.obj["metadata"]["name"], event.obj.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        assert conditions.get("PodScheduled", {}).get("reason") != "Unschedulable", f"{name} waited in the scheduler"
        if event.type == "DELETED" or status.get("phase") in ("Succeeded", "Failed"):
            live.discard(name)
        else:
            live.add(name)
        most = max(most, len(live))
    assert most == 2, f"at most {most} GPU pods existed at once"


async def test_two_replicas_started_at_once_one_drives_and_the_standby_takes_over(fake: Fake, fault: Fault) -> None:
    fault(
        "two operator replicas started at once",
        "two `labkube operator` processes start together against one API (leader election on a Lease, 3 s); the "
        "leader is SIGKILLed while its 3 runs are mid-step",
        "one leads and drives, the other answers /healthz as standing by and creates nothing; after the kill it takes "
        "the lease and adopts the running pods: one pod per run, every run Finished on its first attempt",
    )
    task = slow_task(fake, "replicas", 8)
    (config_a, port_a), (config_b, port_b) = fake.config(), fake.config()
    a, b = await asyncio.gather(fake.operator(config_a, "a"), fake.operator(config_b, "b"))
    said = await one_leader({"a": (a, port_a), "b": (b, port_b)})
    lease = fake.api.read_object(LEASES, OPERATOR_NAMESPACE, "labkube-operator")
    assert lease is not None and lease["spec"]["holderIdentity"]
    standing_by = [k for k, text in said.items() if "standing by" in text]
    assert len(standing_by) == 1, said
    leader, standby = (b, a) if standing_by == ["a"] else (a, b)
    fake.campaign("replicas", task, seeds=3)
    await eventually(lambda: fake.running("replicas") == 3, 120, what="three running pods")
    assert len(fake.pods_created("replicas")) == 3
    await leader.kill()
    await fake.finished("replicas", [standby])
    code, leftovers = await standby.stop()
    assert code == 0 and leftovers == [], (code, leftovers, standby.said())
    fake.assert_one_pod_per_run("replicas", 3)
    lease = fake.api.read_object(LEASES, OPERATOR_NAMESPACE, "labkube-operator")
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1
    assert supervisor_actor_pids() == [], described(supervisor_actor_pids())


async def test_a_ray_worker_node_killed_mid_campaign_loses_no_run(fake: Fake, fault: Fault) -> None:
    fault(
        "Ray worker node killed (multi-node Ray, as a KubeRay worker pod)",
        "the operator drives through a Ray cluster of a head and two worker nodes (`ray start`, Ray Client with token "
        "auth); once its 4 runs' pods run, one worker node and every process on it is SIGKILLed",
        "the supervisors on the dead node are replaced on the other one and re-attach to their runs' pods: every "
        "run Finished, one pod per run, no supervisor actor left after the campaign",
    )
    """The operator drives through a Ray cluster of its own (rayAddress: Ray Client, with the cluster's token, as the
    chart wires a KubeRay cluster); its supervisors run on the two worker nodes. One worker node is killed with
    every process on it; its actors are replaced on the other node and their runs re-attach to their pods."""
    task = slow_task(fake, "raynode", 12)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LABKUBE_"))}
    env["KUBECONFIG"] = str(fake.kubeconfig)  # what a RayCluster worker's service account gives it
    ray_cluster = await asyncio.to_thread(LocalRayCluster, fake.work / "ray", 2, env, {"labkube_run_slot": 16})
    try:
        config, port = fake.config(rayAddress=ray_cluster.client_address)
        op = await fake.operator(config, "ray", env={"RAY_AUTH_TOKEN": ray_cluster.token})
        await wait_healthy(op, port, timeout=120)
        fake.campaign("raynode", task, seeds=4)
        await eventually(lambda: fake.running("raynode") == 4, 120, what="four running pods")
        hosts = {i: set(w.pids()) & set(supervisor_actor_pids()) for i, w in enumerate(ray_cluster.workers)}
        assert all(hosts.values()), f"supervisors are not spread over both worker nodes: {hosts}"
        doomed = ray_cluster.workers[0]
        await asyncio.to_thread(doomed.kill)
        assert doomed.pids() == []
        await fake.finished("raynode", [op], timeout=240)
        code, leftovers = await op.stop()
        assert code == 0 and leftovers == [], (code, leftovers, op.said())
        fake.assert_one_pod_per_run("raynode", 4)
        await eventually(lambda: supervisor_actor_pids() == [], 30, what="the supervisor actors to be gone")
    finally:
        await asyncio.to_thread(ray_cluster.stop)
    assert ray_cluster.leftovers() == []


async def test_fresh_leaders_with_empty_runs_roots_rerun_nothing_and_keep_the_gpu_meter(
    fake: Fake, fault: Fault
) -> None:
    fault(
        "the leader replaced twice by a replica with an empty runs root (the chart's default storage)",
        "two replicas, leader election on, a claim per run and each replica's runs root an empty directory of its "
        "own (the chart's emptyDir); one run finishes, then the leader is SIGKILLed while the other runs, the "
        "standby takes over, a fresh replica joins, and the new leader is SIGKILLed too",
        "the Run statuses are the record: the finished run is never started again (no pod), its gpuHours and pod "
        "times are unchanged and each new leader's ledger is rebuilt from them; the running pod is adopted (one "
        "agent pod per run); the campaign finishes",
    )
    quick = tiny_task(fake.work, "quick", [WRITE, READ], resources={"gpus": 1})
    slow = tiny_task(
        fake.work, "slow", [WRITE, {"tool": "bash", "args": {"command": "sleep 30"}}, READ], resources={"gpus": 1}
    )
    roots = {name: fake.work / f"root-{name}" for name in "abc"}
    for root in roots.values():
        root.mkdir()
    per_run = {"mode": "pvc"}
    configs = {name: fake.config(workspace=per_run) for name in "abc"}
    ops = dict(
        zip(
            "ab",
            await asyncio.gather(*(fake.operator(configs[n][0], n, runs_root=roots[n]) for n in "ab")),
            strict=True,
        )
    )
    said = await one_leader({n: (ops[n], configs[n][1]) for n in "ab"})
    leader = next(n for n, text in said.items() if "standing by" not in text)
    spec = {"tasks": [str(quick), str(slow)], "models": ["oracle"], "seeds": 1, "concurrency": 2}
    body = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": "failover"}, "spec": spec}
    fake.api.create_object(CAMPAIGNS, NAMESPACE, body)

    def run_of(task: str) -> dict[str, Any]:
        return next(
            r
            for r in fake.api.objects(RUNS, NAMESPACE, "labkube.dev/campaign=failover")
            if r["spec"]["task"].endswith(task)
        )

    def quick_done_and_slow_running() -> bool:
        runs = fake.api.objects(RUNS, NAMESPACE, "labkube.dev/campaign=failover")
        if len(runs) != 2:
            return False
        return run_of("quick")["status"]["phase"] == "Finished" and fake.running("failover") == 1

    await eventually(quick_done_and_slow_running, 120, every=0.3, what="the quick run finished, the slow one running")
    recorded = run_of("quick")["status"]
    assert recorded["gpuHours"] > 0 and len(recorded["podTimes"]) == 2 and recorded["report"]
    quick_pods = [n for n in fake.pods_created("failover") if n.startswith(run_of("quick")["metadata"]["name"])]
    slow_run = run_of("slow")["metadata"]["name"]

    def holder() -> str:
        lease = fake.api.read_object(LEASES, OPERATOR_NAMESPACE, "labkube-operator") or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    for round_ in (1, 2):
        before = holder()
        await ops[leader].kill()
        survivor = next(n for n in ops if n != leader and ops[n].returncode is None)
        if round_ == 1:  # a fresh replica joins, as the Deployment replaces the dead pod
            ops["c"] = await fake.operator(configs["c"][0], "c", runs_root=roots["c"])
            await wait_healthy(ops["c"], configs["c"][1])
        await eventually(lambda b=before: holder() not in ("", b), 60, what="the standby to take the lease")
        leader = survivor
        ledger = roots[leader] / NAMESPACE / "failover" / "pods"
        quick_id = run_of("quick")["spec"]["run_id"]
        # the new leader rebuilt the finished run's ledger from its Run status (its runs root was empty)
        await eventually(lambda p=ledger / f"{quick_id}.json": p.exists(), 60, what="the ledger rebuilt")
        assert run_of("slow")["status"]["phase"] != "Finished", "the slow run ended before the second failover"
    await fake.finished("failover", [ops[leader]])
    for name, op in ops.items():
        if op.returncode is None:
            code, leftovers = await op.stop()
            assert code == 0 and leftovers == [], (name, code, leftovers, op.said())

    after = run_of("quick")["status"]
    assert [n for n in fake.pods_created("failover") if n.startswith(run_of("quick")["metadata"]["name"])] == (
        quick_pods
    ), "the finished run was started again"
    assert after["gpuHours"] == recorded["gpuHours"] and after["podTimes"] == recorded["podTimes"]
    slow_pods = [n for n in fake.pods_created("failover") if n.startswith(slow_run)]
    assert slow_pods == [f"{slow_run}-0", f"{slow_run}-1-grade"], f"pods created: {slow_pods}"
    assert run_of("slow")["status"]["phase"] == "Finished" and run_of("slow")["status"]["attempts"] == 1
    campaign = fake.api.read_object(CAMPAIGNS, NAMESPACE, "failover")
    assert campaign is not None
    used = campaign["status"]["gpuHoursUsed"]
    assert used == pytest.approx(after["gpuHours"] + run_of("slow")["status"]["gpuHours"], abs=1e-5)
    rebuilt = read_model(roots[leader] / NAMESPACE / "failover" / "pods" / f"{quick_id}.json", PodLedger)
    assert rebuilt is not None and rebuilt.gpu_hours() == pytest.approx(recorded["gpuHours"], abs=1e-6)
    # the final leader's campaign directory holds both results, the finished run's from its Run status
    results = sorted((roots[leader] / NAMESPACE / "failover" / "runs").glob("*/result.json"))
    assert len(results) == 2


def served_metrics(config: Path) -> str | None:
    """The `/metrics` text the replica of `config` serves (None: no answer)."""
    import urllib.request

    import yaml

    port = yaml.safe_load(config.read_text())["metricsPort"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return None


def leader_gauge(config: Path) -> float | None:
    """`labkube_operator_leader` as the replica of `config` serves it (None: no answer)."""
    text = served_metrics(config)
    found = re.search(r"^labkube_operator_leader (\S+)$", text or "", re.M)
    return float(found.group(1)) if found else None


def serves_campaign_series(config: Path, campaign: str) -> bool:
    return f'campaign="{campaign}"' in (served_metrics(config) or "")


async def test_an_api_outage_is_waited_out_and_sigterm_hands_over_at_once(fake: Fake, fault: Fault) -> None:
    fault(
        "the API unreachable for 20 s with leader election on, then a rolling upgrade",
        "two replicas (lease 3 s, renew deadline 2 s: the outage is ~7 lease durations, the time-compressed form of "
        "5 minutes at the chart's 15 s), a claim per run and each replica's runs root empty; every HTTP request "
        "answers 503 for 20 s while 2 runs are mid-step; afterwards the leader gets SIGTERM",
        "no replica exits: the leader fences (labkube_operator_leader 0) and both keep answering /healthz and "
        "/metrics; when the API returns one leads again and adopts the pods; SIGTERM releases the lease and the "
        "standby leads within 2 s; one agent pod per run, every run Finished on its first attempt",
    )
    task = slow_task(fake, "outage", 40)
    roots = {name: fake.work / f"root-{name}" for name in "ab"}
    configs = {name: fake.config(workspace={"mode": "pvc"}) for name in "ab"}
    ops = {}
    for name in "ab":
        roots[name].mkdir()
        ops[name] = await fake.operator(configs[name][0], name, runs_root=roots[name])
    for name in "ab":
        await wait_healthy(ops[name], configs[name][1])
    await eventually(
        lambda: sorted(str(leader_gauge(configs[n][0])) for n in "ab") == ["0.0", "1.0"],
        60,
        what="one replica serving labkube_operator_leader 1 and the standby 0",
    )

    def holder() -> str:
        lease = fake.api.read_object(LEASES, OPERATOR_NAMESPACE, "labkube-operator") or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def leading() -> list[str]:
        return [n for n in "ab" if leader_gauge(configs[n][0]) == 1.0]

    fake.campaign("outage", task, seeds=2)
    await eventually(lambda: fake.running("outage") == 2, 120, what="two running pods")
    await eventually(
        lambda: [n for n in "ab" if serves_campaign_series(configs[n][0], "outage")] == leading(),
        30,
        what="the leader, and only it, serving the campaign's series",
    )
    outage = Outage(20)
    fake.api[lambda _: True] << outage
    await eventually(lambda: leading() == [], 10, every=0.3, what="the leader to fence itself")
    while not outage.over:
        for name in "ab":
            assert ops[name].returncode is None, f"replica {name} exited in the outage: {ops[name].said()}"
            assert await asyncio.to_thread(health, configs[name][1]), f"replica {name} stopped answering /healthz"
            assert leader_gauge(configs[name][0]) == 0.0, f"replica {name} leads without the API"
            # a fenced replica serves no frozen copy of the campaign's series (dashboards would count it twice)
            assert not serves_campaign_series(configs[name][0], "outage"), f"fenced replica {name} serves them"
        await asyncio.sleep(1)
    await eventually(lambda: len(leading()) == 1 and holder() != "", 30, every=0.3, what="a leader after the outage")
    (leader,) = leading()
    standby = next(n for n in "ab" if n != leader)
    await eventually(lambda: fake.running("outage") == 2, 30, what="the pods still running (adopted)")
    # the rolling upgrade below starts from a leader that drives: its supervisor actors follow the pods
    await eventually(
        lambda: any(descends_from(pid, ops[leader].pid) for pid in supervisor_actor_pids()),
        60,
        what="the new leader's supervisors",
    )
    assert "standing by" in (await asyncio.to_thread(health, configs[standby][1]) or "")
    assert fake.phase("outage") != "Finished" and fake.running("outage") == 2, "no campaign to hand over"
    ops[leader].proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    before = holder()
    await eventually(lambda: holder() not in ("", before), 10, every=0.05, what="the standby to take the lease")
    handover_s = time.monotonic() - signalled
    await asyncio.wait_for(ops[leader].proc.wait(), 30)  # the one SIGTERM a kubelet sends is enough
    code, leftovers = await ops[leader].stop()
    assert code == 0 and leftovers == [], (code, leftovers, ops[leader].said())
    # The released Lease is what makes the hand-over fast: the old leader says it gave it up, and the standby took it
    # before the lease could have run out (at least leaseSeconds - retrySeconds after the last renewal). The figure
    # itself (0.1-1.7 s with these settings on a quiet 2-core machine) is a measurement, not a timed test.
    assert "released lease" in ops[leader].said(50_000), ops[leader].said()
    expiry_s = FAST_LEASE["leaseSeconds"] - FAST_LEASE["retrySeconds"]
    assert handover_s < expiry_s, f"hand-over took {handover_s:.1f}s: as long as an expiry ({expiry_s:g}s)"
    await fake.finished("outage", [ops[standby]])
    code, leftovers = await ops[standby].stop()
    assert code == 0 and leftovers == [], (code, leftovers, ops[standby].said())
    assert outage.hits > 20
    fake.assert_one_pod_per_run("outage", 2)
    print(f"hand-over on SIGTERM: {handover_s:.2f}s")
