"""Records that are what the API server stored: CRDs older than the operator, against the fake API's
`serve_older_crds` (the Run CRD of an older chart, whose status lacks the newer fields: the server prunes them from
every write and answers 200, as kube-apiserver does).

- The operator refuses to lead with such CRDs, in one line naming `labkube crds apply`, with `/healthz` answering
  503 and saying so, and leads (here: stands by for a Lease another replica holds) once they are applied.
- A result whose `report` the server dropped is not "recorded": the run's pods are kept, and the Run says why.
- A status patch carries what its writer changed, never a null it did not mean: a stale supervisor's patch keeps
  the report another one recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from conftest import PODS, RUNS, eventually
from fakekube import CRDS, FakeKube, serve_older_crds
from operator_process import OperatorProcess, operator_config, write_kubeconfig

from labkube.budgets import StopReason
from labkube.operator.admission import write_admitted
from labkube.operator.crds import API_VERSION, LABEL_CAMPAIGN, LABEL_RUN, crds_problem, run_crd, run_name
from labkube.operator.k8s_backend import K8sBackend, PodRun
from labkube.operator.k8s_grading import report_of
from labkube.operator.k8s_models import PodOptions, RunResourceSpec, status_patch
from labkube.operator.kube import KubeTarget, api_client
from labkube.operator.kube_session import KubeSession
from labkube.operator.pod_manifest import LABEL_ATTEMPT, LABEL_COMPONENT
from labkube.result import RunResult
from labkube.run_spec import RunPhase
from labkube.store import RunDir, write_model

NAMESPACE = "default"
CAMPAIGN = "records"
RUN_ID = "r0"
LEASES = ("coordination.k8s.io", "v1", "leases")


@dataclass
class Api:
    fake: FakeKube
    url: str


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with FakeKube() as fake, kmock.Server(fake) as server:
        yield Api(fake, str(server.url).rstrip("/"))
        fake.close_watches()


# -- the status patch ---------------------------------------------------------------------------------------------


def test_a_status_patch_holds_what_changed_and_a_null_only_for_what_its_writer_cleared() -> None:
    base = {"phase": "Running", "score": 0.5, "report": None, "clusterSpend": {"costUsd": 1.0, "atLeast": False}}
    now = {"phase": "Finished", "score": None, "report": None, "clusterSpend": {"costUsd": 2.0, "atLeast": False}}
    assert status_patch(base, now) == {"phase": "Finished", "score": None, "clusterSpend": {"costUsd": 2.0}}
    # a field this writer never set is never sent as null, whatever the server holds
    assert status_patch({}, {"phase": "Running", "report": None}) == {"phase": "Running"}
    assert status_patch(now, now) == {}


# -- the operator checks the installed CRDs ---------------------------------------------------------------------------


async def test_crds_older_than_the_operator_are_named_in_one_line(api: Api) -> None:
    client = api_client(KubeTarget(server=api.url))
    assert await asyncio.to_thread(crds_problem, client) is None
    serve_older_crds(api.fake, ["report", "clusterSpend"])
    problem = await asyncio.to_thread(crds_problem, client)
    assert problem is not None and "\n" not in problem
    assert "runs.labkube.dev lacks status.report, status.clusterSpend" in problem
    assert "campaigns.labkube.dev" not in problem and "`labkube crds apply`" in problem


def healthz(port: int) -> tuple[int, str] | None:
    """`/healthz`'s status code and text, 503 included (None: nothing answers yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return None


