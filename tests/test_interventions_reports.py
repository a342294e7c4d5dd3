"""People's interventions (#44) in every report: a campaign of three runs of one system, one extended, one untouched,
one paused, resumed and cancelled. The cancelled run is counted apart and left out of every statistic; each
intervention shows in the report's json, csv, table and html, in analyze, in the ATIF export and in the trajectory
viewer; `--exclude-intervened` leaves the touched runs out and says how many."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from analyze_synth import write_run
from click.testing import CliRunner
from rich.console import Console

from labkube.budgets import Budgets, Spend, StopReason, Usage
from labkube.campaign import CampaignSpec
from labkube.control import add_interventions
from labkube.interventions import BudgetChange, Intervention, InterventionKind
from labkube.report import aggregate, report_rows
from labkube.result import Grade, Outcome, RunResult, SubtaskScore
from labkube.results.analysis_cli import analyze
from labkube.results.export_cli import export
from labkube.results.html_report import intervention_seconds
from labkube.results.report_cli import report, status
from labkube.results.trajectory_view import build_trajectory, intervention_steps, render_run_html
from labkube.results.views import status_table
from labkube.run_spec import RunPhase, RunSpec, RunStatus, make_run_id
from labkube.store import CampaignDir, write_model
from labkube.tasks import BUNDLED

TASK = "researchgym/continual-learning-lite"
MODEL = "openai:gpt-5"
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
OPERATOR_TEXT = "Stop tuning the learning rate; write up what you have."
EXTENDED, UNTOUCHED, CANCELLED = (make_run_id(TASK, MODEL, seed, "rg-agent") for seed in range(3))


def act(kind: InterventionKind, minutes: float, **fields: object) -> Intervention:
    return Intervention(kind=kind, at=START + timedelta(minutes=minutes), by="alice@host", **fields)  # type: ignore[arg-type]


INTERVENTIONS = {
    EXTENDED: [
        act(InterventionKind.extend, 20, budgets=BudgetChange(wall_hours=3.0), reason="close to a result"),
        act(InterventionKind.message, 25, message=OPERATOR_TEXT),
    ],
    UNTOUCHED: [],
    CANCELLED: [
        act(InterventionKind.pause, 10, reason="overnight"),
        act(InterventionKind.resume, 70),
        act(InterventionKind.cancel, 80, reason="stuck in a loop"),
    ],
}


def grade(minutes: float, step: int, score: float) -> Grade:
    subtasks = [SubtaskScore(id="primary", raw=score, fraction_of_sota=score)]
    return Grade(
        at_seconds=minutes * 60, step=step, tokens=1000 * step, usd=0.01 * step, subtasks=subtasks, score=score
    )


def result_of(run_id: str, seed: int, score: float) -> RunResult:
    cancelled = run_id == CANCELLED
    return RunResult(
        run_id=run_id,
        task=TASK,
        model=MODEL,
        seed=seed,
        status=RunPhase.finished,
        stop_reason=StopReason.cancelled if cancelled else StopReason.done,
        outcome=Outcome.cancelled if cancelled else Outcome.scored,
        score=score,
        beat_baseline=True,
        completion=1.0,
        subtasks=[SubtaskScore(id="primary", raw=score, fraction_of_sota=score)],
        spend=Spend(steps=4, usage=Usage(input=4000, output=800), usd=0.04, wall_seconds=1800),
        score_curve=[grade(5, 1, score / 2), grade(15, 2, score / 2), grade(30, 4, score)],
        integrity_verdict="PASS",
        started_at=START,
        finished_at=START + timedelta(hours=2),
        interventions=INTERVENTIONS[run_id],
    )


def transcript(run_id: str) -> list[dict]:
    """Four steps; the harness's `intervention` event after the step each took effect at."""
    events: list[dict] = [{"type": "start", "ts": START.isoformat(), "model": MODEL, "seed": 0}]
    acts = {i: intervention for i, intervention in zip((1, 2, 3), INTERVENTIONS[run_id], strict=False)}
    for step in range(1, 5):
        call = {"id": f"c{step}", "name": "bash", "arguments": {"command": "ls"}}
        message = {"role": "assistant", "content": f"step {step}", "tool_calls": [call]}
        usage = {"input": 1000, "output": 200}
        events.append({"type": "model_call", "step": step, "model": MODEL, "message": message, "usage": usage})
        events.append({"type": "tool_call", "step": step, "call_id": f"c{step}", "tool": "bash", "ok": True})
        if step in acts:
            i = acts[step]
            events.append(
                {"type": "intervention", "ts": i.at.isoformat(), "kind": i.kind.value, "id": i.id, "by": i.by}
                | {"reason": i.reason, "step": step}
            )
    return events


