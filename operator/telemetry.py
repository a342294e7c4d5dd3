"""Campaign-level Prometheus series, kept by the campaign driver (locally) or the operator, and the operator's
`/metrics`: every campaign it drives, and whether this replica leads (`OperatorMetrics`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from labkube.control import control_dir, read_control
from labkube.interventions import InterventionKind
from labkube.metrics import CAMPAIGN_LABELS, CAMPAIGN_METRICS, MetricSet
from labkube.operator.replica import ReplicaState, leader_family
from labkube.report import ReportRow
from labkube.run_spec import RunPhase

__all__ = ["CampaignTelemetry", "ControlFileCounts", "OperatorMetrics", "interventions_by_kind"]

KINDS = frozenset(k.value for k in InterventionKind)


class CampaignTelemetry:
    def __init__(self, campaign: str, gpu_hours_cap: float | None, registry: object = None) -> None:
        self.campaign = campaign
        self.m = MetricSet(CAMPAIGN_METRICS, CAMPAIGN_LABELS, registry)
        self._gpu_seconds = 0.0
        self._resumes = 0
        self._l("labkube_campaign_gpu_seconds_cap").set((gpu_hours_cap or 0) * 3600)
        self._l("labkube_campaign_runs_waiting_for_gpus").set(0)
        for counter in (
            "labkube_campaign_gpu_seconds_total",
            "labkube_campaign_run_restarts_total",
            "labkube_campaign_run_resumes_total",
            "labkube_campaign_run_pods_lost_total",
        ):
            self._l(counter).inc(0)
        self._pods_lost = 0
        self._interventions: dict[str, int] | None = None  # None: nothing counts them here (no series at all)

    def _l(self, name: str, **extra: str) -> Any:
        return self.m[name].labels(campaign=self.campaign, **extra)  # type: ignore[attr-defined]

    def update(
        self,
        rows: list[ReportRow],
        gpus_by_run: dict[str, int],
        gpu_seconds: float | None = None,
        pods_lost: int = 0,
        interventions: Mapping[str, int] | None = None,
    ) -> None:
        """Refresh from the results store (called on every tick of the driver). `gpu_seconds`: the GPU time the
        operator's pod ledgers hold (a cluster), which counts instead of the runs' own wall time; `pods_lost`: the run
        pods the ledgers mark lost; `interventions`: how many interventions of each kind the campaign's runs hold
        (`ControlFileCounts`, `interventions_by_kind`), None where nothing counts them: then the series is absent,
        and the campaign overview marks the runs' own counters instead."""
        if interventions is not None:
            self._count_interventions(interventions)
        if pods_lost > self._pods_lost:
            self._l("labkube_campaign_run_pods_lost_total").inc(pods_lost - self._pods_lost)
            self._pods_lost = pods_lost
        for phase in RunPhase:
            self._l("labkube_campaign_runs", phase=phase.value).set(sum(r.status == phase.value for r in rows))
        final = sum(r.status in (RunPhase.finished.value, RunPhase.failed.value) for r in rows)
        self._l("labkube_campaign_progress_ratio").set(final / len(rows) if rows else 0.0)
        if gpu_seconds is None:
            gpu_seconds = sum(gpus_by_run.get(r.run_id, 0) * r.wall_seconds for r in rows)
        if gpu_seconds > self._gpu_seconds:
            self._l("labkube_campaign_gpu_seconds_total").inc(gpu_seconds - self._gpu_seconds)
            self._gpu_seconds = gpu_seconds
        # counted while runs go on (a live run's status says how often it started), not when they end
        resumes = sum(r.resumes for r in rows)
        if resumes > self._resumes:
            self._l("labkube_campaign_run_resumes_total").inc(resumes - self._resumes)
            self._l("labkube_campaign_run_restarts_total").inc(resumes - self._resumes)
            self._resumes = resumes

    def _count_interventions(self, interventions: Mapping[str, int]) -> None:
        if self._interventions is None:
            # Every kind from the first count: the campaign overview's annotations look for an increase, which a
            # series born at 1 never shows.
            self._interventions = {}
            for kind in InterventionKind:
                self._l("labkube_campaign_interventions_total", kind=kind.value).inc(0)
        for kind, n in interventions.items():
            counted = self._interventions.get(kind, 0)
            if kind in KINDS and n > counted:
                self._l("labkube_campaign_interventions_total", kind=kind).inc(n - counted)
                self._interventions[kind] = n

    def waiting_for_gpus(self, n: int) -> None:
        self._l("labkube_campaign_runs_waiting_for_gpus").set(n)


