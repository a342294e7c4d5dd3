"""Every intervention on a live run (issue #44) is a Prometheus counter with a Grafana annotation: the run's own
`labkube_run_interventions_total{kind}`, the campaign's `labkube_campaign_interventions_total{kind}` counted from
its runs' control files, and an annotation on the run detail and the campaign overview that marks each rise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitoring_helpers import free_port, load_dashboards, series_names, substitute
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import labkube.operator.telemetry as campaign_telemetry
from labkube.agent.telemetry import RunTelemetry, UnreadTelemetry
from labkube.campaign import CampaignSpec
from labkube.control import add_interventions, control_dir
from labkube.interventions import Intervention, InterventionKind
from labkube.metrics import CAMPAIGN_METRICS, RUN_METRICS
from labkube.operator.telemetry import CampaignTelemetry, ControlFileCounts, interventions_by_kind
from labkube.run_spec import RunSpec
from labkube.store import CampaignDir

KINDS = [k.value for k in InterventionKind]
PROMTOOL = Path("/usr/bin/promtool")


def spec() -> RunSpec:
    return RunSpec(run_id="t--m--s0", campaign="c", task="t", task_path="/t", model="m", seed=0)


def counts_in(exposition: str, name: str) -> dict[str, float]:
    """kind -> value of one counter's `_total` samples in a scrape."""
    return {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    }


def made(kind: InterventionKind, **extra: Any) -> Intervention:
    return Intervention(kind=kind, by="tester@host", **extra)


# -- the run's counter ------------------------------------------------------------------------------


def test_the_run_counter_starts_at_zero_for_every_kind_and_counts_each() -> None:
    telemetry = RunTelemetry(spec())

    def scrape() -> dict[str, float]:
        return counts_in(generate_latest(telemetry.m.registry).decode(), "labkube_run_interventions_total")  # type: ignore[arg-type]

    assert scrape() == dict.fromkeys(KINDS, 0)
    telemetry.intervention("pause")
    telemetry.intervention("resume")
    telemetry.intervention("pause")
    assert scrape() == {**dict.fromkeys(KINDS, 0), "pause": 2, "resume": 1}


def test_an_unread_runs_telemetry_takes_interventions_too() -> None:
    unread = UnreadTelemetry(spec())
    unread.intervention("cancel")  # no series to count into, and no error
    assert not hasattr(unread, "m")


