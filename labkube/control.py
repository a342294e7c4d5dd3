"""Where a run's interventions (labkube/interventions.py) are kept.

Locally the list is `<campaign>/control/<run-id>.json`, written by `labkube runs` (and by the supervisor at a usage
checkpoint) under `<campaign>/control/.lock`, in a folder only the campaign's owner can enter and out of every run's
sandbox. On a cluster it is the Run's `spec.interventions`, which only the API's RBAC lets anyone write, and a pod
reads the copy the operator mounts read-only (`CONTROL_FILE_VARIABLE`).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from labkube.interventions import ControlVerb, Intervention, RunControl, RunState, SteerRequest, check_request
from labkube.store import CampaignDir, read_model, write_model

CONTROL_DIR = "control"
# A run pod's agent container finds its Run's interventions here (a read-only ConfigMap the operator keeps up to date).
CONTROL_FILE_VARIABLE = "LABKUBE_CONTROL_FILE"
# A harness that paused at the operator's request exits with this code: saved, resumable, neither a crash nor a result.
PAUSED_EXIT = 76


def requester() -> str:
    """Who is asking, locally: the user and the machine."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def control_dir(campaign_root: Path) -> Path:
    return campaign_root / CONTROL_DIR


def control_path(campaign_root: Path, run_id: str) -> Path:
    return control_dir(campaign_root) / f"{run_id}.json"


def run_control_path(run_dir: Path) -> Path | None:
    """Where a run's harness reads its interventions: the copy the operator mounts in a pod, else the campaign's. In
    a pod without that copy, none: every folder around the run there is the agent's to write."""
    mounted = os.environ.get(CONTROL_FILE_VARIABLE)
    if mounted:
        return Path(mounted)
    if os.environ.get("LABKUBE_RUN_DIR"):
        return None
    return control_path(run_dir.parent.parent, run_dir.name)


def read_control(path: Path, run_id: str) -> RunControl:
    """A run's control; none yet (or a file that is not one, which only its owner could have written) reads as no
    interventions. A link is followed within its own folder only: that is how the kubelet projects a ConfigMap (each
    key a link to `..data/KEY`, `..data` a link to the folder of the current copy, swapped at each update), and the
    mount is read-only to the pod; a link out of the folder is refused."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop of links
        return RunControl(run_id=run_id)
    if not target.is_relative_to(path.parent.resolve()):
        return RunControl(run_id=run_id)
    control = read_model(target, RunControl, limit=8 << 20)
    return control if control is not None and control.run_id == run_id else RunControl(run_id=run_id)


def run_control(campaign_root: Path, run_id: str) -> RunControl:
    return read_control(control_path(campaign_root, run_id), run_id)


@dataclass
class ControlFile:
    """A run's control as its file says now, for whoever asks often (the run's harness each second, the driver
    while the run is paused): the file is read again only when its size or mtime changed, a stat otherwise."""

    path: Path | None  # None: nothing to read (a pod without the operator's copy)
    run_id: str
    control: RunControl = field(init=False)
    _stamp: tuple[int, int] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.control = RunControl(run_id=self.run_id)

    def read(self) -> RunControl:
        if self.path is None:
            return self.control
        try:
            st = os.stat(self.path)
        except OSError:
            return self.control
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            self.control = read_control(self.path, self.run_id)
        return self.control


@contextlib.contextmanager
def control_lock(campaign_root: Path) -> Iterator[Path]:
    """The campaign's control folder, made only its owner's (0700), locked against every other writer of it."""
    folder = control_dir(campaign_root)
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_mode & 0o077:  # made by an older labkube or by hand: only the owner's from now on
        folder.chmod(0o700)
    with open(folder / ".lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield folder


def add_interventions(campaign_root: Path, made: dict[str, Intervention]) -> None:
    """Append each run's intervention to its control file, all under the campaign's control lock."""
    with control_lock(campaign_root):
        for run_id, intervention in made.items():
            control = run_control(campaign_root, run_id)
            control.interventions.append(intervention)
            write_model(control_path(campaign_root, run_id), control)


def run_state(cdir: CampaignDir, run_id: str, control: RunControl) -> RunState:
    """What a request is checked against for one run of a local campaign (from its files)."""
    spec = cdir.run_spec(run_id)
    return RunState(
        run_id=run_id,
        family=spec.family.value if spec is not None else "",
        agent=spec.agent if spec is not None else "",
        started=(cdir.run_dir(run_id) / "checkpoint.json").exists(),
        final=cdir.is_finished(run_id),
        control=control,
    )


def steer_here(cdir: CampaignDir, request: SteerRequest) -> list[str]:
    """Apply `request` to a local campaign: checked and written under the control lock, so that two requests at once
    are each checked against the other's outcome. The run ids it acted on; ControlError (nothing written) when it
    cannot be applied."""
    whole = request.all_runs or request.verb is ControlVerb.drain
    with control_lock(cdir.root):
        ids = cdir.run_ids() if whole else request.run_ids
        controls = {run_id: run_control(cdir.root, run_id) for run_id in ids}
        states = [run_state(cdir, run_id, controls[run_id]) for run_id in ids]
        picked = check_request(request.verb, states, whole, request.intervention.budgets)
        for run_id in picked:
            controls[run_id].interventions.append(request.for_run())
            write_model(control_path(cdir.root, run_id), controls[run_id])
    return picked
