"""`labkube operator` started exactly as the rendered chart starts it.

The chart is rendered with helm-python-sdk; the operator Deployment's container (command, args, env,
volume mounts, user, read-only root file system, capabilities) runs in a scratch root standing in for
the container's (`container.start_container`: mount and pid namespaces, pivot_root, setpriv), with the
rendered ConfigMap as its config volume, a service-account mount and the kubelet's `KUBERNETES_*`
variables, against the fake API over HTTPS (in-cluster configuration trusts only the mount's CA).
Its Ray starts inside that container, with token authentication. The run pods it creates are run by
the fake kubelet. Nothing of the test process leaks in: not its environment, not RAY_AUTH_MODE.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from conftest import CAMPAIGNS, RUNS, eventually
from container import ServiceAccountMount, start_container
from fakekube import FakeKube
from kubelet import FakeKubelet
from tls import https_server, kubernetes_service_env, make_tls

from labkube.operator.crds import API_VERSION
from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "helm" / "labkube"
RELEASE_NAMESPACE = "labkube-system"
CLAIM = "labkube-runs"
TASKS = ["researchgym/continual-learning-lite", "researchgym/timeseries-attribution"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="labkube", namespace=RELEASE_NAMESPACE)
    return [
        d for path, text in sorted(rendered.items()) if not path.endswith(".txt") for d in yaml.safe_load_all(text) if d
    ]


class Installed:
    """The fake cluster, and the operator pod as the chart describes it."""

    def __init__(
        self, api: FakeKube, docs: list[dict[str, Any]], work: Path, kube_env: dict[str, str], sa: ServiceAccountMount
    ) -> None:
        self.api = api
        self.docs = docs
        self.work = work
        self.kube_env = kube_env
        self.sa = sa
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        self.pod = deployment["spec"]["template"]
        (self.container,) = self.pod["spec"]["containers"]
        config_map = next(d for d in docs if d["kind"] == "ConfigMap" and "operator.yaml" in d["data"])
        self.volumes: dict[str, Path] = {}
        for volume in self.pod["spec"]["volumes"]:
            path = work / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                assert volume["configMap"]["name"] == config_map["metadata"]["name"]
                for key, text in config_map["data"].items():
                    (path / key).write_text(text)
            if "persistentVolumeClaim" in volume:
                self.volumes[volume["name"]] = (
                    work / "claims" / RELEASE_NAMESPACE / volume["persistentVolumeClaim"]["claimName"]
                )
                self.volumes[volume["name"]].mkdir(parents=True, exist_ok=True)
            elif (volume.get("emptyDir") or {}).get("medium") != "Memory":
                self.volumes[volume["name"]] = path  # a memory emptyDir stays a tmpfs inside the container

    def port(self, name: str) -> int:
        return int(next(p["containerPort"] for p in self.container["ports"] if p["name"] == name))

    @contextlib.asynccontextmanager
    async def operator(self) -> AsyncIterator[Any]:
        meta = {"name": "labkube-7d9f-abcde", "namespace": RELEASE_NAMESPACE, "labels": self.pod["metadata"]["labels"]}
        proc = start_container(
            self.container,
            self.pod["spec"],
            self.volumes,
            log_dir=self.work / "logs",
            service_account=self.sa if self.pod["spec"].get("automountServiceAccountToken", True) else None,
            kube_env=self.kube_env,
            pod_meta=meta,
            grace_s=20,
        )
        async with proc:
            yield proc

    async def ready(self, proc: Any, timeout: float = 90) -> None:
        """Until the startup probe's endpoint answers (`/healthz` on the `health` port)."""
        probe = self.container["startupProbe"]["httpGet"]
        url = f"http://127.0.0.1:{self.port(probe['port'])}{probe['path']}"

        def answers() -> bool:
            if proc.returncode is not None:
                raise AssertionError(f"the operator exited ({proc.exit_code}): {proc.log('err')[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        deadline = asyncio.get_running_loop().time() + timeout
        while not await asyncio.to_thread(answers):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{url} never answered; the operator said: {proc.log('err')[-3000:]}")
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def installed(tmp_path: Path, values: dict[str, Any]) -> AsyncIterator[Installed]:
    ports = {"metricsPort": free_port(), "healthPort": free_port()}  # the pod's ports are this host's here
    values = {**values, "operator": {**values.get("operator", {}), **ports}}
    docs = render(values)
    tls = make_tls(tmp_path / "tls")
    async with FakeKube() as api, https_server(api, tls) as server:
        sa = ServiceAccountMount(token="operator-token", ca_cert=tls.ca_cert, namespace=RELEASE_NAMESPACE)
        installation = Installed(api, docs, tmp_path / "pod", kubernetes_service_env("127.0.0.1", server.port), sa)
        claims = {(ns, CLAIM): tmp_path / "pod" / "claims" / ns / CLAIM for ns in (RELEASE_NAMESPACE, "default")}
        for path in claims.values():
            path.mkdir(parents=True, exist_ok=True)
        kubelet = FakeKubelet(api, claims=claims, work=tmp_path / "kubelet")
        async with kubelet:
            yield installation
        api.close_watches()


def campaign(name: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Campaign",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tasks": TASKS, "models": ["oracle"], "seeds": 2, "concurrency": 4},
    }


