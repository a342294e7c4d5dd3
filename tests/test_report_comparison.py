"""Scaffolds side by side (issue #16, "comparison"): `labkube report` as a table, JSON, CSV and HTML puts, per
task, one row per (model, scaffold) with the same columns, the scaffolds of one model adjacent.

The campaign is written with the real models and store layout: two bundled paper tasks, two models, and for
the first model three scaffolds (rg-agent, claude-code, codex), for the second rg-agent only; planted scores,
spend, GPUs and verdicts, so every number the report shows is known here.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from analyze_synth import write_run
from browser import Browser
from cli_helpers import labkube

from labkube.budgets import Budgets, Spend, StopReason, Usage
from labkube.campaign import CampaignSpec
from labkube.report import aggregate, comparison_order, report_rows
from labkube.result import RunResult, SubtaskScore
from labkube.results.html_report import render_report_html
from labkube.run_spec import RunPhase, RunSpec, make_run_id
from labkube.store import CampaignDir
from labkube.tasks import BUNDLED

TASKS = ["researchgym/continual-learning-lite", "researchgym/retrieval-ranking"]
GPT, OPUS = "openai:gpt-5", "anthropic:claude-opus-4-5"
BEAT = 0.5  # planted: a run "beat the baseline" when its score is above this (the report counts result.json's flag)


@dataclass(frozen=True)
class Plant:
    task: str
    model: str
    agent: str
    seed: int
    score: float
    tokens: int  # input; output is a fifth of it
    usd: float
    wall_s: float
    gpus: int = 1
    completion: float = 1.0
    verdict: str = "PASS"
    partial_calls: int = 0  # model calls whose answer did not say its usage: the tokens and dollars are lower bounds

    @property
    def run_id(self) -> str:
        return make_run_id(self.task, self.model, self.seed, self.agent)


PLANTS = [
    # continual-learning-lite: gpt-5 under three scaffolds, opus under rg-agent
    Plant(TASKS[0], GPT, "rg-agent", 0, 0.40, 10_000, 0.10, 1800),
    Plant(TASKS[0], GPT, "rg-agent", 1, 0.60, 12_000, 0.12, 3600),
    Plant(TASKS[0], GPT, "claude-code", 0, 0.70, 30_000, 0.50, 3600),
    Plant(TASKS[0], GPT, "claude-code", 1, 0.90, 34_000, 0.60, 7200, verdict="SUSPICIOUS"),
    Plant(TASKS[0], GPT, "codex", 0, 0.20, 8_000, 0.05, 900, completion=0.5),
    Plant(TASKS[0], GPT, "codex", 1, 0.30, 9_000, 0.07, 900, partial_calls=1),
    Plant(TASKS[0], OPUS, "rg-agent", 0, 0.55, 20_000, 0.80, 3600, gpus=2),
    Plant(TASKS[0], OPUS, "rg-agent", 1, 0.65, 22_000, 0.90, 3600, gpus=2),
    # retrieval-ranking: gpt-5 under rg-agent and codex only
    Plant(TASKS[1], GPT, "rg-agent", 0, 0.10, 5_000, 0.02, 600, gpus=0),
    Plant(TASKS[1], GPT, "rg-agent", 1, 0.80, 6_000, 0.03, 600, gpus=0),
    Plant(TASKS[1], GPT, "codex", 0, 0.95, 7_000, 0.04, 1200, gpus=0),
    Plant(TASKS[1], GPT, "codex", 1, 0.85, 7_500, 0.05, 1200, gpus=0),
]
SYSTEMS = [  # (task, model, scaffold) in the order every output must list them
    (TASKS[0], OPUS, "rg-agent"),
    (TASKS[0], GPT, "rg-agent"),
    (TASKS[0], GPT, "claude-code"),
    (TASKS[0], GPT, "codex"),
    (TASKS[1], GPT, "rg-agent"),
    (TASKS[1], GPT, "codex"),
]


def planted(task: str, model: str, agent: str) -> list[Plant]:
    return [p for p in PLANTS if (p.task, p.model, p.agent) == (task, model, agent)]


def expected(task: str, model: str, agent: str) -> dict[str, float | int]:
    runs = planted(task, model, agent)
    return {
        "runs": len(runs),
        "finished": len(runs),
        "errors": 0,
        "mean_score": statistics.fmean(p.score for p in runs),
        "best_score": max(p.score for p in runs),
        "beat_baseline": sum(p.score > BEAT for p in runs),
        "mean_completion": statistics.fmean(p.completion for p in runs),
        "tokens_total": sum(p.tokens + p.tokens // 5 for p in runs),
        "cost_usd": sum(p.usd for p in runs),
        "gpu_hours": sum(p.gpus * p.wall_s / 3600 for p in runs),
        "suspicious": sum(p.verdict == "SUSPICIOUS" for p in runs),
        "audited": len(runs),
        "spend_at_least": any(p.partial_calls for p in runs),
    }


def write_campaign(root: Path) -> Path:
    budgets = Budgets(wall_hours=2.0, usd=5.0)
    spec = CampaignSpec(
        name="scaffolds",
        tasks=TASKS,
        models=[GPT, OPUS],
        agents=["rg-agent", "claude-code", "codex"],
        seeds=2,
        budgets=budgets,
    )  # type: ignore[arg-type]
    cdir = CampaignDir(root)
    # Written in an order unlike the report's, so that the report's order is its own doing.
    order = sorted(PLANTS, key=lambda p: (p.agent != "codex", -p.seed, p.model))
    specs = [
        RunSpec(
            run_id=p.run_id,
            campaign="scaffolds",
            task=p.task,
            task_path=str(BUNDLED / p.task),
            model=p.model,
            agent=p.agent,  # type: ignore[arg-type]
            seed=p.seed,
            budgets=budgets,
            gpus=p.gpus,
        )
        for p in order
    ]
    cdir.write_campaign(spec, specs)
    for p, s in zip(order, specs, strict=True):
        result = RunResult(
            run_id=p.run_id,
            task=p.task,
            model=p.model,
            agent=p.agent,  # type: ignore[arg-type]
            seed=p.seed,
            status=RunPhase.finished,
            stop_reason=StopReason.done,
            score=p.score,
            beat_baseline=p.score > BEAT,
            completion=p.completion,
            subtasks=[SubtaskScore(id="primary", raw=p.score, fraction_of_sota=p.score)],
            spend=Spend(
                steps=10,
                usage=Usage(input=p.tokens, output=p.tokens // 5),
                usd=p.usd,
                wall_seconds=p.wall_s,
                partial_calls=p.partial_calls,
            ),
            integrity_verdict=p.verdict,
        )
        write_run(cdir, s, result, [])
    return root


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_campaign(tmp_path_factory.mktemp("scaffolds") / "camp")


def check_aggregate(got: dict, system: tuple[str, str, str]) -> None:
    want = expected(*system)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), (system, key, got[key], value)


# -- the report's data ------------------------------------------------------------------------------------------


def test_aggregates_are_one_row_per_task_model_and_scaffold_with_the_planted_numbers(campaign: Path) -> None:
    aggs = aggregate(report_rows(CampaignDir(campaign)))
    assert [(a.task, a.model, a.agent) for a in aggs] == SYSTEMS
    for a in aggs:
        check_aggregate(a.model_dump(), (a.task, a.model, a.agent))
    # the three scaffolds of gpt-5 on the first task really differ, as planted
    means = {a.agent: a.mean_score for a in aggs if a.task == TASKS[0] and a.model == GPT}
    assert means == pytest.approx({"rg-agent": 0.5, "claude-code": 0.8, "codex": 0.25})


def test_rows_keep_model_and_scaffold_apart_and_in_comparison_order(campaign: Path) -> None:
    rows = comparison_order(report_rows(CampaignDir(campaign)))
    assert [(r.task, r.model, r.agent, r.seed) for r in rows] == [
        (t, m, a, p.seed) for t, m, a in SYSTEMS for p in planted(t, m, a)
    ]
    codex = next(r for r in rows if r.agent == "codex")
    assert codex.model == GPT and codex.label == f"{GPT} (codex)"


# -- the CLI ----------------------------------------------------------------------------------------------------


def test_json_by_scaffold_is_the_comparison(campaign: Path) -> None:
    proc = labkube("report", str(campaign), "--format", "json", "--by", "scaffold", cwd=campaign.parent)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert [(g["task"], g["model"], g["agent"]) for g in got] == SYSTEMS
    for g in got:
        check_aggregate(g, (g["task"], g["model"], g["agent"]))


def test_json_by_run_has_a_scaffold_column_and_adjacent_scaffolds(campaign: Path) -> None:
    proc = labkube("report", str(campaign), "--format", "json", cwd=campaign.parent)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["task"], r["model"], r["agent"]) for r in rows] == [s for s in SYSTEMS for _p in planted(*s)]
    by_id = {p.run_id: p for p in PLANTS}
    for r in rows:
        p = by_id[r["run_id"]]
        assert r["score"] == p.score and r["gpu_hours"] == pytest.approx(p.gpus * p.wall_s / 3600)


def test_csv_by_scaffold_has_the_same_columns_for_every_system(campaign: Path) -> None:
    proc = labkube("report", str(campaign), "--format", "csv", "--by", "scaffold", cwd=campaign.parent)
    assert proc.returncode == 0, proc.stderr
    got = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(g["task"], g["model"], g["agent"]) for g in got] == SYSTEMS
    for g in got:
        want = expected(g["task"], g["model"], g["agent"])
        assert float(g["mean_score"]) == pytest.approx(want["mean_score"])
        assert float(g["gpu_hours"]) == pytest.approx(want["gpu_hours"])
        assert int(g["suspicious"]) == want["suspicious"] and int(g["tokens_total"]) == want["tokens_total"]
        assert g["spend_at_least"] == str(want["spend_at_least"])


def test_table_lists_each_system_once_with_its_mean(campaign: Path) -> None:
    proc = labkube("report", str(campaign), cwd=campaign.parent)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout[proc.stdout.index("Per task, model and scaffold") :]
    cells: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│ "):
            continue
        row = [c.strip() for c in line.strip().strip("│").split("│")]
        if row[3]:  # a system's first line
            cells.append(row)
        else:  # a long task or model name folded onto the next line
            cells[-1][:3] = [a + b for a, b in zip(cells[-1][:3], row[:3], strict=True)]
    task = ""
    for c in cells:
        task = c[0] = c[0] or task  # the task is named on its first system only
    assert [(c[0], c[1], c[2]) for c in cells] == SYSTEMS
    for c in cells:
        want = expected(c[0], c[1], c[2])
        assert c[4] == str(want["errors"]) and c[5] == "0"  # errors, then cancelled runs: none planted
        assert c[6] == f"{want['mean_score']:.3f}" and c[7] == f"{want['best_score']:.3f}"
        assert c[13] == f"{want['gpu_hours']:.2f}" and c[14] == f"{want['suspicious']}/{want['audited']}"


# -- the HTML report --------------------------------------------------------------------------------------------


class ComparisonTable(HTMLParser):
    """The rows of `table#comparison-table`: the row's data attributes, its task, and each `cmp-*` cell's text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.in_table = False
        self.task = ""
        self.cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table" and a.get("id") == "comparison-table":
            self.in_table = True
        if not self.in_table:
            return
        if tag == "tbody":
            self.task = a.get("data-task", "")
        elif tag == "tr" and "cmp-row" in a.get("class", ""):
            self.rows.append({"task": self.task, "model": a["data-model"], "scaffold": a["data-scaffold"]})
        elif tag == "td" and self.rows:
            self.cell = next((c for c in a.get("class", "").split() if c.startswith("cmp-")), None)
            if self.cell:
                self.rows[-1][self.cell] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.in_table:
            self.in_table = False
        if tag == "td":
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.in_table and self.cell and self.rows:
            self.rows[-1][self.cell] += data


