"""Run a process the way a Kubernetes container runs it, from its rendered container spec, without a
container runtime: a test can then catch what only shows in a cluster (a write to a read-only root
filesystem, a path that is not mounted, a file that uid 1000 cannot open, a variable the chart does not
set, a process that ignores SIGTERM as PID 1). `FakeKubelet` runs pods as plain local processes and
cannot catch those; this is for the tests that mean to.

`start_container(container, pod_spec, volumes, ...)` gives a `ContainerProcess`; entered (`async with`)
it runs `unshare` (util-linux) into new mount, PID, UTS and IPC namespaces (and a network one, on
request), where a generated shell script (`<log_dir>/<container>.setup.sh`) builds the container's
root and `exec`s the command, which becomes PID 1 of the PID namespace. What the kubelet and the
runtime do, and what this does instead:

- Root filesystem: the image is the host's. A fresh tmpfs gets read-only binds of `/usr` and the
  `/bin`, `/lib`, ... next to it (symlinks are recreated, as on merged-/usr systems), of the test's
  Python (`sys.base_prefix`, the interpreter's directory), the venv (`sys.prefix`) and the checkout
  (the venv's editable install points into it), all at their host paths, and a copy of `/etc` (so
  mount points such as `/etc/labkube` can be created in it, as in an image); `/tmp`, `/var/tmp` (1777),
  `/root`, `/home`, `/run` (and `/var/run` -> `../run`) are empty directories. Then, as runc does,
  the script `pivot_root`s into it and detaches the host's tree: nothing else of the host is reachable.
  `image_dirs` adds host directories, read-only at their own paths, standing in for what the image
  holds besides the code (a test's task in a pytest directory, which a run's `run.json` names by its
  path); they are bound after the volumes, so one under a volume's mountPath (a pytest directory under
  an emptyDir at /tmp) shows through it, its mount point created in that volume.
- Kernel filesystems: a new `/proc` (of the new PID namespace; `/proc/sys`, `/proc/sysrq-trigger`,
  `/proc/irq`, `/proc/bus` read-only), `/sys` and its submounts (cgroups) read-only, and a `/dev` tmpfs
  with the device nodes runc gives (`null`, `zero`, `full`, `random`, `urandom`, `tty`), a new `devpts`
  instance, the usual symlinks, `/dev/termination-log`, and a private 64 MiB `/dev/shm` (the runtime's
  default; a pod that wants more mounts a memory emptyDir there, as it must in a cluster).
- Termination message: with `termination_file`, that host file is bound at the container's
  `terminationMessagePath` (default `/dev/termination-log`), mode 0666 as the kubelet makes it (and
  owned by the container's user); the caller reads it once the container has ended (the kubelet's 4096
  bytes, its FallbackToLogsOnError, are the caller's). Without it, an empty file of the root's `/dev`.
- Network: with `own_network`, a new network namespace too, with only its loopback up (`ip link set lo
  up`, or, without iproute2, the same ioctl from Python): 127.0.0.1 is the container's own, and every
  other address, the host's services on its loopback included, is unreachable ("Network is
  unreachable"; "Connection refused" on 127.0.0.1), as under a NetworkPolicy that denies all egress
  (no DNS either). Without it, the container shares the host's network: ports are shared and
  127.0.0.1 is the host.
- Volumes: `volumes` maps a pod volume's name to the host directory standing in for it (a claim, a
  configMap's files already written, an emptyDir the caller wants to look at). Each `volumeMounts`
  entry binds it (or its `subPath`, created if missing; `subPathExpr` expanded) at `mountPath`;
  `readOnly: true` mounts read-only, and configMap, secret, downwardAPI and projected volumes are
  read-only whatever the mount says, as in Kubernetes. A pod emptyDir missing from `volumes` is a fresh
  directory (mode 0777, removed on exit), or, with `medium: Memory`, a tmpfs of its `sizeLimit` made in
  the container's namespace (so no other container sees it: share one by passing a directory).
  Mount points are created inside the root with its symlinks resolved there; like runc, one cannot be
  created in a read-only directory (an image directory, or a read-only volume) and the start fails.
  A memory emptyDir the caller passes a directory for is that (disk) directory, not a tmpfs.
- Ownership: with `runAsUser` or `fsGroup` set, the volume directories this container mounts are
  chowned, recursively, to runAsUser:fsGroup (runAsGroup without an fsGroup) before the start, so the
  user can write them; with an fsGroup they also get the kubelet's modes (group rw, setgid
  directories: new files get the fsGroup). The kubelet only changes the group, and emptyDirs are mode
  0777, so a claim owned by root and a pod with runAsUser but no fsGroup fails there and not here.
- Service account: with `service_account` given and the pod's `automountServiceAccountToken` not
  false, a directory with `token`, `ca.crt` and `namespace` is mounted read-only at
  /var/run/secrets/kubernetes.io/serviceaccount (plain files, not the kubelet's `..data` symlinks).
- Read-only root: with `readOnlyRootFilesystem: true`, the root tmpfs is remounted read-only once
  everything is mounted: a write outside a volume (or `/dev`, `/dev/shm`) fails with EROFS.
- User: `runAsUser`/`runAsGroup` of the container, else of the pod; without a user, root (as the
  image would); without a group, the user's group in the image's /etc/passwd, else 0 (the runtimes'
  rule). Supplementary groups: the pod's `supplementalGroups` and `fsGroup`. `runAsNonRoot` with
  uid 0 refuses to start, as the kubelet does. Capabilities: containerd's default set, minus
  `capabilities.drop` (`ALL`), plus `add`, as the bounding set (a non-root user has none effective,
  as in a cluster); `allowPrivilegeEscalation: false` sets no_new_privs. `privileged` is refused.
- Environment: exactly the image's `PATH` (`image_path`), the `kube_env` the kubelet injects (e.g.
  `tls.kubernetes_service_env`), the container's `env` (`value`s, with `$(VAR)` references expanded
  as Kubernetes does; `valueFrom.fieldRef` of `metadata.name`, `metadata.namespace`, `metadata.uid`,
  `metadata.labels['k']`, `metadata.annotations['k']` from `pod_meta`, and `spec.serviceAccountName`),
  plus what the runtime adds: `HOSTNAME` (the pod's name, also the UTS hostname and in /etc/hosts),
  and `HOME` when the spec has none (the user's home in /etc/passwd, else `/`). Nothing comes from the
  test process. Secrets, configMap keys, `resourceFieldRef` and `envFrom` are refused: give values.
- Command: `command` (there is no image entrypoint, so it is required) plus `args`, `$(VAR)`
  expanded (so `$$` is `$`: a shell's `$$` is `$$$$` in a spec), looked up in the container's PATH;
  `workingDir` (default `/`) is created if missing. The script says "ready" and its host pid on a
  pipe just before the `exec`: `start()` returns then, and `pid` is PID 1 as the host sees it.
- Output: stdout and stderr are appended to `<log_dir>/<container>.out` / `.err`
  (`ContainerProcess.log`); the setup's own output goes to `<container>.setup.log`.
- Stopping: `terminate(grace_s)` sends SIGTERM to PID 1 and SIGKILL after `grace_s`. As in a
  container, PID 1 ignores signals it has no handler for (a shell or a Python process without a SIGTERM
  handler waits out the grace period), and when it ends the kernel kills every other process of the
  namespace. `__aexit__` always does this (grace: the pod's `terminationGracePeriodSeconds`, else 30 s,
  unless `grace_s` is given), and the namespace's mounts vanish with its last process. A caller that
  does not use `async with` waits (`wait`), stops (`terminate`) and then `close()`s it itself. Should the
  test process die, PID 1 and `unshare` are killed too (parent-death signals).
- Not modelled: a pod's network shared by its containers (each `own_network` container has its own),
  Services and DNS, resource limits, seccomp/AppArmor, image users and groups beyond /etc/passwd,
  probes, restarts. `returncode` is asyncio's (-N: killed by signal N); `exit_code` is the
  containerStatus's (128 + N).

Needs root and util-linux (`unshare`, `setpriv`, `pivot_root`, `mount`); otherwise `ContainerError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import pwd
import re
import shlex
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[2]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IMAGE_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEFAULT_IMAGE_PATH = (
    str(Path(sys.prefix) / "bin"),
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
)
# containerd's default capabilities for a container (runc's spec template)
DEFAULT_CAPS = frozenset(
    {
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    }
)
READ_ONLY_KINDS = ("configMap", "secret", "downwardAPI", "projected")  # always mounted read-only
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
SETUP_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # the setup script's, on the host and then in the root
START_TIMEOUT_S = 30.0
UNSHARE_SIGKILL_BUG = "sigprocmask unblock failed"  # util-linux 2.38 `unshare --fork`, child SIGKILLed


class ContainerError(Exception):
    """A container this runner cannot run (a spec it does not support, no root), or a failed setup."""


@dataclass(frozen=True)
class ServiceAccountMount:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""

    token: str
    ca_cert: Path  # PEM on the host, e.g. `tls.make_tls(...).ca_cert`
    namespace: str = "default"


@dataclass(frozen=True)
class _Mount:
    path: str  # in the container
    source: str  # on the host, or in the namespace (a memory emptyDir's tmpfs)
    read_only: bool
    file: bool = False  # a single file (a subPath that is one)
    memory: str = ""  # the memory emptyDir whose tmpfs `source` is in (mounted by the script first)


class ContainerProcess:
    """One container's process tree, in namespaces of its own (see the module docstring); not started yet:
    `async with start_container(...) as proc:` runs it. `pod_meta` is the pod's metadata (`name`, `namespace`,
    `uid`, `labels`, `annotations`); by default the pod is named after the container, in the service account's
    namespace. `image_dirs` are host directories bound read-only at their own paths (what an image would hold,
    e.g. a task); `termination_file` a host file bound at the container's `terminationMessagePath`;
    `own_network` gives the container a network namespace of its own with only loopback up."""

    def __init__(
        self,
        container: Mapping[str, Any],
        pod_spec: Mapping[str, Any],
        volumes: Mapping[str, Path],
        image_path: Sequence[str] = DEFAULT_IMAGE_PATH,
        *,
        log_dir: Path,
        service_account: ServiceAccountMount | None = None,
        kube_env: Mapping[str, str] | None = None,
        pod_meta: Mapping[str, Any] | None = None,
        grace_s: float | None = None,
        image_dirs: Sequence[Path | str] = (),
        termination_file: Path | None = None,
        own_network: bool = False,
    ) -> None:
        self.container = dict(container)
        self.pod_spec = dict(pod_spec)
        self.volumes = {name: Path(path) for name, path in volumes.items()}
        self.image_path = list(image_path)
        self.log_dir = Path(log_dir)
        self.service_account = service_account
        self.kube_env = dict(kube_env or {})
        namespace = service_account.namespace if service_account else "default"
        self.pod_meta = {"name": self.container["name"], "namespace": namespace, **(pod_meta or {})}
        self.grace_s = float(pod_spec.get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s)
        self.name: str = self.container["name"]
        self.image_dirs = [os.path.normpath(os.path.abspath(d)) for d in image_dirs]
        self.termination_file = None if termination_file is None else Path(termination_file)
        self.own_network = own_network
        self.pid: int | None = None  # the container's PID 1, as the host sees it
        self.script = ""  # the generated setup script
        self._work: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._pidfd: int | None = None
        self._pidns = ""
        self._killed = False
        self._returncode: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> ContainerProcess:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.terminate()
        except BaseException:  # cancelled while stopping: no grace, but nothing left running
            self._kill_now()
            raise
        finally:
            self._cleanup()

    async def start(self) -> ContainerProcess:
        """Set up the namespaces and start the command; return once it is being `exec`ed."""
        if self._proc is not None:
            raise ContainerError(f"container {self.name} was already started")
        _require_tools()
        uid, gid, groups = self._identity()
        declared = self._declared()
        env = self._env(uid, declared)
        argv = self._argv(declared)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._work = Path(tempfile.mkdtemp(prefix=f"container-{self.name}-"))
        try:
            mounts = self._mounts(declared, uid, gid)
            self.script = self._render(mounts, uid, gid, groups, env, argv)
            script = self.log_dir / f"{self.name}.setup.sh"
            script.write_text(self.script)
            for stream in ("out", "err"):
                (self.log_dir / f"{self.name}.{stream}").touch()
            await self._spawn(script)
        except BaseException:
            self._kill_now()
            if self._proc is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(self._proc.wait(), 5)
            self._cleanup()
            raise
        return self

    async def _spawn(self, script: Path) -> None:
        ready_r, ready_w = os.pipe()
        try:
            with (self.log_dir / f"{self.name}.setup.log").open("ab") as setup_log:
                # setpriv: unshare dies with this process (its child, and so the namespace, with it)
                self._proc = await asyncio.create_subprocess_exec(
                    "setpriv",
                    "--pdeathsig=SIGKILL",
                    "--",
                    "unshare",
                    "--mount",
                    "--pid",
                    "--uts",
                    "--ipc",
                    *(["--net"] if self.own_network else []),
                    "--fork",
                    "--propagation=private",
                    "--kill-child=SIGKILL",
                    "--",
                    "sh",
                    str(script),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=ready_w,  # the script moves it to fd 3, says "ready" there when all is set
                    stderr=setup_log,
                    env={"PATH": SETUP_PATH, "LC_ALL": "C"},
                    cwd="/",
                )
        finally:
            os.close(ready_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(ready_r, "rb")
        )
        try:
            line = await asyncio.wait_for(reader.readline(), START_TIMEOUT_S)
        except TimeoutError:
            raise ContainerError(
                f"container {self.name}: no start after {START_TIMEOUT_S:g}s{self._setup_log()}"
            ) from None
        finally:
            transport.close()
        words = line.split()
        if len(words) != 2 or words[0] != b"ready":
            await self._proc.wait()
            raise ContainerError(f"container {self.name} could not be set up{self._setup_log()}")
        self.pid = int(words[1])
        # A pidfd, so that a signal never reaches another process that got the pid. The command may
        # have ended already (and unshare reaped it): then there is nothing to signal.
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(self.pid)
            self._pidns = os.readlink(f"/proc/{self.pid}/ns/pid")
            if _parent(self.pid) != self._proc.pid:  # ended, and its pid taken since: not ours
                os.close(self._pidfd)
                self._pidfd, self._pidns = None, ""

    def _setup_log(self) -> str:
        path = self.log_dir / f"{self.name}.setup.log"
        text = path.read_text(errors="replace").strip() if path.exists() else ""
        return f":\n{text}" if text else ""

    @property
    def returncode(self) -> int | None:
        """The main process's exit status, as asyncio gives it (-N: killed by signal N); None while it runs."""
        if self._returncode is not None or self._proc is None or self._proc.returncode is None:
            return self._returncode
        code = self._proc.returncode
        # unshare 2.38 re-raises the signal that killed its child, but fails to for SIGKILL and exits 1
        if code == 1 and self._killed and UNSHARE_SIGKILL_BUG in self._setup_log():
            code = -signal.SIGKILL
        self._returncode = code  # kept: the log that tells may be removed (a kubelet's pod directory)
        return code

    @property
    def exit_code(self) -> int | None:
        """The exit code Kubernetes reports in the container's status (128 + N when killed by signal N)."""
        code = self.returncode
        return None if code is None else (128 - code if code < 0 else code)

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the main process to end (TimeoutError after `timeout`): its `returncode`."""
        if self._proc is None:
            raise ContainerError(f"container {self.name} was not started")
        await asyncio.wait_for(self._proc.wait(), timeout)
        code = self.returncode
        assert code is not None
        return code

    async def terminate(self, grace_s: float | None = None) -> int:
        """SIGTERM to PID 1, SIGKILL after `grace_s` (the pod's grace period by default); its `returncode`."""
        if self._proc is None:
            raise ContainerError(f"container {self.name} was not started")
        if self._proc.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), self.grace_s if grace_s is None else grace_s)
            except TimeoutError:
                self._kill_now()
                await self._proc.wait()
        return await self.wait()

    def close(self) -> None:
        """SIGKILL what is left of the container, if anything, and release its pidfd and scratch directory: for a
        caller that waits for it and stops it itself (`terminate`) instead of `async with`. Idempotent."""
        if self._proc is not None and self._proc.returncode is None:
            self._kill_now()
        self._cleanup()

    def _signal(self, sig: signal.Signals) -> None:
        if self._pidfd is not None:  # a pidfd: never another process that got the same pid
            if sig == signal.SIGKILL:
                self._killed = True
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def _kill_now(self) -> None:
        """SIGKILL the container's PID 1 (the kernel then kills the rest), or unshare before there is one."""
        if self._pidfd is not None:
            self._signal(signal.SIGKILL)
        elif self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()  # --kill-child: its child, the would-be PID 1, dies with it

    def _cleanup(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    # -- what tests look at ----------------------------------------------------------------------

    def log(self, stream: Literal["out", "err", "setup.log"] = "out") -> str:
        """What the container wrote to stdout (`out`) or stderr (`err`) so far, or the setup's log."""
        path = self.log_dir / f"{self.name}.{stream}"
        return path.read_text(errors="replace") if path.exists() else ""

    def processes(self) -> list[int]:
        """Host pids of the processes in the container's PID namespace (none once it has ended)."""
        if not self._pidns:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns" / "pid") == self._pidns:
                        pids.append(int(entry.name))
        return sorted(pids)

    # -- the spec ----------------------------------------------------------------------------------

    def _security(self, key: str) -> Any:
        """A securityContext field of the container, else of the pod."""
        own = self.container.get("securityContext") or {}
        return own[key] if key in own else (self.pod_spec.get("securityContext") or {}).get(key)

    def _identity(self) -> tuple[int, int, list[int]]:
        """uid, gid and supplementary groups of the container's processes."""
        uid = self._security("runAsUser")
        uid = 0 if uid is None else int(uid)
        gid = self._security("runAsGroup")
        if gid is None:
            try:
                gid = pwd.getpwuid(uid).pw_gid  # the image's /etc/passwd is a copy of this host's
            except KeyError:
                gid = 0
        if self._security("runAsNonRoot") and uid == 0:
            raise ContainerError(f"container {self.name} has runAsNonRoot and image will run as root")
        if (self.container.get("securityContext") or {}).get("privileged"):
            raise ContainerError(f"container {self.name}: privileged containers are not supported here")
        pod_security = self.pod_spec.get("securityContext") or {}
        groups = [int(g) for g in pod_security.get("supplementalGroups") or []]
        if pod_security.get("fsGroup") is not None and int(pod_security["fsGroup"]) not in groups:
            groups.append(int(pod_security["fsGroup"]))
        return uid, int(gid), groups

    def _declared(self) -> dict[str, str]:
        """The kubelet's part of the environment: `kube_env`, then the container's `env`. `$(VAR)` in a
        value, a command or a subPathExpr refers to these (not to the image's or the runtime's)."""
        if self.container.get("envFrom"):
            raise ContainerError(f"container {self.name}: envFrom is not supported here; give the values in env")
        declared: dict[str, str] = dict(self.kube_env)
        for item in self.container.get("env") or []:
            name = item["name"]
            if "value" in item:
                declared[name] = expand(str(item["value"]), declared)
            elif "valueFrom" in item:
                declared[name] = self._value_from(name, item["valueFrom"])
            else:
                declared[name] = ""
        return declared

    def _env(self, uid: int, declared: Mapping[str, str]) -> dict[str, str]:
        """The process's whole environment: the runtime's HOSTNAME, the image's PATH, the kubelet's, HOME."""
        env = {"HOSTNAME": self._hostname(), "PATH": ":".join(self.image_path), **declared}
        if "HOME" not in env:
            try:
                env["HOME"] = pwd.getpwuid(uid).pw_dir
            except KeyError:
                env["HOME"] = "/"
        return env

    def _value_from(self, name: str, source: Mapping[str, Any]) -> str:
        field = (source.get("fieldRef") or {}).get("fieldPath")
        if field is None:
            raise ContainerError(
                f"container {self.name}: env {name} takes its value from {sorted(source)}, which this runner "
                "cannot resolve (only fieldRef); give a plain value"
            )
        meta = self.pod_meta
        if m := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field):
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        if field in ("metadata.name", "metadata.namespace", "metadata.uid") and field[9:] in meta:
            return str(meta[field[9:]])
        if field == "spec.serviceAccountName":
            return str(self.pod_spec.get("serviceAccountName") or "default")
        raise ContainerError(f"container {self.name}: env {name} needs fieldRef {field}, which pod_meta does not give")

    def _argv(self, env: Mapping[str, str]) -> list[str]:
        command = self.container.get("command") or []
        if not command:
            raise ContainerError(
                f"container {self.name} has no command: the image's entrypoint is unknown here (args alone need one)"
            )
        return [expand(str(word), env) for word in [*command, *(self.container.get("args") or [])]]

    def _hostname(self) -> str:
        return str(self.pod_meta["name"])[:63]

    def _mounts(self, env: Mapping[str, str], uid: int, gid: int) -> list[_Mount]:
        """The container's mounts, parents first (containerd's order); chowns the volumes (fsGroup)."""
        assert self._work is not None
        pod_volumes = {v["name"]: v for v in self.pod_spec.get("volumes") or []}
        pod_security = self.pod_spec.get("securityContext") or {}
        owner_uid = -1 if self._security("runAsUser") is None else uid
        fs_group = pod_security.get("fsGroup")
        owner_gid = int(fs_group) if fs_group is not None else (gid if owner_uid != -1 else -1)
        mounts: list[_Mount] = []
        chowned: set[Path] = set()
        for m in self.container.get("volumeMounts") or []:
            name, path = m["name"], m["mountPath"]
            volume = pod_volumes.get(name)
            if volume is None:
                raise ContainerError(f"container {self.name}: volumeMount {path} names no volume of the pod: {name}")
            if not path.startswith("/"):
                raise ContainerError(f"container {self.name}: mountPath {path} is not absolute")
            sub = m.get("subPath") or (expand(m["subPathExpr"], env) if m.get("subPathExpr") else "")
            if sub.startswith("/") or ".." in sub.split("/"):
                raise ContainerError(f"container {self.name}: bad subPath {sub!r}")
            read_only = bool(m.get("readOnly")) or any(kind in volume for kind in READ_ONLY_KINDS)
            if name not in self.volumes and (volume.get("emptyDir") or {}).get("medium") == "Memory":
                source = self._work / "memory" / name  # a tmpfs the script mounts in the namespace
                mounts.append(_Mount(posixpath.normpath(path), str(source / sub), read_only, memory=name))
                continue
            if name in self.volumes:
                host = self.volumes[name]
            elif "emptyDir" in volume:
                host = self._work / "emptydir" / name
                if not host.exists():
                    host.mkdir(parents=True)
                    host.chmod(0o777)
            else:
                kind = next(iter(k for k in volume if k != "name"), "?")
                raise ContainerError(f"container {self.name}: volume {name} ({kind}) has no host directory in volumes")
            source = host / sub if sub else host
            if not source.exists():
                source.mkdir(parents=True)  # the kubelet creates a missing subPath
            if (owner_uid != -1 or owner_gid != -1) and host not in chowned:
                _chown_tree(host, owner_uid, owner_gid, fs_group is not None, read_only)
                chowned.add(host)
            mounts.append(_Mount(posixpath.normpath(path), str(source), read_only, file=source.is_file()))
        automount = self.pod_spec.get("automountServiceAccountToken", True) is not False
        if self.service_account is not None and automount and all(m.path != SA_DIR for m in mounts):
            sa = self._work / "serviceaccount"
            sa.mkdir(mode=0o755)
            (sa / "token").write_text(self.service_account.token)
            (sa / "namespace").write_text(self.service_account.namespace)
            shutil.copyfile(self.service_account.ca_cert, sa / "ca.crt")
            for file in sa.iterdir():
                file.chmod(0o644)
            mounts.append(_Mount(SA_DIR, str(sa), True))
        mounts += self._image_dir_mounts()
        # The test's Python, venv and checkout are the image: a volume mounted over one of them (the pod's /tmp
        # emptyDir over a checkout under /tmp, as CI's may be) must not hide it, so it is bound again on top.
        volume_paths = [m.path for m in mounts]
        mounts += [_Mount(path, path, True) for path in _python_binds() if _covering(path, volume_paths) is not None]
        if self.termination_file is not None:
            mounts.append(self._termination_mount(uid, gid))
        for mount in mounts:
            under = _covering(mount.path, _image_binds())
            if under is not None and not Path(mount.path).exists():
                raise ContainerError(
                    f"container {self.name}: cannot create mount point {mount.path} in the read-only image directory "
                    f"{under}"
                )
        return sorted(mounts, key=lambda m: m.path.count("/") if m.path != "/" else 0)

    def _image_dir_mounts(self) -> list[_Mount]:
        """`image_dirs`, read-only at their own paths (after the volumes: one under a volume's mountPath,
        such as a pytest directory under an emptyDir at /tmp, shows through it)."""
        mounts = []
        for path in self.image_dirs:
            if not os.path.isdir(path):
                raise ContainerError(f"container {self.name}: image directory {path} is not a directory on the host")
            if _covering(path, _image_binds()) is None:  # already in the image otherwise
                mounts.append(_Mount(path, path, True))
        return mounts

    def _termination_mount(self, uid: int, gid: int) -> _Mount:
        """`termination_file` at `terminationMessagePath`, as the kubelet binds it: mode 0666 (and owned by
        the container's user), so that it can write it whatever its uid."""
        assert self.termination_file is not None
        path = self.container.get("terminationMessagePath") or "/dev/termination-log"
        if not path.startswith("/"):
            raise ContainerError(f"container {self.name}: terminationMessagePath {path} is not absolute")
        file = self.termination_file
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch()
        os.chown(file, uid, gid)
        file.chmod(0o666)
        return _Mount(posixpath.normpath(path), str(file), False, file=True)

    # -- the setup script --------------------------------------------------------------------------

    def _render(
        self, mounts: list[_Mount], uid: int, gid: int, groups: list[int], env: Mapping[str, str], argv: list[str]
    ) -> str:
        assert self._work is not None
        q = shlex.quote
        root = self._work / "root"
        root.mkdir()
        security = self.container.get("securityContext") or {}
        lines = [
            f"# Generated by tests/k8s/container.py for container {self.name}: PID 1 of new mount, PID, UTS and",
            "# IPC namespaces builds the container's root, pivots into it and execs the command.",
            "set -eu",
            "umask 022",
            "exec 3>&1 1>&2  # fd 3: where to say ready; the setup's output: its log",
            "read -r stat </proc/self/stat  # the host's /proc, until the pivot: our pid on the host",
            f"ROOT={q(str(root))}",
            "",
            "# PATH in the container, created (dir|file) with its symlinks resolved there: its host path",
            "mountpoint() {",
            '  if [ "$1" = file ]; then',
            '    chroot "$ROOT" sh -c \'[ -e "$1" ] || { mkdir -p -- "$(dirname -- "$1")" && : >"$1"; }\' sh "$2"',
            "  else",
            '    chroot "$ROOT" mkdir -p -- "$2"',
            "  fi",
            '  printf %s "$ROOT$(chroot "$ROOT" realpath -e -- "$2")"',
            "}",
            "# robind PATH [SOURCE]: SOURCE (default: the host's PATH) at PATH in the root, read-only",
            "robind() {",
            '  [ -e "$ROOT$1" ] || mkdir -p "$ROOT$1"',
            '  mount --bind -- "${2:-$1}" "$ROOT$1"',
            '  mount --options-source=disable -o remount,bind,ro -- "$ROOT$1"',
            "}",
            "# bind SOURCE PATH dir|file ro|rw: a volume at PATH",
            "bind() {",
            '  target=$(mountpoint "$3" "$2")',
            '  mount --bind -- "$1" "$target"',
            '  if [ "$4" = ro ]; then mount --options-source=disable -o remount,bind,ro -- "$target"; fi',
            "}",
            "",
            f"printf %s {q(self._hostname())} >/proc/sys/kernel/hostname",
            *([_loopback_up(), ""] if self.own_network else []),
            'mount -t tmpfs -o mode=755 rootfs "$ROOT"',
            'mkdir -p "$ROOT/tmp" "$ROOT/var/tmp" "$ROOT/root" "$ROOT/home" "$ROOT/run" "$ROOT/proc" "$ROOT/sys" '
            '"$ROOT/dev"',
            'chmod 1777 "$ROOT/tmp" "$ROOT/var/tmp"',
            'ln -s ../run "$ROOT/var/run"',
            "",
            "# the image: the host's system, read-only",
        ]
        links = [path for path in IMAGE_DIRS if os.path.islink(path)]
        lines += [f"robind {q(path)}" for path in _image_binds()]
        lines += [f'ln -s {q(os.readlink(path))} "$ROOT"{q(path)}' for path in links]
        lines += [
            'cp -a /etc "$ROOT/etc"',
            f'printf "127.0.0.1\\t%s\\n" {q(self._hostname())} >>"$ROOT/etc/hosts"',
            f'printf "%s\\n" {q(self._hostname())} >"$ROOT/etc/hostname"',
            "",
            "# kernel filesystems",
            'mount -t proc proc "$ROOT/proc"',
            "for p in sys sysrq-trigger irq bus; do",
            '  if [ -e "$ROOT/proc/$p" ]; then robind "/proc/$p" "$ROOT/proc/$p"; fi',
            "done",
        ]
        lines += [f"robind {q(path)}" for path in _sys_mounts()]
        lines += [
            'mount -t tmpfs -o mode=755,size=65536k,nosuid dev "$ROOT/dev"',
            f"for d in {' '.join(DEV_NODES)}; do",
            '  if [ -e "/dev/$d" ]; then : >"$ROOT/dev/$d" && mount --bind "/dev/$d" "$ROOT/dev/$d"; fi',
            "done",
            'ln -s /proc/self/fd "$ROOT/dev/fd"',
            'ln -s /proc/self/fd/0 "$ROOT/dev/stdin"',
            'ln -s /proc/self/fd/1 "$ROOT/dev/stdout"',
            'ln -s /proc/self/fd/2 "$ROOT/dev/stderr"',
            'ln -s pts/ptmx "$ROOT/dev/ptmx"',
            'mkdir "$ROOT/dev/pts" "$ROOT/dev/shm"',
            'mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$ROOT/dev/pts"',
            'mount -t tmpfs -o mode=1777,size=65536k,nosuid,nodev shm "$ROOT/dev/shm"',
            'install -m 666 /dev/null "$ROOT/dev/termination-log"',
            "",
            "# volumes (and the service account)",
        ]
        for name in sorted({m.memory for m in mounts if m.memory}):
            volume = next(v for v in self.pod_spec.get("volumes") or [] if v["name"] == name)
            size = (volume.get("emptyDir") or {}).get("sizeLimit")
            options = f"mode=1777,size={_bytes(size)}" if size is not None else "mode=1777"
            staging = q(str(self._work / "memory" / name))
            lines.append(f"mkdir -p {staging} && mount -t tmpfs -o {options} {q('memory-' + name)} {staging}")
        for m in mounts:
            if m.memory and m.source != str(self._work / "memory" / m.memory):
                lines.append(f"mkdir -p {q(m.source)}")  # its subPath
            kind = "file" if m.file else "dir"
            lines.append(f"bind {q(m.source)} {q(m.path)} {kind} {'ro' if m.read_only else 'rw'}")
        workdir = self.container.get("workingDir") or "/"
        if not workdir.startswith("/"):
            raise ContainerError(f"container {self.name}: workingDir {workdir} is not absolute")
        lines += [
            f"mountpoint dir {q(workdir)} >/dev/null  # the working directory, created if missing (as runc does)",
            "",
            "# into the root; the host's tree goes",
            f"exec 4>>{q(str(self.log_dir / (self.name + '.out')))} 5>>{q(str(self.log_dir / (self.name + '.err')))}",
            'cd "$ROOT"',
            "mkdir .host",
            "pivot_root . .host",
            "cd /",
            "umount -l /.host",
            "rmdir /.host",
        ]
        if security.get("readOnlyRootFilesystem"):
            lines.append("mount --options-source=disable -o remount,ro /  # readOnlyRootFilesystem")
        setpriv = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
            "--inh-caps=-all",
            *_bounding_set(security.get("capabilities") or {}),
            *(["--no-new-privs"] if security.get("allowPrivilegeEscalation") is False else []),
            "--pdeathsig=SIGKILL",  # again: the change of user clears unshare's --kill-child
            "--",
        ]
        assignments = [f"{k}={v}" for k, v in env.items()]
        command = ["env", "-i", f"--chdir={workdir}", *assignments, *argv]
        lines += [
            "",
            "printf 'ready %s\\n' \"${stat%% *}\" >&3",
            "exec 3>&- >&4 2>&5 4>&- 5>&- \\",
            "  " + " \\\n  ".join(q(word) for word in [*setpriv, *command]),
            "",
        ]
        return "\n".join(lines)