@pytest.mark.slow
async def test_the_operator_refuses_to_lead_with_old_crds_and_goes_on_once_they_are_applied(
    api: Api, tmp_path: Path
) -> None:
    # Another replica holds the Lease (for an hour): once the CRDs are current, this one stands by, without Ray.
    lease_spec = {"holderIdentity": "the-other-replica", "leaseDurationSeconds": 3600, "leaseTransitions": 0}
    lease = {"metadata": {"name": "labkube-operator", "namespace": "labkube-system"}, "spec": lease_spec}
    api.fake.create_object(LEASES, "labkube-system", lease)
    serve_older_crds(api.fake)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    runs = {"defaultImage": "labkube:test", "workspace": {"mode": "pvc"}}
    config, port = operator_config(tmp_path, runs=runs, leaderElection={"leaseSeconds": 3, "renewDeadlineSeconds": 2})
    runs_root = tmp_path / "runs"
    env = {"LABKUBE_OPERATOR_NAMESPACE": "labkube-system"}
    op = await OperatorProcess.start(config, kubeconfig, runs_root, tmp_path / "operator.log", env=env)
    try:

        def refusing() -> str | None:
            if op.returncode is not None:
                raise AssertionError(f"the operator exited {op.returncode}: {op.said()}")
            said = healthz(port)
            return said[1] if said is not None and said[0] == 503 else None

        text = await eventually(refusing, 60, every=0.3, what=f"/healthz to refuse: {op.said()}")
        assert "runs.labkube.dev lacks status.podTimes, status.report" in text and "`labkube crds apply`" in text
        await asyncio.sleep(11)  # past a second check: the reason is said once, not on every check
        lines = [line for line in op.said(100_000).splitlines() if "labkube crds apply" in line]
        assert len(lines) == 1 and "refusing to lead" in lines[0], op.said()
        assert healthz(port) == (503, text)
        assert ("update", "leases", "labkube-system", "labkube-operator") not in api.fake.audit  # never a candidate

        current = run_crd()
        api.fake.update_object(CRDS, "", current["metadata"]["name"], lambda crd: crd.update(spec=current["spec"]))

        def standing_by() -> bool:
            said = healthz(port)
            return said is not None and said[0] == 200 and said[1].startswith("standing by")

        await eventually(standing_by, 30, every=0.3, what=f"the operator to go on: {op.said()}")
        assert op.returncode is None
    finally:
        code, _ = await op.stop()
    assert code == 0, op.said()


# -- what the supervisor records ----------------------------------------------------------------------------------


def run_object(spec: RunResourceSpec) -> dict[str, Any]:
    name = run_name(spec.campaign, spec.run_id)
    labels = {LABEL_CAMPAIGN: spec.campaign, LABEL_RUN: name}
    meta = {"name": name, "namespace": NAMESPACE, "labels": labels}
    return {"apiVersion": API_VERSION, "kind": "Run", "metadata": meta, "spec": spec.model_dump(mode="json")}


def pod_object(spec: RunResourceSpec, attempt: int) -> dict[str, Any]:
    name = run_name(spec.campaign, spec.run_id)
    labels = {
        "app.kubernetes.io/managed-by": "labkube-operator",
        LABEL_COMPONENT: "run",
        LABEL_CAMPAIGN: spec.campaign,
        LABEL_RUN: name,
        LABEL_ATTEMPT: str(attempt),
    }
    meta = {"name": f"{name}-{attempt}", "namespace": NAMESPACE, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "agent"}]}}


@dataclass
class Supervised:
    """One run as the operator's campaign directory, the API and a supervisor's session have it."""

    api: Api
    spec: RunResourceSpec
    rd: RunDir
    session: KubeSession
    backend: K8sBackend

    @property
    def name(self) -> str:
        return run_name(self.spec.campaign, self.spec.run_id)

    async def supervisor(self) -> PodRun:
        """A supervisor of the run (`supervise_pod`'s), its pod cache synced."""
        sup = PodRun(self.session, self.backend, self.rd)
        await asyncio.wait_for(sup.watcher.synced.wait(), 30)
        return sup

    def stored(self) -> dict[str, Any]:
        return (self.api.fake.read_object(RUNS, NAMESPACE, self.name) or {}).get("status") or {}


