"""`labkube analyze`: every number equals the one planted in a synthetic campaign (tests/analyze_synth.py),
every flag fires where planted and nowhere else, the three outputs are written, the page renders in headless
Chromium with every figure, and a real oracle campaign analyses without error."""

from __future__ import annotations

import json
import math
import statistics
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from analyze_synth import (
    BASELINE,
    GAIA2,
    GAIA2_MODEL,
    MODELS,
    OUTCOME_GAIA2,
    OUTCOME_PAPER,
    REASONING_PER_CALL,
    TARGET_R,
    Planted,
    expected_flags,
    write_gaia2_campaign,
    write_outcomes_campaign,
    write_paper_campaign,
)
from browser import Browser
from cli_helpers import BUNDLED_TASK, labkube

from labkube.result import Outcome
from labkube.results.analysis import analyze_campaigns, phase_of, read_transcript
from labkube.results.analysis_schema import FLAG_RULES, Analysis
from labkube.results.passk import pass_at_k, pass_hat_k

TOL = 1e-9  # exact quantities (sums, ratios of planted numbers) up to float rounding


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Planted]]:
    root = tmp_path_factory.mktemp("synth")
    runs = write_paper_campaign(root / "paper")
    write_gaia2_campaign(root / "gaia2")
    return root / "paper", root / "gaia2", runs


@pytest.fixture(scope="module")
def analysis(synth: tuple[Path, Path, list[Planted]]) -> Analysis:
    paper, gaia2, _ = synth
    return analyze_campaigns([paper, gaia2])


@pytest.fixture(scope="module")
def planted(synth: tuple[Path, Path, list[Planted]]) -> dict[str, Planted]:
    return {r.run_id: r for r in synth[2]}


# -- 1. capability and reliability -------------------------------------------------------------------------------


def test_group_stats_equal_the_planted_scores(analysis: Analysis, planted: dict[str, Planted]) -> None:
    assert {g.model for g in analysis.groups} == {"openai:gpt-5", "anthropic:claude-sonnet-4-5"}
    for g in analysis.groups:
        scores = [r.score for r in planted.values() if r.model == g.model]
        assert g.runs == len(scores) == 6
        assert g.best == pytest.approx(max(scores), abs=TOL)
        assert g.worst == pytest.approx(min(scores), abs=TOL)
        assert g.mean == pytest.approx(statistics.fmean(scores), abs=TOL)
        assert g.median == pytest.approx(statistics.median(scores), abs=TOL)
        assert g.spread == pytest.approx(max(scores) - min(scores), abs=TOL)
        assert g.mean_ci.low <= g.mean <= g.mean_ci.high
        assert g.completion_rate == pytest.approx(0.5)
        beats = sum(s > BASELINE for s in scores)
        assert g.beat_baseline == beats
        assert g.baseline == pytest.approx(BASELINE, abs=1e-12)
        assert [p.k for p in g.pass_k] == [1, 2, 6]
        for p in g.pass_k:
            assert p.pass_at_k == pytest.approx(pass_at_k(6, beats, p.k))
            assert p.pass_hat_k == pytest.approx(pass_hat_k(6, beats, p.k))
            assert p.pass_at_k_ci.low is not None and p.pass_at_k_ci.low <= p.pass_at_k_ci.high


# -- 2. efficiency -----------------------------------------------------------------------------------------------


def test_time_to_best_and_plateau_equal_the_planted_curves(analysis: Analysis, planted: dict[str, Planted]) -> None:
    assert len(analysis.efficiency) == len(planted)
    for e in analysis.efficiency:
        r = planted[e.run_id]
        t_best = r.best_frac * r.wall_s
        assert e.time_to_best_s == pytest.approx(t_best, abs=1e-6)
        assert e.last_improvement_s == pytest.approx(t_best, abs=1e-6)
        assert e.since_last_improvement_s == pytest.approx(r.wall_s - t_best, abs=1e-6)
        assert e.plateaued is (1 - r.best_frac >= 0.25)
        assert e.final_score == pytest.approx(r.score, abs=TOL)
    assert [planted[e.run_id].best_frac for e in analysis.efficiency if not e.plateaued] == [0.9]