def comparison_rows(html: str) -> list[dict[str, str]]:
    parser = ComparisonTable()
    parser.feed(html)
    return parser.rows


def test_html_report_has_a_per_task_comparison_with_the_planted_numbers(campaign: Path) -> None:
    rows = comparison_rows(render_report_html(campaign))
    assert [(r["task"], r["model"], r["scaffold"]) for r in rows] == SYSTEMS
    for r in rows:
        want = expected(r["task"], r["model"], r["scaffold"])
        assert r["cmp-mean"] == f"{want['mean_score']:.3f}" and r["cmp-best"] == f"{want['best_score']:.3f}"
        assert r["cmp-beat"] == f"{want['beat_baseline']}/{want['finished']}"
        bound = "≥" if want["spend_at_least"] else ""  # one codex run's answer did not say its usage
        assert r["cmp-tokens"] == f"{bound}{want['tokens_total']:,}" and r["cmp-gpu"] == f"{want['gpu_hours']:.2f}"
        assert r["cmp-cost"].startswith(f"{bound}$") and float(r["cmp-cost"].lstrip("≥$")) == pytest.approx(
            want["cost_usd"], abs=0.005
        )
        assert r["cmp-completion"] == f"{want['mean_completion']:.0%}"
        assert ("SUSPICIOUS" in r["cmp-integrity"]) == bool(want["suspicious"])


