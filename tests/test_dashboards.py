"""The monitoring assets in dashboards/: Grafana dashboards, Prometheus rules, and the metric docs.

Static checks (dashboard structure, generator output, which series the queries read, promtool) run
in well under a second each. The live checks start a real local campaign with `--metrics-port` and a
real Prometheus scraping it every second with our rules loaded, then evaluate every dashboard panel's
query (the template variables filled in with the campaign's values, as Grafana would) and every
recording rule against Prometheus's HTTP API.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from monitoring_helpers import (
    CAMPAIGN,
    DASHBOARDS,
    GAIA2_CAPABILITY,
    GAIA2_TASK,
    OPERATOR_JOB,
    REPO,
    RULES,
    RULES_TEST,
    Prometheus,
    Scraper,
    alerting_rules,
    free_port,
    grafana_regex_escape,
    has_finite_value,
    load_dashboards,
    make_campaign,
    panels,
    queries,
    recording_rules,
    series_names,
    start_group,
    stop_group,
    substitute,
    tail,
    variables,
)

from labkube.metrics import CAMPAIGN_METRICS, OPERATOR_METRICS, RUN_LABELS, RUN_METRICS

PROMTOOL = "/usr/bin/promtool"
PROMETHEUS = "/usr/bin/prometheus"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTER_VARIABLES = ("campaign", "task", "model")
GRAFANA_VARIABLES = {"__range", "__rate_interval", "__interval"}


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labkube_dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = load_build()
BOARDS = load_dashboards()
PANEL_QUERIES = [
    pytest.param(name, p, t, id=f"{name.removesuffix('.json')}:{p['title']}:{t['refId']}")
    for name, board in BOARDS.items()
    for p, t in queries(board)
]


def known_series() -> set[str]:
    names = {"up"}
    for name, (kind, _doc, _labels) in {**RUN_METRICS, **CAMPAIGN_METRICS, **OPERATOR_METRICS}.items():
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def pending_reason(expr: str) -> str | None:
    """Why a query cannot return data here: it reads a series only a cluster's DCGM exporter exports (its join is
    checked by test_dcgm_series_join_to_run_pods)."""
    if any(name in expr for name in BUILD.DCGM_SERIES):
        return "DCGM exporter series exist only on a cluster's GPU nodes; the join is tested with promtool"
    return None


def require(binary: str) -> str:
    if not Path(binary).exists():
        pytest.fail(f"{binary} is missing: install Debian's `prometheus` package (scripts/test.sh does)")
    return binary


# -- the dashboards' JSON ---------------------------------------------------------------------------


def test_dashboards_are_the_generators_output() -> None:
    pytest.importorskip(
        "grafana_foundation_sdk",
        exc_type=ImportError,
        reason=f"the generator needs {BUILD.SDK_REQUIREMENT} (a test extra); the structural tests still run",
    )
    installed = importlib.metadata.version("grafana-foundation-sdk")
    assert installed == BUILD.SDK_VERSION, f"install the pinned SDK build: pip install '{BUILD.SDK_REQUIREMENT}'"
    generated = BUILD.render_dashboards()
    assert sorted(generated) == sorted(BOARDS), "dashboards/*.json are exactly the generated dashboards"
    for name, text in generated.items():
        assert (DASHBOARDS / name).read_text() == text, f"{name} is stale: run python dashboards/build.py"


def test_metric_table_in_the_docs_is_current() -> None:
    doc = (REPO / "docs" / "monitoring.md").read_text()
    assert BUILD.doc_with_table(doc, BUILD.render_metrics_table()) == doc, (
        "docs/monitoring.md's metric table is stale: run python dashboards/build.py"
    )


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_structure(name: str) -> None:
    board = BOARDS[name]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39
    assert board["uid"].startswith("labkube-") and len(board["uid"]) <= 40
    assert board["title"].startswith("labkube / ") and "labkube" in board["tags"]
    assert "id" not in board or board["id"] is None, "no database id: dashboards are provisioned"

    v = variables(board)
    assert v["datasource"]["type"] == "datasource" and v["datasource"]["query"] == "prometheus"
    for var in FILTER_VARIABLES:
        assert v[var]["type"] == "query" and v[var]["datasource"] == DATASOURCE, var
        assert v[var]["multi"] and v[var]["includeAll"] and v[var]["allValue"] == ".*", var
        assert re.fullmatch(r"label_values\(.+, " + var + r"\)", v[var]["query"]), v[var]["query"]

    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    titles = [p["title"] for p in panels(board) if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles are unique (rows aside)"
    cells: set[tuple[int, int]] = set()
    for p in panels(board):
        g = p["gridPos"]
        assert set(g) >= {"x", "y", "w", "h"} and g["w"] > 0 and g["h"] > 0
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (p["title"], g)
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), "every panel says what it shows"
        assert p["datasource"] == DATASOURCE, p["title"]
        targets = p["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), p["title"]
        for t in targets:
            assert t["datasource"] == DATASOURCE and t["expr"].strip(), p["title"]
            # `$1` in label_replace is a capture group: Grafana leaves `$<name>` alone where no variable has the name.
            used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", t["expr"]))
            assert "campaign" in used, f"{p['title']}: every query is filtered by campaign"
            assert used <= set(v) | GRAFANA_VARIABLES, f"{p['title']}: unknown variables {used - set(v)}"
            if "run_id" in v:
                assert "run_id" in used, f"{p['title']}: the run detail queries one run"


def test_dashboards_read_only_series_that_exist() -> None:
    """DESIGN.md: dashboards query only series that exist (labkube/metrics.py, our recording rules); every
    recording rule serves a dashboard."""
    records = set(recording_rules())
    allowed = known_series() | records
    used: set[str] = set()
    for name, board in BOARDS.items():
        for p, t in queries(board):
            names = series_names(t["expr"])
            assert names, f"{name}: {p['title']}: no series found in {t['expr']!r}"
            assert names <= allowed, f"{name}: {p['title']}: unknown series {names - allowed}"
            used |= names
        for var in variables(board).values():
            if var["type"] == "query":
                assert series_names(var["query"]) <= allowed, var["query"]
    assert records <= used, f"recording rules no dashboard uses: {records - used}"
    for rule in [*recording_rules().values(), *(r["expr"] for r in alerting_rules().values())]:
        names = series_names(rule)
        assert names <= known_series() | records, f"rule reads unknown series {names - known_series() - records}"


def test_the_gaia2_series_is_designed_as_the_panels_expect() -> None:
    kind, _doc, extra = RUN_METRICS["labkube_run_gaia2_passed"]
    assert kind == "gauge" and extra == ("capability",), RUN_METRICS["labkube_run_gaia2_passed"]
    gaia2 = [t["expr"] for _p, t in queries(BOARDS["gaia2.json"])]
    assert gaia2 and all("labkube_run_gaia2_passed" in e and "capability" in e for e in gaia2)
    assert RUN_LABELS == ("campaign", "run_id", "task", "model")


def test_the_chart_ships_these_files() -> None:
    """The Helm chart takes dashboards/*.json as Grafana dashboards (one ConfigMap, at most 1 MiB) and
    every dashboards/*.yaml with a top-level `groups:` as a rule file."""
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(BUILD.DASHBOARDS)
    assert sum(p.stat().st_size for p in DASHBOARDS.glob("*.json")) < 900_000
    rule_files = [p for p in DASHBOARDS.glob("*.y*ml") if "groups" in (yaml.safe_load(p.read_text()) or {})]
    assert rule_files == [RULES]
    assert "groups" not in yaml.safe_load(RULES_TEST.read_text())
    chart_link = REPO / "helm" / "labkube" / "dashboards"
    if chart_link.exists():
        assert chart_link.resolve() == DASHBOARDS.resolve()


def test_docs_cover_every_alert_and_recording_rule() -> None:
    doc = (REPO / "docs" / "monitoring.md").read_text()
    for name, rule in alerting_rules().items():
        assert f"\n### {name}\n" in doc, f"docs/monitoring.md says what to do when {name} fires"
        assert rule["annotations"]["runbook"] == f"docs/monitoring.md#{name.lower()}"
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
    for record in recording_rules():
        assert f"| `{record}` |" in doc, f"docs/monitoring.md lists {record}"


# -- promtool -------------------------------------------------------------------------------------


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require(PROMTOOL), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout and "WARNING" not in proc.stdout + proc.stderr


def test_promtool_test_rules() -> None:
    proc = promtool("test", "rules", str(RULES_TEST))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == set(alerting_rules()), "every alert has a unit test"
    for record in recording_rules():
        assert record in RULES_TEST.read_text(), f"{record} has no unit test"


# -- the live campaign ------------------------------------------------------------------------------


@dataclass
class Live:
    prometheus: Prometheus
    scrapes: list[str]
    start: float  # when Prometheus began scraping
    end: float  # the last moment Prometheus scraped the campaign successfully
    values: dict[str, str]  # template variables as Grafana would send them
    campaign_log: Path
    task: str  # the paper task's path (the other task is GAIA2_TASK)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require(PROMETHEUS)
    root = tmp_path_factory.mktemp("monitoring")
    task, campaign_file = make_campaign(root)
    port = free_port()
    prom = Prometheus(root, [f"127.0.0.1:{port}"], binary=PROMETHEUS)
    campaign: subprocess.Popen[bytes] | None = None
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics")
    try:
        prom.start()
        start = time.time()
        campaign = start_group(
            [
                *(sys.executable, "-P", "-m", "labkube", "campaign", "run", str(campaign_file)),
                *("--out", str(root / "out"), "--metrics-port", str(port)),
            ],
            root / "campaign.log",
            env={
                "LABKUBE_LOCAL_GPUS": "1",
                "RAY_AUTH_MODE": "disabled",
                "COLUMNS": "200",
                # The fake GPU's NVML readings, recorded (tests/test_gpu_use.py): the GPU panels get data.
                "LABKUBE_GPU_REPLAY": str(REPO / "tests" / "data" / "nvml" / "one-gpu-training.jsonl"),
                "LABKUBE_GPU_SAMPLE_S": "1",
            },
            cwd=root,
        )
        scraper.start()
        try:
            rc = campaign.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the campaign did not finish in 120 s:\n{tail(root / 'campaign.log')}")
        exited = time.time()
        scraper.halt.set()
        scraper.join()
        assert rc == 0, f"the campaign exited {rc}:\n{tail(root / 'campaign.log')}"
        prom.wait_for_rules_evaluated_after(exited)  # the last rule evaluations after the last scrape
        up = prom.range(f'up{{job="{OPERATOR_JOB}"}}', start, time.time())
        scraped = [float(ts) for s in up for ts, value in s["values"] if value == "1"]
        assert scraped, f"Prometheus never scraped the campaign:\n{tail(prom.log)}"
        end = max(scraped)
        suspicious = prom.instant("labkube_run_integrity_suspicious == 1", end)
        assert suspicious, "the seed that edits grading/grade.sh is SUSPICIOUS"
        values = {
            "campaign": grafana_regex_escape(CAMPAIGN),
            # both tasks selected: Grafana joins a multi-value variable's escaped values as (a|b)
            "task": f"({grafana_regex_escape(str(task))}|{grafana_regex_escape(GAIA2_TASK)})",
            "model": grafana_regex_escape("oracle"),
            "run_id": suspicious[0]["metric"]["run_id"],  # a single-value variable: not escaped
            "__range": f"{math.ceil(end - start) + 5}s",
            "__rate_interval": "10s",
            "__interval": "1s",
        }
        yield Live(prom, scraper.scrapes, start, end, values, root / "campaign.log", str(task))
    finally:
        scraper.halt.set()
        if campaign is not None:  # Ctrl-C first, so the campaign shuts its Ray down
            stop_group(campaign, ((signal.SIGINT, 20), (signal.SIGTERM, 5)))
        prom.stop()


slow = pytest.mark.slow  # the live checks (about 35 s for all of them)


@slow
def test_live_campaign_lasts_as_intended(live: Live) -> None:
    """The scenario the panels need happened: a run waited for the GPU, a run was resumed."""
    p, end = live.prometheus, live.end
    waited = p.instant(f"max_over_time(labkube_campaign_runs_waiting_for_gpus[{live.values['__range']}])", end)
    assert waited and float(waited[0]["value"][1]) >= 1
    resumes = p.instant("labkube_campaign_run_resumes_total", end)
    assert resumes and float(resumes[0]["value"][1]) >= 1
    assert 10 < end - live.start < 90, f"the campaign was scraped for {end - live.start:.0f} s"


@slow
def test_promtool_check_metrics_on_a_live_scrape(live: Live) -> None:
    assert live.scrapes, "the campaign's endpoint answered"
    richest = max(live.scrapes, key=len)
    for text in {live.scrapes[len(live.scrapes) // 2], richest, live.scrapes[-1]}:
        proc = promtool("check", "metrics", stdin=text)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
    exported = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", "\n".join(live.scrapes), re.M)}
    declared = {*RUN_METRICS, *CAMPAIGN_METRICS}
    assert declared <= exported, f"series the live campaign never exported: {declared - exported}"


@slow
@pytest.mark.parametrize(("name", "panel", "target"), PANEL_QUERIES)
def test_every_panel_query_returns_data(live: Live, name: str, panel: dict[str, Any], target: dict[str, Any]) -> None:
    expr = substitute(target["expr"], live.values)
    assert not re.search(r"\$\{?[A-Za-z_]", expr), expr  # every variable filled in (`$1`: label_replace's group)
    p = live.prometheus
    # Grafana runs the query either at the end of the time range or over it; either way it must parse.
    result = p.instant(expr, live.end) if target.get("instant") else p.range(expr, live.start, live.end)
    reason = pending_reason(target["expr"])
    if reason:
        pytest.skip(reason)
    assert has_finite_value(result), f"{name}: {panel['title']}: no data for {expr}"


@slow
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_template_variables_offer_the_campaigns_values(live: Live, name: str) -> None:
    """`label_values(selector, label)` as Grafana asks it (the series API), with the variables above it
    filled in, offers the value the panel test used."""
    raw = {"campaign": CAMPAIGN, "model": "oracle", "run_id": live.values["run_id"]}
    for var in variables(BOARDS[name]).values():
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
        assert m, var["query"]
        selector, label = substitute(m.group(1), live.values), m.group(2)
        found = {s.get(label) for s in live.prometheus.series(selector, live.start, live.end)}
        if pending_reason(m.group(1)):
            continue
        if label == "task":  # the tasks as the campaign names them: the paper task's path, the Gaia2 reference
            assert found and found <= {live.task, GAIA2_TASK}, found
            if name == "gaia2.json":
                assert found == {GAIA2_TASK}, found
        else:
            assert raw[label] in found, (var["name"], found)


@slow
@pytest.mark.parametrize("record", sorted(recording_rules()))
def test_recording_rules_evaluate(live: Live, record: str) -> None:
    assert has_finite_value(live.prometheus.instant(record, live.end)), f"{record} has no value"


@slow
def test_every_rule_evaluates_without_error(live: Live) -> None:
    groups = live.prometheus.api("rules")["groups"]
    rules = {r.get("name"): r for g in groups for r in g["rules"]}
    assert set(rules) == set(recording_rules()) | set(alerting_rules())
    broken = {name: r.get("lastError") for name, r in rules.items() if r.get("health") != "ok"}
    assert not broken, broken


@slow
def test_gaia2_panels_show_the_judges_verdicts(live: Live) -> None:
    """ARE's judge passes the oracle on both seeds: one series per run with the scenario's capability, value 1,
    and the pass-rate panel's query gives 1 for that capability."""
    passed = live.prometheus.instant("labkube_run_gaia2_passed", live.end)
    assert sorted((r["metric"]["task"], r["metric"]["capability"], r["value"][1]) for r in passed) == [
        (GAIA2_TASK, GAIA2_CAPABILITY, "1"),
        (GAIA2_TASK, GAIA2_CAPABILITY, "1"),
    ], passed
    assert len({r["metric"]["run_id"] for r in passed}) == 2
    (pass_rate,) = [t["expr"] for p, t in queries(BOARDS["gaia2.json"]) if p["title"] == "Pass rate by capability"]
    result = live.prometheus.instant(substitute(pass_rate, live.values), live.end)
    assert [(r["metric"]["capability"], r["value"][1]) for r in result] == [(GAIA2_CAPABILITY, "1")], result


@slow
def test_suspicious_alert_fires_in_prometheus(live: Live) -> None:
    firing = live.prometheus.instant('ALERTS{alertname="LabkubeRunIntegritySuspicious", alertstate="firing"}', live.end)
    assert [a["metric"]["run_id"] for a in firing] == [live.values["run_id"]]


DCGM_TEST = """
rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # The exporter scraped without honorLabels: its own pod is `pod`, the GPU's user is `exported_pod`.
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="0", pod="dcgm-exporter-x1", exported_pod="run-a-pod"}'
        values: '80 80'
      - series: 'DCGM_FI_DEV_FB_USED{gpu="0", pod="dcgm-exporter-x1", exported_pod="run-a-pod"}'
        values: '3380 3380'
      # With honorLabels: `pod` is the GPU's user.
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="1", pod="run-b-pod"}'
        values: '30 30'
      - series: 'DCGM_FI_DEV_FB_USED{gpu="1", pod="run-b-pod"}'
        values: '1024 1024'
      # Another workload's GPU: no run of ours.
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="2", pod="dcgm-exporter-x1", exported_pod="someone-else"}'
        values: '99 99'
      - series: 'DCGM_FI_DEV_FB_USED{gpu="2", pod="dcgm-exporter-x1", exported_pod="someone-else"}'
        values: '9000 9000'
      - series: 'labkube_run_steps_total{campaign="c", run_id="a", task="t", model="m", pod="run-a-pod"}'
        values: '3 4'
      - series: 'labkube_run_steps_total{campaign="c", run_id="b", task="t", model="m", pod="run-b-pod"}'
        values: '3 4'
    promql_expr_test:
"""


def test_dcgm_series_join_to_run_pods(tmp_path: Path) -> None:
    """Every dashboard query on DCGM's series, evaluated by promtool on exporter series of both label layouts
    (`pod` and `exported_pod`): each run gets its own GPU's value, in base units, and no other workload's."""
    values = {"campaign": "c", "task": ".*", "model": ".*", "run_id": "a"}
    tests = []
    for name, board in BOARDS.items():
        for panel, target in queries(board):
            if not any(series in target["expr"] for series in BUILD.DCGM_SERIES):
                continue
            expr = substitute(target["expr"], values)
            memory = "FB_USED" in expr
            per_run = "by (run_id)" in expr
            if per_run:
                samples = [
                    {"labels": '{run_id="a"}', "value": 3380 * 2**20 if memory else 0.8},
                    {"labels": '{run_id="b"}', "value": 1024 * 2**20 if memory else 0.3},
                ]
            else:  # the run detail: run a's one GPU
                samples = [{"labels": '{gpu="0"}', "value": 3380 * 2**20 if memory else 0.8}]
            tests.append((name, panel["title"], expr, samples))
    assert len(tests) == 4, [t[:2] for t in tests]  # utilisation and memory, on the overview and the run detail
    text = DCGM_TEST
    for _name, _title, expr, samples in tests:
        text += f"      - expr: '{expr.replace(chr(39), chr(39) * 2)}'\n        eval_time: 1m\n        exp_samples:\n"
        for s in samples:
            text += f"          - labels: '{s['labels']}'\n            value: {s['value']}\n"
    path = tmp_path / "dcgm_test.yaml"
    path.write_text(text)
    proc = promtool("test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr + text


def test_helpers_escape_and_substitute_like_grafana() -> None:
    assert grafana_regex_escape("a.b") == "a\\\\.b"
    assert grafana_regex_escape("/tmp/x-y_1") == "/tmp/x-y_1"
    values = {"task": "t", "run_id": "r", "__range": "5s"}
    assert substitute('x{a=~"$task", b="${run_id}"}[$__range]', values) == 'x{a=~"t", b="r"}[5s]'
    assert series_names('sum(rate(labkube_run_tokens_total{kind="a:b"}[5m])) / up') == {
        "labkube_run_tokens_total",
        "up",
    }