def interventions_by_kind(runs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The interventions of each kind that Run resources hold in `spec.interventions` (a cluster)."""
    counts: Counter[str] = Counter()
    for run in runs:
        for intervention in (run.get("spec") or {}).get("interventions") or ():
            kind = intervention.get("kind") if isinstance(intervention, Mapping) else None
            if kind in KINDS:
                counts[kind] += 1
    return dict(counts)


class ControlFileCounts:
    """The interventions of each kind a local campaign's control files hold (`<campaign>/control/<run-id>.json`).
    A file is parsed again only when it changed (its inode, size or mtime: `add_interventions` replaces it), so a
    tick of a campaign nobody steers costs one listing of an empty or missing folder."""

    def __init__(self, campaign_root: Path) -> None:
        self.folder = control_dir(campaign_root)
        self._files: dict[str, tuple[tuple[int, int, int], Counter[str]]] = {}

    def counts(self) -> dict[str, int]:
        try:
            with os.scandir(self.folder) as listing:
                entries = [e for e in listing if e.name.endswith(".json") and not e.name.startswith(".")]
        except OSError:  # none yet (nobody intervened), or unreadable for now: the counter keeps what it counted
            return {}
        seen: dict[str, tuple[tuple[int, int, int], Counter[str]]] = {}
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = self._files.get(entry.name)
            if known is None or known[0] != key:
                control = read_control(Path(entry.path), entry.name.removesuffix(".json"))
                known = (key, Counter(i.kind.value for i in control.interventions))
            seen[entry.name] = known
        self._files = seen
        total: Counter[str] = Counter()
        for _key, kinds in seen.values():
            total.update(kinds)
        return dict(total)


class OperatorMetrics:
    """Every driven campaign's series (`CampaignTelemetry`, one registry each) on one `/metrics`."""

    def __init__(self, replica: ReplicaState | None = None) -> None:
        self.campaigns: dict[tuple[str, str], Any] = {}
        self.replica = replica  # `labkube_operator_leader`, served by every replica, leading or not

    def telemetry(self, namespace: str, name: str, gpu_hours_cap: float | None) -> Any:
        from prometheus_client import CollectorRegistry

        key = (namespace, name)
        if key not in self.campaigns:
            self.campaigns[key] = CampaignTelemetry(name, gpu_hours_cap, registry=CollectorRegistry())
        return self.campaigns[key]

    def drop(self, namespace: str, name: str) -> None:
        self.campaigns.pop((namespace, name), None)

    def drop_all(self) -> None:
        """Forget every campaign's series: a fenced replica's would be frozen copies of the leader's, and a dashboard
        summing over replicas would count each campaign twice. A replica that leads again builds them anew (its
        counters start from the ledgers and statuses, as after a restart)."""
        self.campaigns.clear()

    def collect(self) -> Any:
        """One family per metric (one `# HELP`), each campaign's samples labelled with its `namespace`: two campaigns
        of one name in two namespaces are two series."""
        from prometheus_client.metrics_core import Metric

        if self.replica is not None:
            yield leader_family(self.replica)
            if not self.replica.leader:
                # fenced or standing by: the leader serves the campaigns' series; a copy frozen here (its daemons may
                # take a while to end while the API is down) would be counted twice by a dashboard summing replicas
                return
        merged: dict[str, Metric] = {}
        for (namespace, _), telemetry in list(self.campaigns.items()):
            for family in telemetry.m.registry.collect():
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                into.samples.extend(s._replace(labels={**s.labels, "namespace": namespace}) for s in family.samples)
        yield from merged.values()

    def serve(self, port: int) -> object:
        from prometheus_client import CollectorRegistry

        from labkube.metrics import serve

        registry = CollectorRegistry()
        registry.register(self)  # type: ignore[arg-type]
        return serve(port, registry)
