"""A run's pod time on a cluster: when each of its pods held its GPUs, as the API reports it.

The GPU-hour meter's only source (never a file a run can write). Its record is the Run's status
(`status.podTimes`, written with every status patch, before any pod is deleted); the operator's
`<campaign>/pods/<run-id>.json` is a cache of it, which a new leader with an empty runs root rebuilds from the
Run statuses (`ledger_from_status`) before it drives the campaign, so `gpuHours` and the cap meter carry on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from labkube.operator.k8s_models import PodTimeStatus, RunStatus
from labkube.operator.kube import parse_time
from labkube.store import read_model, write_model

__all__ = [
    "PodLedger",
    "PodTime",
    "campaign_ledger_totals",
    "last_seen_running",
    "ledger_from_status",
    "ledger_path",
    "pod_time",
    "restore_ledger",
]

_TERMINAL = frozenset({"Succeeded", "Failed"})
LIVE_STEP_S = 60.0  # a running pod's time in the Run status moves in these steps (see `PodLedger.seconds`)
MIN_POD_SECONDS = 1.0  # the resolution of a pod's `startTime` and `finishedAt`: an ended pod counts at least this


class PodTime(BaseModel):
    start: datetime
    end: datetime | None = None
    lost: str | None = None  # why it was lost (its node died or went); `end` is when the cluster last saw it run


class PodLedger(BaseModel):
    """When each pod of a run held its GPUs, as the API reports it (`status.startTime` to the last container's
    `finishedAt`): the GPU-hour meter's only source on a cluster. Kept in the operator's `<campaign>/pods/`,
    which no pod mounts, and in the Run's `status.podTimes`."""

    run_id: str
    gpus: int = Field(default=0, ge=0)
    pods: dict[str, PodTime] = Field(default_factory=dict)

    def seconds(self, now: datetime | None = None, live_step_s: float = 0.0) -> float:
        """Pod time of every attempt so far. The API's times are whole seconds: a pod that started and ended within
        one (a quick grading pod) ran for an unknown part of it, and counts the whole second, never zero.
        `live_step_s`: a running pod's time so far in whole steps (rounded down), for a figure that changes once a
        step rather than at every look (the Run status's `gpuHours`: a patch per change)."""
        now = now or datetime.now(UTC)
        total = 0.0
        for t in self.pods.values():
            if t.end is not None:
                total += max(MIN_POD_SECONDS, (t.end - t.start).total_seconds())
                continue
            elapsed = max(0.0, (now - t.start).total_seconds())
            total += elapsed - elapsed % live_step_s if live_step_s > 0 else elapsed
        return total

    def gpu_hours(self, now: datetime | None = None, live_step_s: float = 0.0) -> float:
        return self.gpus * self.seconds(now, live_step_s) / 3600.0

    def to_status(self) -> list[PodTimeStatus]:
        """The ledger as `Run.status.podTimes`."""
        return [PodTimeStatus(pod=name, start=t.start, end=t.end, lost=t.lost) for name, t in sorted(self.pods.items())]

    def lost_pods(self) -> int:
        return sum(t.lost is not None for t in self.pods.values())


def ledger_path(campaign_root: Path, run_id: str) -> Path:
    return campaign_root / "pods" / f"{run_id}.json"


def campaign_ledger_totals(campaign_root: Path, run_ids: list[str]) -> tuple[float, int]:
    """The campaign's GPU-seconds and its lost pods, from the operator's ledgers: what
    `labkube_campaign_gpu_seconds_total` (and its cap alert) and `labkube_campaign_run_pods_lost_total` count on a
    cluster, never a run's own account of its wall time."""
    ledgers = [read_model(ledger_path(campaign_root, run_id), PodLedger) for run_id in run_ids]
    known = [ledger for ledger in ledgers if ledger is not None]
    return sum(ledger.gpu_hours() * 3600.0 for ledger in known), sum(ledger.lost_pods() for ledger in known)


def ledger_from_status(run_id: str, gpus: int, status: RunStatus) -> PodLedger:
    """The ledger a Run's status records (`status.podTimes`)."""
    pods = {p.pod: PodTime(start=p.start, end=p.end, lost=p.lost) for p in status.pod_times}
    return PodLedger(run_id=run_id, gpus=gpus, pods=pods)


def restore_ledger(campaign_root: Path, run_id: str, gpus: int, status: RunStatus) -> PodLedger:
    """The run's ledger: the cached file merged with what its Run status records (the status wins for a pod
    both know, a pod only the cache knows is kept); the cache is rewritten when the status knew more."""
    path = ledger_path(campaign_root, run_id)
    cached = read_model(path, PodLedger)
    recorded = ledger_from_status(run_id, gpus, status)
    if cached is None:
        ledger = recorded
    else:
        ledger = cached.model_copy(update={"gpus": gpus, "pods": {**cached.pods, **recorded.pods}})
    if cached is None or ledger.pods != cached.pods:
        write_model(path, ledger)
    return ledger


def _statuses(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def last_seen_running(pod: Mapping[str, Any] | None, now: datetime | None = None) -> datetime:
    """When the cluster last saw a pod that went without a terminal phase run: its containers' latest `finishedAt`
    when they report one (a kubelet that ended them); else the end of its deletion's grace period
    (`deletionTimestamp`) if that has passed; else `now` (the operator saw it go). A caller that knows the pod's node
    stopped reporting earlier (its `Ready` condition's `lastHeartbeatTime`) passes that instead."""
    now = now or datetime.now(UTC)
    if pod is None:
        return now
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")) for cs in _statuses(pod)]
    known = [e for e in ends if e is not None]
    if known:
        return min(now, max(known))
    deleted = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return min(now, deleted) if deleted is not None else now


def pod_time(pod: Mapping[str, Any]) -> PodTime | None:
    """From the pod's start (scheduled, its GPUs bound) to the end of its last container; None before it starts."""
    status = pod.get("status") or {}
    start = parse_time(status.get("startTime"))
    if start is None:
        return None
    if status.get("phase") not in _TERMINAL:
        return PodTime(start=start)
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")) for cs in _statuses(pod)]
    known = [e for e in ends if e is not None]
    return PodTime(start=start, end=max(known) if known else datetime.now(UTC))
