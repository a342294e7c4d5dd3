"""Scale: one Campaign of N concurrent Runs (default 1,000) through `labkube operator`, and a failover at N live Runs.

The Kubernetes API is `tests/k8s/fakekube.py` (kmock, extended) served from this process, and
`tests/k8s/kubelet.py` is the node: it schedules every pod and moves it Pending -> Running ->
Succeeded, but runs no agent: a simulated agent writes the run's status.json twice into the run
directory on its volume (a local directory), and the grading pod the operator starts after it
writes the final result.json and its termination report. The operator is
the real command (`labkube operator --config ... --kube-context ...`, `tests/k8s/operator_process.py`) in its own
process, with its own embedded Ray, so its memory is its own.

With `--failover` (the default) the operators are deployed as the chart deploys them by default: two replicas,
leader election on a Lease with the chart's timings (`operator.leaderElection` in helm/labkube/values.yaml), a
claim per run, and each replica's runs root an empty directory of its own (the chart's emptyDir). Once every one
of the N Runs has its pod Running, the leader is SIGKILLed (its whole process group, embedded Ray included, as a
node failure does), and the standby, whose runs root is empty, takes the Lease and adopts the running pods. It
prints, beside the figures below: the time from the kill to the standby holding the Lease; the time to adopt all
(from the kill until the new leader's supervisor of every Run live at the kill has read its Run, found its pod and
patched its status: a supervisor's first status patch, which it sends whether or not anything changed, so it is
counted by request, not by watch event); and the re-runs: agent pods created beyond one per Run, grading pods
beyond one per Run, and Runs that ended on another attempt than their first. Any re-run, or a Run not Finished,
exits 1. `--no-failover` runs one replica with a shared claim as its runs root (live status from status.json).

With `--lose-node` (the default) every Run needs one GPU, and once every live Run is adopted (or, without the
failover, once every pod is Running) the node dies (`FakeKubelet.lose_node`: its pods' agents end, it goes
`Ready=Unknown`, a new node takes new pods). The operator must find every pod lost (`runs.podLostAfterSeconds` 5 s
here), resume each Run in a new pod and close the lost pod's GPU time at the node's last heartbeat. It prints the
pods lost, the time from the loss to every lost Run's new pod Running, and the GPU-hours the Runs recorded against
the pods' real GPU time (each pod's start to its end as the kubelet wrote them, a lost pod's to the loss); a Run
left with a second re-run, or GPU-hours more than 2% off, is a problem (exit 1).

Prints, as a table: how long the campaign took, API requests per Run per minute (every request the
fake API served, from the operator's start to the campaign's end, by verb), the peak RSS of every
process of the control plane (the operator, its Ray supervisor actors and each of Ray's own processes,
sampled every 2 s) and of all of them together (the first leader's; with `--failover` also the new leader's), and
the latency from a pod's phase change (as the kubelet writes it to the API) to the Run's status showing it
(Running -> Run `Running`, Succeeded -> Run `Finished`), median and p95.

    python benchmarks/operator_scale.py [--runs 1000] [--run-seconds S] [--no-failover] [--no-lose-node] [--keep]
        [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "k8s"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import kmock  # noqa: E402
from docs_block import markdown_table, write_block  # noqa: E402
from fakekube import FakeKube, ResKey  # noqa: E402
from kubelet import FakeKubelet  # noqa: E402
from operator_process import OperatorProcess, health, operator_config, write_kubeconfig  # noqa: E402
from tinytask import make_tiny_task  # noqa: E402

from labkube.budgets import Spend, StopReason, Usage  # noqa: E402
from labkube.operator.crds import API_VERSION  # noqa: E402
from labkube.operator.k8s_grading import LABEL_FINALIZE  # noqa: E402
from labkube.result import RunResult, termination_report  # noqa: E402
from labkube.run_spec import RunPhase, RunStatus  # noqa: E402
from labkube.store import read_model, utcnow, write_model  # noqa: E402

PODS: ResKey = ("", "v1", "pods")
RUNS: ResKey = ("labkube.dev", "v1alpha1", "runs")
CAMPAIGNS: ResKey = ("labkube.dev", "v1alpha1", "campaigns")
LEASES: ResKey = ("coordination.k8s.io", "v1", "leases")
CLAIM = "labkube-runs"
OPERATOR_NAMESPACE = "labkube-system"
ADOPT_TARGET_S = 60.0


def chart_leader_election() -> dict[str, Any]:
    """`leaderElection` as the chart's default values configure it (its timings, its Lease name for a release
    called labkube)."""
    values = yaml.safe_load((ROOT / "helm" / "labkube" / "values.yaml").read_text())
    return {**values["operator"]["leaderElection"], "leaseName": "labkube-leader"}


def simulated_agent(run_seconds: float) -> Any:
    """The agent (status.json twice over `run_seconds` ±20%), and the grading pod that follows it (result.json and
    its termination report, at once)."""

    async def run(pod: dict[str, Any], run_dir: Path | None, termination: Path) -> int:
        assert run_dir is not None
        meta = pod["metadata"]
        run_id = meta["annotations"]["labkube.dev/run-id"]  # the run directory is its claim's, named after it
        if LABEL_FINALIZE in meta["labels"]:
            status = read_model(run_dir / "status.json", RunStatus)
            spend = status.spend if status is not None else Spend()
            result = RunResult(
                run_id=run_id,
                task=meta["annotations"]["labkube.dev/task"],
                model=meta["annotations"]["labkube.dev/model"],
                seed=int(meta["annotations"]["labkube.dev/seed"]),
                status=RunPhase.finished,
                stop_reason=StopReason.done,
                score=0.6,
                spend=spend,
                finished_at=utcnow(),
            )
            write_model(run_dir / "result.json", result)
            termination.write_text(termination_report(result))
            return 0
        length = run_seconds * random.uniform(0.8, 1.2)
        spend = Spend(steps=1, usage=Usage(input=900, output=100), usd=0.01, wall_seconds=length / 2)
        write_model(run_dir / "status.json", RunStatus(run_id=run_id, phase=RunPhase.running, updated_at=utcnow()))
        await asyncio.sleep(length / 2)
        status = RunStatus(run_id=run_id, phase=RunPhase.running, step=1, score=0.5, spend=spend, updated_at=utcnow())
        write_model(run_dir / "status.json", status)
        await asyncio.sleep(length / 2)
        spend = spend.model_copy(update={"steps": 2, "wall_seconds": length})
        write_model(run_dir / "status.json", status.model_copy(update={"phase": RunPhase.grading, "spend": spend}))
        return 0

    return run


class Recorder:
    """Pod phases (as the kubelet writes them) and Run status phases (as the operator patches them)."""

    def __init__(self) -> None:
        self.pods: dict[str, list[tuple[float, str]]] = {}
        self.runs: dict[str, list[tuple[float, str]]] = {}

    def __call__(self, type_: str, res: ResKey, obj: dict[str, Any]) -> None:
        if type_ != "MODIFIED":
            return
        now = time.monotonic()
        if res == PODS:
            phase = (obj.get("status") or {}).get("phase", "")
            seen = self.pods.setdefault(obj["metadata"]["name"], [])
            if not seen or seen[-1][1] != phase:
                seen.append((now, phase))
        elif res == RUNS:
            phase = (obj.get("status") or {}).get("phase", "")
            seen = self.runs.setdefault(obj["metadata"]["name"], [])
            if not seen or seen[-1][1] != phase:
                seen.append((now, phase))

    def latencies(self, pod_phase: str, run_phases: set[str], skip: frozenset[str] = frozenset()) -> list[float]:
        out = []
        for pod, changes in self.pods.items():
            if pod in skip:
                continue
            run = pod.rsplit("-", 1)[0]
            for t0, phase in changes:
                if phase != pod_phase:
                    continue
                after = [t for t, p in self.runs.get(run, []) if p in run_phases and t >= t0]
                if after:
                    out.append(after[0] - t0)
        return out


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, RSS in MiB), from /proc."""
    out: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rss_kb = int(status.get("VmRSS", "0 kB").split()[0])
        out[int(entry.name)] = (int(status["PPid"]), cmdline, rss_kb / 1024)
    return out


