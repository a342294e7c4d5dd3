"""Scale: one Campaign of N concurrent Runs (default 1,000) through `labkube operator`.

The Kubernetes API is `tests/k8s/fakekube.py` (kmock, extended) served from this process, and
`tests/k8s/kubelet.py` is the node: it schedules every pod and moves it Pending -> Running ->
Succeeded, but runs no agent: a simulated agent writes the run's status.json twice into the run
directory on the "shared volume" (a local directory), and the grading pod the operator starts after it
writes the final result.json and its termination report. The operator is
the real command (`labkube operator --config ... --kube-context ...`) in its own process, with its
own embedded Ray, so its memory is its own.

Prints, as a table: how long the campaign took, API requests per Run per minute (every request the
fake API served, from the operator's start to the campaign's end, by verb), the peak RSS of every
process of the control plane (the operator, its Ray supervisor actors and each of Ray's own processes,
sampled every 2 s) and of all of them together, and the latency from
a pod's phase change (as the kubelet writes it to the API) to the Run's status showing it
(Running -> Run `Running`, Succeeded -> Run `Finished`), median and p95.

    python benchmarks/operator_scale.py [--runs 1000] [--run-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
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
CLAIM = "labkube-runs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def simulated_agent(run_seconds: float) -> Any:
    """The agent (status.json twice over `run_seconds` ±20%), and the grading pod that follows it (result.json and
    its termination report, at once)."""

    async def run(pod: dict[str, Any], run_dir: Path | None, termination: Path) -> int:
        assert run_dir is not None
        run_id = run_dir.name
        meta = pod["metadata"]
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

    def latencies(self, pod_phase: str, run_phases: set[str]) -> list[float]:
        out = []
        for pod, changes in self.pods.items():
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


async def stop(operator: asyncio.subprocess.Process) -> None:
    """SIGTERM the operator's process group (kopf stops, Ray shuts down), SIGKILL after 30 s."""
    if operator.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(operator.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(operator.wait(), 30)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(operator.pid, signal.SIGKILL)
        await operator.wait()


def quantiles(values: list[float]) -> tuple[str, str]:
    if not values:
        return "—", "—"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:.0f} ms", f"{p95 * 1000:.0f} ms"