@pytest.fixture
async def supervised(api: Api, tmp_path: Path) -> AsyncIterator[Supervised]:
    spec = RunResourceSpec(run_id=RUN_ID, campaign=CAMPAIGN, task="t", task_path="/t", model="oracle", seed=0)
    root = tmp_path / NAMESPACE / CAMPAIGN
    write_admitted(root, [spec])
    rd = RunDir(root / "runs" / RUN_ID)
    rd.root.mkdir(parents=True)
    api.fake.create_object(RUNS, NAMESPACE, run_object(spec))
    target = KubeTarget(server=api.url)
    # A claim per run (the chart's default): the operator's run directory is its own, and its result.json the
    # operator's copy of the grading pod's report.
    options = PodOptions(default_image="labkube:test", workspace={"mode": "pvc"})
    backend = K8sBackend(kube=target, namespace=NAMESPACE, runs=options, poll_seconds=0.2)
    session = KubeSession(target, asyncio.get_running_loop())
    try:
        yield Supervised(api, spec, rd, session, backend)
    finally:
        for watcher in session.watchers.values():
            watcher.close()
        session.executor.shutdown(wait=False, cancel_futures=True)


def final_result(spec: RunResourceSpec) -> RunResult:
    return RunResult(
        run_id=spec.run_id,
        task=spec.task,
        model=spec.model,
        seed=spec.seed,
        status=RunPhase.finished,
        stop_reason=StopReason.done,
        score=0.6,
        finished_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


async def test_a_report_the_server_dropped_is_not_recorded_and_the_pods_are_kept(supervised: Supervised) -> None:
    s = supervised
    serve_older_crds(s.api.fake)
    pod = s.api.fake.create_object(PODS, NAMESPACE, pod_object(s.spec, 0))
    s.api.fake.set_status(PODS, NAMESPACE, pod["metadata"]["name"], {"phase": "Succeeded"})
    result = final_result(s.spec)
    write_model(s.rd.result_json, result)  # the grading pod's report, as the operator keeps it
    # A leader that restarted after the run's final status was written finds it (without its report: dropped).
    final = {"phase": "Finished", "podName": pod["metadata"]["name"], "attempts": 1, "report": report_of(result)}
    s.api.fake.set_status(RUNS, NAMESPACE, s.name, final)
    assert s.stored()["phase"] == "Finished" and "report" not in s.stored()

    sup = await s.supervisor()
    done = await sup.run()

    assert done.final and done.score == pytest.approx(0.6)
    # Not "recorded": the API server answered without the report, so the pod (whose report it is) stays.
    assert s.api.fake.read_object(PODS, NAMESPACE, pod["metadata"]["name"]) is not None
    assert ("delete", "pods", NAMESPACE, pod["metadata"]["name"]) not in s.api.fake.audit
    stored = s.stored()
    assert "report" not in stored
    recorded = next(c for c in stored["conditions"] if c["type"] == "Recorded")
    assert recorded["status"] == "False" and recorded["reason"] == "CRDOutdated"
    assert "report" in recorded["message"] and "`labkube crds apply`" in recorded["message"]


async def test_a_stale_supervisors_status_patch_keeps_the_report_another_one_recorded(supervised: Supervised) -> None:
    s = supervised
    pod = s.api.fake.create_object(PODS, NAMESPACE, pod_object(s.spec, 0))
    pod_name = pod["metadata"]["name"]
    s.api.fake.set_status(RUNS, NAMESPACE, s.name, {"phase": "Starting", "podName": pod_name, "attempts": 1})
    # The stale supervisor: an old leader's actor, still following the run's pod.
    stale = await s.supervisor()
    following = asyncio.create_task(stale.run())
    try:
        await eventually(lambda: ("update/status", "runs", NAMESPACE, s.name) in s.api.fake.audit, 30)
        # Meanwhile the new leader's supervisor recorded the run's result.
        report = report_of(final_result(s.spec))
        recorded = {**s.stored(), "phase": "Finished", "stopReason": "done", "score": 0.6, "report": report}
        s.api.fake.set_status(RUNS, NAMESPACE, s.name, recorded)
        patches = s.api.fake.audit.count(("update/status", "runs", NAMESPACE, s.name))
        # The pod starts: the stale supervisor patches what it saw change.
        started = {"phase": "Running", "startTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        s.api.fake.set_status(PODS, NAMESPACE, pod_name, started)
        await eventually(lambda: s.api.fake.audit.count(("update/status", "runs", NAMESPACE, s.name)) > patches, 30)
        await asyncio.sleep(0.5)  # and whatever it sends next
        assert s.stored().get("report") == report, yaml.safe_dump(s.stored())
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