async def finish_a_campaign(installation: Installed, runs_root: Path, namespace: str = "default") -> None:
    async with installation.operator() as proc:
        await installation.ready(proc)
        installation.api.create_object(CAMPAIGNS, namespace, campaign("as-installed", namespace))

        def finished() -> bool:
            obj = installation.api.read_object(CAMPAIGNS, namespace, "as-installed") or {}
            return (obj.get("status") or {}).get("phase") == "Finished"

        try:
            await eventually(finished, 240, every=0.5, what="the campaign to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the operator said: {proc.log('err')[-4000:]}") from None
        await proc.terminate()
        leftovers = proc.processes()
    assert leftovers == [], f"processes of the operator's container outlived it: {leftovers}"
    runs = installation.api.objects(RUNS, namespace, "labkube.dev/campaign=as-installed")
    assert len(runs) == 4 and all(r["status"]["phase"] == "Finished" for r in runs)
    assert all(r["status"]["score"] is not None for r in runs)
    cdir = CampaignDir(runs_root / namespace / "as-installed")
    assert len(cdir.run_ids()) == 4
    for run_id in cdir.run_ids():
        result = cdir.result(run_id)
        assert result is not None and result.final and result.status.value == "Finished"


def gcs_port(pids: list[int]) -> int | None:
    """The GCS server's gRPC port among the container's processes (it picks a free one: `--gcs_server_port=0`);
    None while there is none listening."""
    import psutil

    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.name() == "gcs_server":
                ports = sorted(
                    c.laddr.port for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
                )
                flag = next((a for a in process.cmdline() if a.startswith("--gcs_server_port=")), "=0")
                wanted = int(flag.split("=")[1])
                if wanted or ports:
                    return wanted if wanted else ports[0]
    return None  # not started yet (or not listening yet)


def ray_client_without_the_token(port: int) -> str:
    """What a pod that reached the operator's Ray would get, with no token and with a wrong one."""
    import subprocess
    import sys

    script = f"import ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR'); print('CONNECTED')"
    outputs = []
    for env in ({"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}):
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        outputs.append(done.stdout + done.stderr)
    return "\n".join(outputs)


async def test_default_values_cluster_wide_operator_finishes_a_campaign(tmp_path: Path) -> None:
    async with installed(tmp_path, {}) as installation:
        assert installation.container["securityContext"]["readOnlyRootFilesystem"] is True
        assert "RAY_AUTH_MODE" not in str(installation.container)
        async with installation.operator() as proc:
            await installation.ready(proc)
            # It leads: the chart's two replicas elect one on a Lease in the release namespace. /healthz
            # answers from process start (before the election, #24 item 5), so the Lease may come later.
            lease = await eventually(
                lambda: installation.api.read_object(
                    ("coordination.k8s.io", "v1", "leases"), RELEASE_NAMESPACE, "labkube-leader"
                ),
                60,
                every=0.2,
                what="the leader Lease",
            )
            assert lease["spec"]["holderIdentity"].startswith("labkube-7d9f-abcde-")
            # Embedded Ray has token authentication on: a client without the operator's token is refused.
            # /healthz answers from process start (standing by, connecting to Ray): wait for the embedded head
            port = await eventually(lambda: gcs_port(proc.processes()), 120, every=0.5, what="the embedded Ray head")
            said = await asyncio.to_thread(ray_client_without_the_token, port)
            assert "CONNECTED" not in said and "InvalidAuthToken" in said, said
        await finish_a_campaign(installation, installation.volumes["runs"])
        # The default workspace is a claim per run (so a replaced pod resumes), owned by its Run.
        claims = installation.api.objects(("", "v1", "persistentvolumeclaims"), "default")
        assert len(claims) == 4 and all(c["metadata"]["ownerReferences"][0]["kind"] == "Run" for c in claims)
        policy = installation.api.read_object(("networking.k8s.io", "v1", "networkpolicies"), "default", "labkube-runs")
        assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


async def test_shared_claim_values_finish_a_campaign_with_results_on_the_claim(tmp_path: Path) -> None:
    values = {"runs": {"workspace": {"mode": "pvc", "existingClaim": CLAIM, "accessModes": ["ReadWriteMany"]}}}
    async with installed(tmp_path, values) as installation:
        claim = installation.volumes["runs"]
        # The release namespace's claim: the operator and that namespace's pods share it.
        await finish_a_campaign(installation, claim, namespace=RELEASE_NAMESPACE)
        cdir = CampaignDir(claim / RELEASE_NAMESPACE / "as-installed")
        assert all((cdir.run_dir(i) / "transcript.jsonl").exists() for i in cdir.run_ids())


async def test_namespaced_mode_finishes_a_campaign_in_a_watched_namespace(tmp_path: Path) -> None:
    async with installed(tmp_path, {"operator": {"watchNamespaces": ["default"]}}) as installation:
        await finish_a_campaign(installation, installation.volumes["runs"])


async def test_an_unusable_runs_root_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    values = {"operator": {"env": [{"name": "LABKUBE_RUNS_ROOT", "value": "/var/lib/labkube/runs"}]}}
    async with installed(tmp_path, values) as installation, installation.operator() as proc:
        code = await proc.wait(timeout=60)
        err = proc.log("err")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "runs root /var/lib/labkube/runs: Read-only file system (uid 1000)" in lines[0]
    assert "operator.runsRoot" in lines[0]