async def bench(runs: int, run_seconds: float, timeout: float, console: Console) -> list[tuple[str, str]]:
    work = Path(tempfile.mkdtemp(prefix="labkube-scale-"))
    volume = work / "volume"
    volume.mkdir()
    task = make_tiny_task(work, [{"tool": "end_task", "args": {"summary": "done"}}])
    recorder = Recorder()
    operator: asyncio.subprocess.Process | None = None
    try:
        async with FakeKube() as api, kmock.Server(api) as server:
            api.keep_requests = False
            api.listeners.append(recorder)
            url = str(server.url).rstrip("/")
            kubelet = FakeKubelet(
                api, claims={CLAIM: volume}, gpus=0, simulate=simulated_agent(run_seconds), work=work / "kubelet"
            )
            async with kubelet:
                kubeconfig = work / "kubeconfig"
                kubeconfig.write_text(
                    yaml.safe_dump(
                        {
                            "apiVersion": "v1",
                            "kind": "Config",
                            "clusters": [{"name": "bench", "cluster": {"server": url}}],
                            "users": [{"name": "bench", "user": {"token": "x"}}],
                            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                            "current-context": "bench",
                        }
                    )
                )
                config = work / "operator.yaml"
                config.write_text(
                    yaml.safe_dump(
                        {
                            "healthPort": free_port(),
                            "metricsPort": free_port(),
                            "runs": {
                                "defaultImage": "labkube:bench",
                                "workspace": {"mode": "pvc", "existingClaim": CLAIM, "accessModes": ["ReadWriteMany"]},
                            },
                        }
                    )
                )
                log = (work / "operator.log").open("wb")
                operator = await asyncio.create_subprocess_exec(
                    sys.executable, "-P", "-m", "labkube", "operator", "--config", str(config),
                    "--kube-context", "bench", "--runs-root", str(volume), "--max-runs", str(runs),
                    env={**os.environ, "KUBECONFIG": str(kubeconfig), "RAY_AUTH_MODE": "disabled"},
                    stdout=log, stderr=log, start_new_session=True,
                )  # fmt: skip
                memory = Memory(operator.pid)
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
                    memory.sample()
                    campaign = api.read_object(CAMPAIGNS, "default", "scale") or {}
                    status = campaign.get("status") or {}
                    pods = api.count(PODS)
                    if all_pods_at is None and pods >= runs:
                        all_pods_at = time.monotonic() - started
                    console.print(
                        f"[dim]{time.monotonic() - started:6.1f}s  pods {pods}/{runs}  "
                        f"running {len(kubelet.running())}  campaign {status.get('phase', '-')} "
                        f"{status.get('progress', '')}[/]",
                        highlight=False,
                    )
                    if status.get("phase") in ("Finished", "Failed"):
                        break
                    if operator.returncode is not None:
                        raise RuntimeError(f"the operator exited {operator.returncode}; see {work / 'operator.log'}")
                    if time.monotonic() - started > timeout:
                        raise TimeoutError(f"the campaign did not finish in {timeout:g}s; see {work / 'operator.log'}")
                    await asyncio.sleep(2.0)
                total = time.monotonic() - started
                finished = sum(1 for r in api.objects(RUNS) if (r.get("status") or {}).get("phase") == "Finished")
                created = sum(1 for verb, plural, _, _ in api.audit if verb == "create" and plural == "pods")
                verbs = dict(api.request_counts)
                requests = sum(verbs.values())
                await stop(operator)
            api.close_watches()
    finally:
        if operator is not None:
            await stop(operator)
        shutil.rmtree(work, ignore_errors=True)

    running_median, running_p95 = quantiles(recorder.latencies("Running", {"Running", "Grading", "Finished"}))
    done_median, done_p95 = quantiles(recorder.latencies("Succeeded", {"Finished"}))
    rows: list[tuple[str, str]] = []
    rows.append(("Runs finished", f"{finished}/{runs}"))
    rows.append(("pods created", str(created)))
    rows.append(("campaign wall time", f"{total:.1f} s (simulated agents run {run_seconds:g} s ±20%)"))
    rows.append(("all pods created after", f"{all_pods_at:.1f} s" if all_pods_at is not None else "—"))
    minutes = total / 60.0
    rows.append(("API requests per Run per minute", f"{requests / runs / minutes:.2f}"))
    rows.append(("  of which (verb: count)", ", ".join(f"{verb} {n}" for verb, n in sorted(verbs.items()))))
    for kind, peak in memory.peak.items():
        count = memory.counts.get(kind, 1)
        rows.append((f"RSS peak: {kind}" + (f" ({count} processes)" if count > 1 else ""), f"{peak:.0f} MiB"))
    rows.append(("RSS peak: the control plane together", f"{memory.total:.0f} MiB"))
    rows.append(("pod Running -> Run Running: median", running_median))
    rows.append(("pod Running -> Run Running: p95", running_p95))
    rows.append(("pod Succeeded -> Run Finished: median", done_median))
    rows.append(("pod Succeeded -> Run Finished: p95", done_p95))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--run-seconds", type=float, default=30.0, help="How long each simulated agent runs.")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/kubernetes.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "kubernetes.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    console = Console()
    rows = asyncio.run(bench(args.runs, args.run_seconds, args.timeout, console))
    table = Table(title=f"labkube operator: {args.runs} concurrent Runs (fake API and kubelet)", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if args.write_docs:
        command = f"python benchmarks/operator_scale.py --runs {args.runs} --run-seconds {args.run_seconds:g}"
        body = markdown_table(("measure", f"{args.runs:,} Runs"), rows, (False, True))
        write_block(args.doc, f"operator_scale-{args.runs}", body, command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