def test_html_report_leaves_suspicious_runs_out_of_the_comparison_when_asked(campaign: Path) -> None:
    rows = comparison_rows(render_report_html(campaign, exclude_suspicious=True))
    claude = next(r for r in rows if r["scaffold"] == "claude-code")
    assert claude["cmp-mean"] == "0.700" and "SUSPICIOUS" not in claude["cmp-integrity"]


@pytest.mark.slow
def test_comparison_table_renders_in_chromium(campaign: Path, browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_report_html(campaign), encoding="utf-8")
    assert [e for e in browser.open(page) if e.get("level") == "SEVERE"] == []
    shown = browser.js(
        "return [...document.querySelectorAll('#comparison-table tr.cmp-row')].map(r => {"
        " const b = r.getBoundingClientRect();"
        " return [r.dataset.model, r.dataset.scaffold, r.querySelector('.cmp-mean').innerText, b.width, b.height]; })"
    )
    assert [(m, a) for m, a, *_ in shown] == [(m, a) for _t, m, a in SYSTEMS]
    assert [mean for _m, _a, mean, _w, _h in shown] == [f"{expected(*s)['mean_score']:.3f}" for s in SYSTEMS]
    assert all(w > 600 and h > 10 for *_x, w, h in shown), shown
    # one task cell spans its systems' rows, and each links to the task's section
    spans = browser.js(
        "return [...document.querySelectorAll('#comparison-table tbody th')].map(th => [th.rowSpan, th.innerText,"
        " document.querySelector(th.querySelector('a').getAttribute('href')) !== null])"
    )
    assert spans == [[4, TASKS[0], True], [2, TASKS[1], True]]
    # the score plot of the first task has a row per system
    labels = browser.js(
        "return document.querySelector('#plot-task-researchgym-continual-learning-lite svg').textContent"
    )
    assert f"{GPT} (claude-code)" in labels and f"{GPT} (codex)" in labels