def conversation() -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You are a researcher."}, {"role": "user", "content": "Task"}]
    for step in range(1, 5):
        call = {"id": f"c{step}", "name": "bash", "arguments": {"command": "ls"}}
        messages.append({"role": "assistant", "content": f"step {step}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "name": "bash", "content": "ok"})
        if step == 2:
            messages.append({"role": "user", "content": f"A message from the operator:\n{OPERATOR_TEXT}"})
    return messages


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("interventions") / "camp"
    budgets = Budgets(wall_hours=2.0, usd=5.0)
    spec = CampaignSpec(name="touched", tasks=[TASK], models=[MODEL], seeds=3, budgets=budgets)  # type: ignore[arg-type]
    specs = [
        RunSpec(
            run_id=run_id,
            campaign="touched",
            task=TASK,
            task_path=str(BUNDLED / TASK),
            model=MODEL,
            seed=seed,
            budgets=budgets,
        )
        for seed, run_id in enumerate((EXTENDED, UNTOUCHED, CANCELLED))
    ]
    cdir = CampaignDir(root)
    cdir.write_campaign(spec, specs)
    for s, score in zip(specs, (0.6, 0.4, 0.9), strict=True):
        write_run(cdir, s, result_of(s.run_id, s.seed, score), transcript(s.run_id))
        with (cdir.run_dir(s.run_id) / "conversation.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(m) + "\n" for m in conversation())
    return root


def invoke(command, *args: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    got = CliRunner().invoke(command, list(args), catch_exceptions=False)
    assert got.exit_code == 0, got.output
    return got.stdout, got.stderr


def test_the_cancelled_run_is_left_out_of_the_statistics_and_counted_apart(campaign: Path) -> None:
    (agg,) = aggregate(report_rows(CampaignDir(campaign)))
    assert (agg.runs, agg.finished, agg.errors, agg.cancelled, agg.intervened) == (3, 2, 0, 1, 2)
    assert agg.mean_score == pytest.approx(0.5)  # the cancelled run's 0.9 is in its curve only
    assert agg.best_score == pytest.approx(0.6)
    assert agg.beat_baseline == 2


def test_report_json_lists_each_run_s_interventions_and_csv_counts_them(campaign: Path) -> None:
    rows = {r["run_id"]: r for r in json.loads(invoke(report, str(campaign), "--format", "json")[0])}
    assert [i["kind"] for i in rows[CANCELLED]["interventions"]] == ["pause", "resume", "cancel"]
    assert rows[CANCELLED]["outcome"] == "cancelled" and rows[CANCELLED]["score"] is None
    assert rows[EXTENDED]["interventions"][0]["budgets"] == {
        "wall_hours": 3.0,
        "usd": None,
        "tokens": None,
        "steps": None,
    }
    assert rows[UNTOUCHED]["interventions"] == []
    table = {r["run_id"]: r for r in csv.DictReader(io.StringIO(invoke(report, str(campaign), "--format", "csv")[0]))}
    assert {run_id: table[run_id]["interventions"] for run_id in table} == {
        EXTENDED: "2",
        UNTOUCHED: "0",
        CANCELLED: "3",
    }
    (system,) = json.loads(invoke(report, str(campaign), "--format", "json", "--by", "scaffold")[0])
    assert (system["errors"], system["cancelled"], system["intervened"]) == (0, 1, 2)


def test_the_table_shows_cancelled_not_error_and_names_each_intervention(campaign: Path) -> None:
    text = invoke(report, str(campaign))[0]
    assert "cancelled" in text and "error" not in text.replace("errors", "")
    assert "intervention: cancel by alice@host (stuck in a loop)" in text
    assert f"intervention: message {OPERATOR_TEXT[:20]}" in text.replace("'", "")


def test_exclude_intervened_leaves_touched_runs_out_of_report_and_says_how_many(campaign: Path) -> None:
    out, err = invoke(report, str(campaign), "--format", "json", "--exclude-intervened")
    assert [r["run_id"] for r in json.loads(out)] == [UNTOUCHED]
    assert "left out: 2 runs a person intervened in (--exclude-intervened)" in err
    (system,) = json.loads(
        invoke(report, str(campaign), "--format", "json", "--by", "scaffold", "--exclude-intervened")[0]
    )
    assert (system["runs"], system["cancelled"], system["mean_score"]) == (1, 0, pytest.approx(0.4))


def test_html_report_has_the_column_the_counts_and_a_marker_per_intervention(campaign: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    invoke(report, str(campaign), "--format", "html", "--out", str(page))
    html = page.read_text()
    assert 'id="cancelled-count">1<' in html and 'id="intervened-count">2<' in html
    assert html.count('class="num run-interventions"') == 3
    assert 'data-kind="cancel"' in html and "cancel by alice@host (stuck in a loop)" in html
    assert re.search(r'<td class="num agg-cancelled">1</td>', html)
    for run_id, acts in INTERVENTIONS.items():
        for i in acts:
            assert f'id="intervention-time-{run_id}-{i.id}"' in html, (run_id, i.kind)
    page_without = tmp_path / "without.html"
    invoke(report, str(campaign), "--format", "html", "--out", str(page_without), "--exclude-intervened")
    left = page_without.read_text()
    assert 'id="excluded-intervened-note"' in left and f"run-{CANCELLED}" not in left


def test_an_intervention_falls_at_its_charged_time_not_counting_the_pause() -> None:
    result = result_of(CANCELLED, 2, 0.9)
    pause, resume, cancel = result.interventions
    assert intervention_seconds(result, pause) == 600
    assert intervention_seconds(result, resume) == 600  # an hour paused: nothing charged
    assert intervention_seconds(result, cancel) == 1200
    result.spend.wall_seconds = 900
    assert intervention_seconds(result, cancel) == 900  # never past the run's charged end


def test_analyze_counts_the_cancelled_run_apart_and_leaves_out_touched_runs_when_asked(
    campaign: Path, tmp_path: Path
) -> None:
    out = tmp_path / "analysis.json"
    printed = invoke(analyze, str(campaign), "--format", "json", "--out", str(out))[0]
    analysis = json.loads(out.read_text())
    (group,) = analysis["groups"]
    assert (group["runs"], group["errors"], group["cancelled"]) == (2, 0, 1)
    assert group["mean"] == pytest.approx(0.5)
    assert [e["run_id"] for e in analysis["cancelled"]] == [CANCELLED] and analysis["errors"] == []
    assert sorted(analysis["intervened"]) == sorted([EXTENDED])
    assert "left out: 1 runs a person cancelled" in printed
    printed = invoke(analyze, str(campaign), "--format", "md", "--out", str(tmp_path / "a.md"), "--exclude-intervened")[
        0
    ]
    assert "left out: 2 runs a person intervened in (--exclude-intervened)" in printed
    md = (tmp_path / "a.md").read_text()
    assert f"- {EXTENDED}: a person intervened in it (--exclude-intervened)" in md
    assert "Runs analysed: 1" in md


def test_atif_marks_touched_runs_and_the_operator_s_message_and_exclude_intervened_drops_them(
    campaign: Path, tmp_path: Path
) -> None:
    out = tmp_path / "atif"
    printed = invoke(export, str(campaign), "--format", "atif", "--out", str(out))[0]
    assert "3 of 3 runs exported" in printed
    got = {p.name.split("--", 1)[1].removesuffix(".atif.json"): json.loads(p.read_text()) for p in out.glob("*.json")}
    marks = {run_id: t["extra"]["labkube"]["intervened"] for run_id, t in got.items()}
    assert marks == {EXTENDED: True, UNTOUCHED: False, CANCELLED: True}
    cancelled = got[CANCELLED]["extra"]
    assert [i["kind"] for i in cancelled["labkube"]["interventions"]] == ["pause", "resume", "cancel"]
    assert cancelled["labkube"]["outcome"] == "cancelled"
    assert {r["kind"]: r["value"] for r in cancelled["rewards"]["terminal"]}["final_score"] is None
    (sent,) = [s for s in got[EXTENDED]["steps"] if (s.get("extra") or {}).get("operator_message")]
    assert sent["source"] == "user" and OPERATOR_TEXT in sent["message"]
    assert sent["extra"]["intervention_id"] == INTERVENTIONS[EXTENDED][1].id
    assert not any((s.get("extra") or {}).get("operator_message") for s in got[UNTOUCHED]["steps"])
    kept = tmp_path / "kept"
    printed = invoke(export, str(campaign), "--format", "atif", "--out", str(kept), "--exclude-intervened")[0]
    assert [p.name for p in kept.glob("*.json")] == [f"camp--{UNTOUCHED}.atif.json"]
    assert "left out: 2 runs a person intervened in (--exclude-intervened)" in printed


def test_the_viewer_shows_each_intervention_as_a_row_and_a_line_on_the_curve(campaign: Path) -> None:
    html = render_run_html(CampaignDir(campaign).run_dir(CANCELLED))
    assert html.count('class="event ev-intervention marked"') == 3
    assert "Intervention: pause by alice@host (overnight)" in html
    assert 'id="run-interventions"' in html
    for i in INTERVENTIONS[CANCELLED]:
        assert f'id="intervention-score-{i.id}"' in html
    untouched = render_run_html(CampaignDir(campaign).run_dir(UNTOUCHED))
    assert "event ev-intervention" not in untouched and 'id="run-interventions"' not in untouched


def test_status_shows_a_paused_run_with_its_message_and_its_interventions(tmp_path: Path) -> None:
    root = tmp_path / "live"
    budgets = Budgets(wall_hours=2.0)
    spec = CampaignSpec(name="live", tasks=[TASK], models=[MODEL], seeds=1, budgets=budgets)  # type: ignore[arg-type]
    run = RunSpec(run_id=UNTOUCHED, campaign="live", task=TASK, task_path=str(BUNDLED / TASK), model=MODEL, seed=0)
    cdir = CampaignDir(root)
    cdir.write_campaign(spec, [run])
    message = "paused by alice@host (overnight)"
    write_model(
        cdir.run_dir(UNTOUCHED) / "status.json",
        RunStatus(run_id=UNTOUCHED, phase=RunPhase.paused, step=3, message=message),
    )
    add_interventions(root, {UNTOUCHED: act(InterventionKind.pause, 10, reason="overnight")})
    (row,) = report_rows(cdir)
    assert row.status == "Paused" and [i.kind for i in row.interventions] == [InterventionKind.pause]
    assert "Paused" in invoke(status, str(root))[0]
    wide = Console(file=io.StringIO(), width=300, no_color=True)
    wide.print(status_table([row], "runs"))
    (line,) = [ln for ln in wide.file.getvalue().splitlines() if UNTOUCHED in ln]  # type: ignore[attr-defined]
    assert "Paused" in line and message in line and "1 (pause by alice@host)" in line


def test_the_viewer_places_an_intervention_the_transcript_lacks_by_its_charged_time() -> None:
    """A cancel of a paused run is applied with no harness running: no transcript event, so the curve's gradings
    (step against charged seconds) place it."""
    result = result_of(CANCELLED, 2, 0.9)
    untold = build_trajectory([e for e in transcript(CANCELLED) if e["type"] != "intervention"])
    placed = dict(intervention_steps(result.interventions, result, untold))
    pause, resume, cancel = result.interventions
    assert placed[pause.id] == pytest.approx(1.5) and placed[resume.id] == pytest.approx(1.5)
    assert placed[cancel.id] == pytest.approx(2 + 2 * 300 / 900)
    told = dict(intervention_steps(result.interventions, result, build_trajectory(transcript(CANCELLED))))
    assert told == {pause.id: 1.0, resume.id: 2.0, cancel.id: 3.0}


def test_the_viewer_takes_no_intervention_from_the_transcript_alone(campaign: Path, tmp_path: Path) -> None:
    """In a pod the transcript is the agent's to write: a line claiming an intervention the run's record (the result's
    `interventions`, from the operator's account) does not hold is shown as that claim, and drawn on no curve."""
    copied = shutil.copytree(campaign, tmp_path / "camp")  # the module's campaign stays as the other tests see it
    run_dir = CampaignDir(copied).run_dir(UNTOUCHED)
    forged = {"type": "intervention", "ts": "2026-12-07T10:00:00+00:00", "step": 1, "id": "forged0000001",
              "kind": "extend", "by": "alice@host", "reason": "the agent's own"}  # fmt: skip
    with (run_dir / "transcript.jsonl").open("a") as out:
        out.write(json.dumps(forged) + "\n")
    html = render_run_html(run_dir)
    assert "NOT in the run&#39;s record of interventions" in html or "NOT in the run's record of interventions" in html
    assert 'id="intervention-score-forged0000001"' not in html
