"""The API is the record: what a campaign daemon learns from the Run statuses before it drives anything.

A Run's status holds its outcome, score, GPU-hours, the pod times behind them (`podTimes`) and, once final, the
grading pod's report (`report`), all written before the run's pods are deleted. The operator's campaign
directory is a cache of it: after a restart, an upgrade or a failover to a replica whose runs root is empty (the
chart's default emptyDir), `restore_from_statuses` tells the daemon which runs are final (never started again),
rebuilds every run's GPU ledger (so `gpuHours` and the campaign's cap meter carry on) and puts each final run's
result back on disk for reports and metrics. Running pods are adopted by their supervisors (`k8s_backend`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from labkube.operator.crds import run_name
from labkube.operator.k8s_grading import result_from_status
from labkube.operator.k8s_ledger import restore_ledger
from labkube.operator.k8s_models import RunStatus
from labkube.run_spec import RunSpec
from labkube.store import CampaignDir, write_model

__all__ = ["restore_from_statuses"]


def restore_from_statuses(
    cdir: CampaignDir, runs: Iterable[RunSpec], objs: Iterable[Mapping[str, Any]], *, shared: bool
) -> frozenset[str]:
    """The run ids whose Run status is final. Every run's ledger is rebuilt from its status; a final run's result
    is written to the campaign directory when the directory lacks it (without a shared volume the operator's
    copy is the only one it has; with one, the grading pod wrote it there)."""
    by_name = {str(o["metadata"]["name"]): o for o in objs}
    finished: set[str] = set()
    for run in runs:
        obj = by_name.get(run_name(run.campaign, run.run_id))
        if obj is None:
            continue
        status = RunStatus.model_validate(obj.get("status") or {})
        restore_ledger(cdir.root, run.run_id, run.gpus, status)
        if not status.phase.final:
            continue
        finished.add(run.run_id)
        result = result_from_status(status, run.run_id)
        if result is not None and not shared and cdir.result(run.run_id) is None:
            write_model(cdir.run_dir(run.run_id) / "result.json", result)
    return frozenset(finished)