start_container = ContainerProcess  # the name tests read best: `async with start_container(...)`


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined VAR is replaced, `$$` is `$`, anything else stays."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _require_tools() -> None:
    if os.geteuid() != 0:
        raise ContainerError("running a container needs root (mount and PID namespaces, chown, setpriv)")
    missing = [
        tool
        for tool in ("unshare", "setpriv", "pivot_root", "mount", "umount", "chroot")
        if not shutil.which(tool, path=SETUP_PATH)
    ]
    if missing:
        raise ContainerError(f"running a container needs util-linux and coreutils; not found: {', '.join(missing)}")


# SIOCGIFFLAGS / SIOCSIFFLAGS on "lo" (struct ifreq: a 16-byte name, then the flags), IFF_UP
LOOPBACK_UP_PY = """
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))[:18])[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
"""


def _loopback_up() -> str:
    """The setup script's line that brings up `lo` of the new network namespace: `ip` (iproute2) when the host
    has it, else this Python's ioctl (so util-linux is still all it takes)."""
    ip = shutil.which("ip", path=SETUP_PATH)
    if ip:
        return f"{shlex.quote(ip)} link set lo up  # the network namespace's loopback, and nothing else"
    python = shlex.quote(os.path.realpath(sys.executable))
    return f"{python} -I -S -c {shlex.quote(LOOPBACK_UP_PY)}  # lo up (no iproute2 here): loopback only"