# Worked by hand from tests/analyze_synth.py: grades every tenth of the run, the score rising linearly to the final
# score at best_frac of the run. At 25% of the one-hour wall budget (900 s) a 3600 s run's last grade is at 720 s,
# i.e. 0.2 of the run; at 50% (1800 s) it is 0.5; at 75% (2700 s) it is 0.7. The share is min(1, that / best_frac).
# Token and dollar spend stay under 25% of their budgets (at most 108,000 of 1,000,000 tokens, $0.90 of $10), so
# every grade counts there and the share is 1.
WALL_SHARES_BY_BEST_FRAC = {
    0.3: {"25%": 2 / 3, "50%": 1.0, "75%": 1.0},
    0.5: {"25%": 0.4, "50%": 1.0, "75%": 1.0},
    0.7: {"25%": 2 / 7, "50%": 5 / 7, "75%": 1.0},
    0.9: {"25%": 2 / 9, "50%": 5 / 9, "75%": 7 / 9},
}
ALL_REACHED = {"25%": 1.0, "50%": 1.0, "75%": 1.0}


def test_share_of_final_at_budget_fractions(analysis: Analysis, planted: dict[str, Planted]) -> None:
    assert len(analysis.efficiency) == len(planted) == 12
    for e in analysis.efficiency:
        r = planted[e.run_id]
        # the two early stops ran 1200 s: by 900 s they had reached their best (at 600 s)
        wall = ALL_REACHED if r.wall_s == 1200.0 else WALL_SHARES_BY_BEST_FRAC[r.best_frac]
        expected = {"wall": wall, "tokens": ALL_REACHED, "usd": ALL_REACHED}
        assert set(e.share_of_final) == set(expected), e.run_id
        for kind, row in expected.items():
            assert e.share_of_final[kind] == pytest.approx(row, abs=1e-9), (e.run_id, kind)
    shares_at_quarter = sorted(e.share_of_final["wall"]["25%"] or 0.0 for e in analysis.efficiency)
    assert shares_at_quarter == pytest.approx([2 / 9, 2 / 7] + [0.4] * 7 + [2 / 3] + [1.0] * 2, abs=1e-9)


# -- 3. behaviour ------------------------------------------------------------------------------------------------


