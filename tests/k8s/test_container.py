"""The container runner (`container.py`) enforces what it claims, the fake kubelet's isolated mode runs pods
through it, and in-cluster configuration works against `FakeKube` over TLS (`tls.py`). Needs root and
util-linux: without them these tests fail with `ContainerError`, on purpose (they are what would catch a
chart that cannot work in a cluster)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from container import (
    DEFAULT_IMAGE_PATH,
    REPO,
    SA_DIR,
    ContainerError,
    ContainerProcess,
    ServiceAccountMount,
    start_container,
)
from fakekube import FakeKube
from kubelet import FakeKubelet
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader
from tls import https_server, kubernetes_service_env, make_tls

pytestmark = pytest.mark.slow

UID, GID, FS_GROUP = 1000, 3000, 2000
TOKEN = "sa-token-for-tests"

# As the operator renders a run's pod (operator/pod_manifest.py): non-root, read-only root, no capabilities.
SECURE = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_spec(**extra: Any) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": GID, "fsGroup": FS_GROUP},
        "volumes": [
            {"name": "runs", "persistentVolumeClaim": {"claimName": "labkube-runs"}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}},
            {"name": "config", "configMap": {"name": "agent-config"}},
        ],
        **extra,
    }


def agent(script: str, **extra: Any) -> dict[str, Any]:
    """A container running `sh -c script`, mounting the pod's volumes."""
    return {
        "name": "agent",
        "image": "labkube:test",
        "command": ["sh", "-c", script],
        "securityContext": SECURE,
        "volumeMounts": [
            {"name": "runs", "mountPath": "/runs", "subPath": "campaign-a"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "config", "mountPath": "/etc/labkube", "readOnly": True},
        ],
        **extra,
    }


@pytest.fixture
def volumes(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / "volumes" / name for name in ("runs", "tmp", "config")}
    for path in paths.values():
        path.mkdir(parents=True)
    (paths["config"] / "agent.yaml").write_text("model: test\n")
    return paths


async def run(tmp_path: Path, container: dict[str, Any], pod: dict[str, Any], volumes: dict[str, Path], **kwargs: Any):
    """Run the container to its end: (exit code, stdout, stderr)."""
    async with start_container(container, pod, volumes, log_dir=tmp_path / "logs", **kwargs) as proc:
        await proc.wait(60)
    return proc.exit_code, proc.log("out"), proc.log("err")


def mountinfo() -> list[str]:
    return sorted(Path("/proc/self/mountinfo").read_text().splitlines())


async def test_read_only_root_filesystem_and_volumes(tmp_path: Path, volumes: dict[str, Path]) -> None:
    script = """
        touch /x 2>&1 || echo "root: refused"
        touch /etc/labkube/new 2>&1 || echo "configMap: refused"
        echo out >/runs/result && echo "runs: written"
        echo scratch >/tmp/scratch && echo "tmp: written"
        echo shm >/dev/shm/segment && echo "shm: written"
        echo "config: $(cat /etc/labkube/agent.yaml)"
        stat -f -c "shm-fs: %T %b %S" /dev/shm
    """
    code, out, _ = await run(tmp_path, agent(script), pod_spec(), volumes)
    assert code == 0, out
    assert "touch: cannot touch '/x': Read-only file system" in out
    assert "root: refused" in out
    assert "touch: cannot touch '/etc/labkube/new': Read-only file system" in out
    assert "runs: written" in out and "tmp: written" in out and "shm: written" in out
    assert "config: model: test" in out
    fs, blocks, block_size = next(line for line in out.splitlines() if line.startswith("shm-fs: ")).split()[1:]
    assert (fs, int(blocks) * int(block_size)) == ("tmpfs", 128 * 2**20)  # its sizeLimit, not the runtime's 64 MiB
    result = volumes["runs"] / "campaign-a" / "result"  # the subPath, created by the "kubelet"
    assert result.read_text() == "out\n"
    assert (result.stat().st_uid, result.stat().st_gid) == (UID, FS_GROUP)  # the volume's setgid directory
    assert (volumes["tmp"] / "scratch").exists()
    assert not (volumes["config"] / "new").exists()


async def test_user_groups_and_privileges(tmp_path: Path, volumes: dict[str, Path]) -> None:
    script = 'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; grep -E "^(CapEff|CapBnd|NoNewPrivs)" /proc/self/status'
    code, out, err = await run(tmp_path, agent(script), pod_spec(), volumes)
    assert code == 0, err
    assert "uid=1000 gid=3000 groups=3000 2000" in out  # runAsGroup, and fsGroup as a supplementary group
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    for volume in ("runs", "tmp"):  # chowned for the pod's user before the start
        assert (volumes[volume].stat().st_uid, volumes[volume].stat().st_gid) == (UID, FS_GROUP)