def test_the_run_counter_reaches_the_campaigns_multiprocess_endpoint(tmp_path: Path) -> None:
    """Locally each agent process writes the shared multiprocess dir and the driver serves it: two processes of one
    run (one paused, one resumed) add up (in subprocesses: prometheus_client picks its mode at import)."""
    mp = tmp_path / "mp"
    write = textwrap.dedent(
        f"""
        import sys
        from labkube.metrics import use_multiprocess_dir
        use_multiprocess_dir({str(mp)!r})
        from labkube.agent.telemetry import RunTelemetry
        from labkube.run_spec import RunSpec
        t = RunTelemetry(RunSpec(run_id="r", campaign="c", task="t", task_path="/t", model="m", seed=0))
        for kind in sys.argv[1:]:
            t.intervention(kind)
        """
    )
    for kinds in (["message", "pause"], ["resume"]):
        proc = subprocess.run(
            [sys.executable, "-c", write, *kinds], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
    read = textwrap.dedent(
        f"""
        import prometheus_client as pc
        from prometheus_client import multiprocess
        registry = pc.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path={str(mp)!r})
        print(pc.generate_latest(registry).decode())
        """
    )
    proc = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert counts_in(proc.stdout, "labkube_run_interventions_total") == {
        **dict.fromkeys(KINDS, 0),
        "message": 1,
        "pause": 1,
        "resume": 1,
    }


# -- the campaign's counter -------------------------------------------------------------------------


def campaign_counts(telemetry: CampaignTelemetry) -> dict[str, float]:
    return counts_in(generate_latest(telemetry.m.registry).decode(), "labkube_campaign_interventions_total")  # type: ignore[arg-type]


def test_the_campaign_counter_counts_the_control_files(tmp_path: Path) -> None:
    counts = ControlFileCounts(tmp_path)
    telemetry = CampaignTelemetry("c", None, registry=CollectorRegistry())
    telemetry.update([], {})
    assert campaign_counts(telemetry) == {}  # nothing counts them (an operator): no series, not a false 0
    assert counts.counts() == {}  # no control folder yet: nobody intervened
    telemetry.update([], {}, interventions=counts.counts())
    assert campaign_counts(telemetry) == dict.fromkeys(KINDS, 0)

    add_interventions(tmp_path, {"r1": made(InterventionKind.pause), "r2": made(InterventionKind.message, message="x")})
    add_interventions(tmp_path, {"r1": made(InterventionKind.resume)})
    assert counts.counts() == {"pause": 1, "resume": 1, "message": 1}
    telemetry.update([], {}, interventions=counts.counts())
    telemetry.update([], {}, interventions=counts.counts())  # the same files again: counted once
    assert campaign_counts(telemetry) == {**dict.fromkeys(KINDS, 0), "pause": 1, "resume": 1, "message": 1}

    add_interventions(tmp_path, {"r2": made(InterventionKind.pause), "r3": made(InterventionKind.cancel)})
    telemetry.update([], {}, interventions=counts.counts())
    assert campaign_counts(telemetry) == {
        **dict.fromkeys(KINDS, 0),
        "pause": 2,
        "resume": 1,
        "message": 1,
        "cancel": 1,
    }


def test_only_the_control_files_that_changed_are_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_interventions(tmp_path, {"r1": made(InterventionKind.pause), "r2": made(InterventionKind.pause)})
    read: list[str] = []
    real = campaign_telemetry.read_control

    def counting(path: Path, run_id: str) -> Any:
        read.append(run_id)
        return real(path, run_id)

    monkeypatch.setattr(campaign_telemetry, "read_control", counting)
    counts = ControlFileCounts(tmp_path)
    assert counts.counts() == {"pause": 2}
    assert sorted(read) == ["r1", "r2"]
    read.clear()
    assert counts.counts() == {"pause": 2}
    assert read == []  # nothing changed: nothing parsed
    add_interventions(tmp_path, {"r2": made(InterventionKind.resume)})
    assert counts.counts() == {"pause": 2, "resume": 1}
    assert read == ["r2"]


def test_what_is_not_a_runs_control_counts_nothing(tmp_path: Path) -> None:
    add_interventions(tmp_path, {"r1": made(InterventionKind.extend, budgets={"usd": 5})})
    folder = control_dir(tmp_path)
    (folder / "r2.json").write_text("{not json")
    (folder / "r3.json").write_text('{"run_id": "another", "interventions": [{"kind": "cancel", "by": "x"}]}')
    (folder / "r4.json").symlink_to(folder / "r1.json")  # refused, never followed
    (folder / "notes.txt").write_text("x")
    assert ControlFileCounts(tmp_path).counts() == {"extend": 1}


def test_a_resumed_campaign_serves_its_earlier_interventions_from_the_first_scrape(tmp_path: Path) -> None:
    """The local driver's `/metrics`: counted before it serves, so a restart shows no rise (no annotation) for the
    interventions made before it; one made afterwards shows at the next tick. The server is stopped."""
    from labkube.operator.campaign_run import CampaignMetrics

    add_interventions(tmp_path, {"r1": made(InterventionKind.pause), "r2": made(InterventionKind.cancel)})
    port = free_port()
    metrics = CampaignMetrics(CampaignDir(tmp_path), CampaignSpec(name="c", tasks=["t"]), [], port)
    try:

        def scrape() -> dict[str, float]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                return counts_in(response.read().decode(), "labkube_campaign_interventions_total")

        assert scrape() == {**dict.fromkeys(KINDS, 0), "pause": 1, "cancel": 1}
        add_interventions(tmp_path, {"r1": made(InterventionKind.resume)})
        metrics.tick(force=True)
        assert scrape() == {**dict.fromkeys(KINDS, 0), "pause": 1, "cancel": 1, "resume": 1}
    finally:
        metrics.close()


def test_the_kinds_a_clusters_runs_hold() -> None:
    runs: list[dict[str, Any]] = [
        {"metadata": {"name": "a"}, "spec": {"interventions": [made(InterventionKind.pause).model_dump(mode="json")]}},
        {"metadata": {"name": "b"}, "spec": {"interventions": [{"kind": "pause"}, {"kind": "usage_checkpoint"}]}},
        {"metadata": {"name": "c"}, "spec": {}},
        {"metadata": {"name": "d"}, "status": {}},
        {"metadata": {"name": "e"}, "spec": {"interventions": [{"kind": "reboot"}, "pause"]}},  # not interventions
    ]
    assert interventions_by_kind(runs) == {"pause": 2, "usage_checkpoint": 1}


# -- the annotations --------------------------------------------------------------------------------

ANNOTATED = {
    "run-detail.json": {"labkube_run_interventions_total"},
    # the runs' own counters where the campaign's is absent (a cluster, for now)
    "campaign-overview.json": {"labkube_campaign_interventions_total", "labkube_run_interventions_total"},
}


def annotations(name: str) -> list[dict[str, Any]]:
    list_: list[dict[str, Any]] = load_dashboards()[name].get("annotations", {}).get("list", [])
    return list_


def interventions_annotation(name: str) -> dict[str, Any]:
    (found,) = [a for a in annotations(name) if a["name"] == "Interventions"]
    return found


@pytest.mark.parametrize("name", sorted(ANNOTATED))
def test_the_dashboards_annotate_interventions(name: str) -> None:
    a = interventions_annotation(name)
    assert a["enable"] and not a["hide"]
    assert a["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert series_names(a["expr"]) == ANNOTATED[name]
    assert ANNOTATED[name] <= {*RUN_METRICS, *CAMPAIGN_METRICS}
    assert 'campaign=~"$campaign"' in a["expr"]
    if name == "run-detail.json":
        assert 'run_id="$run_id"' in a["expr"]
    assert "increase(" in a["expr"] and "{{kind}}" in a["titleFormat"] and "kind" in a["tagKeys"].split(",")
    assert a["step"] and not a["useValueForTime"]


def test_no_other_dashboard_annotates() -> None:
    assert not annotations("gaia2.json")


PROMTOOL_TEST = """
rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}
    promql_expr_test:
{checks}
"""


def series_of(name: str, labels: str, values: str) -> str:
    return f"      - series: '{name}{{{labels}}}'\n        values: '{values}'\n"


def check(expr: str, at: str, marked: list[str]) -> str:
    """`count by (kind)` of what the annotation query returns: which kinds it marks at `at`."""
    text = f"      - expr: 'count by (kind) ({expr})'\n        eval_time: {at}\n        exp_samples:"
    if not marked:
        return text + " []\n"
    return text + "\n" + "".join(f"          - labels: '{{kind=\"{k}\"}}'\n            value: 1\n" for k in marked)


@pytest.fixture
def promtool() -> Iterator[Path]:
    if not PROMTOOL.exists():
        pytest.fail(f"{PROMTOOL} is missing: install Debian's `prometheus` package (scripts/test.sh does)")
    yield PROMTOOL


def test_the_annotations_mark_each_rise_and_not_a_restart(tmp_path: Path, promtool: Path) -> None:
    """Evaluated by promtool on series of a run paused at 3m, whose pod restarts at 7m with its counters at 0 again
    and is resumed at 9m: events at the pause and at the resume, none at the restart, nor for another run's cancel
    that its campaign's counter does not hold. Campaign `k` has no campaign counter (a cluster's operator does not
    count them yet): its overview marks its runs' own counters."""
    paused, resumed = "0 0 0 1 1 1 1 0 0 0 0 0 0", "0 0 0 0 0 0 0 0 0 1 1 1 1"
    run = 'campaign="c", run_id="r", task="t", model="m"'
    other = 'campaign="c", run_id="s", task="t", model="m"'
    cluster_run = 'campaign="k", run_id="x", task="t", model="m", pod="x-2"'
    series = (
        series_of("labkube_run_interventions_total", f'{run}, kind="pause"', paused)
        + series_of("labkube_run_interventions_total", f'{run}, kind="resume"', resumed)
        + series_of("labkube_run_interventions_total", f'{other}, kind="cancel"', resumed)
        + series_of("labkube_campaign_interventions_total", 'campaign="c", kind="pause"', "0 0 0 1 1 1 1 1 1 1 1 1 1")
        + series_of("labkube_campaign_interventions_total", 'campaign="c", kind="resume"', resumed)
        + series_of("labkube_campaign_interventions_total", 'campaign="c", kind="cancel"', "0 0 0 0 0 0 0 0 0 0 0 0 0")
        + series_of("labkube_run_interventions_total", f'{cluster_run}, kind="pause"', paused)
        + series_of("labkube_run_interventions_total", f'{cluster_run}, kind="resume"', resumed)
    )
    run_detail = interventions_annotation("run-detail.json")["expr"]
    overview = interventions_annotation("campaign-overview.json")["expr"]
    exprs = [
        substitute(run_detail, {"campaign": "c", "run_id": "r"}),
        substitute(overview, {"campaign": "c"}),
        substitute(overview, {"campaign": "k"}),
    ]
    checks = ""
    for expr in exprs:
        checks += check(expr, "2m", [])
        checks += check(expr, "4m", ["pause"])
        checks += check(expr, "6m", [])
        checks += check(expr, "8m", [])  # the run's pod restarted: its counter fell to 0
        checks += check(expr, "10m", ["resume"])
        checks += check(expr, "12m", [])
    text = PROMTOOL_TEST.format(series=series.rstrip("\n"), checks=checks.rstrip("\n"))
    path = tmp_path / "annotations_test.yaml"
    path.write_text(text)
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr + text