def _ranks(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [statistics.fmean(i + 1 for i, v in enumerate(ordered) if v == x) for x in values]


def test_action_density_correlation_equals_the_planted_one(analysis: Analysis, planted: dict[str, Planted]) -> None:
    c = analysis.density_vs_score
    assert c.n == len(planted) == 12
    assert c.pearson == pytest.approx(TARGET_R, abs=1e-9)
    runs = sorted(planted.values(), key=lambda r: r.run_id)
    rho = float(np.corrcoef(_ranks([r.density for r in runs]), _ranks([r.score for r in runs]))[0, 1])
    assert c.spearman == pytest.approx(rho, abs=1e-9)
    z, se = math.atanh(TARGET_R), 1 / math.sqrt(12 - 3)
    assert c.pearson_ci.low == pytest.approx(math.tanh(z - 1.959963984540054 * se), abs=1e-9)
    assert c.pearson_ci.high == pytest.approx(math.tanh(z + 1.959963984540054 * se), abs=1e-9)
    assert c.spearman_ci.low < c.spearman < c.spearman_ci.high
    for b in analysis.behaviour:
        if b.run_id in planted:
            assert b.actions_per_hour == pytest.approx(planted[b.run_id].density, abs=1e-9)


def test_phases_are_thirds_of_the_steps() -> None:
    assert [phase_of(s, 9) for s in range(1, 10)] == ["start"] * 3 + ["ramp"] * 3 + ["steady"] * 3
    assert [phase_of(s, 4) for s in range(1, 5)] == ["start", "start", "ramp", "steady"]


def test_tool_mix_per_phase_equals_the_planted_one(analysis: Analysis, planted: dict[str, Planted]) -> None:
    by_id = {b.run_id: b for b in analysis.behaviour}
    clean = [r for r in planted.values() if not r.special and r.stop.value == "time"]
    assert clean
    for r in clean:
        k = r.tool_calls
        thirds = [sum((s - 1) * 3 // k == p for s in range(1, k + 1)) for p in range(3)]
        assert by_id[r.run_id].tool_mix == {
            "start": {"read_file": thirds[0]},
            "ramp": {"bash": thirds[1]},
            "steady": {"apply_patch": thirds[2]},
        }
    pooled = analysis.tool_mix
    assert sum(pooled["start"].values()) + sum(pooled["ramp"].values()) + sum(pooled["steady"].values()) == sum(
        r.tool_calls for r in planted.values()
    )
    assert set(pooled["start"]) == {"read_file"}


def test_reasoning_handoffs_and_async_jobs(analysis: Analysis, planted: dict[str, Planted]) -> None:
    by_id = {b.run_id: b for b in analysis.behaviour}
    for rid, r in planted.items():
        b = by_id[rid]
        assert b.tool_calls == r.tool_calls
        assert b.reasoning_tokens == REASONING_PER_CALL * r.tool_calls
        assert b.handoffs == (2 if "context" in r.special else 1 if "one_handoff" in r.special else 0)
        assert b.context_drops == (1 if "context" in r.special else 0)
        jobs = 2 if r.special & {"collapse", "overlap_ok", "sequential_jobs"} else 0
        assert b.async_jobs == jobs
        assert b.overlapping_job_pairs == (1 if r.special & {"collapse", "overlap_ok"} else 0)
        assert b.max_concurrent_jobs == (2 if r.special & {"collapse", "overlap_ok"} else min(jobs, 1))
    assert analysis.reasoning_vs_tool_calls.pearson is not None


# -- 4. flags ----------------------------------------------------------------------------------------------------


def test_flags_fire_where_planted_and_nowhere_else(analysis: Analysis, planted: dict[str, Planted]) -> None:
    assert {(f.kind, f.run_id) for f in analysis.flags} == expected_flags(list(planted.values()))
    assert len(analysis.flags) == len(expected_flags(list(planted.values())))


def test_each_flag_carries_its_rule_and_evidence(analysis: Analysis, planted: dict[str, Planted]) -> None:
    evidence = {(f.kind, "nan" in planted[f.run_id].special): f for f in analysis.flags}
    assert "loss=nan" in evidence[("silent_failure", True)].evidence
    assert "progress" in evidence[("silent_failure", True)].evidence
    assert "loss stays at 0.6931" in evidence[("silent_failure", False)].evidence
    assert "runs/log.txt" in evidence[("parallel_collapse", False)].evidence
    assert "end_task" in evidence[("early_stop", False)].evidence
    assert "context_drop of 6 messages" in evidence[("context_pressure", False)].evidence
    assert "SUSPICIOUS" in evidence[("integrity", False)].evidence
    for f in analysis.flags:
        assert f.heuristic and f.rule == FLAG_RULES[f.kind]
    assert all(f"flag.{k}" in analysis.rules for k in FLAG_RULES)


# -- 5. Gaia2 ----------------------------------------------------------------------------------------------------


def test_gaia2_pass_at_1_per_capability_and_scaffold(analysis: Analysis) -> None:
    got = {(c.capability, c.model): c.pass_at_1 for c in analysis.gaia2_capabilities}
    expected: dict[tuple[str, str], list[bool]] = {}
    for _scenario, caps, agent, _seed, passed, *_ in GAIA2:
        label = GAIA2_MODEL if agent == "rg-agent" else f"{GAIA2_MODEL} ({agent})"
        for cap in caps:
            expected.setdefault((cap, label), []).append(passed)
    assert got == pytest.approx({k: sum(v) / len(v) for k, v in expected.items()})
    assert len(analysis.gaia2) == len(GAIA2)
    row = next(r for r in analysis.gaia2 if r.run_id == "time_door_code--are-default--s1")
    assert (row.passed, row.cost_usd, row.simulated_seconds) == (False, 0.02, 200.0)
    # Gaia2 runs are pass/fail: no paper-task group, no early-stop flag without a baseline.
    assert all(not g.task.startswith("gaia2/") for g in analysis.groups)
    assert all(f.run_id not in {r.run_id for r in analysis.gaia2} for f in analysis.flags)


# -- streaming ---------------------------------------------------------------------------------------------------


def test_transcript_is_read_line_by_line(tmp_path: Path) -> None:
    """Peak memory stays small over a 40 MB transcript: nothing keeps its lines."""
    path = tmp_path / "transcript.jsonl"
    line = {"type": "tool_call", "step": 1, "ts": "2026-01-01T00:00:00+00:00", "tool": "bash", "output": "x" * 4000}
    with path.open("w") as fh:
        for step in range(1, 10_001):
            fh.write(json.dumps({**line, "step": step}) + "\n")
    tracemalloc.start()
    stats = read_transcript(path, 10_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert stats.tool_calls == 10_000
    assert peak < 2_000_000, f"peak {peak / 1e6:.1f} MB"


# -- the command and its outputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "md", "html"])
def test_each_format_writes_its_file(synth: tuple[Path, Path, list[Planted]], tmp_path: Path, fmt: str) -> None:
    paper, gaia2, _ = synth
    out = tmp_path / f"a.{fmt}"
    proc = labkube("analyze", str(paper), str(gaia2), "--format", fmt, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert f"written: {out}" in proc.stdout
    text = out.read_text()
    if fmt == "json":
        data = Analysis.model_validate_json(text)
        assert data.runs == 20 and data.figures
    elif fmt == "md":
        assert "## Failure-mode flags (heuristics)" in text and "parallel_collapse" in text
    else:
        assert text.startswith("<!DOCTYPE html>")
        for needle in ('src="http', 'href="http', "@import", "url(http", "<script src", '<link rel="stylesheet'):
            assert needle not in text  # self-contained: nothing fetched


def test_not_a_campaign_is_a_one_line_error(tmp_path: Path) -> None:
    proc = labkube("analyze", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "not a campaign directory" in proc.stderr and "labkube run" in proc.stderr


def test_empty_campaign_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "camp").mkdir()
    (tmp_path / "camp" / "campaign.json").write_text(json.dumps({"spec": {"tasks": ["x"]}, "runs": []}))
    proc = labkube("analyze", str(tmp_path / "camp"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no runs yet" in proc.stderr


@pytest.mark.slow
def test_page_renders_in_chromium_with_every_figure(
    synth: tuple[Path, Path, list[Planted]], analysis: Analysis, browser: Browser, tmp_path: Path
) -> None:
    from labkube.results.analysis_html import render_analysis_html

    page = tmp_path / "analysis.html"
    page.write_text(render_analysis_html(analysis), encoding="utf-8")
    console = browser.open(page)
    assert [e for e in console if e.get("level") == "SEVERE"] == []
    # one task: scores and curves; behaviour: tool mix, density, reasoning; Gaia2: capabilities, cost/time
    assert len(analysis.figures) == 7
    figures = browser.js("return [...document.querySelectorAll('figure')].map(f => f.id)")
    assert figures == [f"fig-{f.id}" for f in analysis.figures]
    assert browser.js("return document.querySelectorAll('figure > svg').length") == len(analysis.figures)
    captions = browser.js("return [...document.querySelectorAll('figure > figcaption')].map(c => c.textContent)")
    assert captions == [f.caption for f in analysis.figures]
    heights = browser.js(
        "return [...document.querySelectorAll('figure > svg')].map(s => s.getBoundingClientRect().height)"
    )
    assert all(h > 100 for h in heights)
    assert browser.js("return document.querySelectorAll('#flags-table tr.flag-row').length") == len(analysis.flags)
    shot = browser.screenshot(tmp_path / "analysis.png", full_page_height=6000)  # the test's artefact
    assert shot.stat().st_size > 20_000


# -- the demo campaign: a real oracle run --------------------------------------------------------------------------


@pytest.mark.slow
def test_oracle_campaigns_analyse_without_error(tmp_path: Path) -> None:
    """A real paper-task campaign and a real Gaia2 campaign (oracle model), analysed pooled, in every format."""
    paper, gaia2 = tmp_path / "paper", tmp_path / "gaia2"
    runs = [
        ("run", BUNDLED_TASK, "--model", "oracle", "--seeds", "2", "--grade-interval", "1", "--out", str(paper)),
        ("run", "gaia2/execution_budget_email", "gaia2/time_door_code", "--model", "oracle", "--out", str(gaia2)),
    ]
    for args in runs:
        proc = labkube(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
    for fmt in ("json", "md", "html"):
        proc = labkube("analyze", str(paper), str(gaia2), "--format", fmt, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert (paper / f"analysis.{fmt}").is_file()
    data = Analysis.model_validate_json((paper / "analysis.json").read_text())
    assert data.runs == 4 and data.groups[0].beat_baseline == 2
    assert data.flags == []
    assert all(b.tool_calls > 0 for b in data.behaviour if b.run_id.startswith("continual"))
    assert {(c.capability, c.pass_at_1) for c in data.gaia2_capabilities} == {("execution", 1.0), ("time", 1.0)}
    assert all(r.simulated_seconds and r.simulated_seconds > 0 for r in data.gaia2)


def test_unfinished_runs_are_skipped_and_listed(tmp_path: Path) -> None:
    write_gaia2_campaign(tmp_path / "g")
    (tmp_path / "g" / "runs" / "time_door_code--rg-agent--s0" / "result.json").unlink()
    a = analyze_campaigns([tmp_path / "g"])
    assert a.runs == len(GAIA2) - 1 and a.skipped == ["time_door_code--rg-agent--s0"]


def test_torn_and_odd_transcript_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "transcript.jsonl"
    good = {"type": "tool_call", "step": 1, "ts": "2026-01-01T00:00:00+00:00", "tool": "bash", "output": "ok"}
    odd = {"type": "tool_call", "step": "x", "tool": "bash"}
    path.write_text("\n".join([json.dumps(good), "[1, 2]", json.dumps(odd), '{"type": "tool_ca']) + "\n")
    stats = read_transcript(path, 1)
    assert stats.tool_calls == 1 and stats.mix["start"] == {"bash": 1}


# -- outcomes: error outcomes are left out and counted, a run without a value is never 0 -------------------------


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outcomes") / "outcomes"
    write_outcomes_campaign(root)
    return root


def _cli_json(*args: str, cwd: Path) -> tuple[object, str]:
    proc = labkube(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout), proc.stdout


def _analyze_json(campaign: Path, tmp: Path, *extra: str) -> tuple[Analysis, str]:
    out = tmp / "analysis.json"
    proc = labkube("analyze", str(campaign), "--format", "json", "--out", str(out), *extra, cwd=tmp)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return Analysis.model_validate_json(out.read_text()), proc.stdout


def test_a_run_without_a_value_shows_the_same_in_report_and_analyze(outcomes: Path, tmp_path: Path) -> None:
    """The same run shows the same value in `report --format json` and `analyze` JSON: a do-nothing run has no
    score (null) in both, never 0.000 with an interval of [0.00, 0.00]; per model the statistics over seeds agree."""
    analysis, _ = _analyze_json(outcomes, tmp_path)
    per_run, _ = _cli_json("report", str(outcomes), "--format", "json", cwd=tmp_path)
    by_run = {r["run_id"]: r for r in per_run}  # type: ignore[union-attr]
    no_value = [p.run_id for p in OUTCOME_PAPER if p.outcome is Outcome.no_value]
    assert len(no_value) == 3
    for run_id in no_value:
        assert by_run[run_id]["outcome"] == "no_value"
        assert by_run[run_id]["score"] is None and by_run[run_id]["beat_baseline"] is None
    efficiency = {e.run_id: e for e in analysis.efficiency}
    behaviour = {b.run_id: b for b in analysis.behaviour}
    assert set(no_value) <= set(efficiency)
    for run_id, e in efficiency.items():
        assert e.final_score == by_run[run_id]["score"], run_id
        assert behaviour[run_id].score == by_run[run_id]["score"], run_id
    for run_id in no_value:
        e = efficiency[run_id]
        assert (e.best_score, e.time_to_best_s, e.plateaued) == (None, None, None)
        assert all(v is None for row in e.share_of_final.values() for v in row.values())
    do_nothing = next(g for g in analysis.groups if g.model == MODELS[1])
    assert (do_nothing.runs, do_nothing.scored, do_nothing.no_value) == (1, 0, 1)
    assert (do_nothing.mean, do_nothing.best, do_nothing.mean_ci.low, do_nothing.mean_ci.high) == (None,) * 4
    per_system, _ = _cli_json("report", str(outcomes), "--format", "json", "--by", "scaffold", cwd=tmp_path)
    aggregates = {(a["task"], a["model"]): a for a in per_system}  # type: ignore[union-attr]
    assert analysis.groups
    for g in analysis.groups:
        agg = aggregates[(g.task, g.model)]
        assert (agg["finished"], agg["errors"], agg["beat_baseline"]) == (g.runs, g.errors, g.beat_baseline)
        assert (agg["mean_score"], agg["best_score"]) == (g.mean, g.best)
        assert agg["mean_completion"] == g.completion_rate


def test_error_outcomes_are_left_out_of_every_number_and_counted(outcomes: Path) -> None:
    a = analyze_campaigns([outcomes])
    planted_errors = {p.run_id: p.outcome.value for p in OUTCOME_PAPER if p.is_error}
    planted_errors |= {f"oc-time_door_code--s{seed}": o.value for seed, o, _ in OUTCOME_GAIA2 if o.is_error}
    assert {e.run_id: e.outcome for e in a.errors} == planted_errors
    grader = next(e for e in a.errors if e.outcome == "grader_error")
    assert grader.error == "ModuleNotFoundError: No module named 'sklearn'"  # the failing step's last line
    measured = [p for p in OUTCOME_PAPER if not p.is_error]
    assert a.runs == len(measured) + sum(not o.is_error for _, o, _ in OUTCOME_GAIA2)
    left_out = set(planted_errors)
    assert not left_out & {e.run_id for e in a.efficiency}
    assert not left_out & {b.run_id for b in a.behaviour}
    assert not left_out & {f.run_id for f in a.flags}
    g = next(g for g in a.groups if g.model == MODELS[0])
    mine = [p for p in measured if p.model == MODELS[0]]
    values = [p.score for p in mine if p.score is not None]
    assert (g.runs, g.scored, g.no_value, g.errors) == (len(mine), len(values), len(mine) - len(values), 2)
    assert g.mean == pytest.approx(statistics.fmean(values), abs=TOL)
    assert (g.best, g.worst) == (max(values), min(values))
    assert g.mean_no_value_as_zero == pytest.approx(sum(values) / len(mine), abs=TOL)
    beats = sum(v > BASELINE for v in values)
    assert g.beat_baseline == beats
    assert g.pass_k[0].pass_at_k == pytest.approx(pass_at_k(len(mine), beats, 1))  # no value = not passing
    assert g.completion_rate == pytest.approx(len(values) / len(mine))


def test_gaia2_judge_and_world_errors_are_neither_pass_nor_fail(outcomes: Path) -> None:
    """As in `labkube report`'s capability table (its own function): left out of pass@k and counted."""
    from labkube.results.passk import capability_scores
    from labkube.results.report_cli import gaia2_attempts
    from labkube.store import CampaignDir

    (cap,) = analyze_campaigns([outcomes]).gaia2_capabilities
    passes = [passed for _, o, passed in OUTCOME_GAIA2 if not o.is_error]
    assert (cap.capability, cap.scenarios, cap.excluded) == ("time", 1, 2)
    assert cap.pass_at_1 == pytest.approx(sum(passes) / len(passes))
    (reported,) = capability_scores(gaia2_attempts(CampaignDir(outcomes)))
    assert (reported.pass_at_1, reported.pass_at_k, reported.excluded) == (cap.pass_at_1, cap.pass_at_k, cap.excluded)


def test_exclude_suspicious_leaves_out_what_report_leaves_out(outcomes: Path, tmp_path: Path) -> None:
    analysis, stdout = _analyze_json(outcomes, tmp_path, "--exclude-suspicious")
    suspicious = [p.run_id for p in OUTCOME_PAPER if p.verdict == "SUSPICIOUS"]
    assert analysis.excluded_suspicious == suspicious
    assert not {f.run_id for f in analysis.flags} & set(suspicious)
    assert "left out: 4 runs that ended in an error outcome (1 grader_error, 1 judge_error, 1 setup_error, " in stdout
    assert "left out: 1 SUSPICIOUS runs" in stdout
    args = ("report", str(outcomes), "--format", "json", "--by", "scaffold", "--exclude-suspicious")
    per_system, _ = _cli_json(*args, cwd=tmp_path)
    agg = next(a for a in per_system if a["model"] == MODELS[0] and not a["task"].startswith("gaia2"))  # type: ignore[union-attr]
    g = next(g for g in analysis.groups if g.model == MODELS[0])
    assert (agg["finished"], agg["mean_score"], agg["best_score"]) == (g.runs, g.mean, g.best)
    assert g.best == 0.6  # the SUSPICIOUS 0.9 is out


def test_a_run_without_a_value_that_claims_success_is_flagged(outcomes: Path) -> None:
    flags = {(f.kind, f.run_id): f for f in analyze_campaigns([outcomes]).flags}
    silent, early = flags[("silent_failure", "oc--gpt5--s2")], flags[("early_stop", "oc--gpt5--s2")]
    assert "training works and accuracy improved" in silent.evidence and "gave no value" in silent.evidence
    assert "score no value < baseline" in early.evidence
    assert not [k for k in flags if k[1] == "oc--gpt5--s3"]  # no value, but no claim and no early stop


def test_markdown_and_html_label_what_is_left_out_and_what_counts_as_zero(outcomes: Path) -> None:
    from labkube.results.analysis_html import render_analysis_html
    from labkube.results.analysis_md import render_markdown

    a = analyze_campaigns([outcomes])
    md = render_markdown(a)
    assert "| no value | errors (left out) |" in md and "| mean, no value = 0 |" in md
    do_nothing = next(line for line in md.splitlines() if f"| {MODELS[1]} |" in line)
    assert "| 1 | 1 | 0 | 0 | — | — — |" in do_nothing and "[0.00, 0.00]" not in do_nothing
    assert "- oc--gpt5--s4: `grader_error`: ModuleNotFoundError" in md
    assert "| time | openai:gpt-5 | 1 | 0.50 | 1.00 | 0.00 | 2 |" in md
    html = render_analysis_html(a)
    assert html.count('<tr class="left-out">') == len(a.errors) == 4
    assert '<th class="num">mean, no value = 0</th>' in html
    assert "excluded (error or no verdict)" in html