@pytest.mark.parametrize("automount", [True, False])
async def test_service_account_token_only_when_automounted(
    tmp_path: Path, volumes: dict[str, Path], automount: bool
) -> None:
    tls = make_tls(tmp_path / "tls")
    account = ServiceAccountMount(TOKEN, tls.ca_cert, "labs")
    script = f"""
        ls {SA_DIR} || true
        echo "token=$(cat {SA_DIR}/token) namespace=$(cat {SA_DIR}/namespace)"
        touch {SA_DIR}/token 2>/dev/null || echo "token: read-only"
    """
    pod = pod_spec(automountServiceAccountToken=automount)
    code, out, _ = await run(tmp_path, agent(script), pod, volumes, service_account=account)
    assert code == 0
    if automount:
        assert "ca.crt\nnamespace\ntoken\n" in out
        assert f"token={TOKEN} namespace=labs" in out
        assert "token: read-only" in out
    else:
        assert "ca.crt" not in out and "token= namespace=" in out


async def test_sees_only_its_own_files_and_processes(tmp_path: Path, volumes: dict[str, Path]) -> None:
    (tmp_path / "host-secret").write_text("not for the container")
    # on the host, not in the container: the test's files, a volume's host path, what else / and /root hold
    host_only = [tmp_path, tmp_path / "host-secret", volumes["runs"], Path(sys.base_prefix).parent.parent / "shims"]
    host_only += [p for p in Path("/").iterdir() if p.name in ("opt", "srv", "boot", "mnt", "media")]
    host_only += [p for p in Path.home().iterdir() if not _is_under(Path(sys.base_prefix), p)]
    host_only = [p for p in host_only if p.exists()]
    assert len(host_only) >= 3
    top = Path("/", REPO.parts[1])  # the checkout's top directory (/work here, /tmp in a clone under /tmp)
    script = f"""
        for path in {" ".join(map(str, host_only))} {top}; do
            [ -e "$path" ] && echo "visible: $path" || echo "hidden: $path"
        done
        echo "repo: $(ls {REPO / "pyproject.toml"})"
        echo "pid=$$$$"  # `$$` is `$` after Kubernetes' expansion of the command
        [ -e /proc/{os.getpid()} ] && echo "visible: the test's process" || echo "hidden: the test's process"
        echo "hostname=$(hostname)"
    """
    code, out, err = await run(tmp_path, agent(script), pod_spec(), volumes, pod_meta={"name": "run-a-pod"})
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("visible: /")] == [f"visible: {top}"]
    for path in host_only:
        assert f"hidden: {path}\n" in out  # a volume is at its mountPath only
    assert f"repo: {REPO / 'pyproject.toml'}" in out
    assert "pid=1\n" in out  # PID 1 of its own PID namespace
    assert "hidden: the test's process" in out
    assert "hostname=run-a-pod" in out


