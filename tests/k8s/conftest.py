"""The operator against a fake cluster: `FakeKube` (kmock, extended) serves the API on the test's
event loop, `FakeKubelet` runs the pods as local processes, and kopf runs the operator's handlers
in `kopf.testing.KopfRunner` (a thread with its own loop) against the real `kubernetes` client.
Ray is the session's `ray_local` (2 logical GPUs). Everything started here is stopped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import pytest
from fakekube import FakeKube, ResKey
from kopf.testing import KopfRunner
from kubelet import FakeKubelet
from tinytask import make_tiny_task

from labkube.operator.crds import API_VERSION
from labkube.operator.driver import RayContext
from labkube.operator.k8s_models import OperatorConfig, PodOptions, Tenancy, WorldOptions
from labkube.operator.k8s_operator import OperatorRuntime, build_registry
from labkube.operator.kube import KubeTarget
from labkube.operator.telemetry import OperatorMetrics
from labkube.tasks.gaia2.world_process import SERVER_SCRIPT

CAMPAIGNS: ResKey = ("labkube.dev", "v1alpha1", "campaigns")
RUNS: ResKey = ("labkube.dev", "v1alpha1", "runs")
PODS: ResKey = ("", "v1", "pods")
CLAIM = "labkube-runs"
UNPULLABLE = "registry.invalid/labkube/missing:0"
NAMESPACE = "default"
WORLD_IMAGE = "ghcr.io/labkube/world:test"  # its entrypoint: world_server.py with ARE's python


@dataclass
class Cluster:
    api: FakeKube
    url: str
    kubelet: FakeKubelet
    volume: Path  # the shared claim `labkube-runs`, as the kubelet and the operator see it
    ray: RayContext
    root: Path

    def runtime(
        self,
        world: WorldOptions | None = None,
        tenancy: Tenancy | None = None,
        run_policies: list[dict[str, Any]] | None = None,
        workspace: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> OperatorRuntime:
        """The operator's configuration; `world` is the chart's `runs.world` (Gaia2 runs need it), `tenancy` what
        Campaigns may choose (default: nothing), `workspace` the runs' (default: the shared claim)."""
        runs = PodOptions(
            default_image="labkube:test",
            workspace=workspace or {"mode": "pvc", "existingClaim": CLAIM, "accessModes": ["ReadWriteMany"]},
            termination_grace_period_seconds=5,
            deadline_grace_seconds=60,
            world=world,
        )
        values: dict[str, Any] = {
            "config": OperatorConfig(runs=runs, tenancy=tenancy or Tenancy(), run_policies=run_policies or []),
            "kube": KubeTarget(server=self.url),
            "runs_root": self.volume,
            "namespace": NAMESPACE,  # the operator's own: the namespace whose claim it mounts
            "poll_seconds": 0.3,
            "status_interval_s": 0.3,
        }
        return OperatorRuntime(**{**values, **overrides})

    @contextlib.asynccontextmanager
    async def operator(self, metrics: OperatorMetrics | None = None, **overrides: Any) -> AsyncIterator[KopfRunner]:
        """kopf with the operator's handlers, in a thread (so this loop keeps serving the API)."""
        registry = build_registry(self.runtime(**overrides), self.ray, metrics)
        runner = KopfRunner(["run", "-A", "--standalone"], registry=registry, timeout=60)
        await asyncio.to_thread(runner.__enter__)
        try:
            yield runner
        finally:
            await asyncio.to_thread(runner.__exit__, None, None, None)

    def campaign(self, name: str, **spec: Any) -> dict[str, Any]:
        """Create a Campaign, as `kubectl apply` would."""
        body = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}
        return self.api.create_object(CAMPAIGNS, NAMESPACE, body)

    def get_campaign(self, name: str) -> dict[str, Any] | None:
        return self.api.read_object(CAMPAIGNS, NAMESPACE, name)

    def runs(self, campaign: str) -> list[dict[str, Any]]:
        return self.api.objects(RUNS, NAMESPACE, f"labkube.dev/campaign={campaign}")

    def pods(self, campaign: str | None = None) -> list[dict[str, Any]]:
        return self.api.objects(PODS, NAMESPACE, f"labkube.dev/campaign={campaign}" if campaign else None)

    def created_pod(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """A pod as it was created (finished pods are deleted once their result is recorded)."""
        return next(
            e.obj
            for e in self.api.log
            if e.res == PODS and e.type == "ADDED" and e.namespace == namespace and e.obj["metadata"]["name"] == name
        )

    def last_pod_state(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """A pod's last state, also after it was deleted (the object of its last watch event)."""
        return next(
            e.obj
            for e in reversed(self.api.log)
            if e.res == PODS and e.namespace == namespace and e.obj["metadata"]["name"] == name
        )

    def pods_created(self, campaign: str) -> list[str]:
        """Every pod the API ever created for the campaign, in order."""
        return [
            name
            for verb, plural, _, name in self.api.audit
            if verb == "create" and plural == "pods" and name.startswith(f"{campaign}-")
        ]

    def agent_pods_created(self, campaign: str) -> list[str]:
        """The pods the agents ran in, in order (not the grading pods, `<run>-<attempt>-grade`)."""
        return [name for name in self.pods_created(campaign) if not name.endswith("-grade")]

    def grading_pods_created(self, campaign: str) -> list[str]:
        """The pods that graded the campaign's runs after their agents' pods ended (`k8s_grading`)."""
        return [name for name in self.pods_created(campaign) if name.endswith("-grade")]

    def campaign_dir(self, name: str, namespace: str = NAMESPACE) -> Path:
        return self.volume / namespace / name


async def eventually(check: Callable[[], Any], timeout: float = 60.0, every: float = 0.2, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or check}")
        await asyncio.sleep(every)


def tiny_task(root: Path, name: str, steps: list[dict[str, Any]], **labkube_yaml: Any) -> Path:
    """`tinytask.make_tiny_task`, in a directory of its own name (run ids come from it)."""
    made = make_tiny_task(root / f".{name}", steps, **labkube_yaml)
    dest = root / name
    shutil.move(str(made), dest)
    return dest


@pytest.fixture
async def cluster(tmp_path: Path, ray_local: RayContext) -> AsyncIterator[Cluster]:
    volume = tmp_path / "volume"
    volume.mkdir()
    async with FakeKube() as api, kmock.Server(api) as server:
        kubelet = FakeKubelet(
            api,
            claims={CLAIM: volume},
            gpus=2,
            unpullable=frozenset({UNPULLABLE}),
            entrypoints={WORLD_IMAGE: ["python", str(SERVER_SCRIPT)]},
            work=tmp_path / "kubelet",
        )
        async with kubelet:
            yield Cluster(api, str(server.url).rstrip("/"), kubelet, volume, ray_local, tmp_path)
        api.close_watches()
