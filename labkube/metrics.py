"""Prometheus metrics: one registry of names for every part of labkube.

Names follow DESIGN.md: the `labkube_` prefix, base units (seconds, dollars, ratios), `_total`
for counters, and no unbounded label values except `run_id`, which appears only on the
per-run series that the run's own agent process exports.

How series reach Prometheus:
- In Kubernetes each run pod serves its own `/metrics` (`LABKUBE_METRICS_PORT`), and the
  operator serves the campaign-level series.
- Locally, `labkube run --metrics-port N` serves the campaign's and every run's series on one
  endpoint: the agent processes write to a shared `PROMETHEUS_MULTIPROC_DIR` (set through
  `LABKUBE_METRICS_DIR`), and the campaign driver serves them all with prometheus_client's
  multiprocess collector.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_LABELS = ("campaign", "run_id", "task", "model")
CAMPAIGN_LABELS = ("campaign",)

# name: (type, help, extra labels)
RUN_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "labkube_run_tokens_total": ("counter", "Model tokens used by the run, by kind.", ("kind",)),
    "labkube_run_cost_dollars_total": ("counter", "Model spend of the run in US dollars.", ()),
    "labkube_run_cost_unknown": (
        "gauge",
        "1 once a model the run called has no price: its dollars are unknown (the dollar counter has only the priced "
        "calls'); else 0.",
        (),
    ),
    "labkube_run_model_calls_partial": (
        "gauge",
        "Model calls (and retried attempts) whose answer did not say its usage (it broke off before, never came, or "
        "never says it); while above 0 the run's tokens and dollars are lower bounds.",
        (),
    ),
    "labkube_run_steps_total": ("counter", "Agent steps the run completed.", ()),
    "labkube_run_tool_calls_total": ("counter", "Tool calls of the run, by tool and outcome.", ("tool", "outcome")),
    "labkube_run_model_call_duration_seconds": ("histogram", "Latency of the run's model calls.", ()),
    "labkube_run_budget_used_ratio": ("gauge", "Fraction of each budget the run has used.", ("budget",)),
    "labkube_run_score": ("gauge", "The run's current normalized score (primary subtask); NaN until graded.", ()),
    "labkube_run_best_score": ("gauge", "The best normalized score the run has reached; NaN until graded.", ()),
    "labkube_run_subtask_completion_ratio": ("gauge", "Fraction of subtasks with a valid number.", ()),
    "labkube_run_last_step_timestamp_seconds": ("gauge", "Unix time of the run's last completed step.", ()),
    "labkube_run_integrity_violations": (
        "gauge",
        "Integrity violations found by the audit, by type; 0 until the audit.",
        ("type",),
    ),
    "labkube_run_integrity_suspicious": ("gauge", "1 when the audit found the run SUSPICIOUS, else 0.", ()),
    "labkube_run_finished": ("gauge", "1 once the run reached a final state, else 0.", ()),
    "labkube_run_interventions_total": (
        "counter",
        "Interventions (cancel, pause, resume, extend, message, usage_checkpoint) the run's harness applied, by kind; "
        "the run detail's annotations mark each.",
        ("kind",),
    ),
    "labkube_run_gaia2_passed": (
        "gauge",
        "1 when ARE's judge passed the Gaia2 run, else 0, per capability.",
        ("capability",),
    ),
    "labkube_run_gpu_utilization_ratio": (
        "gauge",
        "Fraction of NVML's sample period a kernel ran on each of the run's GPUs; absent without a GPU.",
        ("gpu",),
    ),
    "labkube_run_gpu_memory_used_bytes": (
        "gauge",
        "Memory in use on each of the run's GPUs (NVML); absent without a GPU.",
        ("gpu",),
    ),
    "labkube_run_gpu_memory_total_bytes": ("gauge", "Memory of each of the run's GPUs (NVML).", ("gpu",)),
}

CAMPAIGN_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "labkube_campaign_runs": ("gauge", "Runs of the campaign by phase.", ("phase",)),
    "labkube_campaign_progress_ratio": ("gauge", "Fraction of the campaign's runs in a final state.", ()),
    "labkube_campaign_gpu_seconds_total": ("counter", "GPU time the campaign's runs have used.", ()),
    "labkube_campaign_gpu_seconds_cap": ("gauge", "The campaign's GPU-time cap (0 when uncapped).", ()),
    "labkube_campaign_runs_waiting_for_gpus": ("gauge", "Runs waiting for free GPUs.", ()),
    "labkube_campaign_run_restarts_total": ("counter", "Sandbox restarts after a crash or an eviction.", ()),
    "labkube_campaign_run_resumes_total": ("counter", "Runs resumed from a checkpoint.", ()),
    "labkube_campaign_run_pods_lost_total": (
        "counter",
        "Run pods lost with their node (dead, NotReady or deleted) or stuck Terminating past their grace period, as "
        "the operator saw them (a cluster; `LabkubeRunPodLost`).",
        (),
    ),
    "labkube_campaign_interventions_total": (
        "counter",
        "Interventions made on the campaign's runs, by kind, as their control files hold them (a local campaign; "
        "the operator does not count them yet: no series); the campaign overview's annotations mark each.",
        ("kind",),
    ),
}

OPERATOR_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "labkube_operator_leader": (
        "gauge",
        "1 while this operator replica holds the leader lease and drives campaigns, else 0 (standing by, fenced).",
        (),
    ),
}

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


def use_multiprocess_dir(directory: Path | str) -> None:
    """Point prometheus_client at a shared directory; call before `prometheus_client` is imported."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


def _make(name: str, kind: str, doc: str, labels: tuple[str, ...], registry: object) -> object:
    import prometheus_client as pc

    if kind == "counter":
        return pc.Counter(name.removesuffix("_total"), doc, labels, registry=registry)
    if kind == "histogram":
        return pc.Histogram(name, doc, labels, buckets=DURATION_BUCKETS, registry=registry)
    return pc.Gauge(name, doc, labels, registry=registry, multiprocess_mode="mostrecent")


class MetricSet:
    """The series of one registry (a run's, or a campaign's), created from the tables above."""

    def __init__(
        self, table: dict[str, tuple[str, str, tuple[str, ...]]], base_labels: tuple[str, ...], registry: object = None
    ) -> None:
        import prometheus_client as pc

        self.registry = registry if registry is not None else pc.CollectorRegistry()
        self.metrics = {
            name: _make(name, kind, doc, base_labels + extra, self.registry)
            for name, (kind, doc, extra) in table.items()
        }

    def __getitem__(self, name: str) -> object:
        return self.metrics[name]


def serve(port: int, registry: object = None, addr: str = "0.0.0.0") -> object:
    """Serve `/metrics`; in multiprocess mode, the series of every process writing to the shared dir."""
    import prometheus_client as pc
    from prometheus_client import multiprocess

    if registry is None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = pc.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = pc.REGISTRY
    server, _thread = pc.start_http_server(port, addr=addr, registry=registry)
    return server
