"""The HTML outputs: the campaign report and the trajectory viewer, rendered from a real campaign and opened in
headless Chromium (console errors, key elements, a screenshot of each page).

Set LABKUBE_HTML_ARTIFACTS=<dir> to keep the rendered pages and screenshots there.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from browser import Browser
from cli_helpers import BUNDLED_TASK, labkube

from labkube.results.html_report import CapabilityScore, render_gaia2_section, render_report_html
from labkube.results.trajectory_view import build_flags, build_trajectory, read_transcript, render_run_html
from labkube.store import CampaignDir, StoreError

pytestmark = pytest.mark.slow

GAIA_IDS = ["demo-sum-sales", "demo-warmest-city"]  # levels 1 and 2
MODELS = ["oracle", "cheat:read-labels"]
WRONG_ANSWER = "steps:\n  - tool: end_task\n    args: {summary: 'FINAL ANSWER: wrong'}\n"
SEEDS = 2


# -- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real campaign: a paper task and two GAIA questions, a reference model and a cheat, two seeds.

    On the GAIA questions (a copy of the bundled dataset) the "cheat" answers wrongly. Runs that fail before
    their first step are covered by `test_run_without_a_transcript_still_renders` with synthetic run directories.
    """
    from labkube.tasks import BUNDLED

    work = tmp_path_factory.mktemp("html")
    dataset = work / "gaia-demo"
    shutil.copytree(BUNDLED / "gaia" / "demo", dataset)
    (dataset / "oracle" / "cheats").mkdir(parents=True)
    (dataset / "oracle" / "cheats" / "read-labels.yaml").write_text(WRONG_ANSWER)
    out = work / "camp"
    questions = [f"{dataset}#{q}" for q in GAIA_IDS]
    args = ["run", BUNDLED_TASK, *questions, "--seeds", str(SEEDS), "--grade-interval", "1", "--out", str(out)]
    for model in MODELS:
        args += ["--model", model]
    proc = labkube(*args, cwd=work, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr + proc.stdout
    cdir = CampaignDir(out)
    assert len(cdir.run_ids()) == (1 + len(GAIA_IDS)) * len(MODELS) * SEEDS
    assert all(cdir.is_finished(r) for r in cdir.run_ids()), proc.stdout
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = os.environ.get("LABKUBE_HTML_ARTIFACTS")
    path = Path(keep) if keep else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def severe(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("level") == "SEVERE"]


def check_png(path: Path) -> None:
    """A real, non-blank PNG."""
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 600
    with Image.open(path) as im:
        colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 50, "the screenshot is (nearly) blank"


def run_dir(campaign: Path, task_part: str, model: str, seed: int = 0) -> Path:
    return next(
        p for p in sorted((campaign / "runs").iterdir()) if task_part in p.name and f"--{model}--s{seed}" in p.name
    )


# -- the campaign report ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report_page(campaign: Path, artifacts: Path) -> Path:
    started = time.monotonic()
    html = render_report_html(campaign)
    print(f"render_report_html: {time.monotonic() - started:.2f} s, {len(html) / 1024:.0f} KiB")
    page = artifacts / "report.html"
    page.write_text(html, encoding="utf-8")
    return page


def test_report_is_self_contained(report_page: Path) -> None:
    html = report_page.read_text()
    for needle in (
        'src="http',
        "src='http",
        'href="http',
        "href='http",
        "@import",
        "url(http",
        "<script src",
        '<link rel="stylesheet',
    ):
        assert needle not in html
    assert len(html) < 1_500_000


def test_report_opens_in_chromium_with_tables_and_plots(
    report_page: Path, campaign: Path, browser: Browser, artifacts: Path
) -> None:
    assert severe(browser.open(report_page)) == []
    assert browser.js("return performance.getEntriesByType('resource').length") == 0, "the page fetched something"
    runs = len(CampaignDir(campaign).run_ids())
    assert browser.js("return document.querySelectorAll('#runs-table tbody tr.run-row').length") == runs
    # One aggregate row per model for the paper task, one GAIA row per model.
    assert browser.js("return document.querySelectorAll('table.aggregates tr.agg-row').length") == len(MODELS)
    assert browser.js("return document.querySelectorAll('table.gaia-levels tr.gaia-row').length") == len(MODELS)
    # The comparison: the paper task once, a row per model (one scaffold here), the same means as its section.
    compared = browser.js(
        "return [...document.querySelectorAll('#comparison-table tr.cmp-row')].map(r => [r.dataset.model,"
        " r.dataset.scaffold, r.querySelector('.cmp-mean').innerText, r.getBoundingClientRect().height])"
    )
    assert sorted(m for m, *_ in compared) == sorted(MODELS) and {a for _m, a, *_ in compared} == {"rg-agent"}
    section_means = browser.js(
        "return [...document.querySelectorAll('table.aggregates tr.agg-row')]"
        ".map(r => r.querySelector('.agg-mean').innerText)"
    )
    assert [mean for _m, _a, mean, _h in compared] == section_means and all(h > 10 for *_x, h in compared)
    # The score plot is drawn, with one line per oracle seed on each axis, and the reference lines are labelled.
    size = browser.js(
        "const r = document.querySelector('.score-plot svg').getBoundingClientRect(); return [r.width, r.height]"
    )
    assert size[0] > 500 and size[1] > 200
    oracle_lines = browser.js(
        'return document.querySelectorAll(\'.score-plot g[id^="curve-time-"][id*="oracle"]\').length'
    )
    assert oracle_lines == SEEDS
    legend = browser.js("return document.querySelector('.score-plot svg').textContent")
    assert "baseline" in legend and "SOTA" in legend and "seed 0" in legend
    # GAIA: a bar per model and level with a finished run; the oracle passes both levels.
    assert browser.js("return document.querySelectorAll('.gaia-plot g[id^=\"gaia-bar-oracle\"]').length") == 2
    oracle_row = browser.js(
        "return [...document.querySelectorAll('tr.gaia-row')].find(r => r.textContent.includes('oracle')).textContent"
    )
    assert "100%" in oracle_row
    # The cheat's paper-task runs carry their integrity verdict beside the score.
    cheat_rows = browser.js(
        "return [...document.querySelectorAll('tr.run-row')].filter(r => r.textContent.includes('cheat:read-labels')"
        " && r.textContent.includes('continual')).map(r => r.textContent)"
    )
    assert len(cheat_rows) == SEEDS and all("SUSPICIOUS" in r for r in cheat_rows)
    check_png(browser.screenshot(artifacts / "report.png", full_page_height=4000))


def test_report_can_leave_out_suspicious_runs(campaign: Path) -> None:
    html = render_report_html(campaign, exclude_suspicious=True)
    assert 'id="excluded-note"' in html
    assert html.count('class="run-row') == len(CampaignDir(campaign).run_ids()) - SEEDS


def test_report_of_a_directory_that_is_not_a_campaign_says_so(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a campaign directory"):
        render_report_html(tmp_path)


# -- Gaia2 hook ------------------------------------------------------------------------------------------------

GAIA2 = [
    CapabilityScore(capability=cap, model=model, pass_at_1=p1, pass_at_k=pk, pass_hat_k=ph, k=3, scenarios=20)
    for model, scale in (("gpt-x", 1.0), ("claude-y", 0.8))
    for cap, p1, pk, ph in (
        ("execution", 0.6 * scale, 0.8 * scale, 0.4 * scale),
        ("search", 0.5 * scale, 0.7 * scale, 0.3 * scale),
        ("adaptability", 0.3 * scale, 0.45 * scale, 0.15 * scale),
        ("time", 0.2 * scale, 0.35 * scale, 0.1 * scale),
        ("ambiguity", 0.25 * scale, 0.4 * scale, 0.05 * scale),
    )
]


def test_gaia2_section_is_empty_without_data() -> None:
    assert render_gaia2_section([]) == ""


def test_gaia2_section_draws_a_bar_per_capability_model_and_metric(
    campaign: Path, browser: Browser, artifacts: Path
) -> None:
    page = artifacts / "report-gaia2.html"
    page.write_text(render_report_html(campaign, gaia2=GAIA2), encoding="utf-8")
    assert severe(browser.open(page)) == []
    assert browser.js("return document.querySelectorAll('#gaia2-plot g[id^=\"gaia2-\"]').length") == len(GAIA2) * 3
    assert browser.js("return document.querySelectorAll('#gaia2-table tbody tr').length") == len(GAIA2)
    browser.js("document.getElementById('gaia2').scrollIntoView()")
    check_png(browser.screenshot(artifacts / "report-gaia2.png"))


# -- the trajectory viewer -------------------------------------------------------------------------------------


def test_run_page_links_integrity_flags_to_their_steps(campaign: Path, browser: Browser, artifacts: Path) -> None:
    rd = run_dir(campaign, "continual", "cheat-read-labels")
    integrity = json.loads((rd / "integrity.json").read_text())
    assert integrity["verdict"] == "SUSPICIOUS"
    page = artifacts / "run-cheat.html"
    page.write_text(render_run_html(rd), encoding="utf-8")
    assert severe(browser.open(page)) == []
    links = browser.js("return [...document.querySelectorAll('a.flag-step')].map(a => a.getAttribute('href'))")
    assert links and len(links) >= len([v for v in integrity["violations"] if v["step"] is not None])
    for href in links:
        assert (
            browser.js("const el = document.getElementById(arguments[0]); return el && el.tagName", href[1:])
            == "SECTION"
        )
    # Following a flag opens the step's tool calls; the step links back to the flag.
    browser.driver.find_element("css selector", "a.flag-step").click()
    target = links[0][1:]
    assert browser.js(f"return document.querySelectorAll('#{target} details.call[open]').length") >= 1
    assert browser.js(f"return document.querySelectorAll('#{target} a[href^=\"#flag-\"]').length") >= 1
    assert severe(browser.console()) == []
    check_png(browser.screenshot(artifacts / "run-cheat.png"))


def test_flag_naming_only_a_file_points_at_the_step_that_touched_it(campaign: Path) -> None:
    from labkube.integrity_report import IntegrityReport, Severity, Verdict, Violation, ViolationType

    rd = run_dir(campaign, "continual", "cheat-read-labels")
    trajectory = build_trajectory(read_transcript(rd / "transcript.jsonl"))
    writes = [
        step
        for step, rec in trajectory.tool_calls
        if rec["tool"] == "bash" and "labels_copy.npz" in rec["args"].get("command", "")
    ]
    assert writes, "the read-labels cheat copies the held-out labels to labels_copy.npz"
    report = IntegrityReport(
        verdict=Verdict.SUSPICIOUS,
        violations=[Violation(type=ViolationType.heldout_read, severity=Severity.high, file="labels_copy.npz")],
    )
    (flag,) = build_flags(report, trajectory)
    assert flag.steps == writes and flag.via_file


def test_oracle_run_page_shows_steps_score_curve_and_costs(campaign: Path, browser: Browser, artifacts: Path) -> None:
    rd = run_dir(campaign, "continual", "oracle")
    result = json.loads((rd / "result.json").read_text())
    page = artifacts / "run-oracle.html"
    page.write_text(render_run_html(rd), encoding="utf-8")
    assert severe(browser.open(page)) == []
    assert browser.js("return document.querySelectorAll('section.step').length") == result["spend"]["steps"]
    assert browser.js("return document.querySelectorAll('#score-plot g#grade-points a').length") >= 1
    stats = browser.js("return document.querySelector('section.step .stats').textContent")
    assert "in " in stats and "out " in stats and "$" in stats
    # The tool calls are folded until asked for.
    assert browser.js("return document.querySelectorAll('details.call[open]').length") == 0
    browser.driver.find_element("id", "expand-all").click()
    assert browser.js("return document.querySelectorAll('details.call:not([open])').length") == 0
    check_png(browser.screenshot(artifacts / "run-oracle.png", full_page_height=2400))


@pytest.mark.parametrize("state", ["failed", "pending"])
def test_run_without_a_transcript_still_renders(
    state: str, campaign: Path, tmp_path: Path, browser: Browser, artifacts: Path
) -> None:
    """A run that failed before its first step (a result, a log, no transcript), or one that never started."""
    from labkube.result import RunResult
    from labkube.run_spec import RunPhase
    from labkube.store import write_model

    src = run_dir(campaign, "continual", "oracle")
    rd = tmp_path / "runs" / src.name
    rd.mkdir(parents=True)
    shutil.copy(src / "run.json", rd / "run.json")
    if state == "failed":
        spec = json.loads((src / "run.json").read_text())
        result = RunResult(
            run_id=spec["run_id"],
            task=spec["task"],
            model=spec["model"],
            seed=spec["seed"],
            status=RunPhase.failed,
            stop_reason="error",
            error="sandbox failed to start: workspace copy: No space left on device",
        )
        write_model(rd / "result.json", result)
        (rd / "logs").mkdir()
        (rd / "logs" / "agent.stderr").write_text("Traceback (most recent call last):\nOSError: No space left\n")
    page = artifacts / f"run-no-transcript-{state}.html"
    page.write_text(render_run_html(rd), encoding="utf-8")
    assert severe(browser.open(page)) == []
    assert browser.js("return !!document.getElementById('no-transcript')")
    assert browser.js("return document.querySelectorAll('section.step').length") == 0
    text = browser.js("return document.body.textContent")
    if state == "failed":
        assert "No space left on device" in text and "OSError: No space left" in text
        check_png(browser.screenshot(artifacts / "run-no-transcript.png"))


def test_run_page_of_a_directory_that_is_not_a_run_says_so(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a run directory"):
        render_run_html(tmp_path)


# -- long runs -------------------------------------------------------------------------------------------------

LONG_STEPS = 3000
HANDOFF_EVERY = 700
FLAGGED_STEP = 2345


def write_long_run(src: Path, dest: Path) -> None:
    """A synthetic run of LONG_STEPS steps (real run.json from `src`) with thinking, hand-offs, a budget stop,
    very long tool outputs and an integrity flag deep in the run."""
    dest.mkdir(parents=True)
    shutil.copy(src / "run.json", dest / "run.json")
    lines = [{"type": "start", "ts": "t", "run_id": dest.name, "step": 0, "model": "openai:gpt-x", "seed": 0}]
    curve = []
    for step in range(1, LONG_STEPS + 1):
        if step % HANDOFF_EVERY == 0:
            lines.append(
                {
                    "type": "model_call",
                    "purpose": "handoff",
                    "step": step,
                    "model": "gpt-x",
                    "message": {"role": "assistant", "content": f"Summary before step {step}: tried replay."},
                    "usage": {"input": 90_000, "output": 800},
                    "cost_usd": 0.12,
                    "duration_s": 4.0,
                }
            )
            lines.append({"type": "handoff", "ts": "t", "n": step // HANDOFF_EVERY, "summary": "tried replay"})
        output = "epoch loss\n" * (4000 if step % 500 == 0 else 3)
        lines.append(
            {
                "type": "model_call",
                "purpose": "step",
                "step": step,
                "model": "gpt-x",
                "message": {
                    "role": "assistant",
                    "content": f"Step {step}: run the next experiment.",
                    "thinking": "The <b>loss</b> plateaued; try a smaller learning rate. " * 3,
                    "tool_calls": [{"id": f"c{step}", "name": "bash", "arguments": {"command": "ls"}}],
                },
                "usage": {"input": 2000 + step, "output": 120, "reasoning": 64},
                "cost_usd": 0.004,
                "duration_s": 1.5,
            }
        )
        lines.append(
            {
                "type": "tool_call",
                "step": step,
                "call_id": f"c{step}",
                "tool": "bash",
                "args": {"command": f"python train.py --run {step}"},
                "ok": step % 97 != 0,
                "output": output,
                "duration_s": 2.0,
            }
        )
        if step % 100 == 0:
            score = min(0.9, step / LONG_STEPS)
            grade = {
                "at_seconds": step * 3.5,
                "step": step,
                "tokens": step * 2200,
                "usd": step * 0.004,
                "subtasks": [],
                "score": score,
                "error": None,
            }
            lines.append({"type": "grade", "ts": "t", **grade})
            curve.append(grade)
    lines.append({"type": "budget_stop", "ts": "t", "reason": "usd", "detail": "usd budget exhausted: 12.1 of 12"})
    with (dest / "transcript.jsonl").open("w") as fh:
        for rec in lines:
            fh.write(json.dumps(rec) + "\n")
    result = json.loads((src / "result.json").read_text())
    result.update(run_id=dest.name, stop_reason="usd", score_curve=curve, score=curve[-1]["score"])
    result["spend"] = {
        "steps": LONG_STEPS,
        "usage": {"input": 6_000_000, "output": 360_000, "reasoning": 192_000, "cached": 0},
        "usd": 12.1,
        "wall_seconds": LONG_STEPS * 3.5,
    }
    (dest / "result.json").write_text(json.dumps(result))
    (dest / "integrity.json").write_text(
        json.dumps(
            {
                "verdict": "NEEDS_REVIEW",
                "confidence": 0.6,
                "checks_run": ["heldout_reads"],
                "violations": [
                    {
                        "type": "heldout_read",
                        "severity": "medium",
                        "step": FLAGGED_STEP,
                        "evidence": f"step {FLAGGED_STEP}: bash read data/heldout",
                    }
                ],
            }
        )
    )


def test_long_run_renders_fast_and_folds_long_outputs(
    campaign: Path, tmp_path: Path, browser: Browser, artifacts: Path
) -> None:
    rd = tmp_path / "runs" / "long--gpt-x--s0"
    write_long_run(run_dir(campaign, "continual", "oracle"), rd)
    started = time.monotonic()
    html = render_run_html(rd)
    rendered = time.monotonic() - started
    print(f"render_run_html ({LONG_STEPS} steps): {rendered:.2f} s, {len(html) / 1e6:.1f} MB")
    assert rendered < 15
    page = artifacts / "run-long.html"
    page.write_text(html, encoding="utf-8")
    started = time.monotonic()
    assert severe(browser.open(page)) == []
    print(f"Chromium load ({LONG_STEPS} steps): {time.monotonic() - started:.2f} s")
    assert browser.js("return document.querySelectorAll('section.step').length") == LONG_STEPS
    # Long outputs are cut with a "show more" fold; the model's thinking is escaped text, not markup.
    assert browser.js("return document.querySelectorAll('details.more').length") >= LONG_STEPS // 500
    assert browser.js("return document.querySelectorAll('.thinking b').length") == 0
    # Hand-offs and the budget stop are marked and listed.
    handoffs = LONG_STEPS // HANDOFF_EVERY
    assert browser.js("return document.querySelectorAll('section.step.handed-off').length") == handoffs
    assert browser.js("return document.querySelectorAll('ul.events li').length") == handoffs + 1
    assert browser.js("return document.querySelector('.ev-budget_stop') !== null")
    # The flag deep in the run links to its step, and following it lands there.
    browser.driver.find_element("css selector", "a.flag-step").click()
    assert browser.js("return location.hash") == f"#step-{FLAGGED_STEP}"
    top = browser.js(f"return document.getElementById('step-{FLAGGED_STEP}').getBoundingClientRect().top")
    assert 0 <= top < 200
    assert severe(browser.console()) == []
    check_png(browser.screenshot(artifacts / "run-long.png"))