async def test_environment_is_exactly_the_specs(tmp_path: Path, volumes: dict[str, Path]) -> None:
    assert "PYTEST_CURRENT_TEST" in os.environ
    container = {
        **agent(""),
        "command": ["env"],
        "env": [
            {"name": "HOME", "value": "/tmp/home"},
            {"name": "LABKUBE_CACHE", "value": "$(HOME)/.cache"},  # Kubernetes' dependent variables
            {"name": "ESCAPED", "value": "$$(HOME)"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
    }
    kube_env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    meta = {"name": "run-a-pod", "namespace": "labs"}
    code, out, err = await run(tmp_path, container, pod_spec(), volumes, kube_env=kube_env, pod_meta=meta)
    assert code == 0, err
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env == {
        "HOSTNAME": "run-a-pod",  # the runtime's
        "PATH": ":".join(DEFAULT_IMAGE_PATH),  # the image's: the venv's bin first
        **kube_env,
        "HOME": "/tmp/home",
        "LABKUBE_CACHE": "/tmp/home/.cache",
        "ESCAPED": "$(HOME)",
        "POD_NAME": "run-a-pod",
        "POD_NAMESPACE": "labs",
    }


async def test_venv_and_editable_install_work_inside(tmp_path: Path, volumes: dict[str, Path]) -> None:
    script = "cd /tmp && python -c 'import labkube, sys; print(labkube.__file__, sys.prefix)'"
    code, out, err = await run(tmp_path, agent(script), pod_spec(), volumes)
    assert code == 0, err
    assert out.split() == [str(REPO / "labkube" / "__init__.py"), sys.prefix]


@pytest.mark.parametrize(
    ("script", "exit_code"),
    [
        ("sleep 1000 & echo started; wait", 137),  # PID 1 has no SIGTERM handler: it ignores it, SIGKILL
        ("trap 'exit 0' TERM; sleep 1000 & echo started; wait", 0),  # PID 1 exits; the kernel kills the rest
    ],
)
async def test_terminate_leaves_no_process_and_no_mount(
    tmp_path: Path, volumes: dict[str, Path], script: str, exit_code: int
) -> None:
    before = mountinfo()
    async with start_container(agent(script), pod_spec(), volumes, log_dir=tmp_path / "logs") as proc:
        for _ in range(200):
            if "started" in proc.log():
                break
            await asyncio.sleep(0.05)
        pids = proc.processes()
        sleeps = [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001000\x00"]
        assert proc.pid in pids and len(sleeps) == 1
        assert await proc.terminate(grace_s=1) in (0, -9)
    assert proc.exit_code == exit_code
    assert proc.processes() == []
    assert not Path(f"/proc/{sleeps[0]}").exists() and not Path(f"/proc/{proc.pid}").exists()
    assert not any(
        p.name.isdigit() and _cmdline(p) == b"sleep\x001000\x00" and _ns(p) == proc._pidns
        for p in Path("/proc").iterdir()
    )
    assert mountinfo() == before


async def test_exit_codes_and_stopping_on_an_error(tmp_path: Path, volumes: dict[str, Path]) -> None:
    code, _, err = await run(tmp_path, agent("echo failing >&2; exit 3"), pod_spec(), volumes)
    assert (code, err) == (3, "failing\n")
    with pytest.raises(RuntimeError, match="the test failed"):
        async with start_container(
            agent("sleep 1000 & wait"), pod_spec(), volumes, log_dir=tmp_path / "logs", grace_s=0.2
        ) as proc:
            assert len(proc.processes()) >= 1
            raise RuntimeError("the test failed")
    assert proc.exit_code == 137 and proc.processes() == []


NETWORK_PROBE = """
import socket
own = socket.create_server(("127.0.0.1", 0))
for host, port in [("127.0.0.1", HOST_PORT), ("169.254.169.254", 80), ("127.0.0.1", own.getsockname()[1])]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(host, port, "connected")
    except OSError as exc:
        print(host, port, exc.strerror)
"""


@pytest.mark.parametrize("iproute2", [True, False], ids=["ip", "ioctl"])
async def test_image_dirs_termination_file_and_own_network(
    tmp_path: Path, volumes: dict[str, Path], monkeypatch: pytest.MonkeyPatch, iproute2: bool
) -> None:
    if not iproute2:  # lo brought up by Python's ioctl, as on a host without iproute2
        which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda cmd, *a, **kw: None if cmd == "ip" else which(cmd, *a, **kw))
    image = tmp_path / "image" / "task"  # under /tmp, where the pod has an emptyDir: it shows through
    image.mkdir(parents=True)
    (image / "grade.sh").write_text("echo graded\n")
    termination = tmp_path / "termination" / "agent"
    with socket.create_server(("127.0.0.1", 0)) as host_service:
        port = host_service.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # the host reaches it
        script = f"""
            sh {image}/grade.sh
            touch {image}/new 2>&1
            echo '{{"score": 6}}' >/dev/termination-log && echo "termination: written"
            echo "interfaces: $$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')"
            python -c '{NETWORK_PROBE.replace("HOST_PORT", str(port))}'
        """
        code, out, err = await run(
            tmp_path,
            agent(script),
            pod_spec(),
            volumes,
            image_dirs=[image],
            termination_file=termination,
            own_network=True,
        )
    assert code == 0, err
    assert "graded\n" in out
    assert f"touch: cannot touch '{image}/new': Read-only file system" in out
    assert "termination: written" in out
    assert termination.read_text() == '{"score": 6}\n'  # the host file, written by uid 1000 through the bind
    assert termination.stat().st_uid == UID and termination.stat().st_mode & 0o777 == 0o666
    assert "interfaces: lo \n" in out  # a network namespace of its own: loopback only
    setup = (tmp_path / "logs" / "agent.setup.sh").read_text()
    assert ("link set lo up" in setup, "0x8914" in setup) == (iproute2, not iproute2)
    assert f"127.0.0.1 {port} Connection refused" in out  # the host's loopback service: not this loopback
    assert "169.254.169.254 80 Network is unreachable" in out  # no route anywhere
    assert out.rstrip().endswith("connected")  # its own loopback is up
    assert not (image / "new").exists()


# -- the fake kubelet's isolated mode ------------------------------------------------------------

PODS = ("", "v1", "pods")


def kube_pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod as the operator shapes a run's: `prepare` writes into the run's folder of the claim, `agent` runs
    `script` there."""
    runs = {"name": "runs", "mountPath": f"/runs/{name}", "subPath": f"default/{name}"}
    secure = {**SECURE, "readOnlyRootFilesystem": True}
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"run": name}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": GID, "fsGroup": FS_GROUP},
            "initContainers": [
                {
                    "name": "prepare",
                    "image": "labkube:test",
                    "command": ["sh", "-c", f"echo prepared > /runs/{name}/prepared"],
                    "securityContext": secure,
                    "volumeMounts": [runs],
                }
            ],
            "containers": [
                {
                    "name": "agent",
                    "image": "labkube:test",
                    "command": ["sh", "-c", script],
                    "workingDir": f"/runs/{name}",
                    "env": [
                        {"name": "HOME", "value": "/tmp"},
                        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "k"}}},
                    ],
                    "securityContext": secure,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [
                        runs,
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {"name": "runs", "persistentVolumeClaim": {"claimName": "labkube-runs"}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            ],
            **spec,
        },
    }


async def test_isolated_kubelet_runs_pods_in_containers_and_stops_them(tmp_path: Path) -> None:
    """`FakeKubelet(isolate=True)`: a pod's containers run through `start_container` (volumes at their real paths,
    secrets as values, termination messages through the bound file), and eviction, the deadline, deletion and the
    kubelet's exit each stop a container's whole PID namespace."""
    claim = tmp_path / "claim"
    claim.mkdir()
    started = "sleep 1000 & echo started; wait"  # PID 1 ignores SIGTERM (no handler): SIGKILL after the grace period
    pods = {
        "done": 'echo "$KEY" >/dev/termination-log',
        "failing": "echo 'it went wrong'; exit 3",
        "evicted": started,
        "deadline": started,
        "deleted": started,
        "left": started,
    }
    async with FakeKube() as api:
        api.create_object(
            ("", "v1", "secrets"), "default", {"metadata": {"name": "keys"}, "stringData": {"k": "a$(HOME)b"}}
        )
        kubelet = FakeKubelet(api, claims={"labkube-runs": claim}, grace_s=1.0, isolate=True, work=tmp_path / "kubelet")
        async with kubelet:
            for name, script in pods.items():
                extra = {"activeDeadlineSeconds": 4} if name == "deadline" else {}
                api.create_object(PODS, "default", kube_pod(name, script, **extra))
            sidecar = kube_pod("sidecar", "true")
            sidecar["spec"]["initContainers"].append(
                {**sidecar["spec"]["initContainers"][0], "name": "world", "restartPolicy": "Always"}
            )
            api.create_object(PODS, "default", sidecar)

            def status(name: str) -> dict[str, Any]:
                return (api.read_object(PODS, "default", name) or {}).get("status") or {}

            async def until(check: Any, what: str) -> None:
                for _ in range(300):
                    if check():
                        return
                    await asyncio.sleep(0.1)
                raise AssertionError(f"timed out waiting for {what}")

            running = ("evicted", "deadline", "deleted", "left")
            await until(lambda: all("started" in kubelet.log(n, "agent") for n in running), "the agents to start")
            procs = {name: kubelet.pods[("default", name)].proc for name in running}
            assert all(isinstance(proc, ContainerProcess) for proc in procs.values())
            # the shell and its sleep, in the container's PID namespace (under load, a moment after "started")
            await until(lambda: all(len(p.processes()) == 2 for p in procs.values()), "two processes per container")
            kubelet.evict("evicted")
            api.delete_object(PODS, "default", "deleted")
            for name in ("done", "failing", "sidecar", "evicted", "deadline"):
                await until(lambda n=name: status(n).get("phase") in ("Succeeded", "Failed"), f"pod {name} to end")
            await until(lambda: procs["deleted"].returncode is not None, "the deleted pod's agent to end")
            assert procs["left"].returncode is None
        # the kubelet has gone: nothing of any container is left
        assert {name: (proc.processes(), proc.exit_code) for name, proc in procs.items()} == {
            name: ([], 137) for name in running
        }
        api.close_watches()

    def agent_state(name: str) -> dict[str, Any]:
        return status(name)["containerStatuses"][0]["state"]

    assert status("done")["phase"] == "Succeeded"
    assert agent_state("done")["terminated"]["message"] == "a$(HOME)b\n"  # the secret, verbatim, as the message
    for name in ("done", "failing"):
        prepared = claim / "default" / name / "prepared"
        assert prepared.read_text() == "prepared\n" and prepared.stat().st_uid == UID
    assert status("failing")["phase"] == "Failed"
    assert agent_state("failing")["terminated"] | {"finishedAt": ""} == {
        "exitCode": 3,
        "reason": "Error",
        "finishedAt": "",
        "message": "it went wrong",  # FallbackToLogsOnError: the log's tail
    }
    assert (status("evicted")["phase"], status("evicted")["reason"]) == ("Failed", "Evicted")
    assert agent_state("evicted")["terminated"]["exitCode"] == 137
    assert (status("deadline")["phase"], status("deadline")["reason"]) == ("Failed", "DeadlineExceeded")
    assert status("sidecar")["phase"] == "Failed"
    assert "does not run native sidecars (world)" in status("sidecar")["message"]


def _is_under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _ns(proc: Path) -> str:
    try:
        return os.readlink(proc / "ns" / "pid")
    except OSError:
        return ""


async def test_refuses_what_it_cannot_run(tmp_path: Path, volumes: dict[str, Path]) -> None:
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({**agent(""), "command": [], "args": ["--help"]}, pod_spec(), "has no command"),
        (
            {**agent("true"), "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            pod_spec(),
            "cannot resolve",
        ),
        (agent("true"), {**pod_spec(), "securityContext": {"runAsNonRoot": True}}, "runAsNonRoot"),
        ({**agent("true"), "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, pod_spec(), "names no volume"),
        (
            {**agent("true"), "volumeMounts": [{"name": "tmp", "mountPath": "/usr/no-such-dir"}]},
            pod_spec(),
            "read-only image directory",
        ),
    ]
    for container, pod, message in cases:
        with pytest.raises(ContainerError, match=message):
            await run(tmp_path, container, pod, volumes)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(ContainerError, match="needs root"):
        patch.setattr(os, "geteuid", lambda: 1000)
        await run(tmp_path, agent("true"), pod_spec(), volumes)


# -- the API over TLS ----------------------------------------------------------------------------

LIST_SCRIPT = """
import json
from kubernetes import client, config
config.load_incluster_config()
api = client.CoreV1Api()
print(json.dumps({
    "version": client.VersionApi().get_code().git_version,
    "pods": sorted(p.metadata.name for p in api.list_namespaced_pod("labs").items),
}))
"""


async def test_incluster_config_over_tls(tmp_path: Path) -> None:
    """In-process: the client, configured as in a pod from a token and the CA, trusts the fake API."""
    tls = make_tls(tmp_path / "tls")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    async with FakeKube() as api, https_server(api, tls) as server:
        api.create_object(("", "v1", "pods"), "labs", {"metadata": {"name": "p1"}, "spec": {"containers": []}})
        environ = {"KUBERNETES_SERVICE_HOST": server.host, "KUBERNETES_SERVICE_PORT": str(server.port)}

        def list_pods() -> list[str]:
            config = client.Configuration()
            InClusterConfigLoader(str(token), str(tls.ca_cert), environ=environ).load_and_set(config)
            with client.ApiClient(config) as api_client:
                return [p.metadata.name for p in client.CoreV1Api(api_client).list_namespaced_pod("labs").items]

        assert str(server.url).startswith("https://")
        assert await asyncio.to_thread(list_pods) == ["p1"]
        assert [r.headers.get("Authorization") for r in api][-1] == f"bearer {TOKEN}"
        api.close_watches()


async def test_kubernetes_client_in_a_container_over_tls(tmp_path: Path, volumes: dict[str, Path]) -> None:
    """In a container: the service account mount and the kubelet's variables are all it takes."""
    tls = make_tls(tmp_path / "tls")
    async with FakeKube() as api, https_server(api, tls) as server:
        for name in ("run-a", "run-b"):
            api.create_object(("", "v1", "pods"), "labs", {"metadata": {"name": name}, "spec": {"containers": []}})
        container = {**agent(""), "command": ["python", "-c", LIST_SCRIPT]}
        code, out, err = await run(
            tmp_path,
            container,
            pod_spec(automountServiceAccountToken=True, serviceAccountName="labkube-agent"),
            volumes,
            service_account=ServiceAccountMount(TOKEN, tls.ca_cert, "labs"),
            kube_env=kubernetes_service_env(server.host, server.port),
        )
        assert code == 0, err
        result = json.loads(out)
        assert result["pods"] == ["run-a", "run-b"] and result["version"]
        assert {r.headers.get("Authorization") for r in api} == {f"bearer {TOKEN}"}
        api.close_watches()