PROCESS_KINDS = (
    ("ray::SupervisorActor", "Ray: supervisor actors"),
    ("gcs_server", "Ray: GCS"),
    ("raylet", "Ray: raylet"),
    ("ray::DashboardAgent", "Ray: dashboard agent"),
    ("ray::RuntimeEnvAgent", "Ray: runtime-env agent"),
    ("dashboard/dashboard.py", "Ray: dashboard (API server)"),
    ("log_monitor.py", "Ray: log monitor"),
    ("autoscaler/_private/monitor.py", "Ray: autoscaler monitor"),
    ("ray::IDLE", "Ray: idle workers"),
)


def process_kind(cmdline: str) -> str:
    return next((kind for marker, kind in PROCESS_KINDS if marker in cmdline), "other")


class Memory:
    """Peak RSS of every process of the control plane: the operator and all its descendants (embedded Ray's
    processes, the supervisor actors), by kind, and the peak of their sum."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: dict[str, float] = {"operator": 0.0}
        self.counts: dict[str, int] = {}
        self.total = 0.0

    def sample(self) -> None:
        procs = _processes()
        if self.pid not in procs:
            return
        family, frontier = set(), [self.pid]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, (ppid, _, _) in procs.items() if ppid == parent]
            family.update(children)
            frontier.extend(children)
        now: dict[str, float] = {"operator": procs[self.pid][2]}
        counts: dict[str, int] = {}
        for pid in family:
            _, cmdline, rss = procs[pid]
            kind = process_kind(cmdline)
            now[kind] = now.get(kind, 0.0) + rss
            counts[kind] = counts.get(kind, 0) + 1
        for key, value in now.items():
            self.peak[key] = max(self.peak.get(key, 0.0), value)
        for key, value in counts.items():
            self.counts[key] = max(self.counts.get(key, 0), value)
        self.total = max(self.total, sum(now.values()))


def quantiles(values: list[float]) -> tuple[str, str]:
    if not values:
        return "—", "—"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:.0f} ms", f"{p95 * 1000:.0f} ms"


class MeasuredKube(FakeKube):
    """The fake API, noting each Run's first status patch once `adopting_since` is set. A patch that changes
    nothing is no watch event, and an adopting supervisor's first patch may change nothing: the request is what
    shows it at work."""

    def __init__(self) -> None:
        super().__init__()
        self.adopting_since: float | None = None
        self.first_status_patch: dict[str, float] = {}  # Run name -> monotonic time

    async def __call__(self, raw_request: Any) -> Any:
        if self.adopting_since is not None and raw_request.method == "PATCH":
            parts = raw_request.path.rstrip("/").split("/")
            if len(parts) > 3 and parts[-1] == "status" and parts[-3] == "runs":
                self.first_status_patch.setdefault(parts[-2], time.monotonic())
        return await super().__call__(raw_request)


@dataclass
class Failover:
    """The kill and the take-over, as the API saw them (a listener: the Lease's writes, as they happen)."""

    api: MeasuredKube
    holder: str = ""  # the Lease's holder now
    killed_at: float | None = None  # monotonic
    killed_holder: str = ""
    live: list[str] = field(default_factory=list)  # the Runs whose pod was Running at the kill
    taken_at: float | None = None
    taken_by: str = ""

    def __call__(self, type_: str, res: ResKey, obj: dict[str, Any]) -> None:
        if res != LEASES or type_ == "DELETED":
            return
        self.holder = str((obj.get("spec") or {}).get("holderIdentity") or "")
        if self.killed_at is not None and self.taken_at is None and self.holder not in ("", self.killed_holder):
            self.taken_at, self.taken_by = time.monotonic(), self.holder
            self.api.adopting_since = self.taken_at


async def first_leader(replicas: dict[str, tuple[OperatorProcess, int]], timeout: float) -> str:
    """Which replica leads, once one answers `/healthz` "leading" (kopf started) and the others stand by."""
    deadline = time.monotonic() + timeout
    while True:
        said = {}
        for name, (op, port) in replicas.items():
            if op.returncode is not None:
                raise RuntimeError(f"operator {name} exited {op.returncode}: {op.said()}")
            said[name] = (await asyncio.to_thread(health, port) or "").strip()
        leading = [n for n, text in said.items() if text == "leading"]
        if len(leading) == 1 and all(text.startswith("standing by") for n, text in said.items() if n != leading[0]):
            return leading[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no single leader after {timeout:g}s: {said}")
        await asyncio.sleep(0.5)


def memory_rows(memory: Memory, prefix: str) -> list[tuple[str, str]]:
    rows = []
    for kind, peak in memory.peak.items():
        count = memory.counts.get(kind, 1)
        rows.append((f"{prefix}{kind}" + (f" ({count} processes)" if count > 1 else ""), f"{peak:.0f} MiB"))
    return rows


LOST_AFTER_S = 5  # runs.podLostAfterSeconds in the benchmark: the chart's 300 s, time-compressed
GPU_HOURS_TOLERANCE = 0.02


@dataclass
class NodeLoss:
    """The node lost mid-campaign: when, and the pods (and so the Runs) that were on it."""

    at: float | None = None
    pods: list[str] = field(default_factory=list)
    resumed_at: float | None = None  # every lost Run's next pod Running

    @property
    def runs(self) -> set[str]:
        return {pod.rsplit("-", 1)[0] for pod in self.pods}


def real_gpu_seconds(recorder: Recorder, loss: NodeLoss) -> float:
    """Each pod's time from its start (the kubelet's first `Pending` with its `startTime`) to its end (its terminal
    phase; a pod lost with its node: the loss), one GPU each."""
    total = 0.0
    for pod, changes in recorder.pods.items():
        start = next((t for t, phase in changes if phase in ("Pending", "Running")), None)
        end = next((t for t, phase in changes if phase in ("Succeeded", "Failed")), None)
        if end is None and pod in loss.pods:
            end = loss.at
        if start is not None and end is not None:
            total += max(1.0, end - start)
    return total


async def bench(
    runs: int,
    run_seconds: float,
    timeout: float,
    failover: bool,
    console: Console,
    keep: bool = False,
    lose_node: bool = True,
) -> tuple[list[tuple[str, str]], list[str]]:
    """The table's rows, and what went wrong (a re-run, a Run not finished, a Run not adopted)."""
    # Ctrl-C or SIGTERM stops the operators it started (the `finally` below) rather than leaving them running
    this = asyncio.current_task()
    assert this is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, this.cancel)
    work = Path(tempfile.mkdtemp(prefix="labkube-scale-"))
    volume = work / "volume"
    volume.mkdir()
    resources = {"resources": {"gpus": 1}} if lose_node else {}
    task = make_tiny_task(work, [{"tool": "end_task", "args": {"summary": "done"}}], **resources)
    loss = NodeLoss()
    recorder = Recorder()
    replicas: dict[str, tuple[OperatorProcess, int]] = {}
    problems: list[str] = []
    try:
        async with MeasuredKube() as api, kmock.Server(api) as server:
            api.keep_requests = False
            lease = Failover(api)
            api.listeners += [recorder, lease]
            kubelet = FakeKubelet(
                api,
                claims={CLAIM: volume},
                gpus=runs if lose_node else 0,
                simulate=simulated_agent(run_seconds),
                work=work / "kubelet",
            )
            async with kubelet:
                kubeconfig = write_kubeconfig(work / "kubeconfig", str(server.url).rstrip("/"))
                if failover:  # the chart's default: a claim per run, each replica's runs root an emptyDir
                    workspace: dict[str, Any] = {"mode": "pvc"}
                    roots = {name: work / f"root-{name}" for name in "ab"}
                else:  # one replica whose runs root is the shared claim
                    workspace = {"mode": "pvc", "existingClaim": CLAIM, "accessModes": ["ReadWriteMany"]}
                    roots = {"a": volume}
                env = {"RAY_AUTH_MODE": "disabled", "LABKUBE_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE}
                for name, root in roots.items():
                    root.mkdir(exist_ok=True)
                    config, port = operator_config(
                        work,
                        runs={
                            "defaultImage": "labkube:bench",
                            "workspace": workspace,
                            "podLostAfterSeconds": LOST_AFTER_S,
                        },
                        leaderElection=chart_leader_election(),
                    )
                    op = await OperatorProcess.start(
                        config, kubeconfig, root, work / f"operator-{name}.log", env=env, max_runs=runs
                    )
                    replicas[name] = (op, port)
                leader = await first_leader(replicas, 300)
                standby = next((n for n in replicas if n != leader), None)
                memory = Memory(replicas[leader][0].pid)
                standby_memory = Memory(replicas[standby][0].pid) if standby else None
                new_memory = Memory(replicas[standby][0].pid) if standby else None
                started = time.monotonic()
                body = {
                    "apiVersion": API_VERSION,
                    "kind": "Campaign",
                    "metadata": {"name": "scale"},
                    "spec": {"tasks": [str(task)], "models": ["oracle"], "seeds": runs, "concurrency": runs},
                }
                api.create_object(CAMPAIGNS, "default", body)
                all_pods_at = None
                while True:
                    killed = lease.killed_at is not None
                    memory.sample()
                    if standby_memory is not None and new_memory is not None:
                        (new_memory if killed else standby_memory).sample()
                    campaign = api.read_object(CAMPAIGNS, "default", "scale") or {}
                    status = campaign.get("status") or {}
                    pods = api.count(PODS)
                    running = kubelet.running()
                    if all_pods_at is None and pods >= runs:
                        all_pods_at = time.monotonic() - started
                    adopted = len(set(api.first_status_patch) & set(lease.live)) if killed else 0
                    console.print(
                        f"[dim]{time.monotonic() - started:6.1f}s  pods {pods}/{runs}  running {len(running)}  "
                        f"campaign {status.get('phase', '-')} {status.get('progress', '')}"
                        + (f"  adopted {adopted}/{len(lease.live)}" if killed else "")
                        + "[/]",
                        highlight=False,
                        soft_wrap=True,
                    )
                    if failover and not killed and len(running) >= runs:
                        lease.killed_holder = lease.holder
                        lease.live = sorted({pod.rsplit("-", 1)[0] for pod in running})
                        lease.killed_at = time.monotonic()
                        console.print(f"[bold]{len(running)} pods Running: SIGKILL to the leader ({leader})[/]")
                        await replicas[leader][0].kill()
                        continue
                    all_live = adopted == len(lease.live) if failover else len(running) >= runs
                    if lose_node and loss.at is None and (killed or not failover) and all_live and running:
                        loss.pods = sorted(running)
                        loss.at = time.monotonic()
                        console.print(f"[bold]{len(running)} pods Running: the node dies[/]")
                        await kubelet.lose_node()
                        continue
                    if loss.at is not None and loss.resumed_at is None:
                        resumed = {pod.rsplit("-", 1)[0] for pod in running if pod not in loss.pods}
                        finished = {p.rsplit("-", 1)[0] for p, c in recorder.pods.items() if p not in loss.pods and c}
                        if loss.runs <= resumed | finished:
                            loss.resumed_at = time.monotonic()
                    if failover and not killed and any(r.get("phase") == "Succeeded" for r in _pod_phases(api)):
                        raise RuntimeError(
                            f"a pod ended before all {runs} were Running at once: raise --run-seconds "
                            f"(now {run_seconds:g})"
                        )
                    if status.get("phase") in ("Finished", "Failed"):
                        break
                    driver = replicas[standby][0] if killed and standby else replicas[leader][0]
                    if driver.returncode is not None:
                        raise RuntimeError(f"the operator exited {driver.returncode}; see {driver.log}")
                    if time.monotonic() - started > timeout:
                        raise TimeoutError(f"the campaign did not finish in {timeout:g}s; see {work}/operator-*.log")
                    await asyncio.sleep(2.0)
                total = time.monotonic() - started
                run_objs = api.objects(RUNS)
                created = [name for verb, plural, _, name in api.audit if verb == "create" and plural == "pods"]
                verbs = dict(api.request_counts)
                requests = sum(verbs.values())
                for op, _ in replicas.values():
                    await op.stop()
            api.close_watches()
    finally:
        for op, _ in replicas.values():
            if op.returncode is None:
                await op.stop()
        if keep:
            console.print(f"kept: {work} (the operators' logs are operator-*.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)

    finished = sum(1 for r in run_objs if (r.get("status") or {}).get("phase") == "Finished")
    agents = [n.rsplit("-", 1)[0] for n in created if not n.endswith("-grade")]
    graders = [n.removesuffix("-grade").rsplit("-", 1)[0] for n in created if n.endswith("-grade")]
    lost_runs = loss.runs  # each of these is expected to start a second agent pod, on the new node

    def expected_attempts(run: dict[str, Any]) -> int:
        return 2 if run["metadata"]["name"] in lost_runs else 1

    later_attempts = sum(1 for r in run_objs if (r.get("status") or {}).get("attempts") != expected_attempts(r))
    reruns = (len(agents) - len(set(agents)) - len(lost_runs)) + (len(graders) - len(set(graders))) + later_attempts
    if finished != runs:
        phases = collections.Counter(str((r.get("status") or {}).get("phase")) for r in run_objs)
        problems.append(f"{runs - finished} of {runs} Runs did not finish (Run phases: {dict(phases)})")
        unfinished = next(r for r in run_objs if (r.get("status") or {}).get("phase") != "Finished")
        problems.append(f"e.g. {unfinished['metadata']['name']}: {unfinished.get('status')}")
    if reruns:
        problems.append(
            f"{reruns} re-run(s): {len(agents)} agent pods and {len(graders)} grading pods for {len(set(agents))} "
            f"Runs; {later_attempts} Run(s) not on their first attempt"
        )

    # A lost Run's second agent pod is Running while its Run already shows Running: its time is the row of its own
    # below (loss -> new pod Running), not a latency of the status.
    resumed = frozenset(
        pod
        for pod, changes in recorder.pods.items()
        if loss.at is not None and not pod.endswith("-grade") and changes and changes[0][0] > loss.at
    )
    running_median, running_p95 = quantiles(
        recorder.latencies("Running", {"Running", "Grading", "Finished"}, skip=resumed)
    )
    done_median, done_p95 = quantiles(recorder.latencies("Succeeded", {"Finished"}))
    rows: list[tuple[str, str]] = []
    rows.append(("Runs finished", f"{finished}/{runs}"))
    rows.append(("pods created (agent, grading)", f"{len(created)} ({len(agents)}, {len(graders)})"))
    rows.append(("campaign wall time", f"{total:.1f} s (simulated agents run {run_seconds:g} s ±20%)"))
    rows.append(("all pods created after", f"{all_pods_at:.1f} s" if all_pods_at is not None else "—"))
    minutes = total / 60.0
    rows.append(("API requests per Run per minute", f"{requests / runs / minutes:.2f}"))
    rows.append(("  of which (verb: count)", ", ".join(f"{verb} {n}" for verb, n in sorted(verbs.items()))))
    lead = "the first leader's " if failover else ""
    rows += memory_rows(memory, f"RSS peak: {lead}")
    rows.append((f"RSS peak: {lead}control plane together", f"{memory.total:.0f} MiB"))
    rows.append(("pod Running -> Run Running: median", running_median))
    rows.append(("pod Running -> Run Running: p95", running_p95))
    rows.append(("pod Succeeded -> Run Finished: median", done_median))
    rows.append(("pod Succeeded -> Run Finished: p95", done_p95))
    if failover and standby_memory is not None and new_memory is not None:
        rows += failover_rows(lease, api.first_status_patch, standby_memory, new_memory, reruns, problems)
    if lose_node:
        rows += node_loss_rows(loss, run_objs, real_gpu_seconds(recorder, loss), problems)
    return rows, problems


def node_loss_rows(
    loss: NodeLoss, run_objs: list[dict[str, Any]], real_seconds: float, problems: list[str]
) -> list[tuple[str, str]]:
    if loss.at is None:
        problems.append("the node was never lost (not every pod was Running at once)")
        return []
    lost = sum(1 for r in run_objs for p in (r.get("status") or {}).get("podTimes") or [] if p.get("lost"))
    rows = [("node lost: pods on it", str(len(loss.pods))), ("node lost: pods the operator found lost", str(lost))]
    if lost != len(loss.pods):
        problems.append(f"{len(loss.pods)} pods were on the lost node; the Runs mark {lost} lost")
    if loss.resumed_at is not None:
        rows.append(("node lost: loss -> every lost Run's new pod Running", f"{loss.resumed_at - loss.at:.1f} s"))
    recorded = sum(float((r.get("status") or {}).get("gpuHours") or 0) for r in run_objs)
    real = real_seconds / 3600.0
    off = recorded / real - 1 if real else float("inf")
    rows.append(
        ("node lost: GPU-hours recorded / pods' real GPU time", f"{recorded:.3f} h / {real:.3f} h ({off:+.1%})")
    )
    if abs(off) > GPU_HOURS_TOLERANCE:
        problems.append(f"GPU-hours recorded {recorded:.3f} h, the pods' real time {real:.3f} h ({off:+.1%})")
    return rows


def _pod_phases(api: FakeKube) -> list[dict[str, Any]]:
    """Each pod's status, read in place (no copy: the loop must not stall the server it measures)."""
    return [obj.get("status") or {} for key, obj in api.store.items() if key[:3] == PODS]


def failover_rows(
    lease: Failover,
    patched: dict[str, float],
    standby: Memory,
    new_leader: Memory,
    reruns: int,
    problems: list[str],
) -> list[tuple[str, str]]:
    assert lease.killed_at is not None
    rows = [("failover: Runs live at the kill (pod Running)", f"{len(lease.live)}")]
    if lease.taken_at is None:
        problems.append("the standby never took the Lease")
        return rows
    rows.append(("failover: kill -> new leader holds the Lease", f"{lease.taken_at - lease.killed_at:.1f} s"))
    adopted = sorted(patched[r] for r in lease.live if r in patched)
    if len(adopted) < len(lease.live):
        problems.append(f"{len(lease.live) - len(adopted)} live Run(s) never adopted")
        rows.append(("failover: Runs adopted", f"{len(adopted)}/{len(lease.live)}"))
    if adopted:
        rows.append(("failover: kill -> first Run adopted", f"{adopted[0] - lease.killed_at:.1f} s"))
        adopt_all = adopted[-1] - lease.killed_at
        rows.append((f"failover: kill -> all {len(adopted)} live Runs adopted", f"{adopt_all:.1f} s"))
        rows.append(("  of which after the Lease was taken", f"{adopted[-1] - lease.taken_at:.1f} s"))
        if adopt_all >= ADOPT_TARGET_S:
            print(f"note: adopting took {adopt_all:.1f}s, past the {ADOPT_TARGET_S:g}s target")
    rows.append(("failover: re-runs", str(reruns)))
    rows.append(("RSS peak: the standby before the kill (control plane together)", f"{standby.total:.0f} MiB"))
    rows.append(("RSS peak: the new leader's control plane together", f"{new_leader.total:.0f} MiB"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=None,
        help="How long each simulated agent runs (default 30; 180 with the failover, so that every pod is Running at "
        "the kill and still running while it is adopted).",
    )
    parser.add_argument(
        "--failover",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Two replicas as the chart deploys them; SIGKILL the leader once every Run's pod is Running.",
    )
    parser.add_argument(
        "--lose-node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Every Run needs a GPU; the node dies once every live Run is adopted (or every pod is Running).",
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (the operators' logs)")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/kubernetes.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "kubernetes.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs < 1 or (args.run_seconds is not None and args.run_seconds <= 0):
        parser.error("--runs and --run-seconds must be positive")
    run_seconds = args.run_seconds if args.run_seconds is not None else 180.0 if args.failover else 30.0
    console = Console()
    try:
        rows, problems = asyncio.run(
            bench(args.runs, run_seconds, args.timeout, args.failover, console, args.keep, args.lose_node)
        )
    except asyncio.CancelledError:
        console.print("interrupted: the operators it started are stopped")
        sys.exit(130)
    title = f"labkube operator: {args.runs} concurrent Runs (fake API and kubelet)"
    table = Table(title=title + (", leader killed at all Runs live" if args.failover else ""), title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if problems:
        for problem in problems:
            console.print(f"[red]{problem}[/]")
        sys.exit(1)
    if args.write_docs:
        command = f"python benchmarks/operator_scale.py --runs {args.runs} --run-seconds {run_seconds:g}"
        command += "" if args.failover else " --no-failover"
        command += "" if args.lose_node else " --no-lose-node"
        body = markdown_table(("measure", f"{args.runs:,} Runs"), rows, (False, True))
        if not args.failover:
            body += "\n\nNo failover in this run (`--no-failover`): one replica, its runs root the shared claim."
        write_block(args.doc, f"operator_scale-{args.runs}", body, command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