def _image_binds() -> list[str]:
    return [p for p in IMAGE_DIRS if os.path.isdir(p) and not os.path.islink(p)] + _python_binds()


def _python_binds() -> list[str]:
    """The test's Python (its installation, venv, the checkout with the editable install), outermost first."""
    candidates = [sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    candidates += [sys.prefix, sys.exec_prefix, str(REPO)]
    paths: list[str] = []
    for path in sorted({os.path.normpath(p) for c in candidates for p in (c, os.path.realpath(c))}, key=len):
        if os.path.isdir(path) and _covering(path, [*IMAGE_DIRS, *paths]) is None:
            paths.append(path)
    return paths


def _sys_mounts() -> list[str]:
    """/sys and the mounts under it (cgroups), in mount order."""
    paths: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if _is_under(point, "/sys") and point not in paths:
            paths.append(point)
    return paths


def _parent(pid: int) -> int:
    """The parent's pid (the command after "comm", which may hold spaces and parentheses)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _covering(path: str, tops: Sequence[str]) -> str | None:
    return next((top for top in tops if _is_under(path, top)), None)


def _bounding_set(capabilities: Mapping[str, Any]) -> list[str]:
    def names(key: str) -> set[str]:
        return {str(c).upper().removeprefix("CAP_") for c in capabilities.get(key) or []}

    add, drop = names("add"), names("drop")
    if "ALL" in add:
        return []
    keep = (set() if "ALL" in drop else DEFAULT_CAPS - drop) | add
    return [f"--bounding-set=-all{''.join(',+' + c.lower() for c in sorted(keep))}"]


def _chown_tree(top: Path, uid: int, gid: int, fs_group: bool, read_only: bool) -> None:
    """chown -R; with an fsGroup also the kubelet's modes: group rw (r for a read-only volume), and
    directories group x and setgid, so that new files get the group."""
    paths = [str(top)]
    for dirpath, dirnames, filenames in os.walk(top):
        paths += [os.path.join(dirpath, name) for name in [*dirnames, *filenames]]
    for path in paths:
        try:  # a shared claim changes meanwhile: a file written by rename (`x.tmp` -> `x`) may be gone
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            os.chown(path, uid, gid)
            if fs_group:
                mask = 0o040 if read_only else 0o060
                if stat.S_ISDIR(info.st_mode):
                    mask |= stat.S_ISGID | 0o010
                os.chmod(path, stat.S_IMODE(info.st_mode) | mask)
        except FileNotFoundError:
            continue


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _bytes(quantity: str | int) -> int:
    """A Kubernetes quantity (`64Mi`, `1G`, `1e6`, `512`) in bytes."""
    m = re.fullmatch(r"([0-9.eE+-]+?)(Ki|Mi|Gi|Ti|k|M|G|T|)", str(quantity).strip())
    if m is None:
        raise ContainerError(f"cannot read the quantity {quantity!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
